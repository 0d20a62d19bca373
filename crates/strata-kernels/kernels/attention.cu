// Attention over explicitly positioned keys (prefill, extend and decode alike).
//
// One block per (query token, head); each of the block's warps walks a strided subset of
// the keys with its own online softmax (running max, running sum, f32 accumulator of
// head_dim / 32 values per lane), and the warps' partial results are merged at the end.
// Key s is visible to a query at q_pos iff (!causal || k_pos <= q_pos) and
// (window < 0 || q_pos - k_pos < window). A query that sees no key gets zeros.
// head_dim <= ATTN_MAX_D; query head h reads KV head h / (n_heads / n_kv_heads).

#define ATTN_MAX_D 512
#define ATTN_WARPS 4
#define ATTN_PER_LANE (ATTN_MAX_D / 32)

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
attention(const float* q, const float* k, const float* v, const u32* q_pos, const u32* k_pos,
          float* out, int n_keys, int n_heads, int n_kv_heads, int head_dim, float scale,
          long long window, int causal, int has_softcap, float softcap) {
    __shared__ float q_row[ATTN_MAX_D];
    __shared__ float warp_max[ATTN_WARPS];
    __shared__ float warp_sum[ATTN_WARPS];
    __shared__ float warp_acc[ATTN_WARPS][ATTN_MAX_D];

    const int d = head_dim;
    const u64 t = blockIdx.x / n_heads;
    const int h = blockIdx.x % n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    const float* qsrc = q + (t * n_heads + h) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) q_row[i] = qsrc[i];
    __syncthreads();

    const long long qp = q_pos[t];
    float m = NEG_INF, l = 0.0f;
    float acc[ATTN_PER_LANE];
#pragma unroll
    for (int j = 0; j < ATTN_PER_LANE; ++j) acc[j] = 0.0f;

    for (int s = warp; s < n_keys; s += ATTN_WARPS) {
        const long long behind = qp - (long long)k_pos[s];
        if (causal && behind < 0) continue;
        if (window >= 0 && behind >= window) continue;
        const u64 kv_row = ((u64)s * n_kv_heads + kvh) * d;
        float dot = 0.0f;
        for (int i = lane; i < d; i += 32) dot += q_row[i] * k[kv_row + i];
        dot = warp_sum_f32(dot);
        float score = dot * scale;
        if (has_softcap) score = softcap * tanhf(score / softcap);
        const float m_new = fmaxf(m, score);
        const float correction = expf(m - m_new);  // 0 on the first visible key
        const float p = expf(score - m_new);
        l = l * correction + p;
#pragma unroll
        for (int j = 0; j < ATTN_PER_LANE; ++j) {
            const int i = lane + 32 * j;
            if (i < d) acc[j] = acc[j] * correction + p * v[kv_row + i];
        }
        m = m_new;
    }

    if (lane == 0) {
        warp_max[warp] = m;
        warp_sum[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < ATTN_PER_LANE; ++j) {
        const int i = lane + 32 * j;
        if (i < d) warp_acc[warp][i] = acc[j];
    }
    __syncthreads();

    float global_max = NEG_INF;
    for (int w = 0; w < ATTN_WARPS; ++w)
        if (warp_sum[w] > 0.0f) global_max = fmaxf(global_max, warp_max[w]);
    float total = 0.0f;
    float weight[ATTN_WARPS];
    for (int w = 0; w < ATTN_WARPS; ++w) {
        weight[w] = warp_sum[w] > 0.0f ? expf(warp_max[w] - global_max) : 0.0f;
        total += warp_sum[w] * weight[w];
    }
    float* dst = out + (t * n_heads + h) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATTN_WARPS; ++w) o += warp_acc[w][i] * weight[w];
        dst[i] = total > 0.0f ? o / total : 0.0f;
    }
}

// The same attention for many queries at head_dim <= TILE_D (an encoder's bidirectional
// layers, prefill of small-head models): one block per TILE_Q queries of one head, one
// thread per query with its q row and output accumulator in registers. Each tile of TILE_K
// keys and values goes through shared memory once for all the block's queries, where the
// kernel above reads every key from global memory once per query and reduces each score
// across a warp. Positions, masks, softcap and the zero output of a query that sees no key
// follow the kernel above.
#define TILE_Q 64
#define TILE_K 64
#define TILE_D 64

extern "C" __global__ void __launch_bounds__(TILE_Q)
attention_tiled(const float* q, const float* k, const float* v, const u32* q_pos,
                const u32* k_pos, float* out, int n_queries, int n_keys, int n_heads,
                int n_kv_heads, int head_dim, float scale, long long window, int causal,
                int has_softcap, float softcap) {
    __shared__ float ks[TILE_K][TILE_D];
    __shared__ float vs[TILE_K][TILE_D];
    __shared__ long long kp[TILE_K];

    const int d = head_dim;
    const int h = blockIdx.y;
    const int kvh = h / (n_heads / n_kv_heads);
    const long long t = (long long)blockIdx.x * TILE_Q + threadIdx.x;
    const bool live = t < n_queries;

    // Values past head_dim are zeros in q, k and v, so they add nothing to a score.
    float qr[TILE_D], acc[TILE_D];
#pragma unroll
    for (int i = 0; i < TILE_D; ++i) {
        qr[i] = (live && i < d) ? q[((u64)t * n_heads + h) * d + i] : 0.0f;
        acc[i] = 0.0f;
    }
    const long long qp = live ? (long long)q_pos[t] : 0;
    float m = NEG_INF, l = 0.0f;

    for (int s0 = 0; s0 < n_keys; s0 += TILE_K) {
        const int tile = min(TILE_K, n_keys - s0);
        __syncthreads();
        for (int e = threadIdx.x; e < tile * TILE_D; e += TILE_Q) {
            const int r = e / TILE_D, i = e % TILE_D;
            const u64 row = ((u64)(s0 + r) * n_kv_heads + kvh) * d;
            ks[r][i] = i < d ? k[row + i] : 0.0f;
            vs[r][i] = i < d ? v[row + i] : 0.0f;
        }
        if (threadIdx.x < tile) kp[threadIdx.x] = (long long)k_pos[s0 + threadIdx.x];
        __syncthreads();
        if (!live) continue;
        for (int r = 0; r < tile; ++r) {
            const long long behind = qp - kp[r];
            if (causal && behind < 0) continue;
            if (window >= 0 && behind >= window) continue;
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < TILE_D; ++i) dot += qr[i] * ks[r][i];
            float score = dot * scale;
            if (has_softcap) score = softcap * tanhf(score / softcap);
            if (score > m) {
                const float correction = expf(m - score);  // 0 on the first visible key
                l *= correction;
#pragma unroll
                for (int i = 0; i < TILE_D; ++i) acc[i] *= correction;
                m = score;
            }
            const float p = expf(score - m);
            l += p;
#pragma unroll
            for (int i = 0; i < TILE_D; ++i) acc[i] += p * vs[r][i];
        }
    }
    if (!live) return;
    float* dst = out + ((u64)t * n_heads + h) * d;
#pragma unroll
    for (int i = 0; i < TILE_D; ++i)
        if (i < d) dst[i] = l > 0.0f ? acc[i] / l : 0.0f;
}
