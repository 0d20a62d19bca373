//! bitsandbytes 4-bit linear weights (NF4 and FP4, with or without double quantization), as
//! transformers saves them: the packed codes under the weight's own name (U8, two a byte,
//! the first in the high nibble), `.absmax` (f32, or U8 codes when double-quantized, with
//! `.nested_absmax`, `.nested_quant_map` and the state's `nested_offset`), `.quant_map`
//! (the 16 values a code stands for) and the state as JSON bytes in
//! `.quant_state.bitsandbytes__nf4` (or `__fp4`).
//!
//! Dequantization is bitsandbytes' own: value = quant_map[code] * absmax[block] in f32, a
//! double-quantized absmax being nested_quant_map[u8] * nested_absmax[block / 256] +
//! nested_offset in f32, the product rounded to the state's dtype.
//!
//! A matrix is read into [`Bnb4`]: the 4-bit codes as stored and one f32 absmax a block
//! (a double-quantized one decoded once), about 0.56 bytes a weight; values are decoded from
//! it where they are used.

use crate::error::{Result, WeightsError};
use crate::safetensors::SafetensorsModel;
use crate::{GgmlType, WeightSource};

/// A dequantized tensor: its shape, element type and little-endian bytes.
#[derive(Clone, Debug)]
pub struct Decoded {
    /// `[out_features, in_features]`.
    pub shape: Vec<usize>,
    /// F32, BF16 or F16, as the quantization state's `dtype` says.
    pub ty: GgmlType,
    /// The values.
    pub bytes: Vec<u8>,
}

const STATE_SUFFIXES: [&str; 2] = [
    ".quant_state.bitsandbytes__nf4",
    ".quant_state.bitsandbytes__fp4",
];

fn bad(name: &str, msg: impl std::fmt::Display) -> WeightsError {
    WeightsError::Tensor {
        name: name.to_string(),
        reason: format!("bitsandbytes 4-bit: {msg}"),
    }
}

/// A bitsandbytes 4-bit matrix: codes as stored, an f32 absmax a block, the 16-value map.
#[derive(Clone, Debug)]
pub struct Bnb4 {
    /// `[out_features, in_features]`.
    pub shape: Vec<usize>,
    /// What a value is rounded to: F32, BF16 or F16, as the quantization state's `dtype`
    /// says.
    pub ty: GgmlType,
    blocksize: usize,
    /// Two codes a byte, value `2i` in the high nibble.
    codes: Vec<u8>,
    absmax: Vec<f32>,
    quant_map: [f32; 16],
}

impl Bnb4 {
    /// A matrix from its parts: `shape` `[rows, cols]`, the rounding `ty` (F32, BF16 or
    /// F16), values a block, the codes (two a byte, value `2i` in the high nibble), one
    /// absmax a block and the 16 values a code stands for. Errors on sizes that disagree.
    pub fn new(
        shape: [usize; 2],
        ty: GgmlType,
        blocksize: usize,
        codes: Vec<u8>,
        absmax: Vec<f32>,
        quant_map: [f32; 16],
    ) -> Result<Self> {
        let n = shape[0]
            .checked_mul(shape[1])
            .ok_or_else(|| bad("Bnb4::new", "shape overflows"))?;
        if !matches!(ty, GgmlType::F32 | GgmlType::BF16 | GgmlType::F16) {
            return Err(bad("Bnb4::new", format!("values rounded to {ty}")));
        }
        if blocksize == 0 || codes.len() != n.div_ceil(2) || absmax.len() != n.div_ceil(blocksize) {
            return Err(bad(
                "Bnb4::new",
                format!(
                    "{} code bytes and {} absmax values for {n} values in blocks of {blocksize}",
                    codes.len(),
                    absmax.len()
                ),
            ));
        }
        Ok(Self {
            shape: shape.to_vec(),
            ty,
            blocksize,
            codes,
            absmax,
            quant_map,
        })
    }

    /// Values a block (one absmax each).
    pub fn blocksize(&self) -> usize {
        self.blocksize
    }

    /// The codes, two a byte, value `2i` in the high nibble.
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }

    /// One absmax a block (a double-quantized one already decoded).
    pub fn absmax(&self) -> &[f32] {
        &self.absmax
    }

    /// The 16 values a code stands for.
    pub fn quant_map(&self) -> &[f32; 16] {
        &self.quant_map
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.shape[0]
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.shape[1]
    }

    /// Bytes kept: the codes and the absmax values.
    pub fn stored_bytes(&self) -> usize {
        self.codes.len() + 4 * self.absmax.len()
    }

    /// Values `start .. start + out.len()` of the row-major matrix, as bitsandbytes
    /// dequantizes them (`quant_map[code] * absmax` in f32, rounded to [`Bnb4::ty`]).
    /// Panics past the end.
    pub fn decode(&self, start: usize, out: &mut [f32]) {
        let round: fn(f32) -> f32 = match self.ty {
            GgmlType::BF16 => |v| half::bf16::from_f32(v).to_f32(),
            GgmlType::F16 => |v| half::f16::from_f32(v).to_f32(),
            _ => |v| v,
        };
        let mut i = start;
        let mut at = 0;
        while at < out.len() {
            // One block's run at a time: its absmax is read once.
            let block = i / self.blocksize;
            let end = ((block + 1) * self.blocksize - i).min(out.len() - at);
            let scale = self.absmax[block];
            for o in &mut out[at..at + end] {
                let b = self.codes[i / 2];
                let code = if i.is_multiple_of(2) { b >> 4 } else { b & 0xF };
                *o = round(self.quant_map[code as usize] * scale);
                i += 1;
            }
            at += end;
        }
    }

    /// Every value, as the state's dtype's little-endian bytes.
    pub fn to_decoded(&self) -> Decoded {
        let n = self.rows() * self.cols();
        let mut values = vec![0f32; n];
        self.decode(0, &mut values);
        let mut bytes = Vec::with_capacity(n * 4);
        for v in values {
            match self.ty {
                GgmlType::BF16 => bytes.extend(half::bf16::from_f32(v).to_le_bytes()),
                GgmlType::F16 => bytes.extend(half::f16::from_f32(v).to_le_bytes()),
                _ => bytes.extend(v.to_le_bytes()),
            }
        }
        Decoded {
            shape: self.shape.clone(),
            ty: self.ty,
            bytes,
        }
    }
}

/// The weights of `st` stored as bitsandbytes 4-bit, by name.
pub fn read_all(st: &SafetensorsModel) -> Result<Vec<(String, Bnb4)>> {
    let mut out = Vec::new();
    for name in st.names() {
        for suffix in STATE_SUFFIXES {
            if let Some(base) = name.strip_suffix(suffix) {
                out.push((base.to_string(), read(st, base, name)?));
            }
        }
    }
    Ok(out)
}

/// The weights of `st` stored as bitsandbytes 4-bit, by name, dequantized.
pub fn dequantize_all(st: &SafetensorsModel) -> Result<Vec<(String, Decoded)>> {
    Ok(read_all(st)?
        .into_iter()
        .map(|(n, q)| (n, q.to_decoded()))
        .collect())
}

/// f32 values of tensor `name` of `st`, which must be F32.
fn f32s(st: &SafetensorsModel, name: &str) -> Result<Vec<f32>> {
    let v = st
        .get(name)
        .filter(|v| v.ty == GgmlType::F32)
        .ok_or_else(|| bad(name, "missing, or not F32"))?;
    Ok(v.bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// U8 bytes of tensor `name` of `st`.
fn u8s<'a>(st: &'a SafetensorsModel, name: &str) -> Result<&'a [u8]> {
    match st.dtype(name) {
        Some("U8") => st.raw_bytes(name).ok_or_else(|| bad(name, "missing")),
        Some(other) => Err(bad(name, format!("dtype {other}, not U8"))),
        None => Err(bad(name, "missing")),
    }
}

/// Tensor `base`, its state at `state`.
fn read(st: &SafetensorsModel, base: &str, state: &str) -> Result<Bnb4> {
    let json: serde_json::Value =
        serde_json::from_slice(u8s(st, state)?).map_err(|e| bad(state, e))?;
    let field = |k: &str| json.get(k).ok_or_else(|| bad(state, format!("no `{k}`")));
    let usize_of = |k: &str| -> Result<usize> {
        field(k)?
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v > 0)
            .ok_or_else(|| bad(state, format!("`{k}` is not a positive whole number")))
    };
    let blocksize = usize_of("blocksize")?;
    let shape: Vec<usize> = field("shape")?
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d.as_u64())
                .map(|d| d as usize)
                .collect()
        })
        .filter(|s: &Vec<usize>| s.len() == 2)
        .ok_or_else(|| bad(state, "`shape` is not [rows, cols]"))?;
    let ty = match field("dtype")?.as_str() {
        Some("float32") => GgmlType::F32,
        Some("bfloat16") => GgmlType::BF16,
        Some("float16") => GgmlType::F16,
        other => return Err(bad(state, format!("dtype {other:?}"))),
    };
    let n = shape[0]
        .checked_mul(shape[1])
        .ok_or_else(|| bad(base, "shape overflows"))?;
    let blocks = n.div_ceil(blocksize);
    let packed = u8s(st, base)?;
    if packed.len() != n.div_ceil(2) {
        return Err(bad(base, format!("{} bytes for {n} codes", packed.len())));
    }
    let quant_map = f32s(st, &format!("{base}.quant_map"))?;
    if quant_map.len() != 16 {
        return Err(bad(base, "quant_map does not hold 16 values"));
    }
    let absmax_name = format!("{base}.absmax");
    let absmax: Vec<f32> = match json.get("nested_blocksize") {
        None => f32s(st, &absmax_name)?,
        Some(_) => {
            let nested_block = usize_of("nested_blocksize")?;
            let offset = field("nested_offset")?
                .as_f64()
                .ok_or_else(|| bad(state, "`nested_offset` is not a number"))?
                as f32;
            let codes = u8s(st, &absmax_name)?;
            let scales = f32s(st, &format!("{base}.nested_absmax"))?;
            let map = f32s(st, &format!("{base}.nested_quant_map"))?;
            if map.len() != 256 || scales.len() != codes.len().div_ceil(nested_block) {
                return Err(bad(base, "nested absmax tensors of the wrong size"));
            }
            codes
                .iter()
                .enumerate()
                .map(|(i, &c)| map[c as usize] * scales[i / nested_block] + offset)
                .collect()
        }
    };
    if absmax.len() != blocks {
        return Err(bad(
            base,
            format!("{} absmax values for {blocks} blocks", absmax.len()),
        ));
    }
    let mut map = [0f32; 16];
    map.copy_from_slice(&quant_map);
    Ok(Bnb4 {
        shape,
        ty,
        blocksize,
        codes: packed.to_vec(),
        absmax,
        quant_map: map,
    })
}
