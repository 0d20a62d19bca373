//! Compiles every kernel file with NVRTC for sm_80, sm_90 (sm_90a for the files that use
//! Hopper's wgmma) and sm_100, on any machine (no GPU needed), so a kernel that does not
//! build fails CI rather than the first GPU run.
//!
//! libnvrtc is looked for on the loader path, then at `$STRATA_NVRTC_LIB` (the library file
//! or its directory), then in Python's site-packages (`pip install nvidia-cuda-nvrtc==13.0.*`
//! puts it in `nvidia/cu13/lib`). A library found by path is loaded first (with its
//! builtins library), so the later loads by name find them by soname. Without libnvrtc the test prints a note and passes.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::Command;

use rayon::prelude::*;
use strata_kernels::cuda::{
    compile_cubin, nvrtc_available, nvrtc_version, KernelFile, KERNEL_FILES,
};

const LIB_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

fn lib_in(dir: &Path) -> Option<PathBuf> {
    LIB_NAMES.iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

fn python_site_dirs() -> Vec<PathBuf> {
    let script = "import site, sys\n\
                  dirs = list(getattr(site, 'getsitepackages', lambda: [])())\n\
                  dirs.append(site.getusersitepackages())\n\
                  dirs += [p for p in sys.path if p]\n\
                  print('\\n'.join(dirs))";
    ["python3", "python"]
        .iter()
        .find_map(|py| Command::new(py).args(["-c", script]).output().ok())
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

fn find_nvrtc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_NVRTC_LIB").map(PathBuf::from) {
        if p.is_file() {
            return Some(p);
        }
        if let Some(found) = lib_in(&p) {
            return Some(found);
        }
    }
    python_site_dirs().iter().find_map(|site| {
        ["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"]
            .iter()
            .find_map(|sub| lib_in(&site.join(sub)))
    })
}

/// Makes libnvrtc loadable by name; false if there is none to be found.
fn ensure_nvrtc() -> bool {
    if nvrtc_available() {
        return true;
    }
    let Some(path) = find_nvrtc() else {
        return false;
    };
    // libnvrtc opens its builtins library by name at compile time; load it first from the
    // same directory so that lookup finds it already loaded.
    let builtins = path.parent().and_then(|dir| std::fs::read_dir(dir).ok());
    for entry in builtins.into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("libnvrtc-builtins.so") {
            // SAFETY: as below.
            if let Ok(lib) = unsafe { libloading::Library::new(entry.path()) } {
                std::mem::forget(lib);
            }
        }
    }
    // SAFETY: loading NVIDIA's NVRTC runs no initialisers with preconditions on us.
    match unsafe { libloading::Library::new(&path) } {
        Ok(lib) => {
            // Kept loaded for the whole process: cudarc resolves it by soname later.
            std::mem::forget(lib);
            eprintln!("using {}", path.display());
            nvrtc_available()
        }
        Err(e) => {
            eprintln!("found {} but could not load it: {e}", path.display());
            false
        }
    }
}

#[test]
fn every_kernel_file_compiles_for_sm80_sm90_and_sm100() {
    if !ensure_nvrtc() {
        // CI names the library explicitly, so there a missing NVRTC is a failure, not a skip.
        assert!(
            std::env::var_os("STRATA_NVRTC_LIB").is_none(),
            "STRATA_NVRTC_LIB is set but no loadable libnvrtc was found there"
        );
        eprintln!(
            "note: libnvrtc not found (set STRATA_NVRTC_LIB or `pip install \
             nvidia-cuda-nvrtc==13.0.*`); kernel compilation NOT checked"
        );
        return;
    }
    let (major, minor) = nvrtc_version().expect("nvrtc version");
    eprintln!("NVRTC {major}.{minor}");
    // One program per (arch, file), compiled on every core: NVRTC compiles separate
    // programs concurrently, and one at a time this test takes minutes.
    let jobs: Vec<(u32, &KernelFile)> = [80, 90, 100]
        .into_iter()
        .flat_map(|arch| KERNEL_FILES.iter().map(move |f| (arch, f)))
        .collect();
    let built: Vec<_> = jobs
        .par_iter()
        .map(|&(arch, file)| (arch, file, compile_cubin(file, arch)))
        .collect();
    for (arch, file, cubin) in built {
        let cubin = cubin.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            cubin.starts_with(b"\x7fELF"),
            "{}.cu sm_{arch}: not a CUBIN",
            file.name
        );
        // Every entry point the backend looks up must be in the symbol table (a file
        // for newer GPUs builds empty below its `min_arch`; the backend skips it).
        let expected = if arch >= file.min_arch {
            file.functions
        } else {
            &[]
        };
        for f in expected {
            assert!(
                cubin
                    .windows(f.len() + 1)
                    .any(|w| &w[..f.len()] == f.as_bytes() && w[f.len()] == 0),
                "{}.cu sm_{arch}: no symbol {f}",
                file.name
            );
        }
        eprintln!("{}.cu sm_{arch}: {} bytes", file.name, cubin.len());
    }
}

/// On a machine without a driver the backend must refuse with an error, not panic; on a
/// GPU machine it opens.
#[test]
fn backend_start_is_an_error_not_a_panic() {
    match strata_kernels::cuda::CudaBackend::new(0) {
        Ok(b) => eprintln!("opened {b:?}"),
        Err(e) => eprintln!("no CUDA backend here: {e}"),
    }
}
