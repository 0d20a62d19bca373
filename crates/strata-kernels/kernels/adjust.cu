// Logit adjustments before a draw: per adjusted row, logit_bias, then the penalties, then the
// min_tokens mask (`strata_types::sampling::adjust_logits` is the definition, to the bit).
// One block a row; each list's ids are distinct within a row (checked by the launcher), so
// the threads of a phase touch distinct logits, and the phases are ordered by barriers.
//
// meta holds 7 words a row: the logits row, then [start, end) of its bias, seen and masked
// entries in the flat lists; params holds 3 floats a row: presence, frequency, repetition.
// The arithmetic is rounded operation by operation (no contraction into fused multiply-adds)
// so that it equals the host's f32 expressions.

#define ADJUST_META 7
#define ADJUST_THREADS 256

extern "C" __global__ void adjust_logits(float* logits, u64 vocab, const u32* meta,
                                         const float* params, const u32* bias_ids,
                                         const float* bias, const u32* seen_ids,
                                         const u32* seen_counts, const u32* masked_ids) {
    const u32* m = meta + (u64)blockIdx.x * ADJUST_META;
    float* row = logits + (u64)m[0] * vocab;
    const float presence = params[blockIdx.x * 3];
    const float frequency = params[blockIdx.x * 3 + 1];
    const float repetition = params[blockIdx.x * 3 + 2];
    for (u32 j = m[1] + threadIdx.x; j < m[2]; j += blockDim.x) {
        row[bias_ids[j]] = __fadd_rn(row[bias_ids[j]], bias[j]);
    }
    __syncthreads();
    for (u32 j = m[3] + threadIdx.x; j < m[4]; j += blockDim.x) {
        const u32 count = seen_counts[j];
        const float x = row[seen_ids[j]];
        const float r = x > 0.0f ? __fdiv_rn(x, repetition) : __fmul_rn(x, repetition);
        const float present = count > 0 ? presence : 0.0f;
        row[seen_ids[j]] = __fsub_rn(__fsub_rn(r, __fmul_rn(frequency, (float)count)), present);
    }
    __syncthreads();
    for (u32 j = m[5] + threadIdx.x; j < m[6]; j += blockDim.x) {
        row[masked_ids[j]] = NEG_INF;
    }
}
