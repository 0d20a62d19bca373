//! Loading the kernel files onto the device: from the disk cache when it holds a CUBIN for
//! this source, GPU architecture and NVRTC version, else compiled by NVRTC (and cached).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::cache;
use super::sources::{compile_cubin, nvrtc_version, KernelFile, KERNEL_FILES};
use crate::{KernelError, Result};

/// Every entry point of every kernel file, by function name.
pub(super) struct Kernels {
    functions: HashMap<&'static str, CudaFunction>,
}

fn load_cubin(ctx: &Arc<CudaContext>, cubin: Vec<u8>) -> Result<Arc<CudaModule>> {
    ctx.load_module(Ptx::from_binary(cubin))
        .map_err(|e| KernelError::Device(format!("loading a kernel module: {e:?}")))
}

fn load_file(ctx: &Arc<CudaContext>, file: &KernelFile, arch: u32) -> Result<Arc<CudaModule>> {
    let path = cache::cache_path(file, arch, nvrtc_version()?);
    if let Some(cubin) = cache::load(&path) {
        // A cached file the driver refuses (say, written by another driver) is recompiled.
        if let Ok(module) = load_cubin(ctx, cubin) {
            return Ok(module);
        }
    }
    let cubin = compile_cubin(file, arch)?;
    cache::store(&path, &cubin);
    load_cubin(ctx, cubin)
}

impl Kernels {
    pub(super) fn load(ctx: &Arc<CudaContext>, arch: u32) -> Result<Self> {
        let mut functions = HashMap::new();
        for file in KERNEL_FILES.iter().filter(|f| arch >= f.min_arch) {
            let module = load_file(ctx, file, arch)?;
            for &name in file.functions {
                let f = module.load_function(name).map_err(|e| {
                    KernelError::Device(format!("{}.cu has no kernel {name}: {e:?}", file.name))
                })?;
                functions.insert(name, f);
            }
        }
        Ok(Self { functions })
    }

    pub(super) fn get(&self, name: &'static str) -> Result<&CudaFunction> {
        super::host_gaps::mark(name);
        self.functions
            .get(name)
            .ok_or_else(|| KernelError::Device(format!("kernel {name} was not loaded")))
    }
}
