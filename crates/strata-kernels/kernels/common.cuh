// Shared helpers, prepended to every kernel file before NVRTC compiles it (NVRTC is given
// no include paths). bf16 and f16 travel as raw 16-bit patterns, so no CUDA header is needed.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Element types of weight buffers; must match `DType` codes in the Rust launcher.
#define STRATA_F32 0
#define STRATA_BF16 1
#define STRATA_F16 2

// GGUF block formats, the template parameter of the quantized products (quant.cu and
// quant_dp4a.cu).
#define QF_Q4_0 0
#define QF_Q5_0 1
#define QF_Q8_0 2
#define QF_Q4_K 3
#define QF_Q5_K 4
#define QF_Q6_K 5
// bitsandbytes 4-bit (NF4 / FP4) in the device layout of quant.cu's `decode32`.
#define QF_BNB4 6

// -inf without math.h.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

// f32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN with its sign and top
// payload bits: the host encoder's rounding (the KV-store check compares them bit for bit).
__device__ __forceinline__ u16 f32_to_bf16_rne(float x) {
    const u32 b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x40u);
    return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Element `i` of a buffer of `dtype`, widened exactly to f32.
__device__ __forceinline__ float load_as_f32(const void* p, int dtype, u64 i) {
    switch (dtype) {
        case STRATA_BF16: return bf16_to_f32(((const u16*)p)[i]);
        case STRATA_F16: return f16_to_f32(((const u16*)p)[i]);
        default: return ((const float*)p)[i];
    }
}

__device__ __forceinline__ float warp_sum_f32(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Slot m of a three-entry kernel-parameter array by selects, not an indexed load (which
// would copy the kernel parameters to local memory).
template <typename V>
__device__ __forceinline__ V pick3(const V (&a)[3], int m) {
    return m == 0 ? a[0] : (m == 1 ? a[1] : a[2]);
}

// Activations (precise libm tanhf / expf: NVRTC runs without fast math); the codes match
// the launcher's `act_code`.
#define ACT_GELU_TANH 0
#define ACT_SILU 1
#define ACT_SIGMOID 2

__device__ __forceinline__ float gelu_tanh(float x) {
    const float sqrt_2_over_pi = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * (x + 0.044715f * x * x * x)));
}

// x / (1 + e^-x): finite for every finite x.
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float apply_act(int act, float x) {
    return act == ACT_GELU_TANH ? gelu_tanh(x) : (act == ACT_SILU ? silu(x) : 1.0f / (1.0f + expf(-x)));
}

// Grid-stride loop over `n` elements.
#define FOR_EACH_INDEX(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// Tensor-core building blocks (sm_80 and later): asynchronous copies to shared memory,
// ldmatrix and the bf16 mma, for the attention and GEMM kernels that use them.

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// 16 bytes from global to shared memory; `bytes` 0 zero-fills the destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(bytes));
}

// The same to a shared-memory address already converted (`smem_addr`).
__device__ __forceinline__ void cp_async16_to(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }

// Waits until at most `pending` (0 or 1) of this thread's newest copy groups are in flight.
__device__ __forceinline__ void cp_async_wait(int pending) {
    if (pending == 0) asm volatile("cp.async.wait_group 0;\n");
    else asm volatile("cp.async.wait_group 1;\n");
}

__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3,
                                                  const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

// c += a (16 x 16, row-major bf16) x b (16 x 8, column-major bf16), f32 accumulators.
__device__ __forceinline__ void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two f32 rounded to bf16 (nearest even; finite inputs: the probabilities) in one register,
// `lo` in the low half: an mma A-operand pair.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
