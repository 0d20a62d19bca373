// Matrix-vector products for decode: y[t, n] = x[t, k] . W[n, k] for a bf16 weight W and a
// few f32 rows x (t = 1..8, a template parameter so the accumulators live in registers);
// several weights that share x in one launch, or an MLP's gate and up with its activation.
//
// Floor: every weight byte is read once, so the time is n * k * 2 bytes over the memory
// bandwidth. A warp owns one output feature (or R of them) and streams the weight in 16-byte loads
// that skip L1 (each weight byte is used once per call), U loads in flight per lane; x
// is re-read by every warp and stays in L1. x is used in f32, so the result is the exact
// f32 product of the rows and the bf16 weights, up to summation order.
// Needs k % 8 == 0 and 16-byte aligned buffers (the launcher checks k; allocations are
// 256-byte aligned).

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

// Up to three matrices that share x (a layer's q, k and v) in one launch: the warp groups
// run over the first matrix's features, then the second's, then the third's. `group_end[m]`
// counts the feature groups (of R) in matrices 0..=m; unused slots repeat the last matrix
// with the same end, so no group falls in them. The launcher's `GemvMats` matches.
#define GEMV_MAX_MATS 3
struct GemvMats {
    const u16* w[GEMV_MAX_MATS];
    float* y[GEMV_MAX_MATS];
    int n[GEMV_MAX_MATS];
    int group_end[GEMV_MAX_MATS];
};

// What a launch writes. GEMV_GATED: matrix 0 is the gate and matrix 1 the up projection of
// an MLP (same shape); each warp computes R features of both and writes act(gate) * up to
// y[0], so the two products and the activation are one kernel and the gate and up outputs
// never reach memory. GEMV_SLICE: y[t, i] = act(x W^T)[t, i] * table[t * stride + offset +
// i] (Gemma-4's per-layer-input gate times its slice of the per-layer inputs).
#define GEMV_PLAIN 0
#define GEMV_GATED 1
#define GEMV_SLICE 2

struct GemvSlice {
    const float* table;
    u64 offset;
    u64 stride;
};

// One output value: the product, act(gate) * up, or act(product) times the table's value.
template <int MODE>
__device__ __forceinline__ float gemv_out(float acc, float up, int act, const GemvSlice& s, int t,
                                          int i) {
    if (MODE == GEMV_GATED) return apply_act(act, acc) * up;
    if (MODE == GEMV_SLICE) return apply_act(act, acc) * s.table[t * s.stride + s.offset + i];
    return acc;
}

template <int T, int R, int MODE, int UNROLL>
__device__ __forceinline__ void gemv_bf16(const float* __restrict__ x, const GemvMats& mats, int k,
                                          int split, int act, const GemvSlice& slice) {
    constexpr bool GATED = MODE == GEMV_GATED;
    constexpr int RR = GATED ? 2 * R : R;  // weight rows each warp streams
    constexpr int U = RR >= UNROLL ? 1 : UNROLL / RR;  // chunks in flight per row
    __shared__ float partial[GEMV_BLOCK_WARPS][RR * T];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int groups = GEMV_BLOCK_WARPS / split;
    const int part = warp % split;
    const int group = blockIdx.x * groups + warp / split;
    const int m = GATED ? 0 : (group >= mats.group_end[0]) + (group >= mats.group_end[1]);
    const int first_group = m == 0 ? 0 : (m == 1 ? mats.group_end[0] : mats.group_end[1]);
    const int row0 = (group - first_group) * R;
    // Groups past the last matrix's end (the last block's spare warps) would map onto its
    // first rows: with n = 0 they neither load nor write.
    const bool active = group < mats.group_end[GEMV_MAX_MATS - 1];
    const int n = active ? pick3(mats.n, m) : 0;
    float* __restrict__ y = pick3(mats.y, m);
    const int chunks = k >> 3;
    const int per = (chunks + split - 1) / split;
    const int c_begin = part * per;
    const int c_end = active ? min(chunks, c_begin + per) : c_begin;
    const uint4* wr[RR];
#pragma unroll
    for (int r = 0; r < RR; ++r) {
        const int rr = r % R;
        const u16* base = GATED ? (r < R ? mats.w[0] : mats.w[1]) : pick3(mats.w, m);
        wr[r] = reinterpret_cast<const uint4*>(base + (u64)(row0 + rr) * k);
    }
    float acc[RR][T];
#pragma unroll
    for (int r = 0; r < RR; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
    for (int c0 = c_begin + lane; c0 < c_end; c0 += 32 * U) {
        uint4 wv[U][RR];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u * 32;
#pragma unroll
            for (int r = 0; r < RR; ++r)
                wv[u][r] = c < c_end && row0 + r % R < n ? load_streaming(wr[r] + c)
                                                         : make_uint4(0, 0, 0, 0);
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
                    for (int r = 0; r < RR; ++r) acc[r][t] += dot8(wv[u][r], a, b);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RR; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = warp_sum_f32(acc[r][t]);
    if (split == 1) {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int t = 0; t < T; ++t)
                    if (row0 + r < n)
                        y[(u64)t * n + row0 + r] =
                            gemv_out<MODE>(acc[r][t], GATED ? acc[R + r][t] : 0.0f, act, slice,
                                           t, row0 + r);
        return;
    }
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < RR; ++r)
#pragma unroll
            for (int t = 0; t < T; ++t) partial[warp][r * T + t] = acc[r][t];
    __syncthreads();
    if (part == 0 && lane < R * T) {
        const int r = lane / T, t = lane % T;
        float sum = 0.0f, up = 0.0f;
        for (int p = 0; p < split; ++p) {
            sum += partial[warp + p][lane];
            if (GATED) up += partial[warp + p][R * T + lane];
        }
        if (row0 + r < n)
            y[(u64)t * n + row0 + r] = gemv_out<MODE>(sum, up, act, slice, t, row0 + r);
    }
}

// Per row count T: features per warp R (the launcher's GEMV_FEATURES_PER_WARP must match),
// 16-byte chunks in flight per lane U, and blocks each multiprocessor must hold B. At one
// or two rows, U = 2 and six blocks (40 registers a thread; U = 4 spills there) make 6336
// resident warps on an H200, so the 6144-warp launches of E2B's MLP and output projections
// run as one wave rather than 1.16 (step 3.06 -> 2.90 ms at batch 1, docs/perf-notes.md).
#define GEMV_ENTRY(T, R, U, B)                                                                \
    extern "C" __global__ void __launch_bounds__(GEMV_BLOCK_WARPS * 32, B)                  \
        gemv_bf16_##T(const float* x, GemvMats mats, int k, int split) {                      \
        gemv_bf16<T, R, GEMV_PLAIN, U>(x, mats, k, split, 0, GemvSlice{});                    \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_BLOCK_WARPS * 32, B)                  \
        gemv_gated_bf16_##T(const float* x, GemvMats mats, int k, int split, int act) {       \
        gemv_bf16<T, R, GEMV_GATED, U>(x, mats, k, split, act, GemvSlice{});                  \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_BLOCK_WARPS * 32, B)                  \
        gemv_slice_bf16_##T(const float* x, GemvMats mats, int k, int split, int act,         \
                            GemvSlice slice) {                                                \
        gemv_bf16<T, R, GEMV_SLICE, U>(x, mats, k, split, act, slice);                        \
    }

GEMV_ENTRY(1, 1, 2, 6)
GEMV_ENTRY(2, 1, 2, 6)
GEMV_ENTRY(3, 2, 4, 1)
GEMV_ENTRY(4, 2, 4, 1)
GEMV_ENTRY(5, 4, 4, 1)
GEMV_ENTRY(6, 4, 4, 1)
GEMV_ENTRY(7, 4, 4, 1)
GEMV_ENTRY(8, 4, 4, 1)
