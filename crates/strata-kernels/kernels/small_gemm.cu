// Products of a small bf16 weight over a decode step's many rows: y[t, n] = x[t, k] .
// W[n, k]^T for the activation's bf16 copy x and f32 accumulation, where W is a few MB at
// most and either n or k is short (Gemma-4's per-layer-input gate, 1536 -> 256, and
// projection, 256 -> 1536).
//
// Why: past 64 rows these ran on cuBLAS, about 5 us a launch whatever the size, plus a
// separate pass for the gate's activation and table product; below it the skinny GEMM's
// tiles (128 weight rows, every token in one block) leave a 256-row weight two tiles, too
// few blocks to hide a load's latency, made up by a cluster split of k. Here a block takes
// 16 tokens by BN features over all of k, so such a product is tens to hundreds of short
// blocks with no cross-block reduction.
//
// Floor: the weight (0.8 MB for E2B) is read from memory once and from L2 once per 16-token
// tile; x (t k 2 bytes) once per feature tile. Both are L2-resident sizes, so the time is
// a few dependent L2 round trips, not bandwidth.
//
// Layout: W warps (eight for long k, four for short) split k into contiguous parts
// (k % (32 W) == 0); each multiplies the block's 16 tokens (the mma's A operand) by its
// BN / 8 fragments of 8 features (B) with mma.sync m16n8k16, loading its operands straight from global memory as 16-byte pieces:
// lane 4 g + q reads k elements [8 q, 8 q + 8) of a 32-k step for token rows g and g + 8
// and feature row g, and uses elements 0-3 as the first k16 step's (2q, 2q+1, 2q+8, 2q+9)
// and 4-7 as the second's. That permutes k within each 32-element step identically for
// both operands, so the dot products are the same sums in another order. The W partial
// tiles meet in shared memory and are added in warp order (the result does not depend on
// timing).
// Modes: SM_PLAIN writes the products; SM_SLICE writes act(product) * table[t * stride +
// offset + i] (the gate's activation times its slice of the per-layer inputs, which
// `act_mul_slice` did as a second pass). Each output is also written as bf16 when `yb` is
// set. Tokens past t read row t - 1 (valid memory) and are never stored.

#define SM_PLAIN 0
#define SM_SLICE 2

struct SmallSlice {
    const float* table;
    u64 offset;
    u64 stride;
};

__device__ __forceinline__ uint4 sm_load(const u16* p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// NF fragments of 8 features a block (BN = 8 NF); W warps; U 32-k steps of loads issued
// together.
template <int MODE, int NF, int U, int W>
__device__ __forceinline__ void small_gemm(const u16* xb, const u16* w, float* y, u16* yb,
                                           int t, int k, int n, int act, SmallSlice slice) {
    __shared__ float part[W][NF][4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, q = lane & 3;
    const int f0 = blockIdx.x * (8 * NF), tok0 = blockIdx.y * 16;
    const int r0 = min(tok0 + g, t - 1), r1 = min(tok0 + g + 8, t - 1);
    const int kq = k / W, kbeg = warp * kq;
    const u16* xa = xb + (u64)r0 * k + kbeg + 8 * q;
    const u16* xc = xb + (u64)r1 * k + kbeg + 8 * q;
    const u16* wr = w + (u64)(f0 + g) * k + kbeg + 8 * q;
    float c[NF][4];
#pragma unroll
    for (int f = 0; f < NF; ++f) c[f][0] = c[f][1] = c[f][2] = c[f][3] = 0.0f;
    for (int k0 = 0; k0 < kq; k0 += 32 * U) {
        uint4 a[U], b[U], bw[U][NF];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kk = k0 + 32 * u;
            if (kk < kq) {
                a[u] = sm_load(xa + kk);
                b[u] = sm_load(xc + kk);
#pragma unroll
                for (int f = 0; f < NF; ++f) bw[u][f] = sm_load(wr + (u64)f * 8 * k + kk);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (k0 + 32 * u < kq) {
#pragma unroll
                for (int f = 0; f < NF; ++f) {
                    mma_bf16(c[f], a[u].x, b[u].x, a[u].y, b[u].y, bw[u][f].x, bw[u][f].y);
                    mma_bf16(c[f], a[u].z, b[u].z, a[u].w, b[u].w, bw[u][f].z, bw[u][f].w);
                }
            }
        }
    }
#pragma unroll
    for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[warp][f][e][lane] = c[f][e];
    __syncthreads();
    // Thread i adds fragment entry (f, lane) = (i / 32, i % 32) of the W warps in order.
    for (int i = threadIdx.x; i < NF * 32; i += W * 32) {
        const int f = i >> 5, l = i & 31, gg = l >> 2, qq = l & 3;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = part[0][f][e][l];
#pragma unroll
            for (int p = 1; p < W; ++p) v += part[p][f][e][l];
            // C fragment: entries 0, 1 are token gg, features 2qq and 2qq + 1; 2, 3 token gg + 8.
            const int tok = tok0 + gg + 8 * (e >> 1), feat = f0 + 8 * f + 2 * qq + (e & 1);
            if (tok >= t) continue;
            float out = v;
            if (MODE == SM_SLICE)
                out = apply_act(act, v) * slice.table[(u64)tok * slice.stride + slice.offset + feat];
            const u64 idx = (u64)tok * n + feat;
            y[idx] = out;
            if (yb) yb[idx] = f32_to_bf16_rne(out);
        }
    }
}

// Entry points: small_gemm_<mode>_n<BN>. BN 16 (two fragments) for long k: eight warps,
// six 32-k steps of loads in flight (E2B's k of 1536 in one round); BN 64 (eight
// fragments) for short k: four warps, two steps (a k of 256 in one round). Four warps with
// four steps in flight made the E2B gate 6.7 us a call at 112 rows (ncu), three rounds.
#define SM_ENTRY(NAME, MODE, NF, U, W)                                                       \
    extern "C" __global__ void __launch_bounds__(W * 32)                                    \
        NAME(const u16* xb, const u16* w, float* y, u16* yb, int t, int k, int n, int act, \
             SmallSlice slice) {                                                            \
        small_gemm<MODE, NF, U, W>(xb, w, y, yb, t, k, n, act, slice);                      \
    }

SM_ENTRY(small_gemm_plain_n16, SM_PLAIN, 2, 6, 8)
SM_ENTRY(small_gemm_slice_n16, SM_SLICE, 2, 6, 8)
SM_ENTRY(small_gemm_plain_n64, SM_PLAIN, 8, 2, 4)
SM_ENTRY(small_gemm_slice_n64, SM_SLICE, 8, 2, 4)
