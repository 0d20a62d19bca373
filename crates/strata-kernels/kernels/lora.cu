// LoRA products by slot (Backend::lora_bgmv), in two passes so that a decode step of one
// row still spreads over many blocks: `lora_shrink` writes h[r, k] = A[s] x[r] (f32), one
// warp a rank k; `lora_expand` adds scale[s] * B[s] h[r] to out[r], one thread an output
// feature. A row whose slot is not below `slots_n` (u32 max: no adapter) is skipped by both.
// The slots are read on the device, so a captured step replays with other adapters.
//
// Both are bound by load instructions more than by bytes (the stacks sit in L2 after the
// first rows): the weights are read 8 values a load where the shapes allow (`cols` and
// `rank` multiples of 8), and an expand thread keeps its B row in registers across the
// rows of its block that share a slot.

#define LORA_WARPS 8
#define LORA_EXPAND_ROWS 8
#define LORA_MAX_REG_RANK 64

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

// grid (rows, ceil(rank / LORA_WARPS)), block 32 * LORA_WARPS.
extern "C" __global__ void lora_shrink(const float* __restrict__ x, const void* __restrict__ a,
                                       int dtype, const u32* __restrict__ slots, u32 slots_n,
                                       int rank, int cols, float* __restrict__ h) {
    const int r = blockIdx.x;
    const u32 s = slots[r];
    if (s >= slots_n) return;
    const int k = blockIdx.y * LORA_WARPS + (threadIdx.x >> 5);
    if (k >= rank) return;
    const int lane = threadIdx.x & 31;
    const float* xr = x + (u64)r * cols;
    const u64 base = ((u64)s * rank + k) * cols;
    float acc = 0.0f;
    if ((cols & 7) == 0) {
        for (int i = lane * 8; i < cols; i += 256) {
            float w[8];
            load8(a, dtype, base + i, w);
            const float4 x0 = *reinterpret_cast<const float4*>(xr + i);
            const float4 x1 = *reinterpret_cast<const float4*>(xr + i + 4);
            acc += w[0] * x0.x + w[1] * x0.y + w[2] * x0.z + w[3] * x0.w;
            acc += w[4] * x1.x + w[5] * x1.y + w[6] * x1.z + w[7] * x1.w;
        }
    } else {
        for (int i = lane; i < cols; i += 32) acc += load_as_f32(a, dtype, base + i) * xr[i];
    }
    acc = warp_sum_f32(acc);
    if (lane == 0) h[(u64)r * rank + k] = acc;
}

// grid (ceil(out / 256), ceil(rows / LORA_EXPAND_ROWS)), block 256; the block's rows' h in
// shared memory (LORA_EXPAND_ROWS * rank floats).
extern "C" __global__ void lora_expand(const float* __restrict__ h, const void* __restrict__ b,
                                       int dtype, const float* __restrict__ scales,
                                       const u32* __restrict__ slots, u32 slots_n, int rows,
                                       int rank, int out_n, float* __restrict__ out) {
    extern __shared__ float hs[];
    const int r0 = blockIdx.y * LORA_EXPAND_ROWS;
    const int nr = min(LORA_EXPAND_ROWS, rows - r0);
    for (int i = threadIdx.x; i < nr * rank; i += blockDim.x) hs[i] = h[(u64)r0 * rank + i];
    __syncthreads();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= out_n) return;
    const bool regs = rank <= LORA_MAX_REG_RANK && (rank & 7) == 0;
    float bw[LORA_MAX_REG_RANK];
    u32 held = 0xffffffffu;
    for (int q = 0; q < nr; ++q) {
        const u32 s = slots[r0 + q];
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
        out[(u64)(r0 + q) * out_n + j] += scales[s] * acc;
    }
}
