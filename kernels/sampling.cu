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

// Grid (rows, parts): block (r, p) takes every gridDim.y-th stretch of row r and folds its
// best key into keys[r] (zeroed by the launcher) with one atomicMax, so a single row
// spreads over many multiprocessors. The index is ~key's low half (every value -inf or NaN:
// index 0, as the host does, since ties go to the lowest index).
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_rows(const float* logits, unsigned long long* keys, u64 vocab, int has_cap, float cap) {
    __shared__ u64 warp_best[ARGMAX_THREADS / 32];
    const float* row = logits + (u64)blockIdx.x * vocab;
    u64 best = 0;
    const u64 stride = (u64)gridDim.y * blockDim.x;
    for (u64 i = (u64)blockIdx.y * blockDim.x + threadIdx.x; i < vocab; i += stride) {
        const float v = has_cap ? cap * tanhf(row[i] / cap) : row[i];
        const u64 k = argmax_key(v, (u32)i);
        best = k > best ? k : best;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const u64 other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (warp == 0) {
        best = lane < (int)(blockDim.x / 32) ? warp_best[lane] : 0;
        for (int o = 16; o > 0; o >>= 1) {
            const u64 other = __shfl_xor_sync(0xffffffffu, best, o);
            best = other > best ? other : best;
        }
        if (lane == 0) atomicMax(keys + blockIdx.x, (unsigned long long)best);
    }
}
