// Greedy sampling where the logits are: the largest value of each row, ties to the lowest
// index, NaN counted as -inf (the host sampler's `argmax`), optionally of the softcapped
// values (`softcap` in elementwise.cu, the same expression), so a greedy step needs no
// capped copy of its logits.

#define ARGMAX_THREADS 512

// A logit and its index as one u64 whose unsigned order is the argmax order: the f32 bits
// mapped to an unsigned total order (NaN as -inf, -0 as +0) above the complemented index,
// so a larger value wins and, between equal values, the lower index.
__device__ __forceinline__ u64 argmax_key(float v, u32 i) {
    if (v != v) v = NEG_INF;
    if (v == 0.0f) v = 0.0f;  // -0 ties with +0, as the host's comparison has it
    const u32 b = __float_as_uint(v);
    const u32 ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)ordered << 32) | (u64)(0xffffffffu - i);
}

// The key of logit `x` at index `i`, capped first when `has_cap`.
__device__ __forceinline__ u64 logit_key(float x, u32 i, int has_cap, float cap) {
    return argmax_key(has_cap ? cap * tanhf(x / cap) : x, i);
}

#define ARGMAX_UNROLL 4

__device__ __forceinline__ u64 key_max(u64 a, u64 b) { return a > b ? a : b; }

// The best key of four consecutive logits from index `at`.
__device__ __forceinline__ u64 logit4_key(float4 v, u32 at, int has_cap, float cap) {
    return key_max(
        key_max(logit_key(v.x, at, has_cap, cap), logit_key(v.y, at + 1, has_cap, cap)),
        key_max(logit_key(v.z, at + 2, has_cap, cap), logit_key(v.w, at + 3, has_cap, cap)));
}

// Capped values are only worth computing near the top. If raw x <= capped_skip_below(m),
// the exact cap tanh(x / cap) sits at least cap 2^-12 below the exact capped m (tanh is
// increasing; the margin CAP_MARGIN is taken in tanh's units and survives the float
// errors of this function, a few ulps in atanhf and tanhf, whose effect on the threshold's
// tanh is under 1e-5 since atanh's slope times tanh's is one). The computed capped values
// (tanhf within 2 ulps, a correctly rounded division and product: under 1e-6 cap each)
// cannot close a gap of cap 2^-12, so x's capped key is below m's and x is not the argmax
// of any row that holds m. NaN when no value may be skipped (m -inf, or every value NaN).
#define CAP_MARGIN 0.00048828125f  // 2^-11
__device__ __forceinline__ float capped_skip_below(float m, float cap) {
    const float target = tanhf(m / cap) - CAP_MARGIN;
    return target > -1.0f ? cap * atanhf(target) : __int_as_float(0x7fc00000);
}

// Grid (rows, parts): block (r, p) takes every gridDim.y-th stretch of row r and folds its
// best key into keys[r] (zeroed by the launcher) with one atomicMax, so a single row
// spreads over many multiprocessors. The index is ~key's low half (every value -inf or NaN:
// index 0, as the host does, since ties go to the lowest index). The best key does not
// depend on the order the values are read in, so where every row starts 16-byte aligned
// (an aligned buffer, rows of a multiple of four values) a thread issues ARGMAX_UNROLL
// 16-byte loads before it uses the first: read one value at a time, a 112-row step's
// logits went at 1.5 TB/s.
// has_cap: 0 raw values; 1 capped, where a whole warp's loads are in range only the values
// above its raw maximum's `capped_skip_below` capped (a precise division and tanhf a value
// made the kernel arithmetic-bound: about 29 M of each at 112 rows), the rest every value.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_rows(const float* logits, unsigned long long* keys, u64 vocab, int has_cap, float cap) {
    __shared__ u64 warp_best[ARGMAX_THREADS / 32];
    const float* row = logits + (u64)blockIdx.x * vocab;
    u64 best = 0;
    const u64 stride = (u64)gridDim.y * blockDim.x;
    u64 i = (u64)blockIdx.y * blockDim.x + threadIdx.x;
    if (vocab % 4 == 0 && (u64)logits % 16 == 0) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        const u64 n4 = vocab / 4;
        if (has_cap) {
            // The loop runs while the warp's last lane is in range (blocks are whole
            // warps), so every lane takes part in the shuffles; the loops below finish.
            const u64 last = 31 - threadIdx.x % 32;
            for (; i + last + (ARGMAX_UNROLL - 1) * stride < n4; i += ARGMAX_UNROLL * stride) {
                float4 v[ARGMAX_UNROLL];
#pragma unroll
                for (int u = 0; u < ARGMAX_UNROLL; ++u) v[u] = __ldcs(row4 + i + u * stride);
                float m = NEG_INF;
#pragma unroll
                for (int u = 0; u < ARGMAX_UNROLL; ++u)
                    m = fmaxf(fmaxf(m, fmaxf(v[u].x, v[u].y)), fmaxf(v[u].z, v[u].w));
                for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                const float t = capped_skip_below(m, cap);
#pragma unroll
                for (int u = 0; u < ARGMAX_UNROLL; ++u) {
                    const u32 at = (u32)(4 * (i + u * stride));
                    const float x[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                    for (int c = 0; c < 4; ++c)
                        if (!(x[c] <= t)) best = key_max(best, logit_key(x[c], at + c, 1, cap));
                }
            }
        }
        for (; i + (ARGMAX_UNROLL - 1) * stride < n4; i += ARGMAX_UNROLL * stride) {
            float4 v[ARGMAX_UNROLL];
#pragma unroll
            for (int u = 0; u < ARGMAX_UNROLL; ++u) v[u] = __ldcs(row4 + i + u * stride);
#pragma unroll
            for (int u = 0; u < ARGMAX_UNROLL; ++u)
                best = key_max(best, logit4_key(v[u], (u32)(4 * (i + u * stride)), has_cap, cap));
        }
        for (; i < n4; i += stride)
            best = key_max(best, logit4_key(__ldcs(row4 + i), (u32)(4 * i), has_cap, cap));
    } else {
        for (; i < vocab; i += stride)
            best = key_max(best, logit_key(row[i], (u32)i, has_cap, cap));
    }
    for (int o = 16; o > 0; o >>= 1) best = key_max(best, __shfl_xor_sync(0xffffffffu, best, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (warp == 0) {
        best = lane < (int)(blockDim.x / 32) ? warp_best[lane] : 0;
        for (int o = 16; o > 0; o >>= 1) best = key_max(best, __shfl_xor_sync(0xffffffffu, best, o));
        if (lane == 0) atomicMax(keys + blockIdx.x, (unsigned long long)best);
    }
}

// A step's token ids, with the ids marked FED_TOKEN | r (top bit set) replaced by the
// greedy token of row r of an earlier step's argmax keys (`argmax_rows`'s output, still on
// the device): the next decode step is queued before the host has read this one's tokens.
// A mark past the keys' rows (which the host never writes) becomes id 0.
#define FED_TOKEN 0x80000000u

extern "C" __global__ void feed_tokens(unsigned int* ids, const unsigned long long* keys,
                                       u32 n, u32 rows) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const u32 id = ids[i];
        if (id & FED_TOKEN) {
            const u32 r = id & ~FED_TOKEN;
            ids[i] = r < rows ? 0xffffffffu - (u32)keys[r] : 0u;
        }
    }
}

// The greedy pick of a clustered output head (Gemma-4's assistant), as the host's
// `sampling::clustered_argmax` defines it: the `top_k` clusters whose scores are highest
// (argmax_key order: NaN as -inf, ties to the lower cluster), then the best logit among
// their tokens (`ordering` lists token ids cluster by cluster, vocab / clusters each; ties
// to the lower id). One block a row; out[r] = the token.
#define CLUSTER_THREADS 1024
#define CLUSTER_MAX 4096
#define CLUSTER_TOP_MAX 256
extern "C" __global__ void __launch_bounds__(CLUSTER_THREADS)
clustered_argmax(const float* logits, const float* scores, const u32* ordering, u32* out,
                 u64 vocab, int clusters, int top_k) {
    __shared__ u64 keys[CLUSTER_MAX];
    __shared__ int chosen[CLUSTER_TOP_MAX];
    __shared__ u64 warp_best[CLUSTER_THREADS / 32];
    const int r = blockIdx.x;
    const float* s = scores + (u64)r * clusters;
    for (int c = threadIdx.x; c < clusters; c += blockDim.x) keys[c] = argmax_key(s[c], (u32)c);
    __syncthreads();
    // A cluster's rank is how many keys beat it (keys are distinct: the index is in them).
    for (int c = threadIdx.x; c < clusters; c += blockDim.x) {
        const u64 k = keys[c];
        int rank = 0;
        for (int j = 0; j < clusters; ++j) rank += keys[j] > k;
        if (rank < top_k) chosen[rank] = c;
    }
    __syncthreads();
    const u64 per = vocab / (u64)clusters;
    const float* row = logits + (u64)r * vocab;
    u64 best = 0;
    for (u64 i = threadIdx.x; i < (u64)top_k * per; i += blockDim.x) {
        const u32 t = ordering[(u64)chosen[i / per] * per + i % per];
        best = key_max(best, argmax_key(row[t], t));
    }
    for (int o = 16; o > 0; o >>= 1) best = key_max(best, __shfl_xor_sync(0xffffffffu, best, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (warp == 0) {
        best = lane < (int)(blockDim.x / 32) ? warp_best[lane] : 0;
        for (int o = 16; o > 0; o >>= 1) best = key_max(best, __shfl_xor_sync(0xffffffffu, best, o));
        if (lane == 0) out[r] = 0xffffffffu - (u32)(best & 0xffffffffu);
    }
}
