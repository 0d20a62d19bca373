// RMSNorm and its fused residual forms, one block per row of `dim` elements.
// The mean of squares is summed in f64 (as the CPU reference does), then
// y = (x * inv_rms) * (w + offset) in f32.

#define NORM_PLAIN 0          // out = norm(x)
#define NORM_ADD_THEN_NORM 1  // residual += x; out = norm(residual)
#define NORM_THEN_ADD 2       // residual = (residual + norm(x)) * post_scale
#define NORM_ADD_NORM 3       // residual += norm(x); out = norm2(residual)

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

// `w_dtype` < 0 means no weight (the scale-free norm). `w2` is the second norm's weight
// (NORM_ADD_NORM only); `post_scale` multiplies the residual after NORM_THEN_ADD's add
// (1.0 leaves it exact).
extern "C" __global__ void rms_norm(const float* x, float* residual, const void* w, int w_dtype,
                                    const void* w2, int w2_dtype, float offset, float* out,
                                    int dim, float eps, int mode, float post_scale) {
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
            const float r = residual[base + i] + y;
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
