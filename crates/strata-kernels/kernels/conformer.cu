// The ops of Gemma-4's audio conformer that no text model has (the CPU's
// `cpu/conformer.rs` is the definition): a clamp, the light convolution's causal depthwise
// filter and chunked local attention with relative positions. All f32.

// x = clamp(x, lo, hi), NaN kept (f32::clamp's rule, not fminf/fmaxf's).
extern "C" __global__ void clamp_f32(float* x, u64 n, float lo, float hi) {
    FOR_EACH_INDEX(i, n) {
        const float v = x[i];
        x[i] = v < lo ? lo : (v > hi ? hi : v);
    }
}

// out[t, c] = sum_j w[c, j] x[t - K + 1 + j, c], frames before the first reading zero; one
// thread an output, taps in order.
extern "C" __global__ void depthwise_conv1d_causal_f32(const float* __restrict__ x,
                                                       const float* __restrict__ w,
                                                       float* __restrict__ out, u64 frames,
                                                       int channels, int kernel) {
    FOR_EACH_INDEX(i, frames * (u64)channels) {
        const long long t = (long long)(i / channels);
        const int c = (int)(i % channels);
        float acc = 0.0f;
        for (int j = 0; j < kernel; ++j) {
            const long long src = t + j - (kernel - 1);
            if (src >= 0) acc += w[(u64)c * kernel + j] * x[(u64)src * channels + c];
        }
        out[i] = acc;
    }
}

#define CHUNKED_MAX_CONTEXT 256

// `a . b` over `d` values, summed by the warp (every lane gets it).
__device__ __forceinline__ float warp_dot(const float* a, const float* b, int d) {
    float s = 0.0f;
    for (int e = threadIdx.x & 31; e < d; e += 32) s += a[e] * b[e];
    return warp_sum_f32(s);
}

// One block a (frame i, head): the logits of the block's `context` frames (a warp a
// frame at a time), softmax in frame order by one thread, then the weighted sum of the
// values, a thread a dimension. `left` and `right` as ChunkedAttentionParams.
extern "C" __global__ void chunked_attention_f32(const float* __restrict__ q,
                                                 const float* __restrict__ k,
                                                 const float* __restrict__ v,
                                                 const float* __restrict__ rel_k,
                                                 float* __restrict__ out, int frames, int heads,
                                                 int d, int chunk, int left, int right,
                                                 float cap, float invalid) {
    __shared__ float logits[CHUNKED_MAX_CONTEXT];
    __shared__ float total_s;
    const int i = blockIdx.x, hd = blockIdx.y;
    const int h = heads * d;
    const int ctx = chunk + left - 1 + right, positions = ctx / 2 + 1, past = left - 1;
    const int b = i / chunk, u = i % chunk;
    const float* qi = q + (u64)i * h + (u64)hd * d;
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int c = warp; c < ctx; c += warps) {
        const int j = b * chunk + c - past;
        const bool inside = j >= 0 && j < frames;
        const float ac = inside ? warp_dot(qi, k + (u64)j * h + (u64)hd * d, d) : 0.0f;
        // transformers' relative shift: the block's [chunk, positions] scores padded to
        // rows of ctx + 1, read as rows of ctx.
        const int flat = u * ctx + c;
        const int row = flat / (ctx + 1), col = flat % (ctx + 1);
        const int qr = b * chunk + row;
        float rel = 0.0f;
        if (col < positions && qr < frames)
            rel = warp_dot(q + (u64)qr * h + (u64)hd * d, rel_k + (u64)col * h + (u64)hd * d, d);
        float s = tanhf((ac + rel) / cap) * cap;
        const int dist = i - j;
        const bool seen = (dist >= 0 && dist < past) || (dist < 0 && -dist < right);
        if (!(inside && seen)) s = invalid;
        if ((threadIdx.x & 31) == 0) logits[c] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = NEG_INF;
        for (int c = 0; c < ctx; ++c) m = fmaxf(m, logits[c]);
        float t = 0.0f;
        for (int c = 0; c < ctx; ++c) {
            const float e = expf(logits[c] - m);
            logits[c] = e;
            t += e;
        }
        total_s = t;
    }
    __syncthreads();
    const float total = total_s;
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float o = 0.0f;
        for (int c = 0; c < ctx; ++c) {
            const int j = b * chunk + c - past;
            const float s = logits[c];
            if (s == 0.0f || j < 0 || j >= frames) continue;
            o += (s / total) * v[(u64)j * h + (u64)hd * d + e];
        }
        out[(u64)i * h + (u64)hd * d + e] = o;
    }
}
