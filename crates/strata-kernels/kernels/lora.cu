// LoRA products by slot (Backend::lora_bgmv), in two passes so that a decode step of one
// row still spreads over many blocks: `lora_shrink` writes h[r, k] = A[s] x[r] (f32), one
// warp a rank k; `lora_expand` adds scale[s] * B[s] h[r] to out[r], one thread an output feature.
// A row whose slot is not below `slots_n` (u32 max: no adapter) is skipped by both. The
// slots are read on the device, so a captured step replays with other adapters.

#define LORA_WARPS 8

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
    for (int i = lane; i < cols; i += 32) acc += load_as_f32(a, dtype, base + i) * xr[i];
    acc = warp_sum_f32(acc);
    if (lane == 0) h[(u64)r * rank + k] = acc;
}

// grid (rows, ceil(out / 256)), block 256; h of the row in shared memory (rank floats).
extern "C" __global__ void lora_expand(const float* __restrict__ h, const void* __restrict__ b,
                                       int dtype, const float* __restrict__ scales,
                                       const u32* __restrict__ slots, u32 slots_n,
                                       int rank, int out_n, float* __restrict__ out) {
    extern __shared__ float hs[];
    const int r = blockIdx.x;
    const u32 s = slots[r];
    if (s >= slots_n) return;
    for (int k = threadIdx.x; k < rank; k += blockDim.x) hs[k] = h[(u64)r * rank + k];
    __syncthreads();
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= out_n) return;
    const u64 base = ((u64)s * out_n + j) * rank;
    float acc = 0.0f;
    for (int k = 0; k < rank; ++k) acc += load_as_f32(b, dtype, base + k) * hs[k];
    out[(u64)r * out_n + j] += scales[s] * acc;
}
