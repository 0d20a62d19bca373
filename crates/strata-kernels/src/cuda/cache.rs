//! On-disk cache of compiled kernels, so start-up pays NVRTC once per source change.
//!
//! File: `<dir>/<family>-<source hash>-<target>-nvrtc<major>.<minor>.cubin` (target: `sm_90`,
//! `sm_90a`, ...), where `<dir>` is
//! `$STRATA_KERNEL_CACHE` ([`crate::CudaTuning::kernel_cache`]), else `$XDG_CACHE_HOME/strata/kernels`, else
//! `~/.cache/strata/kernels`. Every failure here (no home, read-only directory, corrupt file)
//! only means compiling again; the cache never turns into an error.

use std::path::PathBuf;

use super::sources::{target, KernelFile};

fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = &crate::CudaTuning::get().kernel_cache {
        return Some(dir.clone());
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(base.join("strata").join("kernels"))
}

/// FNV-1a, 64 bits: stable across Rust versions (unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Where `file` compiled for `arch` by NVRTC `version` is (or would be) cached.
pub fn cache_path(file: &KernelFile, arch: u32, version: (i32, i32)) -> Option<PathBuf> {
    let hash = fnv1a(file.full_source().as_bytes());
    Some(cache_dir()?.join(format!(
        "{}-{hash:016x}-{}-nvrtc{}.{}.cubin",
        file.name,
        target(file, arch),
        version.0,
        version.1
    )))
}

pub fn load(path: &Option<PathBuf>) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path.as_ref()?).ok()?;
    // A CUBIN is an ELF file; anything else is a torn or foreign file.
    bytes.starts_with(b"\x7fELF").then_some(bytes)
}

/// Writes through a temporary file and a rename, so a concurrent reader never sees half a file.
pub fn store(path: &Option<PathBuf>, cubin: &[u8]) {
    let Some(path) = path else { return };
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, cubin).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
