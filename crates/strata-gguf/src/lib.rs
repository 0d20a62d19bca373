//! A bounds-checked reader for the GGUF container format (versions 2 and 3).
//!
//! The reader parses from a byte slice whose length is known, so every count and length in
//! the header is checked against the bytes that are really there before anything is
//! allocated. Files are memory-mapped: reading the header of a multi-gigabyte model touches
//! only its first pages.

mod types;
mod value;
pub mod writer;

use std::collections::HashMap;
use std::path::Path;

pub use types::GgmlType;
pub use value::{Array, Value};

use value::kind;

/// `GGUF` read as a little-endian u32.
pub const MAGIC: u32 = 0x4655_4747;
/// Default tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's limit on tensor rank.
pub const MAX_DIMS: usize = 4;
/// Nesting limit for arrays of arrays (ggml writes none deeper than one).
const MAX_ARRAY_DEPTH: usize = 4;

/// Why a GGUF file could not be opened or parsed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file's path, as given.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`; holds them as a little-endian u32.
    #[error("not a GGUF file (magic {0:#010x}, expected 0x46554747 \"GGUF\")")]
    BadMagic(u32),
    /// A format version other than 2 or 3.
    #[error("GGUF version {0} is not supported (2 and 3 are)")]
    Version(u32),
    /// A read would run past the end of the file.
    #[error("file truncated: {what} needs {needed} bytes at offset {offset}, file has {len}")]
    Truncated {
        /// What was being read (a count, a key, a tensor's data).
        what: String,
        /// Byte offset of the read.
        offset: u64,
        /// Bytes the read needs.
        needed: u64,
        /// Bytes in the whole file.
        len: u64,
    },
    /// Anything else malformed: duplicate keys or tensor names, bad UTF-8, unknown types,
    /// bad ranks, shapes, offsets or alignment.
    #[error("invalid GGUF: {0}")]
    Invalid(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Invalid(msg.into()))
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name in the file (GGUF naming, e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions innermost first (ggml's `ne`): an HF `[out, in]` matrix is `[in, out]` here.
    pub dims: Vec<u64>,
    /// How the data is stored (plain or a quantized block format).
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        // Checked at parse time not to overflow.
        self.dims.iter().product()
    }

    /// Bytes of tensor data.
    pub fn byte_len(&self) -> u64 {
        self.ggml_type
            .bytes_for(self.elements())
            .expect("checked at parse time")
    }
}

enum Bytes {
    Owned(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Owned(v) => v,
            Bytes::Mapped(m) => m,
        }
    }
}

/// A parsed GGUF file: header, metadata and tensor directory over the file's bytes.
pub struct GgufFile {
    bytes: Bytes,
    /// The GGUF format version (2 or 3).
    pub version: u32,
    metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Alignment of tensor data in bytes (`general.alignment`, else [`DEFAULT_ALIGNMENT`]).
    pub alignment: u64,
    /// Absolute file offset where tensor data starts.
    pub data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a file changed under a running engine is a user
        // error that can give wrong values but not memory unsafety in safe accessors, which
        // copy out of the slice.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse_bytes(Bytes::Mapped(map))
    }

    /// Parses an in-memory file.
    pub fn from_vec(bytes: Vec<u8>) -> Result<Self> {
        Self::parse_bytes(Bytes::Owned(bytes))
    }

    fn parse_bytes(bytes: Bytes) -> Result<Self> {
        let parsed = Parser::new(&bytes).file()?;
        let (version, metadata, tensors, alignment, data_offset) = parsed;
        let mut index = HashMap::with_capacity(metadata.len());
        for (i, (k, _)) in metadata.iter().enumerate() {
            if index.insert(k.clone(), i).is_some() {
                return invalid(format!("duplicate metadata key {k:?}"));
            }
        }
        let mut tensor_index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if tensor_index.insert(t.name.clone(), i).is_some() {
                return invalid(format!("duplicate tensor name {:?}", t.name));
            }
        }
        Ok(Self {
            bytes,
            version,
            metadata,
            index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    /// The tensor directory in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The directory entry of a tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (checked at parse time to lie inside the file).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + info.offset) as usize;
        &self.bytes[start..start + info.byte_len() as usize]
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

type Parsed = (u32, Vec<(String, Value)>, Vec<TensorInfo>, u64, u64);

struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() as u64 {
            return Err(Error::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self
            .take(N as u64, what)?
            .try_into()
            .expect("length checked"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => invalid(format!(
                "{what} at offset {} is not valid UTF-8",
                self.pos - bytes.len()
            )),
        }
    }

    /// A count of items each at least `min_item` bytes long; refuses counts the rest of the
    /// file cannot hold, so the caller may allocate for it.
    fn count(&mut self, what: &str, min_item: u64) -> Result<u64> {
        let n = self.u64(what)?;
        let fits = (self.remaining() as u64) / min_item.max(1);
        if n > fits {
            return invalid(format!(
                "{what} is {n}, but only {} bytes remain after offset {}",
                self.remaining(),
                self.pos
            ));
        }
        Ok(n)
    }

    fn value(&mut self, kind_id: u32, what: &str, depth: usize) -> Result<Value> {
        Ok(match kind_id {
            kind::U8 => Value::U8(self.array::<1>(what)?[0]),
            kind::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            kind::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            kind::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            kind::U32 => Value::U32(self.u32(what)?),
            kind::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            kind::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            kind::BOOL => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return invalid(format!("{what}: bool byte {b} is neither 0 nor 1")),
            },
            kind::STRING => Value::String(self.string(what)?),
            kind::U64 => Value::U64(self.u64(what)?),
            kind::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            kind::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            kind::ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return invalid(format!(
                        "{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    ));
                }
                let elem_kind = self.u32(what)?;
                let min_item = match elem_kind {
                    kind::U8 | kind::I8 | kind::BOOL => 1,
                    kind::U16 | kind::I16 => 2,
                    kind::U32 | kind::I32 | kind::F32 => 4,
                    kind::U64 | kind::I64 | kind::F64 | kind::STRING => 8,
                    kind::ARRAY => 12,
                    other => return invalid(format!("{what}: unknown array element type {other}")),
                };
                let n = self.count(what, min_item)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem_kind, what, depth + 1)?);
                }
                Value::Array(Array { elem_kind, items })
            }
            other => return invalid(format!("{what}: unknown value type {other}")),
        })
    }

    fn file(mut self) -> Result<Parsed> {
        let magic = self.u32("magic")?;
        if magic != MAGIC {
            return Err(Error::BadMagic(magic));
        }
        let version = self.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::Version(version));
        }
        // A tensor entry is at least 8 (name len) + 4 (dims) + 4 (type) + 8 (offset) bytes,
        // a metadata entry at least 8 (key len) + 4 (type) + 1 byte.
        let n_tensors = self.u64("tensor count")?;
        let n_kv = self.count("metadata count", 13)?;
        if n_tensors > self.remaining() as u64 / 24 {
            return invalid(format!(
                "tensor count {n_tensors} cannot fit in the {} bytes of the file",
                self.buf.len()
            ));
        }
        let mut metadata = Vec::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = self.string(&format!("metadata key #{i}"))?;
            let kind_id = self.u32(&format!("type of {key:?}"))?;
            let value = self.value(kind_id, &format!("value of {key:?}"), 0)?;
            metadata.push((key, value));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                _ => return invalid(format!("general.alignment {v:?} is not a power of two")),
            },
        };
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = self.string(&format!("tensor name #{i}"))?;
            let n_dims = self.u32(&format!("rank of {name:?}"))? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return invalid(format!(
                    "tensor {name:?} has rank {n_dims} (1..={MAX_DIMS})"
                ));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(self.u64(&format!("dims of {name:?}"))?);
            }
            let type_id = self.u32(&format!("type of {name:?}"))?;
            let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
                Error::Invalid(format!(
                    "tensor {name:?} has unknown ggml type id {type_id}"
                ))
            })?;
            let offset = self.u64(&format!("offset of {name:?}"))?;
            let elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| Error::Invalid(format!("tensor {name:?} dims {dims:?} overflow")))?;
            if dims[0] % ggml_type.block_size() != 0 {
                return invalid(format!(
                    "tensor {name:?}: row length {} is not a multiple of {ggml_type}'s block of {}",
                    dims[0],
                    ggml_type.block_size()
                ));
            }
            if ggml_type.bytes_for(elements).is_none() {
                return invalid(format!("tensor {name:?} byte size overflows"));
            }
            if offset % alignment != 0 {
                return invalid(format!(
                    "tensor {name:?} offset {offset} is not aligned to {alignment}"
                ));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let data_offset = (self.pos as u64).div_ceil(alignment) * alignment;
        let len = self.buf.len() as u64;
        for t in &tensors {
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.byte_len()));
            match end {
                Some(end) if end <= len => {}
                _ => {
                    return Err(Error::Truncated {
                        what: format!("data of tensor {:?}", t.name),
                        offset: data_offset.saturating_add(t.offset),
                        needed: t.byte_len(),
                        len,
                    })
                }
            }
        }
        check_no_overlap(&tensors)?;
        Ok((version, metadata, tensors, alignment, data_offset))
    }
}

/// Refuses two tensors whose bytes overlap: a file so built would make one weight's bytes
/// another's, and load without complaint. Tensors of no bytes overlap nothing.
fn check_no_overlap(tensors: &[TensorInfo]) -> Result<()> {
    let mut spans: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter(|t| t.byte_len() > 0)
        .map(|t| (t.offset, t.offset + t.byte_len(), t.name.as_str()))
        .collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((a_start, a_end, a), (b_start, _, b)) = (pair[0], pair[1]);
        if b_start < a_end {
            return invalid(format!(
                "tensors {a:?} (bytes {a_start}..{a_end}) and {b:?} (from byte {b_start}) overlap"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
