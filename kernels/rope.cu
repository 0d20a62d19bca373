// RoPE in place on x [tokens, n_heads, head_dim]: one thread per rotated pair.
// Angle = (f32)pos * inv_freq in f32, precise sincosf (no fast math), as the CPU does.
// A zero frequency leaves its pair untouched (exact pass-through for partial RoPE).

extern "C" __global__ void rope(float* x, const u32* positions, const float* inv_freq,
                                int tokens, int n_heads, int head_dim, int interleaved) {
    const int half = head_dim / 2;
    const u64 pairs = (u64)tokens * n_heads * half;
    FOR_EACH_INDEX(idx, pairs) {
        const int i = (int)(idx % half);
        const u64 row = idx / half;  // token * n_heads + head
        const float f = inv_freq[i];
        if (f == 0.0f) continue;
        const u32 t = (u32)(row / n_heads);
        const float angle = (float)positions[t] * f;
        float s, c;
        sincosf(angle, &s, &c);
        const u64 base = row * head_dim;
        const u64 ia = interleaved ? base + 2 * i : base + i;
        const u64 ib = interleaved ? base + 2 * i + 1 : base + i + half;
        const float a = x[ia], b = x[ib];
        x[ia] = a * c - b * s;
        x[ib] = b * c + a * s;
    }
}

// A per-head RMSNorm then RoPE, in place on x [tokens, n_heads, head_dim] (Gemma's q/k
// norms before the rotation): one warp per (token, head) instead of a norm kernel and a
// rope kernel. The norm is rms_norm's (f64 sum of squares, then f32), the rotation rope's.
// Up to three tensors of one layer in one launch, one per blockIdx.y (q and k rotated, v
// only normed); the launcher's `HeadSegs` has this layout.
struct HeadSegs {
    float* x[3];
    const void* w[3];
    int w_dtype[3];  // < 0: no weight (the scale-free norm)
    int n_heads[3];
    int rope[3];     // 0: the norm only
};

// The row in registers (head_dim a multiple of 64, at most 512): element lane + 32 j in
// v[j]. Everything that does not depend on x (the weight, the position, the frequencies)
// is requested before x, so the loads overlap; a NeoX pair (i, i + half) sits in one lane,
// an interleaved pair (2i, 2i + 1) in lanes lane and lane ^ 1. Same operations, in the same
// order, as the general path below, so the same bits.
#define HNR_MAX_PER_LANE 16

__device__ __forceinline__ void head_norm_rope_regs(float* xr, const void* w, int w_dtype,
                                                    bool rope, float pos,
                                                    const float* inv_freq, float offset,
                                                    float eps, int head_dim, int interleaved) {
    const int lane = threadIdx.x & 31;
    const int per = head_dim >> 5;
    const int half = head_dim >> 1;
    float wv[HNR_MAX_PER_LANE], f[HNR_MAX_PER_LANE], v[HNR_MAX_PER_LANE];
#pragma unroll
    for (int j = 0; j < HNR_MAX_PER_LANE; ++j) {
        if (j >= per) break;
        const int e = lane + 32 * j;
        wv[j] = w_dtype >= 0 ? load_as_f32(w, w_dtype, e) + offset : 1.0f;
        f[j] = rope ? inv_freq[interleaved ? e >> 1 : (e < half ? e : e - half)] : 0.0f;
        v[j] = xr[e];
    }
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < HNR_MAX_PER_LANE; ++j)
        if (j < per) ss += (double)v[j] * (double)v[j];
    ss = warp_sum_f64(ss);
    const float inv = (float)(1.0 / sqrt(ss / head_dim + (double)eps));
#pragma unroll
    for (int j = 0; j < HNR_MAX_PER_LANE; ++j) {
        if (j >= per) break;
        float y = v[j] * inv;
        if (w_dtype >= 0) y = y * wv[j];
        v[j] = y;
    }
    if (rope && interleaved) {
#pragma unroll
        for (int j = 0; j < HNR_MAX_PER_LANE; ++j) {
            if (j >= per) break;
            const float other = __shfl_xor_sync(0xffffffffu, v[j], 1);
            if (f[j] == 0.0f) continue;
            float sn, cs;
            sincosf(pos * f[j], &sn, &cs);
            // Even lanes hold a (a c - b s), odd lanes b (b c + a s).
            v[j] = (lane & 1) ? v[j] * cs + other * sn : v[j] * cs - other * sn;
        }
    } else if (rope) {
#pragma unroll
        for (int j = 0; j < HNR_MAX_PER_LANE / 2; ++j) {
            if (j >= per / 2) break;
            if (f[j] == 0.0f) continue;
            float sn, cs;
            sincosf(pos * f[j], &sn, &cs);
            const float a = v[j], b = v[j + per / 2];
            v[j] = a * cs - b * sn;
            v[j + per / 2] = b * cs + a * sn;
        }
    }
#pragma unroll
    for (int j = 0; j < HNR_MAX_PER_LANE; ++j)
        if (j < per) xr[lane + 32 * j] = v[j];
}

extern "C" __global__ void head_norm_rope(HeadSegs segs, const u32* positions,
                                          const float* inv_freq, float offset, float eps,
                                          int tokens, int head_dim, int interleaved) {
    const int seg = blockIdx.y;
    const int n_heads = pick3(segs.n_heads, seg);
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= tokens * n_heads) return;
    const void* w = pick3(segs.w, seg);
    const int w_dtype = pick3(segs.w_dtype, seg);
    float* xr = pick3(segs.x, seg) + (u64)row * head_dim;
    const bool rope = pick3(segs.rope, seg);
    if (head_dim % 64 == 0 && head_dim <= 32 * HNR_MAX_PER_LANE) {
        const float pos = rope ? (float)positions[row / n_heads] : 0.0f;
        head_norm_rope_regs(xr, w, w_dtype, rope, pos, inv_freq, offset, eps, head_dim,
                            interleaved);
        return;
    }
    double ss = 0.0;
    for (int i = lane; i < head_dim; i += 32) {
        const float v = xr[i];
        ss += (double)v * (double)v;
    }
    ss = warp_sum_f64(ss);
    const float inv = (float)(1.0 / sqrt(ss / head_dim + (double)eps));
    for (int i = lane; i < head_dim; i += 32) {
        float y = xr[i] * inv;
        if (w_dtype >= 0) y = y * (load_as_f32(w, w_dtype, i) + offset);
        xr[i] = y;
    }
    if (!rope) return;
    __syncwarp();  // the rotation pairs elements written by other lanes
    const int half = head_dim / 2;
    const float pos = (float)positions[row / n_heads];
    for (int i = lane; i < half; i += 32) {
        const float f = inv_freq[i];
        if (f == 0.0f) continue;
        float s, c;
        sincosf(pos * f, &s, &c);
        const int ia = interleaved ? 2 * i : i;
        const int ib = interleaved ? 2 * i + 1 : i + half;
        const float a = xr[ia], b = xr[ib];
        xr[ia] = a * c - b * s;
        xr[ib] = b * c + a * s;
    }
}
