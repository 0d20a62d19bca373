//! A small GGUF writer (version 3) for tests, fixtures and tools.

use crate::value::kind;
use crate::{Array, GgmlType, Value, DEFAULT_ALIGNMENT, MAGIC};

/// Builds a GGUF file in memory: metadata first, then tensors with their raw bytes.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file: no metadata, no tensors.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a metadata entry.
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Appends a string metadata entry.
    pub fn str(&mut self, key: &str, value: &str) -> &mut Self {
        self.kv(key, Value::String(value.to_string()))
    }

    /// Appends a u32 metadata entry.
    pub fn u32(&mut self, key: &str, value: u32) -> &mut Self {
        self.kv(key, Value::U32(value))
    }

    /// Appends an f32 metadata entry.
    pub fn f32(&mut self, key: &str, value: f32) -> &mut Self {
        self.kv(key, Value::F32(value))
    }

    /// Appends an array metadata entry; its element type is the first item's (u32 when
    /// empty).
    pub fn array(&mut self, key: &str, items: Vec<Value>) -> &mut Self {
        let elem_kind = items.first().map_or(kind::U32, Value::kind);
        self.kv(key, Value::Array(Array { elem_kind, items }))
    }

    /// Adds a tensor; `dims` innermost first; `data` must hold exactly its bytes.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    /// Serialises the file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&v.kind().to_le_bytes());
            put_value(&mut out, v);
        }
        let align = DEFAULT_ALIGNMENT;
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(align) * align;
        }
        let start = (out.len() as u64).div_ceil(align) * align;
        out.resize(start as usize, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize((start + off) as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            out.extend_from_slice(&a.elem_kind.to_le_bytes());
            out.extend_from_slice(&(a.items.len() as u64).to_le_bytes());
            for item in &a.items {
                put_value(out, item);
            }
        }
    }
}
