// Tensor-core products for a decode step's rows: y[t, n] = x[t, k] . W[n, k]^T for the
// activation's bf16 copy x, a bf16 weight W, f32 accumulation, t = 3 to 128 rows (sm_90).
//
// Why not cuBLAS: at few rows every product is a weight stream of a few MB, and cuBLAS runs
// each as its own launch of 5-13 us whatever its size (at 8 rows a layer's k and v
// projections, 0.8 MB each, took 5.4 us apiece; the MLP's down projection added a split-K
// reduce kernel), with the gate / up activation and the per-layer-input gate's table product
// as further passes. At 128 rows cuBLAS's products of a step took about 2.5 ms against
// 1.1 ms of weights.
// Here one launch covers a layer's q, k and v, the MLP's gate and up write act(gate) * up, the
// per-layer-input gate writes act(product) * table, and split-K partial sums are added inside
// the launch.
//
// Floor: every weight byte read once (n k 2 bytes) at the memory bandwidth; x (t k 2 bytes)
// is read again from L2 by every feature tile.
//
// A block computes a tile of SG_BN weight rows x BT token columns over its share of k.
// Stages of SG_BK k are copied with cp.async, several deep; rows are 128 bytes and their
// 16-byte pieces are XOR-swizzled by row (piece ^ row % 8), which is both what lets
// ldmatrix read eight rows without bank conflicts and wgmma's 128-byte swizzle.
// Three token tiles, one entry point each:
// - BT = 32 (3 to 32 rows): mma.sync. The weight rows are the mma's A operand (16 rows a
//   fragment) and the tokens its B operand (8 columns a fragment), both read with ldmatrix.
//   Eight warps: warp w takes A rows 32 (w % 4) .. + 31 and tokens 16 (w / 4) .. + 15.
// - BT = 64 and 128 (33 to 128 rows): Hopper's wgmma (sm_90a builds only). At 128 rows a
//   product does 128 flops a weight byte, so streaming the weights at the copy bandwidth
//   needs about 540 TFLOP/s: beyond mma.sync (a 128-token mma.sync tile made the B = 128
//   step 29% slower than cuBLAS), within wgmma's 989. Two warpgroups: warpgroup g multiplies
//   A rows 64 g .. + 63 by all BT tokens straight from shared memory, one m64nBTk16 per 16
//   k; the stage's copies are waited, fenced for the async proxy and barriered first.
// Both leave a thread the same fragment layout (rows g, g + 8 of 16; tokens 2 q, 2 q + 1 of
// 8, for lane 4 g + q), so the stores and the split-K sums are shared.
//
// Split-K: the CLUSTER blocks of a tile (one thread-block cluster, blockIdx.y = rank) take
// contiguous shares of k. Each leaves its partial tile in its own shared memory; after a
// cluster barrier, rank r adds every rank's partials for its share of the tile in rank
// order (so the sum does not depend on timing) through distributed shared memory and writes
// them. No workspace, no second kernel.
//
// Modes: SG_PLAIN writes the products. SG_GATED takes an MLP's gate (w[0]) and up (w[1]): a
// tile is 64 features, its row 16 b + i being feature 8 b + i % 8 of the gate (i < 8) or the
// up (i >= 8), so the rows g and g + 8 a fragment gives a thread are one feature's gate and
// up; it writes act(gate) * up. SG_SLICE writes act(product) * table[t * stride + offset +
// i] (Gemma-4's per-layer-input gate).
// Each output is also written as bf16 when `yb` is set (a GEMM reads it next).
// Needs k % SG_BK == 0 and 16-byte aligned rows (the launcher checks k; allocations are
// 256-byte aligned); rows past t and features past n are never stored (their columns may
// hold anything: a column of the product depends on its own token row alone).

#define SG_BN 128
#define SG_BK 64
#define SG_THREADS 256
#define SG_MAX_MATS 3
// The mma.sync tile: 32 tokens (two B fragments a warp), four stages, two blocks a
// multiprocessor.
#define SG_NT 2
#define SG_BT (16 * SG_NT)
#define SG_STAGES 4
// The wgmma tiles: 64 tokens with four stages, 128 tokens with three, two blocks a
// multiprocessor either way (97 KB each); the launcher's `TILES` matches.
#define WG_STAGES(BT) ((BT) == 64 ? 4 : 3)
#define WG_BLOCKS(BT) 2

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

// Which tile of which weight this block computes, and where that tile's features start.
struct SgTile {
    int m, n, f0;
};

template <int MODE>
__device__ __forceinline__ SgTile sg_tile(const SkinnyMats& mats) {
    const int tile = blockIdx.x;
    const int m = tile < mats.tile_end[0] ? 0 : (tile < mats.tile_end[1] ? 1 : 2);
    const int local = tile - (m == 0 ? 0 : pick3(mats.tile_end, m - 1));
    return {m, pick3(mats.n, m), local * (MODE == SG_GATED ? SG_BN / 2 : SG_BN)};
}

// The weight row behind A row `row` of the tile (null past the weight's features).
template <int MODE>
__device__ __forceinline__ const u16* sg_weight_row(const SkinnyMats& mats, SgTile tl, int k,
                                                    int row) {
    int feat = tl.f0 + row;
    const u16* w = pick3(mats.w, tl.m);
    if (MODE == SG_GATED) {
        feat = tl.f0 + 8 * (row / 16) + row % 8;
        w = row % 16 < 8 ? mats.w[0] : mats.w[1];
    }
    return feat < tl.n ? w + (u64)feat * k : nullptr;
}

// One stage's copies: thread i takes the 16-byte piece i % 8 of A rows i / 8 + 32 j (j < 4)
// and of token rows i / 8 + 32 j (j < BT / 32); rows without a source (past n or t) are left
// as they are: their products land in outputs that are never stored.
template <int BT>
__device__ __forceinline__ void sg_load_stage(u16* sa, u16* sb, const u16* const (&arow)[4],
                                              const u16* const (&xrow)[(BT + 31) / 32], int kb) {
    const int piece = threadIdx.x % 8, row0 = threadIdx.x / 8;
    const int swz = (piece ^ (row0 % 8)) * 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int row = row0 + 32 * j;
        if (arow[j]) cp_async16(sa + row * SG_BK + swz, arow[j] + kb + piece * 8, 16);
    }
#pragma unroll
    for (int j = 0; j < (BT + 31) / 32; ++j) {
        const int row = row0 + 32 * j;
        if (row < BT && xrow[j]) cp_async16(sb + row * SG_BK + swz, xrow[j] + kb + piece * 8, 16);
    }
}

// The copy sources of this thread: its A rows' weight rows and its token rows.
template <int MODE, int BT>
struct SgRows {
    const u16* a[4];
    const u16* x[(BT + 31) / 32];
    __device__ __forceinline__ SgRows(const SkinnyMats& mats, SgTile tl, const u16* xs, int t,
                                      int k) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j] = sg_weight_row<MODE>(mats, tl, k, threadIdx.x / 8 + 32 * j);
#pragma unroll
        for (int j = 0; j < (BT + 31) / 32; ++j) {
            const int row = threadIdx.x / 8 + 32 * j;
            x[j] = row < t ? xs + (u64)row * k : nullptr;
        }
    }
};

// Stores one accumulator fragment: `c` holds A rows r0 + g (x, y) and r0 + g + 8 (z, w) at
// token columns tok0 and tok0 + 1 (g = lane / 4 of the thread that computed it).
template <int MODE>
__device__ __forceinline__ void sg_store_fragment(float4 c, int r0, int g, int tok0, SgTile tl,
                                                  int t, float* y, u16* yb, int act,
                                                  const SkinnySlice& slice) {
    const float v[4] = {c.x, c.y, c.z, c.w};
    if constexpr (MODE == SG_GATED) {
        const int feat = tl.f0 + r0 / 2 + g;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int tok = tok0 + e;
            if (feat >= tl.n || tok >= t) continue;
            const float out = apply_act(act, v[e]) * v[2 + e];
            const u64 i = (u64)tok * tl.n + feat;
            y[i] = out;
            if (yb) yb[i] = f32_to_bf16_rne(out);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int feat = tl.f0 + r0 + g + 8 * (e / 2), tok = tok0 + e % 2;
            if (feat >= tl.n || tok >= t) continue;
            float out = v[e];
            if (MODE == SG_SLICE)
                out = apply_act(act, out) *
                      slice.table[(u64)tok * slice.stride + slice.offset + feat];
            const u64 i = (u64)tok * tl.n + feat;
            y[i] = out;
            if (yb) yb[i] = f32_to_bf16_rne(out);
        }
    }
}

// Split-K: every block of the cluster has left its F fragments a thread at
// part[f * SG_THREADS + thread]; rank `rank` adds its share of them over the cluster's
// blocks in rank order and stores the sums. `where(src, f, r0, tok0)` gives a fragment's
// first A row and token column.
template <int MODE, int CLUSTER, int F, class Where>
__device__ __forceinline__ void sg_cluster_store(const float4* part, Where where, SgTile tl,
                                                 int t, float* y, u16* yb, int act,
                                                 const SkinnySlice& slice) {
    cluster_sync();
    const int rank = blockIdx.y;
    constexpr int per = SG_THREADS * F / CLUSTER;
    for (int it = rank * per + threadIdx.x; it < (rank + 1) * per; it += SG_THREADS) {
        const int src = it % SG_THREADS, f = it / SG_THREADS;
        int r0, tok0;
        where(src, f, r0, tok0);
        if (tok0 >= t) continue;
        const u32 at = smem_addr(part + f * SG_THREADS + src);
        float4 c = cluster_load4(cluster_map(at, 0));
#pragma unroll
        for (int r = 1; r < CLUSTER; ++r) {
            const float4 p = cluster_load4(cluster_map(at, r));
            c.x += p.x;
            c.y += p.y;
            c.z += p.z;
            c.w += p.w;
        }
        sg_store_fragment<MODE>(c, r0, (src % 32) / 4, tok0, tl, t, y, yb, act, slice);
    }
    // No block leaves while another may still read its shared memory.
    cluster_sync();
}

// This thread's cp.async writes (completed) made visible to wgmma's reads, which go
// through the async proxy.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The k loop of every tile: this block's share of k (rank blockIdx.y of CLUSTER) through a
// STAGES-deep cp.async pipeline of a weight tile `sa` and a token tile `sb` per stage;
// `compute(b)` multiplies buffer b once its copies are visible to every thread (fenced for
// the async proxy first when ASYNC, for wgmma) and must be done reading it when it returns.
template <int BT, int STAGES, int CLUSTER, bool ASYNC, class Rows, class Compute>
__device__ __forceinline__ void sg_k_loop(u16* sa, u16* sb, const Rows& rows, int k,
                                          Compute compute) {
    const int stages = k / SG_BK, rank = blockIdx.y;
    const int s0 = rank * stages / CLUSTER, s1 = (rank + 1) * stages / CLUSTER;
    const int count = s1 - s0;
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < count)
            sg_load_stage<BT>(sa + i * SG_BN * SG_BK, sb + i * BT * SG_BK, rows.a, rows.x,
                              (s0 + i) * SG_BK);
        cp_async_commit();
    }
    for (int i = 0; i < count; ++i) {
        sg_wait<STAGES - 2>();
        if constexpr (ASYNC) fence_proxy_async();
        __syncthreads();
        // The buffer refilled here was computed in the previous round, which every warp
        // has finished (the barrier above).
        const int next = i + STAGES - 1;
        if (next < count) {
            const int b = next % STAGES;
            sg_load_stage<BT>(sa + b * SG_BN * SG_BK, sb + b * BT * SG_BK, rows.a, rows.x,
                              (s0 + next) * SG_BK);
        }
        cp_async_commit();
        compute(i % STAGES);
    }
    sg_wait<0>();
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

// The 32-token tile with mma.sync.
template <int MODE, int CLUSTER>
__device__ __forceinline__ void skinny_gemm_body(const u16* __restrict__ x, int t, int k,
                                                 const SkinnyMats& mats, int act,
                                                 const SkinnySlice& slice) {
    extern __shared__ __align__(16) unsigned char sg_smem[];
    u16* sa = (u16*)sg_smem;                     // [SG_STAGES][SG_BN][SG_BK]
    u16* sb = sa + SG_STAGES * SG_BN * SG_BK;    // [SG_STAGES][SG_BT][SG_BK]
    const SgTile tl = sg_tile<MODE>(mats);
    const SgRows<MODE, SG_BT> rows(mats, tl, x, t, k);

    const int warp = threadIdx.x / 32, wf = warp % 4, wt = warp / 4;
    const bool active = 8 * SG_NT * wt < t;
    float acc[2][SG_NT][4];
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int nt = 0; nt < SG_NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[f][nt][e] = 0.0f;

    sg_k_loop<SG_BT, SG_STAGES, CLUSTER, false>(sa, sb, rows, k, [&](int b) {
        if (active) sg_compute_stage(acc, sa + b * SG_BN * SG_BK, sb + b * SG_BT * SG_BK, wf, wt);
    });

    // Fragment (f, nt) of a thread: A rows 32 wf + 16 f, tokens 8 SG_NT wt + 8 nt.
    auto where = [](int src, int fr, int& r0, int& tok0) {
        const int w = src / 32, f = fr / SG_NT, nt = fr % SG_NT;
        r0 = 32 * (w % 4) + 16 * f;
        tok0 = 8 * SG_NT * (w / 4) + 8 * nt + 2 * (src % 4);
    };
    float* y = pick3(mats.y, tl.m);
    u16* yb = pick3(mats.yb, tl.m);
    if (CLUSTER == 1) {
        if (!active) return;
#pragma unroll
        for (int fr = 0; fr < 2 * SG_NT; ++fr) {
            const float* c = acc[fr / SG_NT][fr % SG_NT];
            int r0, tok0;
            where(threadIdx.x, fr, r0, tok0);
            sg_store_fragment<MODE>(make_float4(c[0], c[1], c[2], c[3]), r0, (threadIdx.x % 32) / 4,
                                    tok0, tl, t, y, yb, act, slice);
        }
        return;
    }
    // Partials into this block's shared memory (the stages are done with).
    __syncthreads();
    float4* part = (float4*)sg_smem;
#pragma unroll
    for (int fr = 0; fr < 2 * SG_NT; ++fr) {
        const float* c = acc[fr / SG_NT][fr % SG_NT];
        part[fr * SG_THREADS + threadIdx.x] = make_float4(c[0], c[1], c[2], c[3]);
    }
    sg_cluster_store<MODE, CLUSTER, 2 * SG_NT>(part, where, tl, t, y, yb, act, slice);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A shared-memory matrix descriptor for wgmma: K-major rows of 128 bytes in the 128-byte
// swizzle, eight-row groups 1024 bytes apart (the leading offset is unused in this layout).
// Moving to the next 16 k adds 32 bytes to the start address.
__device__ __forceinline__ u64 wg_desc(u32 addr) {
    return (u64)((addr & 0x3ffff) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_wait_all() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// Orders later uses of an accumulator after the wait that completes its wgmma.
__device__ __forceinline__ void wgmma_settle(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// acc (m64n64, f32) += A (64 x 16, descriptor a) x B (64 x 16, descriptor b), both
// K-major bf16 in shared memory.
__device__ __forceinline__ void wgmma_n64(float (&d)[32], u64 a, u64 b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(1));
}

// acc (m64n128, f32) += A (64 x 16, descriptor a) x B (128 x 16, descriptor b), both
// K-major bf16 in shared memory.
__device__ __forceinline__ void wgmma_n128(float (&d)[64], u64 a, u64 b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(1));
}

template <int BT>
__device__ __forceinline__ void wgmma_tile(float (&d)[BT / 2], u64 a, u64 b) {
    if constexpr (BT == 64) wgmma_n64(d, a, b);
    else wgmma_n128(d, a, b);
}

// The 64- and 128-token tiles with wgmma.
template <int MODE, int BT, int CLUSTER>
__device__ __forceinline__ void wide_gemm_body(const u16* __restrict__ x, int t, int k,
                                               const SkinnyMats& mats, int act,
                                               const SkinnySlice& slice) {
    constexpr int STAGES = WG_STAGES(BT);
    extern __shared__ __align__(16) unsigned char sg_smem[];
    // The swizzle repeats every 1024 bytes, and the stages must start on that boundary (the
    // launcher asks for 1 KB more than the stages).
    unsigned char* base = sg_smem + (1024 - smem_addr(sg_smem) % 1024) % 1024;
    u16* sa = (u16*)base;                   // [STAGES][SG_BN][SG_BK]
    u16* sb = sa + STAGES * SG_BN * SG_BK;  // [STAGES][BT][SG_BK]
    const SgTile tl = sg_tile<MODE>(mats);
    const SgRows<MODE, BT> rows(mats, tl, x, t, k);

    float acc[BT / 2];
#pragma unroll
    for (int i = 0; i < BT / 2; ++i) acc[i] = 0.0f;

    const int wg = threadIdx.x / 128;
    const u32 a_base = smem_addr(sa) + wg * 64 * SG_BK * 2, b_base = smem_addr(sb);
    sg_k_loop<BT, STAGES, CLUSTER, true>(sa, sb, rows, k, [&](int b) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < SG_BK / 16; ++kk)
            wgmma_tile<BT>(acc, wg_desc(a_base + b * SG_BN * SG_BK * 2 + kk * 32),
                           wg_desc(b_base + b * BT * SG_BK * 2 + kk * 32));
        wgmma_commit();
        // Done reading the buffer before the next round refills it.
        wgmma_wait_all();
    });
#pragma unroll
    for (int i = 0; i < BT / 2; ++i) wgmma_settle(acc[i]);

    // Fragment j of a thread: A rows 64 (warpgroup) + 16 (warp in it), tokens 8 j.
    auto where = [](int src, int j, int& r0, int& tok0) {
        r0 = 16 * (src / 32);
        tok0 = 8 * j + 2 * (src % 4);
    };
    float* y = pick3(mats.y, tl.m);
    u16* yb = pick3(mats.yb, tl.m);
    if (CLUSTER == 1) {
#pragma unroll
        for (int j = 0; j < BT / 8; ++j) {
            int r0, tok0;
            where(threadIdx.x, j, r0, tok0);
            sg_store_fragment<MODE>(make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2],
                                                acc[4 * j + 3]),
                                    r0, (threadIdx.x % 32) / 4, tok0, tl, t, y, yb, act, slice);
        }
        return;
    }
    __syncthreads();
    float4* part = (float4*)base;
#pragma unroll
    for (int j = 0; j < BT / 8; ++j)
        part[j * SG_THREADS + threadIdx.x] =
            make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
    sg_cluster_store<MODE, CLUSTER, BT / 8>(part, where, tl, t, y, yb, act, slice);
}

#define SG_IF_WGMMA(...) __VA_ARGS__
#else
#define SG_IF_WGMMA(...)
#endif

#define SG_PARAMS_plain (const u16* x, int t, int k, SkinnyMats mats)
#define SG_ARGS_plain (x, t, k, mats, 0, SkinnySlice{})
#define SG_PARAMS_gated (const u16* x, int t, int k, SkinnyMats mats, int act)
#define SG_ARGS_gated (x, t, k, mats, act, SkinnySlice{})
#define SG_PARAMS_slice (const u16* x, int t, int k, SkinnyMats mats, int act, SkinnySlice slice)
#define SG_ARGS_slice (x, t, k, mats, act, slice)

#define SG_KERNEL_T32(NAME, MODE, C)                                                       \
    extern "C" __global__ void __cluster_dims__(1, C, 1) __launch_bounds__(SG_THREADS, 2)  \
        skinny_gemm_##NAME##_t32_c##C SG_PARAMS_##NAME {                                   \
        skinny_gemm_body<MODE, C> SG_ARGS_##NAME;                                          \
    }

// Outside sm_90a builds (wgmma is Hopper's alone) the wide entry points are empty; the
// backend runs them on sm_90 only.
#define SG_KERNEL_WIDE(NAME, MODE, BT, C)                                                         \
    extern "C" __global__ void __cluster_dims__(1, C, 1)                                          \
        __launch_bounds__(SG_THREADS, WG_BLOCKS(BT)) skinny_gemm_##NAME##_t##BT##_c##C          \
            SG_PARAMS_##NAME {                                                                    \
        SG_IF_WGMMA(wide_gemm_body<MODE, BT, C> SG_ARGS_##NAME;)                                 \
    }

#define SG_KERNELS(C)                          \
    SG_KERNEL_T32(plain, SG_PLAIN, C)          \
    SG_KERNEL_T32(gated, SG_GATED, C)          \
    SG_KERNEL_T32(slice, SG_SLICE, C)          \
    SG_KERNEL_WIDE(plain, SG_PLAIN, 64, C)     \
    SG_KERNEL_WIDE(gated, SG_GATED, 64, C)     \
    SG_KERNEL_WIDE(slice, SG_SLICE, 64, C)     \
    SG_KERNEL_WIDE(plain, SG_PLAIN, 128, C)    \
    SG_KERNEL_WIDE(gated, SG_GATED, 128, C)    \
    SG_KERNEL_WIDE(slice, SG_SLICE, 128, C)

// Entry points skinny_gemm_<mode>_t<tokens>_c<cluster>.
SG_KERNELS(1)
SG_KERNELS(2)
SG_KERNELS(4)
SG_KERNELS(8)

#endif
