// Greedy sampling where the logits are: one block per row finds the largest value, ties to
// the lowest index, NaN counted as -inf (the host sampler's `argmax`), and writes its index.

#define ARGMAX_THREADS 1024

__device__ __forceinline__ bool better(float v, u32 i, float bv, u32 bi) {
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_rows(const float* logits, u32* out, u64 vocab) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ u32 si[ARGMAX_THREADS / 32];
    const float* row = logits + (u64)blockIdx.x * vocab;
    float bv = NEG_INF;
    u32 bi = 0xffffffffu;
    for (u64 i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = row[i];
        if (v != v) v = NEG_INF;
        if (better(v, (u32)i, bv, bi)) {
            bv = v;
            bi = (u32)i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / 32); ++w)
            if (better(sv[w], si[w], bv, bi)) {
                bv = sv[w];
                bi = si[w];
            }
        // Every value -inf (or NaN): index 0, as the host does.
        out[blockIdx.x] = bi == 0xffffffffu ? 0 : bi;
    }
}
