// Shared helpers, prepended to every kernel file before NVRTC compiles it (NVRTC is given
// no include paths). bf16 and f16 travel as raw 16-bit patterns, so no CUDA header is needed.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Element types of weight buffers; must match `DType` codes in the Rust launcher.
#define STRATA_F32 0
#define STRATA_BF16 1
#define STRATA_F16 2

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

__device__ __forceinline__ float gelu_tanh(float x) {
    const float sqrt_2_over_pi = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * (x + 0.044715f * x * x * x)));
}

// x / (1 + e^-x): finite for every finite x.
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float apply_act(int act, float x) {
    return act == ACT_GELU_TANH ? gelu_tanh(x) : silu(x);
}

// Grid-stride loop over `n` elements.
#define FOR_EACH_INDEX(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

