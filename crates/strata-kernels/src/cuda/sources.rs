//! The kernel sources (the repository's `kernels/*.cu`, one file per family) and their
//! compilation to CUBIN with NVRTC. Kept free of any device state so a machine without a
//! GPU can still compile every file (the CI check in `tests/cuda_nvrtc.rs`).

use std::ffi::{c_char, CString};

use cudarc::nvrtc::{result, sys};

use crate::KernelError;

/// Helpers prepended to every file (NVRTC gets no include paths, so no CUDA header either).
const COMMON: &str = include_str!("../../kernels/common.cuh");

/// One kernel file and the entry points the backend looks up in it.
#[derive(Clone, Copy, Debug)]
pub struct KernelFile {
    /// The file's name without `.cu` (`kernels/<name>.cu`).
    pub name: &'static str,
    source: &'static str,
    /// The kernel entry points the backend looks up, by name, in the file's module.
    pub functions: &'static [&'static str],
    /// The oldest compute capability (major x 10 + minor) whose build holds the entry
    /// points; older GPUs compile the file to an empty module and the backend leaves it out.
    pub min_arch: u32,
    /// Compiled for `sm_90a` on sm_90: the file uses Hopper's arch-specific instructions
    /// (wgmma), which a plain `sm_90` build rejects; other GPUs get a build without them.
    pub sm90a: bool,
}

impl KernelFile {
    /// A file every GPU builds in full, for its own architecture.
    const fn any_gpu(
        name: &'static str,
        source: &'static str,
        functions: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            source,
            functions,
            min_arch: 0,
            sm90a: false,
        }
    }

    /// The text NVRTC compiles: the common helpers, then the file (with a `#line` so errors
    /// point into the file itself). With `STRATA_KERNEL_DIR` set
    /// ([`crate::CudaTuning::kernel_dir`]), `common.cuh` and
    /// `<name>.cu` are read from that directory where present (kernel work: edit a file and
    /// rerun the same binary; the cache keys on the text, so each version compiles once).
    pub fn full_source(&self) -> String {
        let dir = crate::CudaTuning::get().kernel_dir.as_ref();
        let read = |file: &str| {
            dir.as_ref()
                .and_then(|d| std::fs::read_to_string(d.join(file)).ok())
        };
        let common = read("common.cuh").unwrap_or_else(|| COMMON.into());
        let source = read(&format!("{}.cu", self.name)).unwrap_or_else(|| self.source.into());
        format!("{common}\n#line 1 \"{}.cu\"\n{source}", self.name)
    }
}

/// The GEMV entry points: `gemv_bf16_<rows>` for 1 to 8 rows of x (index = rows - 1),
/// then the gated MLP forms `gemv_gated_bf16_<rows>` (index = 8 + rows - 1), then the
/// table-slice forms `gemv_slice_bf16_<rows>` (index = 16 + rows - 1).
pub(crate) const GEMV_KERNELS: [&str; 24] = [
    "gemv_bf16_1",
    "gemv_bf16_2",
    "gemv_bf16_3",
    "gemv_bf16_4",
    "gemv_bf16_5",
    "gemv_bf16_6",
    "gemv_bf16_7",
    "gemv_bf16_8",
    "gemv_gated_bf16_1",
    "gemv_gated_bf16_2",
    "gemv_gated_bf16_3",
    "gemv_gated_bf16_4",
    "gemv_gated_bf16_5",
    "gemv_gated_bf16_6",
    "gemv_gated_bf16_7",
    "gemv_gated_bf16_8",
    "gemv_slice_bf16_1",
    "gemv_slice_bf16_2",
    "gemv_slice_bf16_3",
    "gemv_slice_bf16_4",
    "gemv_slice_bf16_5",
    "gemv_slice_bf16_6",
    "gemv_slice_bf16_7",
    "gemv_slice_bf16_8",
];

/// The tensor-core GEMM's entry points for 3 to 128 rows: `skinny_gemm_<mode>_t<tokens>_c<cluster>`
/// for token tiles of 32 (mma.sync), 64 and 128 (wgmma, sm_90a), the plain, gated and
/// table-slice modes and clusters of 1 to 8 (index = 12 x tile + 4 x mode + log2 cluster).
pub(crate) const SKINNY_KERNELS: [&str; 36] = [
    "skinny_gemm_plain_t32_c1",
    "skinny_gemm_plain_t32_c2",
    "skinny_gemm_plain_t32_c4",
    "skinny_gemm_plain_t32_c8",
    "skinny_gemm_gated_t32_c1",
    "skinny_gemm_gated_t32_c2",
    "skinny_gemm_gated_t32_c4",
    "skinny_gemm_gated_t32_c8",
    "skinny_gemm_slice_t32_c1",
    "skinny_gemm_slice_t32_c2",
    "skinny_gemm_slice_t32_c4",
    "skinny_gemm_slice_t32_c8",
    "skinny_gemm_plain_t64_c1",
    "skinny_gemm_plain_t64_c2",
    "skinny_gemm_plain_t64_c4",
    "skinny_gemm_plain_t64_c8",
    "skinny_gemm_gated_t64_c1",
    "skinny_gemm_gated_t64_c2",
    "skinny_gemm_gated_t64_c4",
    "skinny_gemm_gated_t64_c8",
    "skinny_gemm_slice_t64_c1",
    "skinny_gemm_slice_t64_c2",
    "skinny_gemm_slice_t64_c4",
    "skinny_gemm_slice_t64_c8",
    "skinny_gemm_plain_t128_c1",
    "skinny_gemm_plain_t128_c2",
    "skinny_gemm_plain_t128_c4",
    "skinny_gemm_plain_t128_c8",
    "skinny_gemm_gated_t128_c1",
    "skinny_gemm_gated_t128_c2",
    "skinny_gemm_gated_t128_c4",
    "skinny_gemm_gated_t128_c8",
    "skinny_gemm_slice_t128_c1",
    "skinny_gemm_slice_t128_c2",
    "skinny_gemm_slice_t128_c4",
    "skinny_gemm_slice_t128_c8",
];

/// Every kernel family, in the order the backend loads them.
pub const KERNEL_FILES: &[KernelFile] = &[
    KernelFile::any_gpu(
        "embedding",
        include_str!("../../kernels/embedding.cu"),
        &["embedding"],
    ),
    KernelFile::any_gpu(
        "norm",
        include_str!("../../kernels/norm.cu"),
        &[
            "rms_norm_plain",
            "rms_norm_add_then_norm",
            "rms_norm_then_add",
            "rms_norm_add_norm",
            "rms_norm_plain_bf16",
            "rms_norm_add_then_norm_bf16",
            "rms_norm_then_add_bf16",
            "rms_norm_add_norm_bf16",
            "rms_norm_plain_f32",
            "rms_norm_add_then_norm_f32",
            "rms_norm_then_add_f32",
            "rms_norm_add_norm_f32",
            "rms_norm_add_then_norm_f32_parts",
            "rms_norm_then_add_f32_parts",
            "rms_norm_add_norm_f32_parts",
        ],
    ),
    KernelFile::any_gpu(
        "rope",
        include_str!("../../kernels/rope.cu"),
        &[
            "rope",
            "head_norm_rope",
            "head_norm_rope_d64",
            "head_norm_rope_d128",
            "head_norm_rope_d256",
            "head_norm_rope_d512",
            "head_norm_rope_f32_d64",
            "head_norm_rope_f32_d128",
            "head_norm_rope_f32_d256",
            "head_norm_rope_f32_d512",
            "head_norm_rope_store_f32_d64",
            "head_norm_rope_store_f32_d128",
            "head_norm_rope_store_f32_d256",
            "head_norm_rope_store_f32_d512",
            "head_norm_rope_parts_f32_d64",
            "head_norm_rope_parts_f32_d128",
            "head_norm_rope_parts_f32_d256",
            "head_norm_rope_parts_f32_d512",
        ],
    ),
    KernelFile::any_gpu(
        "conformer",
        include_str!("../../kernels/conformer.cu"),
        &[
            "clamp_f32",
            "depthwise_conv1d_causal_f32",
            "chunked_attention_f32",
        ],
    ),
    KernelFile::any_gpu(
        "lora",
        include_str!("../../kernels/lora.cu"),
        &["lora_shrink", "lora_expand"],
    ),
    KernelFile::any_gpu(
        "elementwise",
        include_str!("../../kernels/elementwise.cu"),
        &[
            "act_mul",
            "act_mul_bf16_in",
            "act_mul_bf16_pairs",
            "act_mul_slice_gelu_tanh",
            "act_mul_slice_silu",
            "act_mul_slice_sigmoid",
            "activation",
            "softcap",
            "add",
            "mul",
            "scale",
        ],
    ),
    KernelFile::any_gpu(
        "copy",
        include_str!("../../kernels/copy.cu"),
        &[
            "copy_strided_b32",
            "copy_strided_b16",
            "widen_to_f32",
            "narrow_to_bf16",
        ],
    ),
    KernelFile::any_gpu(
        "attention",
        include_str!("../../kernels/attention.cu"),
        &["attention", "attention_tiled"],
    ),
    KernelFile::any_gpu(
        "sampling",
        include_str!("../../kernels/sampling.cu"),
        &["argmax_rows", "feed_tokens", "clustered_argmax"],
    ),
    KernelFile::any_gpu(
        "adjust",
        include_str!("../../kernels/adjust.cu"),
        &["adjust_logits", "mask_logits"],
    ),
    KernelFile::any_gpu(
        "draw",
        include_str!("../../kernels/draw.cu"),
        &["draw_first_pass", "draw_rows", "logprob_rows"],
    ),
    KernelFile::any_gpu("gemv", include_str!("../../kernels/gemv.cu"), &GEMV_KERNELS),
    KernelFile::any_gpu(
        "quant",
        include_str!("../../kernels/quant.cu"),
        &super::quant::QUANT_KERNELS,
    ),
    KernelFile::any_gpu(
        "quant_dp4a",
        include_str!("../../kernels/quant_dp4a.cu"),
        &super::quant_dp4a::DP4A_KERNELS,
    ),
    KernelFile {
        min_arch: 90,
        sm90a: true,
        ..KernelFile::any_gpu(
            "skinny_gemm",
            include_str!("../../kernels/skinny_gemm.cu"),
            &SKINNY_KERNELS,
        )
    },
    KernelFile {
        min_arch: 80,
        ..KernelFile::any_gpu(
            "small_gemm",
            include_str!("../../kernels/small_gemm.cu"),
            &[
                "small_gemm_plain_n16",
                "small_gemm_slice_n16",
                "small_gemm_plain_n64",
                "small_gemm_slice_n64",
            ],
        )
    },
    KernelFile::any_gpu(
        "paged",
        include_str!("../../kernels/paged.cu"),
        &[
            "kv_store",
            "kv_store_bf16",
            "paged_attention",
            "paged_combine",
            "expand_page_slots",
            "kv_gather",
            "masked_softmax",
        ],
    ),
    KernelFile::any_gpu(
        "paged_mma",
        include_str!("../../kernels/paged_mma.cu"),
        &[
            "paged_attention_mma",
            "prefill_attention_mma_d64",
            "prefill_attention_mma_d128",
            "prefill_attention_mma_d256",
            "prefill_attention_mma_d512",
            "prefill_attention_mma_seqs_d64",
            "prefill_attention_mma_seqs_d128",
            "prefill_attention_mma_seqs_d256",
            "prefill_attention_mma_seqs_d512",
            "prefill_attention_mma_fp8_d64",
            "prefill_attention_mma_fp8_d128",
            "prefill_attention_mma_fp8_d256",
            "prefill_attention_mma_fp8_d512",
            "prefill_attention_mma_fp8_seqs_d64",
            "prefill_attention_mma_fp8_seqs_d128",
            "prefill_attention_mma_fp8_seqs_d256",
            "prefill_attention_mma_fp8_seqs_d512",
            "prefill_attention_mma_int8_d64",
            "prefill_attention_mma_int8_d128",
            "prefill_attention_mma_int8_d256",
            "prefill_attention_mma_int8_d512",
            "prefill_attention_mma_int8_seqs_d64",
            "prefill_attention_mma_int8_seqs_d128",
            "prefill_attention_mma_int8_seqs_d256",
            "prefill_attention_mma_int8_seqs_d512",
            "decode_attention_mma_d64",
            "decode_attention_mma_d128",
            "decode_attention_mma_d256",
            "decode_attention_mma_d512",
            "decode_attention_mma_fp8_d64",
            "decode_attention_mma_fp8_d128",
            "decode_attention_mma_fp8_d256",
            "decode_attention_mma_fp8_d512",
            "decode_attention_mma_int8_d64",
            "decode_attention_mma_int8_d128",
            "decode_attention_mma_int8_d256",
            "decode_attention_mma_int8_d512",
        ],
    ),
];

/// Whether libnvrtc can be loaded (checked before any call: a missing library would
/// otherwise abort inside the dynamic loader).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

fn nvrtc_err(what: &str) -> impl Fn(result::NvrtcError) -> KernelError + '_ {
    move |e| KernelError::Device(format!("nvrtc: {what}: {e:?}"))
}

/// The loaded NVRTC's version, `(major, minor)`; part of the kernel cache key.
pub fn nvrtc_version() -> Result<(i32, i32), KernelError> {
    if !nvrtc_available() {
        return Err(KernelError::Device(
            "libnvrtc not found (install the CUDA toolkit or the nvidia-cuda-nvrtc package \
             and put its lib directory on LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters, written by NVRTC.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(nvrtc_err("version"))?;
    Ok((major, minor))
}

/// The NVRTC target for `file` on compute capability `arch`.
pub(crate) fn target(file: &KernelFile, arch: u32) -> String {
    let suffix = if file.sm90a && arch == 90 { "a" } else { "" };
    format!("sm_{arch}{suffix}")
}

/// Compiles `file` to a CUBIN for `sm_<arch>` (e.g. 90 for Hopper). Precise math only: no
/// fast-math flags, so expf / tanhf / sincosf / division match the f32 references.
pub fn compile_cubin(file: &KernelFile, arch: u32) -> Result<Vec<u8>, KernelError> {
    nvrtc_version()?;
    let what = format!("{}.cu for {}", file.name, target(file, arch));
    let src = CString::new(file.full_source())
        .map_err(|_| KernelError::Device(format!("{what}: source holds a NUL byte")))?;
    let name = CString::new(format!("{}.cu", file.name)).expect("file names hold no NUL");
    let prog = result::create_program(&src, Some(&name)).map_err(nvrtc_err(&what))?;
    let options = [
        format!("--gpu-architecture={}", target(file, arch)),
        "--std=c++17".into(),
    ];
    // SAFETY: `prog` is a live program; it is destroyed exactly once below.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let cubin = match compiled {
        // SAFETY: the compile succeeded, as `read_cubin` requires; `prog` is still live.
        Ok(()) => unsafe { read_cubin(prog) }.map_err(nvrtc_err(&what)),
        Err(e) => {
            // SAFETY: `prog` is still live (destroyed only below).
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| c_chars_to_string(&l))
                .unwrap_or_default();
            Err(KernelError::Device(format!(
                "nvrtc: compiling {what} failed ({e:?}):\n{log}"
            )))
        }
    };
    // A failed destroy leaks one program; the compile result is what matters.
    // SAFETY: `prog` is live and is not used after this, its one destroy.
    let _ = unsafe { result::destroy_program(prog) };
    cubin
}

/// # Safety
/// `prog` must be a successfully compiled program.
unsafe fn read_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
    let mut cubin = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char).result()?;
    Ok(cubin)
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
