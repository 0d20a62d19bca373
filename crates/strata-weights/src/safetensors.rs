//! Hugging Face safetensors: single files and sharded checkpoints, memory-mapped.
//!
//! Format: an 8-byte little-endian header length `n`, `n` bytes of JSON mapping each tensor
//! name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the byte
//! buffer after the header), plus an optional `"__metadata__"` string map. Every length,
//! offset and size is checked before use, so corrupt files give an error, never a panic.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;
use strata_gguf::GgmlType;

use crate::error::{io_error, Result, WeightsError};
use crate::{TensorView, WeightSource};

/// The safetensors reference implementation refuses headers above 100 MB; so do we, before
/// handing the JSON to the parser.
const MAX_HEADER_LEN: u64 = 100_000_000;

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

struct Shard {
    path: String,
    bytes: Bytes,
}

/// One tensor of the directory.
#[derive(Clone, Debug)]
struct Entry {
    /// The safetensors dtype string (`"BF16"`).
    dtype: String,
    /// `None` for dtypes with no ggml counterpart (U8, BOOL, F8_*...): listed, not served.
    ty: Option<GgmlType>,
    shape: Vec<usize>,
    shard: usize,
    /// Absolute byte range in the shard.
    start: usize,
    end: usize,
}

/// A safetensors checkpoint: one file or all shards of an index.
pub struct SafetensorsModel {
    shards: Vec<Shard>,
    entries: BTreeMap<String, Entry>,
    metadata: BTreeMap<String, String>,
}

impl std::fmt::Debug for SafetensorsModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsModel")
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.entries.len())
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

#[derive(Deserialize)]
struct RawIndex {
    weight_map: BTreeMap<String, String>,
}

/// Bytes per element of a safetensors dtype and its ggml type, if any.
fn dtype_info(dtype: &str) -> Option<(u64, Option<GgmlType>)> {
    Some(match dtype {
        "F64" => (8, Some(GgmlType::F64)),
        "F32" => (4, Some(GgmlType::F32)),
        "F16" => (2, Some(GgmlType::F16)),
        "BF16" => (2, Some(GgmlType::BF16)),
        "I64" => (8, Some(GgmlType::I64)),
        "I32" => (4, Some(GgmlType::I32)),
        "I16" => (2, Some(GgmlType::I16)),
        "I8" => (1, Some(GgmlType::I8)),
        "U64" => (8, None),
        "U32" => (4, None),
        "U16" => (2, None),
        "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => (1, None),
        _ => return None,
    })
}

/// A parsed header: the tensors in file order and the `__metadata__` map.
type Header = (Vec<(String, Entry)>, BTreeMap<String, String>);

/// Parses the header of shard number `shard`.
fn parse_header(path: &str, bytes: &[u8], shard: usize) -> Result<Header> {
    let bad = |reason: String| WeightsError::Safetensors {
        path: path.to_string(),
        reason,
    };
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(bad(format!(
            "file is {} bytes, too short for the 8-byte header length",
            bytes.len()
        )));
    };
    let n = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    let available = bytes.len() as u64 - 8;
    if n > MAX_HEADER_LEN || n > available {
        return Err(bad(format!(
            "header length {n} exceeds the file ({available} bytes after the length) or the {MAX_HEADER_LEN}-byte limit"
        )));
    }
    let base = 8 + n as usize;
    let json: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&bytes[8..base])
        .map_err(|e| bad(format!("header is not a JSON object of tensors: {e}")))?;
    let data_len = (bytes.len() - base) as u64;
    let mut metadata = BTreeMap::new();
    let mut entries = Vec::with_capacity(json.len());
    for (name, value) in json {
        if name == "__metadata__" {
            metadata = serde_json::from_value(value)
                .map_err(|e| bad(format!("__metadata__ is not a string map: {e}")))?;
            continue;
        }
        let raw: RawEntry =
            serde_json::from_value(value).map_err(|e| bad(format!("tensor {name:?}: {e}")))?;
        let (elem_size, ty) = dtype_info(&raw.dtype)
            .ok_or_else(|| bad(format!("tensor {name:?}: unknown dtype {:?}", raw.dtype)))?;
        let [begin, end] = raw.data_offsets;
        if begin > end || end > data_len {
            return Err(bad(format!(
                "tensor {name:?}: data offsets [{begin}, {end}] outside the {data_len}-byte data buffer"
            )));
        }
        let size = raw
            .shape
            .iter()
            .try_fold(elem_size, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("tensor {name:?}: shape {:?} overflows", raw.shape)))?;
        if size != end - begin {
            return Err(bad(format!(
                "tensor {name:?}: {} {:?} needs {size} bytes but its offsets span {}",
                raw.dtype,
                raw.shape,
                end - begin
            )));
        }
        entries.push((
            name,
            Entry {
                dtype: raw.dtype,
                ty,
                // Each dim is at most the byte size, which fits in the file, so in usize.
                shape: raw.shape.iter().map(|&d| d as usize).collect(),
                shard,
                start: base + begin as usize,
                end: base + end as usize,
            },
        ));
    }
    let mut spans: Vec<(usize, usize, &str)> = entries
        .iter()
        .filter(|(_, e)| e.end > e.start)
        .map(|(name, e)| (e.start, e.end, name.as_str()))
        .collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((a_start, a_end, a), (b_start, _, b)) = (pair[0], pair[1]);
        if b_start < a_end {
            return Err(bad(format!(
                "tensors {a:?} (bytes {}..{}) and {b:?} (from byte {}) overlap",
                a_start - base,
                a_end - base,
                b_start - base
            )));
        }
    }
    Ok((entries, metadata))
}

fn map_file(path: &Path) -> Result<Bytes> {
    let file = std::fs::File::open(path).map_err(io_error(path))?;
    // SAFETY: read-only map; the file changing underneath is a user error that can give
    // wrong values, and every access goes through bounds-checked slices.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_error(path))?;
    Ok(Bytes::Mapped(map))
}

impl SafetensorsModel {
    /// Opens one `.safetensors` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::from_shards(vec![Shard {
            path: path.display().to_string(),
            bytes: map_file(path)?,
        }])
    }

    /// Parses one in-memory file (`name` is used in error messages).
    pub fn from_vec(name: &str, bytes: Vec<u8>) -> Result<Self> {
        Self::from_shards(vec![Shard {
            path: name.to_string(),
            bytes: Bytes::Owned(bytes),
        }])
    }

    /// Opens a model directory: `model.safetensors.index.json` and its shards when present,
    /// else `model.safetensors`.
    pub fn open_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let index = dir.join("model.safetensors.index.json");
        if index.is_file() {
            return Self::open_index(&index);
        }
        let single = dir.join("model.safetensors");
        if single.is_file() {
            return Self::open(single);
        }
        Err(WeightsError::NoWeights(dir.display().to_string()))
    }

    /// Opens a sharded checkpoint from its index file; every shard it names is loaded and
    /// every tensor it lists must be in the shard it says.
    pub fn open_index(index_path: impl AsRef<Path>) -> Result<Self> {
        let index_path = index_path.as_ref();
        let bad = |reason: String| WeightsError::ShardIndex {
            path: index_path.display().to_string(),
            reason,
        };
        let text = std::fs::read(index_path).map_err(io_error(index_path))?;
        let index: RawIndex = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let mut files: Vec<&String> = index.weight_map.values().collect();
        files.sort();
        files.dedup();
        let mut shards = Vec::with_capacity(files.len());
        for f in &files {
            // Shards live next to the index; refuse anything that would reach elsewhere.
            if f.is_empty() || f.contains(['/', '\\']) || *f == ".." || *f == "." {
                return Err(bad(format!(
                    "shard file name {f:?} is not a plain file name"
                )));
            }
            let path = dir.join(f);
            shards.push(Shard {
                path: path.display().to_string(),
                bytes: map_file(&path)?,
            });
        }
        let model = Self::from_shards(shards)?;
        for (name, file) in &index.weight_map {
            let shard = files.binary_search(&file).expect("file came from this map");
            match model.entries.get(name) {
                Some(e) if e.shard == shard => {}
                Some(e) => {
                    return Err(bad(format!(
                        "tensor {name:?} is listed in {file:?} but found in {:?}",
                        model.shards[e.shard].path
                    )))
                }
                None => {
                    return Err(bad(format!(
                        "tensor {name:?} is listed in {file:?} but missing"
                    )))
                }
            }
        }
        Ok(model)
    }

    fn from_shards(shards: Vec<Shard>) -> Result<Self> {
        let mut entries = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        let mut owner: HashMap<String, usize> = HashMap::new();
        for (i, shard) in shards.iter().enumerate() {
            let (list, meta) = parse_header(&shard.path, &shard.bytes, i)?;
            metadata.extend(meta);
            for (name, entry) in list {
                if let Some(prev) = owner.insert(name.clone(), i) {
                    return Err(WeightsError::Safetensors {
                        path: shard.path.clone(),
                        reason: format!("tensor {name:?} is also in {}", shards[prev].path),
                    });
                }
                entries.insert(name, entry);
            }
        }
        Ok(Self {
            shards,
            entries,
            metadata,
        })
    }

    /// The `__metadata__` maps of all shards, merged.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The safetensors dtype string of a tensor (also for dtypes [`get`](WeightSource::get)
    /// does not serve).
    pub fn dtype(&self, name: &str) -> Option<&str> {
        self.entries.get(name).map(|e| e.dtype.as_str())
    }

    /// Shape of a tensor, whatever its dtype.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// The raw bytes of a tensor, whatever its dtype (U8 included).
    pub fn raw_bytes(&self, name: &str) -> Option<&[u8]> {
        let e = self.entries.get(name)?;
        Some(&self.shards[e.shard].bytes[e.start..e.end])
    }
}

impl WeightSource for SafetensorsModel {
    /// Tensors of dtypes with no ggml counterpart (U8, BOOL, F8) are not returned.
    fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let (name, e) = self.entries.get_key_value(name)?;
        Some(TensorView {
            name,
            shape: e.shape.clone(),
            ty: e.ty?,
            bytes: &self.shards[e.shard].bytes[e.start..e.end],
        })
    }

    fn names(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }

    fn format(&self) -> &'static str {
        "safetensors"
    }
}

/// Writes a safetensors file (for tests, fixtures and tools): `(name, dtype, shape, bytes)`.
/// The header is padded with spaces to a multiple of 8 so data is 8-byte aligned.
pub fn write_safetensors(tensors: &[(&str, &str, &[usize], &[u8])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({
                "dtype": dtype,
                "shape": shape,
                "data_offsets": [offset, offset + data.len()],
            }),
        );
        offset += data.len();
    }
    let mut json = serde_json::to_vec(&header).expect("a map of plain values serializes");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len() + offset);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}
