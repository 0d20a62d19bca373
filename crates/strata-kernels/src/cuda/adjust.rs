//! Logit adjustments on the GPU (`kernels/adjust.cu`): bias, penalties and mask applied to
//! the rows of a step's logits in place, before the draw reads them.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{device_err, CudaBackend, CudaBuffer, CudaTokens};
use crate::sampling::{check_rows, RowAdjust, RowMask};
use crate::{DeviceBuffer, Result};

/// Threads of a block (`ADJUST_THREADS` in `kernels/adjust.cu`).
const THREADS: u32 = 256;

/// The rows' lists laid out flat, as the kernel reads them.
#[derive(Default)]
struct Flat {
    meta: Vec<u32>,
    params: Vec<f32>,
    bias_ids: Vec<u32>,
    bias: Vec<f32>,
    seen_ids: Vec<u32>,
    seen_counts: Vec<u32>,
    masked: Vec<u32>,
    pending: Vec<u32>,
}

impl Flat {
    fn new(rows: &[RowAdjust]) -> Self {
        let mut f = Flat::default();
        for a in rows {
            let at = |n: usize| n as u32;
            f.meta.push(a.row as u32);
            f.meta.push(at(f.bias_ids.len()));
            f.bias_ids.extend(a.bias.iter().map(|b| b.0));
            f.bias.extend(a.bias.iter().map(|b| b.1));
            f.meta.push(at(f.bias_ids.len()));
            f.meta.push(at(f.seen_ids.len()));
            f.seen_ids.extend(a.seen.iter().map(|s| s.0));
            f.seen_counts.extend(a.seen.iter().map(|s| s.1));
            f.meta.push(at(f.seen_ids.len()));
            f.meta.push(at(f.masked.len()));
            f.masked.extend_from_slice(&a.masked);
            f.meta.push(at(f.masked.len()));
            f.meta.push(at(f.pending.len()));
            f.pending.extend_from_slice(&a.pending);
            f.meta.push(at(f.pending.len()));
            f.params.extend([
                a.presence_penalty,
                a.frequency_penalty,
                a.repetition_penalty,
            ]);
        }
        f
    }
}

impl CudaBackend {
    pub(super) fn adjust_logits_impl(
        &self,
        logits: &mut CudaBuffer,
        vocab: usize,
        rows: &[RowAdjust],
        fed: Option<&CudaTokens>,
    ) -> Result<()> {
        const OP: &str = "adjust_logits";
        if rows.is_empty() {
            return Ok(());
        }
        check_rows(OP, rows.iter().map(|a| a.row), vocab, logits.len())?;
        for a in rows {
            a.check(vocab)
                .map_err(|detail| crate::KernelError::Invalid { op: OP, detail })?;
        }
        let flat = Flat::new(rows);
        let (meta, params) = (self.to_device(&flat.meta)?, self.to_device(&flat.params)?);
        let bias_ids = self.to_device(&flat.bias_ids)?;
        let bias = self.to_device(&flat.bias)?;
        let seen_ids = self.to_device(&flat.seen_ids)?;
        let seen_counts = self.to_device(&flat.seen_counts)?;
        let masked = self.to_device(&flat.masked)?;
        let pending = self.to_device(&flat.pending)?;
        // Without fed tokens a mark reads no row (id 0, as `feed_tokens` has it).
        let placeholder;
        let (keys, key_rows) = match fed {
            Some(t) => t.fed_keys(),
            None => {
                placeholder = self.to_device(&[0u64])?;
                (&placeholder, 0)
            }
        };
        let vocab64 = vocab as u64;
        let xs = logits.f32s_mut(OP)?;
        let mut l = self.stream.launch_builder(self.kernels.get(OP)?);
        l.arg(xs)
            .arg(&vocab64)
            .arg(&meta)
            .arg(&params)
            .arg(&bias_ids)
            .arg(&bias)
            .arg(&seen_ids)
            .arg(&seen_counts)
            .arg(&masked)
            .arg(&pending)
            .arg(keys)
            .arg(&key_rows);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `adjust_logits` in adjust.cu; every row is inside the
        // logits and every id below `vocab` (checked above); the lists hold the entries
        // `meta` points at (empty lists get a placeholder element, never read).
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}

impl CudaBackend {
    pub(super) fn mask_logits_impl(
        &self,
        logits: &mut CudaBuffer,
        vocab: usize,
        rows: &[RowMask],
    ) -> Result<()> {
        const OP: &str = "mask_logits";
        if rows.is_empty() {
            return Ok(());
        }
        check_rows(OP, rows.iter().map(|m| m.row), vocab, logits.len())?;
        // Every row's bits padded to the longest (missing words disallow their ids).
        let words = rows
            .iter()
            .map(|m| m.allowed.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut bits = vec![0u32; rows.len() * words];
        for (i, m) in rows.iter().enumerate() {
            bits[i * words..i * words + m.allowed.len()].copy_from_slice(&m.allowed);
        }
        let row_ids: Vec<u32> = rows.iter().map(|m| m.row as u32).collect();
        let (row_ids, bits) = (self.to_device(&row_ids)?, self.to_device(&bits)?);
        let (vocab64, words32) = (vocab as u64, words as u32);
        let xs = logits.f32s_mut(OP)?;
        let mut l = self.stream.launch_builder(self.kernels.get(OP)?);
        l.arg(xs)
            .arg(&vocab64)
            .arg(&row_ids)
            .arg(&bits)
            .arg(&words32);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `mask_logits` in adjust.cu; every row is inside the
        // logits (checked above) and `bits` holds `words` words a row.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}
