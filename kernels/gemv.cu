// Matrix-vector products for decode: y[t, n] = x[t, k] . W[n, k] for a bf16 weight W and a
// few f32 rows x (t = 1..8, a template parameter so the accumulators live in registers).
//
// Floor: every weight byte is read once, so the time is n * k * 2 bytes over the memory
// bandwidth. A warp owns one output feature (or R of them) and streams the weight in 16-byte loads
// that skip L1 (each weight byte is used once per call), four loads in flight per lane; x
// is re-read by every warp and stays in L1. x is used in f32, so the result is the exact
// f32 product of the rows and the bf16 weights, up to summation order.
// Needs k % 8 == 0 and 16-byte aligned buffers (the launcher checks k; allocations are
// 256-byte aligned).

#define GEMV_UNROLL 4

__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
    float s = __uint_as_float(w.x << 16) * a.x;
    s += __uint_as_float(w.x & 0xffff0000u) * a.y;
    s += __uint_as_float(w.y << 16) * a.z;
    s += __uint_as_float(w.y & 0xffff0000u) * a.w;
    s += __uint_as_float(w.z << 16) * b.x;
    s += __uint_as_float(w.z & 0xffff0000u) * b.y;
    s += __uint_as_float(w.w << 16) * b.z;
    s += __uint_as_float(w.w & 0xffff0000u) * b.w;
    return s;
}

// T rows of x, R output features per warp: each x value read from L1 serves R weight rows,
// which matters once T grows (at T = 8 and R = 1 the x reads outweigh the weight reads).
// `split` warps share each group of R features, each taking a contiguous share of k, and
// add their partial sums in shared memory: few features with long rows (a 1536-feature
// down projection over 12288 inputs) would otherwise leave most multiprocessors idle.
#define GEMV_BLOCK_WARPS 8

template <int T, int R>
__device__ __forceinline__ void gemv_bf16(const float* __restrict__ x, const u16* __restrict__ w,
                                          float* __restrict__ y, int k, int n, int split) {
    constexpr int U = R >= GEMV_UNROLL ? 1 : GEMV_UNROLL / R;  // chunks in flight per row
    __shared__ float partial[GEMV_BLOCK_WARPS][R * T];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int groups = GEMV_BLOCK_WARPS / split;
    const int part = warp % split;
    const int row0 = (blockIdx.x * groups + warp / split) * R;
    const int chunks = k >> 3;
    const int per = (chunks + split - 1) / split;
    const int c_begin = part * per;
    const int c_end = row0 < n ? min(chunks, c_begin + per) : c_begin;  // idle past n
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
    for (int c0 = c_begin + lane; c0 < c_end; c0 += 32 * U) {
        uint4 wv[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u * 32;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint4* wr = reinterpret_cast<const uint4*>(w + (u64)(row0 + r) * k);
                wv[u][r] = c < c_end && row0 + r < n ? load_streaming(wr + c) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u * 32;
            if (c < c_end) {
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    const float* xp = x + (u64)t * k + c * 8;
                    const float4 a = *reinterpret_cast<const float4*>(xp);
                    const float4 b = *reinterpret_cast<const float4*>(xp + 4);
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r][t] += dot8(wv[u][r], a, b);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = warp_sum_f32(acc[r][t]);
    if (split == 1) {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int t = 0; t < T; ++t)
                    if (row0 + r < n) y[(u64)t * n + row0 + r] = acc[r][t];
        return;
    }
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < T; ++t) partial[warp][r * T + t] = acc[r][t];
    __syncthreads();
    if (part == 0 && lane < R * T) {
        const int r = lane / T, t = lane % T;
        float sum = 0.0f;
        for (int p = 0; p < split; ++p) sum += partial[warp + p][lane];
        if (row0 + r < n) y[(u64)t * n + row0 + r] = sum;
    }
}

// Features per warp by row count; the launcher's GEMV_FEATURES_PER_WARP must match.
#define GEMV_ENTRY(T, R)                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_BLOCK_WARPS * 32)                 \
        gemv_bf16_##T(const float* x, const u16* w, float* y, int k, int n, int split) {  \
        gemv_bf16<T, R>(x, w, y, k, n, split);                                            \
    }

GEMV_ENTRY(1, 1)
GEMV_ENTRY(2, 1)
GEMV_ENTRY(3, 2)
GEMV_ENTRY(4, 2)
GEMV_ENTRY(5, 4)
GEMV_ENTRY(6, 4)
GEMV_ENTRY(7, 4)
GEMV_ENTRY(8, 4)
