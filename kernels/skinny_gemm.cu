// Tensor-core products for a decode step's few rows: y[t, n] = x[t, k] . W[n, k]^T for the
// activation's bf16 copy x, a bf16 weight W, f32 accumulation, t = 3 to 32 rows (sm_90).
//
// Why not cuBLAS: at few rows every product is a weight stream of a few MB, and cuBLAS runs
// each as its own launch of 5-13 us whatever its size (at 8 rows a layer's k and v
// projections, 0.8 MB each, took 5.4 us apiece; the MLP's down projection added a split-K
// reduce kernel), with the gate / up activation and the per-layer-input gate's table product
// as further passes.
// Here one launch covers a layer's q, k and v, the MLP's gate and up write act(gate) * up, the
// per-layer-input gate writes act(product) * table, and split-K partial sums are added inside
// the launch.
//
// Floor: every weight byte read once (n k 2 bytes) at the memory bandwidth; x (t k 2 bytes)
// is read again from L2 by every feature tile.
//
// A block computes a tile of SG_BN weight rows x SG_BT token columns over its share of k:
// the weight rows are the mma's A operand (16 rows a fragment) and the tokens its B operand
// (8 columns a fragment), both read from shared memory with ldmatrix. Eight warps: warp w
// takes A rows 32 (w % 4) .. + 31 and tokens 8 SG_NT (w / 4) .. (two A fragments x SG_NT B
// fragments). Stages of SG_BK k are copied with cp.async, SG_STAGES deep (a block of an
// 8-way split of a 1536-long k has three stages: all in flight at once); rows are 128 bytes
// and their 16-byte pieces are XOR-swizzled by row so that ldmatrix reads eight rows without
// bank conflicts.
//
// Why 32 rows at most: the mma work grows with the token tile, and mma.sync runs at about
// half the rate of the wgmma cuBLAS uses on sm_90. Measured on an H200 (decode steps,
// `docs/perf-notes.md`): with this kernel in cuBLAS's place the step is 8-10% faster at 3-8
// rows, 7% at 16, 1-4% at 32; a 128-token tile made it 29% slower at 128 rows, where
// streaming the weights at the copy bandwidth needs more mma.sync throughput than there is.
//
// Split-K: the CLUSTER blocks of a tile (one thread-block cluster, blockIdx.y = rank) take
// contiguous shares of k. Each leaves its partial tile in its own shared memory; after a
// cluster barrier, rank r adds every rank's partials for its share of the tile in rank
// order (so the sum does not depend on timing) through distributed shared memory and writes
// them. No workspace, no second kernel.
//
// Modes: SG_PLAIN writes the products. SG_GATED takes an MLP's gate (w[0]) and up (w[1]): a
// tile is 64 gate rows and the same 64 up rows, arranged so that each warp's first A fragment
// is gate and its second the same features' up, and writes act(gate) * up. SG_SLICE writes
// act(product) * table[t * stride + offset + i] (Gemma-4's per-layer-input gate).
// Each output is also written as bf16 when `yb` is set (a GEMM reads it next).
// Needs k % SG_BK == 0 and 16-byte aligned rows (the launcher checks k; allocations are
// 256-byte aligned); rows past t and features past n are never stored.

#define SG_BN 128
#define SG_NT 2
#define SG_BT (16 * SG_NT)
#define SG_BK 64
#define SG_STAGES 4
#define SG_XR ((SG_BT + 31) / 32)  // token rows a thread copies a stage
#define SG_THREADS 256
#define SG_MAX_MATS 3

#define SG_PLAIN 0
#define SG_GATED 1
#define SG_SLICE 2

// Up to three weights that share x (a layer's q, k and v): tiles run over the first
// weight's features, then the second's, then the third's; `tile_end[m]` counts the tiles of
// weights 0..=m (unused slots repeat the last weight and its end). The launcher's
// `SkinnyMats` matches.
struct SkinnyMats {
    const u16* w[SG_MAX_MATS];
    float* y[SG_MAX_MATS];
    u16* yb[SG_MAX_MATS];
    int n[SG_MAX_MATS];
    int tile_end[SG_MAX_MATS];
};

struct SkinnySlice {
    const float* table;
    u64 offset;
    u64 stride;
};

#if __CUDA_ARCH__ >= 900

// The shared-memory address `a` of this block as seen in cluster block `rank`.
__device__ __forceinline__ u32 cluster_map(u32 a, u32 rank) {
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}

__device__ __forceinline__ float4 cluster_load4(u32 a) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(a));
    return v;
}

// Every block of the cluster reaches this point; shared-memory writes before it are seen
// by the whole cluster after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Waits until at most N of this thread's newest copy groups are in flight.
template <int N>
__device__ __forceinline__ void sg_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// One stage's copies: thread i takes the 16-byte piece i % 8 of weight rows i / 8 + 32 j
// (j < 4) and of token rows i / 8 + 32 j (j < SG_XR); rows without a source (past n or t)
// are left as they are: their products land in outputs that are never stored.
__device__ __forceinline__ void sg_load_stage(u16* sa, u16* sb, const u16* const (&arow)[4],
                                              const u16* const (&xrow)[SG_XR], int kb) {
    const int piece = threadIdx.x % 8, row0 = threadIdx.x / 8;
    const int swz = (piece ^ (row0 % 8)) * 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int row = row0 + 32 * j;
        if (arow[j]) cp_async16(sa + row * SG_BK + swz, arow[j] + kb + piece * 8, 16);
    }
#pragma unroll
    for (int j = 0; j < SG_XR; ++j) {
        const int row = row0 + 32 * j;
        if (row < SG_BT && xrow[j])
            cp_async16(sb + row * SG_BK + swz, xrow[j] + kb + piece * 8, 16);
    }
}

// acc += the stage's A rows (this warp's two fragments) x its tokens (SG_NT fragments).
__device__ __forceinline__ void sg_compute_stage(float (&acc)[2][SG_NT][4], const u16* sa,
                                                 const u16* sb, int wf, int wt) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < SG_BK / 16; ++kk) {
        u32 a[2][4];
#pragma unroll
        for (int f = 0; f < 2; ++f) {
            const int row = 32 * wf + 16 * f + lane % 8 + 8 * ((lane / 8) % 2);
            const int piece = 2 * kk + lane / 16;
            ldmatrix_x4(a[f][0], a[f][1], a[f][2], a[f][3],
                        sa + row * SG_BK + (piece ^ (row % 8)) * 8);
        }
#pragma unroll
        for (int np = 0; np < SG_NT / 2; ++np) {
            const int tok = 8 * SG_NT * wt + 16 * np + lane % 8 + 8 * (lane / 16);
            const int piece = 2 * kk + (lane / 8) % 2;
            u32 b0, b1, b2, b3;
            ldmatrix_x4(b0, b1, b2, b3, sb + tok * SG_BK + (piece ^ (tok % 8)) * 8);
#pragma unroll
            for (int f = 0; f < 2; ++f) {
                mma_bf16(acc[f][2 * np], a[f][0], a[f][1], a[f][2], a[f][3], b0, b1);
                mma_bf16(acc[f][2 * np + 1], a[f][0], a[f][1], a[f][2], a[f][3], b2, b3);
            }
        }
    }
}

// Writes B fragment `nt` of thread `src`'s accumulators (both A fragments): c[f] holds the
// fragment's four values (rows g, g + 8; tokens 2 q, 2 q + 1 of lane src % 32).
template <int MODE>
__device__ __forceinline__ void sg_store(const float4 (&c)[2], int nt, int src, int f0, int n,
                                         int t, float* y, u16* yb, int act,
                                         const SkinnySlice& slice) {
    const int warp = src / 32, lane = src % 32, wf = warp % 4, wt = warp / 4;
    const int g = lane / 4, q = lane % 4;
    const int tok0 = 8 * SG_NT * wt + 8 * nt + 2 * q;
#pragma unroll
    for (int f = 0; f < (MODE == SG_GATED ? 1 : 2); ++f) {
        // Gated: fragment 0 is the gate and 1 the up rows of features 16 wf ..; otherwise
        // the fragments are rows 32 wf + 16 f ...
        const int fb = MODE == SG_GATED ? f0 + 16 * wf : f0 + 32 * wf + 16 * f;
        const float v[4] = {c[f].x, c[f].y, c[f].z, c[f].w};
        const float u[4] = {c[1].x, c[1].y, c[1].z, c[1].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int feat = fb + g + 8 * (e / 2), tok = tok0 + e % 2;
            if (feat >= n || tok >= t) continue;
            float out = v[e];
            if (MODE == SG_GATED) out = apply_act(act, out) * u[e];
            if (MODE == SG_SLICE)
                out = apply_act(act, out) * slice.table[(u64)tok * slice.stride + slice.offset + feat];
            const u64 i = (u64)tok * n + feat;
            y[i] = out;
            if (yb) yb[i] = f32_to_bf16_rne(out);
        }
    }
}

template <int MODE, int CLUSTER>
__device__ __forceinline__ void skinny_gemm_body(const u16* __restrict__ x, int t, int k,
                                                 const SkinnyMats& mats, int act,
                                                 const SkinnySlice& slice) {
    extern __shared__ __align__(16) unsigned char sg_smem[];
    u16* sa = (u16*)sg_smem;                     // [SG_STAGES][SG_BN][SG_BK]
    u16* sb = sa + SG_STAGES * SG_BN * SG_BK;    // [SG_STAGES][SG_BT][SG_BK]
    const int tile = blockIdx.x, rank = blockIdx.y;
    const int m = tile < mats.tile_end[0] ? 0 : (tile < mats.tile_end[1] ? 1 : 2);
    const int local = tile - (m == 0 ? 0 : pick3(mats.tile_end, m - 1));
    const int n = pick3(mats.n, m);
    const int f0 = local * (MODE == SG_GATED ? SG_BN / 2 : SG_BN);

    // This thread's copy rows of each tile (null: nothing to copy).
    const u16* arow[4];
    const u16* xrow[SG_XR];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int row = threadIdx.x / 8 + 32 * j;
        int feat = f0 + row;
        const u16* w = pick3(mats.w, m);
        if (MODE == SG_GATED) {
            // Row 32 a + 16 b + i is feature 16 a + i of the gate (b = 0) or the up (b = 1).
            feat = f0 + 16 * (row / 32) + row % 16;
            w = (row / 16) % 2 ? mats.w[1] : mats.w[0];
        }
        arow[j] = feat < n ? w + (u64)feat * k : nullptr;
    }
#pragma unroll
    for (int j = 0; j < SG_XR; ++j) {
        const int row = threadIdx.x / 8 + 32 * j;
        xrow[j] = row < t ? x + (u64)row * k : nullptr;
    }

    const int warp = threadIdx.x / 32, wf = warp % 4, wt = warp / 4;
    const bool active = 8 * SG_NT * wt < t;
    float acc[2][SG_NT][4];
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int nt = 0; nt < SG_NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[f][nt][e] = 0.0f;

    const int stages = k / SG_BK;
    const int s0 = rank * stages / CLUSTER, s1 = (rank + 1) * stages / CLUSTER;
    const int count = s1 - s0;
#pragma unroll
    for (int i = 0; i < SG_STAGES - 1; ++i) {
        if (i < count)
            sg_load_stage(sa + i * SG_BN * SG_BK, sb + i * SG_BT * SG_BK, arow, xrow,
                              (s0 + i) * SG_BK);
        cp_async_commit();
    }
    for (int i = 0; i < count; ++i) {
        sg_wait<SG_STAGES - 2>();
        __syncthreads();
        // The buffer refilled here was computed in the previous round, which every warp
        // has finished (the barrier above).
        const int next = i + SG_STAGES - 1;
        if (next < count) {
            const int b = next % SG_STAGES;
            sg_load_stage(sa + b * SG_BN * SG_BK, sb + b * SG_BT * SG_BK, arow, xrow,
                              (s0 + next) * SG_BK);
        }
        cp_async_commit();
        const int b = i % SG_STAGES;
        if (active)
            sg_compute_stage(acc, sa + b * SG_BN * SG_BK, sb + b * SG_BT * SG_BK, wf, wt);
    }
    sg_wait<0>();

    float* y = pick3(mats.y, m);
    u16* yb = pick3(mats.yb, m);
    if (CLUSTER == 1) {
        if (!active) return;
#pragma unroll
        for (int nt = 0; nt < SG_NT; ++nt) {
            const float4 c[2] = {make_float4(acc[0][nt][0], acc[0][nt][1], acc[0][nt][2], acc[0][nt][3]),
                                 make_float4(acc[1][nt][0], acc[1][nt][1], acc[1][nt][2], acc[1][nt][3])};
            sg_store<MODE>(c, nt, threadIdx.x, f0, n, t, y, yb, act, slice);
        }
        return;
    }
    // Partials into this block's shared memory (the stages are done with): fragment (f, nt)
    // of thread i at float4 index (SG_NT f + nt) * SG_THREADS + i.
    __syncthreads();
    float4* part = (float4*)sg_smem;
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int nt = 0; nt < SG_NT; ++nt)
            part[(SG_NT * f + nt) * SG_THREADS + threadIdx.x] =
                make_float4(acc[f][nt][0], acc[f][nt][1], acc[f][nt][2], acc[f][nt][3]);
    cluster_sync();
    // The tile's SG_THREADS x SG_NT items (a source thread's B fragment nt, both A fragments);
    // rank r adds items r * per .. + per - 1, a thread of it every SG_THREADS-th.
    constexpr int per = SG_THREADS * SG_NT / CLUSTER;
    for (int it = rank * per + threadIdx.x; it < (rank + 1) * per; it += SG_THREADS) {
        const int src = it % SG_THREADS, nt = it / SG_THREADS;
        if (8 * SG_NT * (src / 32 / 4) >= t) continue;  // the source warp's tokens are past t
        const u32 base = smem_addr(part + src);
        float4 c[2];
#pragma unroll
        for (int f = 0; f < 2; ++f) {
            const u32 at = base + (SG_NT * f + nt) * SG_THREADS * 16;
            c[f] = cluster_load4(cluster_map(at, 0));
#pragma unroll
            for (int r = 1; r < CLUSTER; ++r) {
                const float4 p = cluster_load4(cluster_map(at, r));
                c[f].x += p.x;
                c[f].y += p.y;
                c[f].z += p.z;
                c[f].w += p.w;
            }
        }
        sg_store<MODE>(c, nt, src, f0, n, t, y, yb, act, slice);
    }
    // No block leaves while another may still read its shared memory.
    cluster_sync();
}

#define SKINNY_GEMM_KERNEL(NAME, MODE, C, PARAMS, ARGS)                                          \
    extern "C" __global__ void __cluster_dims__(1, C, 1) __launch_bounds__(SG_THREADS, 2)        \
        skinny_gemm_##NAME##_c##C PARAMS {                                                      \
        skinny_gemm_body<MODE, C> ARGS;                                                         \
    }

#define SKINNY_GEMM_KERNELS(C)                                                                  \
    SKINNY_GEMM_KERNEL(plain, SG_PLAIN, C, (const u16* x, int t, int k, SkinnyMats mats),       \
                       (x, t, k, mats, 0, SkinnySlice{}))                                       \
    SKINNY_GEMM_KERNEL(gated, SG_GATED, C, (const u16* x, int t, int k, SkinnyMats mats, int act), \
                       (x, t, k, mats, act, SkinnySlice{}))                                     \
    SKINNY_GEMM_KERNEL(slice, SG_SLICE, C,                                                      \
                       (const u16* x, int t, int k, SkinnyMats mats, int act,                   \
                        SkinnySlice slice),                                                     \
                       (x, t, k, mats, act, slice))

// Entry points skinny_gemm_<mode>_c<cluster>.
SKINNY_GEMM_KERNELS(1)
SKINNY_GEMM_KERNELS(2)
SKINNY_GEMM_KERNELS(4)
SKINNY_GEMM_KERNELS(8)

#endif
