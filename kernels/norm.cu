// RMSNorm and its fused residual forms, one block per row of `dim` elements.
// The mean of squares is summed in f64 (as the CPU reference does), then
// y = (x * inv_rms) * (w + offset) in f32.

#define NORM_PLAIN 0          // out = norm(x)
#define NORM_ADD_THEN_NORM 1  // residual += x; out = norm(residual)
#define NORM_THEN_ADD 2       // residual = (residual + norm(x)) * post_scale
#define NORM_ADD_NORM 3       // residual = (residual + norm(x)) * post_scale; out = norm2(residual)

__device__ double block_sum_f64(double v) {
    __shared__ double partial[32];
    __shared__ double total;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum_f64(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double s = lane < (int)(blockDim.x / 32) ? partial[lane] : 0.0;
        s = warp_sum_f64(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

// Rows of up to NORM_REG values per thread keep x, the weights and the residual in
// registers, loaded before the reduction so their latencies overlap; longer rows take the
// strided loops of rms_norm_long. Both give the same bits (same per-thread summation order).
#define NORM_REG 8

// Weights widened to f32 once per element: a bf16 / f16 / f32 load chosen per call, not
// per element (keeps the unrolled loops free of the dtype switch).
__device__ __forceinline__ float load_weight(const void* p, int dtype, int i) {
    if (dtype == STRATA_F32) return ((const float*)p)[i];
    const u16 h = ((const u16*)p)[i];
    return dtype == STRATA_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

template <int mode>
__device__ __forceinline__ void rms_norm_regs(const float* x, float* residual, const void* w,
                                              int w_dtype, const void* w2, int w2_dtype,
                                              float offset, float* out, int dim, float eps,
                                              float post_scale) {
    const u64 base = (u64)blockIdx.x * dim;
    float xv[NORM_REG], wv[NORM_REG], w2v[NORM_REG], rv[NORM_REG];
    double ss = 0.0;
#pragma unroll
    for (int r = 0; r < NORM_REG; ++r) {
        const int i = threadIdx.x + r * blockDim.x;
        xv[r] = 0.0f;
        wv[r] = 1.0f;
        w2v[r] = 1.0f;
        rv[r] = 0.0f;
        if (i < dim) {
            float v = x[base + i];
            if (mode == NORM_ADD_THEN_NORM) {
                v = residual[base + i] + v;
                residual[base + i] = v;
            } else if (mode == NORM_THEN_ADD || mode == NORM_ADD_NORM) {
                rv[r] = residual[base + i];
            }
            if (w_dtype >= 0) wv[r] = load_weight(w, w_dtype, i) + offset;
            if (mode == NORM_ADD_NORM && w2_dtype >= 0) w2v[r] = load_weight(w2, w2_dtype, i) + offset;
            xv[r] = v;
            ss += (double)v * (double)v;
        }
    }
    ss = block_sum_f64(ss);
    const float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
    double ss2 = 0.0;
#pragma unroll
    for (int r = 0; r < NORM_REG; ++r) {
        const int i = threadIdx.x + r * blockDim.x;
        if (i < dim) {
            float y = xv[r] * inv;
            if (w_dtype >= 0) y = y * wv[r];
            if (mode == NORM_THEN_ADD) {
                residual[base + i] = (rv[r] + y) * post_scale;
            } else if (mode == NORM_ADD_NORM) {
                rv[r] = (rv[r] + y) * post_scale;
                residual[base + i] = rv[r];
                ss2 += (double)rv[r] * (double)rv[r];
            } else {
                out[base + i] = y;
            }
        }
    }
    if (mode != NORM_ADD_NORM) return;
    ss2 = block_sum_f64(ss2);
    const float inv2 = (float)(1.0 / sqrt(ss2 / dim + (double)eps));
#pragma unroll
    for (int r = 0; r < NORM_REG; ++r) {
        const int i = threadIdx.x + r * blockDim.x;
        if (i < dim) {
            float y = rv[r] * inv2;
            if (w2_dtype >= 0) y = y * w2v[r];
            out[base + i] = y;
        }
    }
}

// `w_dtype` < 0 means no weight (the scale-free norm). `w2` is the second norm's weight
// (NORM_ADD_NORM only); `post_scale` multiplies the residual after the add of NORM_THEN_ADD
// and NORM_ADD_NORM (1.0 leaves it exact).
__device__ void rms_norm_long(const float* x, float* residual, const void* w, int w_dtype,
                              const void* w2, int w2_dtype, float offset, float* out, int dim,
                              float eps, int mode, float post_scale) {
    const u64 base = (u64)blockIdx.x * dim;
    double ss = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = x[base + i];
        if (mode == NORM_ADD_THEN_NORM) {
            v = residual[base + i] + v;
            residual[base + i] = v;  // read back below by this same thread
        }
        ss += (double)v * (double)v;
    }
    ss = block_sum_f64(ss);
    const float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
    double ss2 = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = mode == NORM_ADD_THEN_NORM ? residual[base + i] : x[base + i];
        float y = v * inv;
        if (w_dtype >= 0) y = y * (load_as_f32(w, w_dtype, i) + offset);
        if (mode == NORM_THEN_ADD) {
            residual[base + i] = (residual[base + i] + y) * post_scale;
        } else if (mode == NORM_ADD_NORM) {
            const float r = (residual[base + i] + y) * post_scale;
            residual[base + i] = r;  // read back below by this same thread
            ss2 += (double)r * (double)r;
        } else {
            out[base + i] = y;
        }
    }
    if (mode != NORM_ADD_NORM) return;
    ss2 = block_sum_f64(ss2);
    const float inv2 = (float)(1.0 / sqrt(ss2 / dim + (double)eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float y = residual[base + i] * inv2;
        if (w2_dtype >= 0) y = y * (load_as_f32(w2, w2_dtype, i) + offset);
        out[base + i] = y;
    }
}

extern "C" __global__ void rms_norm(const float* x, float* residual, const void* w, int w_dtype,
                                    const void* w2, int w2_dtype, float offset, float* out,
                                    int dim, float eps, int mode, float post_scale) {
    if (dim <= (int)blockDim.x * NORM_REG) {
#define NORM_REGS_CASE(M)                                                                 \
    case M:                                                                               \
        rms_norm_regs<M>(x, residual, w, w_dtype, w2, w2_dtype, offset, out, dim, eps,   \
                         post_scale);                                                     \
        break;
        switch (mode) {
            NORM_REGS_CASE(NORM_PLAIN)
            NORM_REGS_CASE(NORM_ADD_THEN_NORM)
            NORM_REGS_CASE(NORM_THEN_ADD)
            NORM_REGS_CASE(NORM_ADD_NORM)
        }
#undef NORM_REGS_CASE
    } else {
        rms_norm_long(x, residual, w, w_dtype, w2, w2_dtype, offset, out, dim, eps, mode,
                      post_scale);
    }
}
