// Logit adjustments before a draw: per adjusted row, logit_bias, then the penalties, then the
// min_tokens mask (`strata_types::sampling::adjust_logits` is the definition, to the bit).
// One block a row; each list's ids are distinct within a row (checked by the launcher), so
// the threads of a phase touch distinct logits, and the phases are ordered by barriers.
//
// meta holds 9 words a row: the logits row, then [start, end) of its bias, seen, masked and
// pending entries in the flat lists; params holds 3 floats a row: presence, frequency,
// repetition. A pending entry is one more completion occurrence of an id, or of the token
// of row r of an earlier step's picks (`FED_TOKEN | r`, read from its argmax keys as
// feed_tokens reads them): the overlapped step after it is queued before the host knows it.
// The arithmetic is rounded operation by operation (no contraction into fused multiply-adds)
// so that it equals the host's f32 expressions.

#define ADJUST_META 9
#define ADJUST_THREADS 256
#define ADJUST_FED 0x80000000u

__device__ __forceinline__ u32 adjust_resolve(u32 id, const unsigned long long* keys, u32 rows) {
    if (!(id & ADJUST_FED)) return id;
    const u32 r = id & ~ADJUST_FED;
    return r < rows ? 0xffffffffu - (u32)keys[r] : 0u;
}

__device__ __forceinline__ float adjust_penalised(float x, u32 count, float presence,
                                                  float frequency, float repetition) {
    const float r = x > 0.0f ? __fdiv_rn(x, repetition) : __fmul_rn(x, repetition);
    const float present = count > 0 ? presence : 0.0f;
    return __fsub_rn(__fsub_rn(r, __fmul_rn(frequency, (float)count)), present);
}

extern "C" __global__ void adjust_logits(float* logits, u64 vocab, const u32* meta,
                                         const float* params, const u32* bias_ids,
                                         const float* bias, const u32* seen_ids,
                                         const u32* seen_counts, const u32* masked_ids,
                                         const u32* pending, const unsigned long long* keys,
                                         u32 key_rows) {
    const u32* m = meta + (u64)blockIdx.x * ADJUST_META;
    float* row = logits + (u64)m[0] * vocab;
    const float presence = params[blockIdx.x * 3];
    const float frequency = params[blockIdx.x * 3 + 1];
    const float repetition = params[blockIdx.x * 3 + 2];
    for (u32 j = m[1] + threadIdx.x; j < m[2]; j += blockDim.x) {
        row[bias_ids[j]] = __fadd_rn(row[bias_ids[j]], bias[j]);
    }
    __syncthreads();
    // Pending tokens count only with a penalty on (the host's `RowAdjust::resolved`).
    const bool penalises = presence != 0.0f || frequency != 0.0f || repetition != 1.0f;
    const u32 p0 = m[7], p1 = penalises ? m[8] : m[7];
    for (u32 j = m[3] + threadIdx.x; j < m[4]; j += blockDim.x) {
        const u32 id = seen_ids[j];
        u32 count = seen_counts[j];
        for (u32 k = p0; k < p1; k++) count += adjust_resolve(pending[k], keys, key_rows) == id;
        row[id] = adjust_penalised(row[id], count, presence, frequency, repetition);
    }
    // A pending id not in `seen`: its first entry penalises it by its count among them. The
    // ids differ from every seen one, so this touches other logits than the loop above.
    for (u32 i = p0 + threadIdx.x; i < p1; i += blockDim.x) {
        const u32 id = adjust_resolve(pending[i], keys, key_rows);
        bool first = true;
        u32 count = 0;
        for (u32 k = p0; k < p1; k++) {
            const bool same = adjust_resolve(pending[k], keys, key_rows) == id;
            first = first && !(same && k < i);
            count += same;
        }
        for (u32 j = m[3]; first && j < m[4]; j++) first = seen_ids[j] != id;
        if (first) row[id] = adjust_penalised(row[id], count, presence, frequency, repetition);
    }
    __syncthreads();
    for (u32 j = m[5] + threadIdx.x; j < m[6]; j += blockDim.x) {
        row[masked_ids[j]] = NEG_INF;
    }
}

// A grammar's mask: every logit whose bit is clear set to -inf. One block a row; row r's
// bits are words [r * words, (r + 1) * words) of `bits`, and ids past them are disallowed.
extern "C" __global__ void mask_logits(float* logits, u64 vocab, const u32* rows, const u32* bits,
                                       u32 words) {
    float* row = logits + (u64)rows[blockIdx.x] * vocab;
    const u32* w = bits + (u64)blockIdx.x * words;
    for (u64 t = threadIdx.x; t < vocab; t += blockDim.x) {
        const bool allowed = t / 32 < words && ((w[t / 32] >> (t % 32)) & 1u);
        if (!allowed) row[t] = NEG_INF;
    }
}
