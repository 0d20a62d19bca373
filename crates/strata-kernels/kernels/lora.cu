// LoRA products by slot (Backend::lora_bgmv), in two passes so that a decode step of one
// row still spreads over many blocks: `lora_shrink` writes h[p, k] = A[s] x[r] (f32) in
// parts over splits of the columns, one warp a rank k; `lora_expand` adds the parts, then
// scale[s] * B[s] h[p] to out[r], one thread an output feature. A row whose slot is not
// below `slots_n` (u32 max: no adapter) is skipped by both. The slots are read on the
// device, so a captured step replays with other adapters.
//
// Rows are taken in the order the caller lists after the slots (`order`, the rows sorted by
// slot; then `sorted`, the slot at each place of that order, so that a block reads its rows
// and their slots in one round of latency), a tile of LORA_TILE_ROWS at a time, and h is
// stored at a row's place p in that order: the rows of one adapter then sit together, so a
// tile loads each weight of A (a shrink warp) or its B row (an expand thread) once for all
// its rows of that adapter rather than once a row. A row's own arithmetic does not depend on
// its tile, so its result is the same whatever else runs beside it.

#define LORA_WARPS 8
#define LORA_TILE_ROWS 8
#define LORA_MAX_REG_RANK 64
#define LORA_MAX_PARTS 3

// The parts one launch runs, all over the same x: their stacks and outputs (unused entries
// repeat the last part); block_end[i] counts the expand blocks of parts 0..=i. A kernel
// picks its part's entries with `pick`, never by a run-time index, which would copy the
// whole parameter to local memory in every thread.
struct LoraParts {
    const void* a[LORA_MAX_PARTS];
    const void* b[LORA_MAX_PARTS];
    const float* scales[LORA_MAX_PARTS];
    float* out[LORA_MAX_PARTS];
    int out_n[LORA_MAX_PARTS];
    int block_end[LORA_MAX_PARTS];
};

template <typename T>
__device__ __forceinline__ T pick(const T (&v)[LORA_MAX_PARTS], int part) {
    T r = v[0];
#pragma unroll
    for (int i = 1; i < LORA_MAX_PARTS; ++i)
        if (part == i) r = v[i];
    return r;
}

// 8 consecutive weights from element `i` (a multiple of 8) of a stack of `dtype`.
__device__ __forceinline__ void load8(const void* p, int dtype, u64 i, float* v) {
    if (dtype == STRATA_BF16) {
        const uint4 q = *reinterpret_cast<const uint4*>((const u16*)p + i);
        const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[2 * j] = __uint_as_float(w[j] << 16);
            v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    } else {
        const float4 a = *reinterpret_cast<const float4*>((const float*)p + i);
        const float4 b = *reinterpret_cast<const float4*>((const float*)p + i + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
}

// grid (ceil(rows / LORA_TILE_ROWS), parts * ceil(rank / LORA_WARPS), ceil(cols / split)),
// block 32 * LORA_WARPS: a warp sums its part's rank k products over one split of `split`
// columns (a multiple of 8) for the tile's rows into hp[part, z, p, k]; the expand adds the
// splits in order.
extern "C" __global__ void lora_shrink(const float* __restrict__ x, LoraParts parts, int dtype,
                                       const u32* __restrict__ slots, u32 slots_n, int rows,
                                       int rank, int cols, int split, float* __restrict__ hp) {
    const u32* order = slots + rows;
    const u32* sorted = slots + 2 * rows;
    const int p0 = blockIdx.x * LORA_TILE_ROWS;
    const int nr = min(LORA_TILE_ROWS, rows - p0);
    const int kblocks = (rank + LORA_WARPS - 1) / LORA_WARPS;
    const int part = blockIdx.y / kblocks;
    const int k = (blockIdx.y % kblocks) * LORA_WARPS + (threadIdx.x >> 5);
    if (k >= rank) return;
    const void* a = pick(parts.a, part);
    const int lane = threadIdx.x & 31;
    const int c0 = blockIdx.z * split;
    const int c1 = min(cols, c0 + split);
    int rs[LORA_TILE_ROWS];
    u32 ss[LORA_TILE_ROWS];
    bool any = false;
#pragma unroll
    for (int q = 0; q < LORA_TILE_ROWS; ++q) {
        const u32 r = q < nr ? order[p0 + q] : 0xffffffffu;
        const u32 s = q < nr ? sorted[p0 + q] : 0xffffffffu;
        rs[q] = (int)r;
        ss[q] = r < (u32)rows ? s : 0xffffffffu;
        any |= ss[q] < slots_n;
    }
    if (!any) return;
    float acc[LORA_TILE_ROWS];
#pragma unroll
    for (int q = 0; q < LORA_TILE_ROWS; ++q) acc[q] = 0.0f;
    if ((cols & 7) == 0) {
        for (int i = c0 + lane * 8; i < c1; i += 256) {
            float w[8];
            u32 held = 0xffffffffu;
#pragma unroll
            for (int q = 0; q < LORA_TILE_ROWS; ++q) {
                const u32 s = ss[q];
                if (s >= slots_n) continue;
                if (s != held) {
                    load8(a, dtype, ((u64)s * rank + k) * cols + i, w);
                    held = s;
                }
                const float* xr = x + (u64)rs[q] * cols;
                const float4 x0 = *reinterpret_cast<const float4*>(xr + i);
                const float4 x1 = *reinterpret_cast<const float4*>(xr + i + 4);
                acc[q] += w[0] * x0.x + w[1] * x0.y + w[2] * x0.z + w[3] * x0.w;
                acc[q] += w[4] * x1.x + w[5] * x1.y + w[6] * x1.z + w[7] * x1.w;
            }
        }
    } else {
        for (int i = c0 + lane; i < c1; i += 32) {
#pragma unroll
            for (int q = 0; q < LORA_TILE_ROWS; ++q) {
                const u32 s = ss[q];
                if (s >= slots_n) continue;
                acc[q] += load_as_f32(a, dtype, ((u64)s * rank + k) * cols + i) *
                          x[(u64)rs[q] * cols + i];
            }
        }
    }
    float* h = hp + ((u64)part * gridDim.z + blockIdx.z) * rows * rank;
#pragma unroll
    for (int q = 0; q < LORA_TILE_ROWS; ++q) {
        const float v = warp_sum_f32(acc[q]);
        if (lane == 0 && ss[q] < slots_n) h[(u64)(p0 + q) * rank + k] = v;
    }
}

// grid (every part's ceil(out_n / 256), ceil(rows / LORA_TILE_ROWS)), block 256; the tile's
// h of the block's part (its `splits` sums added in order) in shared memory
// (LORA_TILE_ROWS * rank floats).
extern "C" __global__ void lora_expand(const float* __restrict__ hpa, int splits,
                                       LoraParts parts, int dtype,
                                       const u32* __restrict__ slots, u32 slots_n, int rows,
                                       int rank) {
    extern __shared__ float hs[];
    int part = 0;
#pragma unroll
    for (int i = 0; i < LORA_MAX_PARTS - 1; ++i) part += (int)blockIdx.x >= parts.block_end[i];
    const int first = part == 0 ? 0 : pick(parts.block_end, part - 1);
    const void* b = pick(parts.b, part);
    const float* scales = pick(parts.scales, part);
    float* out = pick(parts.out, part);
    const int out_n = pick(parts.out_n, part);
    const float* hp = hpa + (u64)part * splits * rows * rank;
    const u32* order = slots + rows;
    const u32* sorted = slots + 2 * rows;
    const int p0 = blockIdx.y * LORA_TILE_ROWS;
    const int nr = min(LORA_TILE_ROWS, rows - p0);
    u32 rs[LORA_TILE_ROWS], ss[LORA_TILE_ROWS];
    bool any = false;
#pragma unroll
    for (int q = 0; q < LORA_TILE_ROWS; ++q) {
        const u32 r = q < nr ? order[p0 + q] : 0xffffffffu;
        const u32 s = q < nr ? sorted[p0 + q] : 0xffffffffu;
        rs[q] = r;
        ss[q] = r < (u32)rows ? s : 0xffffffffu;
        any |= ss[q] < slots_n;
    }
    if (!any) return;
    // The parts of a value are loaded 8 at once (one round of latency, not one a part) and
    // added in split order.
    for (int i = threadIdx.x; i < nr * rank; i += blockDim.x) {
        float v = 0.0f;
        for (int sp0 = 0; sp0 < splits; sp0 += 8) {
            float part[8];
#pragma unroll
            for (int u = 0; u < 8; ++u)
                part[u] = sp0 + u < splits ? hp[((u64)(sp0 + u) * rows + p0) * rank + i] : 0.0f;
#pragma unroll
            for (int u = 0; u < 8; ++u)
                if (sp0 + u < splits) v += part[u];
        }
        hs[i] = v;
    }
    __syncthreads();
    const int j = ((int)blockIdx.x - first) * blockDim.x + threadIdx.x;
    if (j >= out_n) return;
    const bool regs = rank <= LORA_MAX_REG_RANK && (rank & 7) == 0;
    float bw[LORA_MAX_REG_RANK];
    u32 held = 0xffffffffu;
#pragma unroll
    for (int q = 0; q < LORA_TILE_ROWS; ++q) {
        const u32 r = rs[q], s = ss[q];
        if (s >= slots_n) continue;
        const u64 base = ((u64)s * out_n + j) * rank;
        const float* hr = hs + q * rank;
        float acc = 0.0f;
        if (regs) {
            if (s != held) {
#pragma unroll
                for (int k = 0; k < LORA_MAX_REG_RANK; k += 8)
                    if (k < rank) load8(b, dtype, base + k, bw + k);
                held = s;
            }
#pragma unroll
            for (int k = 0; k < LORA_MAX_REG_RANK; ++k)
                if (k < rank) acc += bw[k] * hr[k];
        } else {
            for (int k = 0; k < rank; ++k) acc += load_as_f32(b, dtype, base + k) * hr[k];
        }
        out[(u64)r * out_n + j] += scales[s] * acc;
    }
}
