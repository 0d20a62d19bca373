//! How many bytes the KV pool gets, and whether a pool of a given size fits: the memory
//! arithmetic a server would otherwise repeat.

use strata_kv::{KvStatus, PoolKind};

use crate::{EngineError, LoadedModel, Result};

/// How the KV pool's size is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvBudget {
    /// Exactly this many bytes.
    Bytes(u64),
    /// This fraction of the memory the pool lives in: free device memory after the weights
    /// on a GPU, available host memory on the CPU. `None`: the default for the device.
    Fraction(Option<f64>),
}

/// Of free device memory: the rest is left to activations, cuBLAS workspaces and the
/// allocator.
pub const GPU_DEFAULT_FRACTION: f64 = 0.85;
/// Of available host memory: a CPU server shares the machine.
pub const CPU_DEFAULT_FRACTION: f64 = 0.1;
/// Assumed when the platform does not say how much host memory is available.
const UNKNOWN_HOST_MEMORY: u64 = 4 << 30;

impl KvBudget {
    /// The bytes this budget gives on `loaded`'s device.
    pub fn bytes(self, loaded: &LoadedModel) -> Result<u64> {
        let fraction = match self {
            KvBudget::Bytes(b) => return Ok(b),
            KvBudget::Fraction(f) => f,
        };
        if let Some(f) = fraction {
            if !(f > 0.0 && f < 1.0) {
                return Err(EngineError::Invalid(format!(
                    "the KV memory fraction must be between 0 and 1 (got {f})"
                )));
            }
        }
        Ok(match loaded.runtime.free_device_memory() {
            Some(free) => (free as f64 * fraction.unwrap_or(GPU_DEFAULT_FRACTION)) as u64,
            None => {
                let avail = available_host_memory().unwrap_or(UNKNOWN_HOST_MEMORY);
                (avail as f64 * fraction.unwrap_or(CPU_DEFAULT_FRACTION)) as u64
            }
        })
    }
}

/// Available host memory from /proc/meminfo, where the platform has it.
pub fn available_host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes a pool of `full_pages` full-attention pages (and its window pool, sized by
/// `window_ratio`) takes, for the pools `kv` describes.
pub fn pool_bytes(kv: &KvStatus, full_pages: usize, window_ratio: f64) -> u128 {
    let unit = |kind: PoolKind| {
        kv.pools
            .iter()
            .find(|p| p.pool == kind)
            .map(|p| p.unit_bytes as u128)
    };
    let window_pages = match unit(PoolKind::Window) {
        Some(_) => ((full_pages as f64 * window_ratio).ceil() as u128).max(1),
        None => 0,
    };
    let page = kv.page_size as u128;
    full_pages as u128 * page * unit(PoolKind::Full).unwrap_or(0)
        + window_pages * page * unit(PoolKind::Window).unwrap_or(0)
}

/// Refuses a pool of `full_pages` pages that cannot fit in host memory (the pool being
/// replaced gives its bytes back first): the storage allocates it at once, and a failed
/// allocation aborts the whole process.
pub fn check_pool_fits(kv: &KvStatus, full_pages: usize, window_ratio: f64) -> Result<()> {
    let needed = pool_bytes(kv, full_pages, window_ratio);
    let Some(available) = available_host_memory() else {
        return Ok(());
    };
    let limit = available as u128 + kv.bytes_reserved as u128;
    if needed > limit {
        return Err(EngineError::Invalid(format!(
            "{full_pages} pages need {needed} bytes of KV memory; {limit} bytes are available"
        )));
    }
    Ok(())
}
