// RMSNorm and its fused residual forms, one block per row of `dim` elements.
// The mean of squares is summed in f64 (as the CPU reference does), then
// y = (x * inv_rms) * (w + offset) in f32, each product and sum rounded on its own
// (__fmul_rn / __fadd_rn: no FMA contraction, so the f32 steps match the CPU path).
//
// Design: at decode (one to a few hundred rows) a call is latency-bound, not
// bandwidth-bound: one block per row, and the time is one chain of load -> square-sum ->
// block reduction -> rsqrt -> scale -> store. So the kernel keeps that chain short and the
// instruction count low:
// - one entry point per mode (rms_norm_plain, rms_norm_add_then_norm, rms_norm_then_add,
//   rms_norm_add_norm), each compiled for its own register count; the weight dtype
//   (none / f32 / bf16 / f16) is a template parameter chosen by one switch per call;
// - rows with dim % 4 == 0 and at most NORM_VEC float4 chunks per thread (dim <= 8192 at
//   1024 threads) go through 16-byte loads and stores (8-byte loads of four 16-bit
//   weights), all issued before the reduction and kept in registers;
// - the block reduction has one barrier: warps reduce with shuffles, lane 0 writes the
//   warp's partial to shared memory, and after __syncthreads every thread sums the (<= 32)
//   partials itself in a fixed order, so all threads hold the identical total without a
//   broadcast. NORM_ADD_NORM's second reduction uses a second array, so the first one's
//   reads need no barrier before it;
// - inv_rms = (float)rsqrt(ss * (1/dim) + eps) in f64 (1/dim computed once, off the
//   dependency chain; the multiply-add may fuse into one f64 fma, no f64 division or sqrt
//   on the chain). This can differ from the CPU reference's
//   (float)(1 / sqrt(ss / dim + eps)) by at most one f32 ulp (both f64 forms are within
//   about an f64 ulp, so only a value within that distance of an f32 rounding boundary
//   rounds differently); the conformance tolerances cover it.
// Other rows (dim % 4 != 0, rows too long for the registers, or a buffer not 16-byte
// aligned) take rms_norm_strided: scalar strided loops that re-read x / the residual from
// cache, with the same reductions; correct for any dim.
// `parts` > 1: x is [rows, parts, dim], a row's input the sum of its parts in order
// (((x0 + x1) + x2) + x3 in f32, as the CPU adds them): a product split over k whose
// reader adds the parts instead of a reduction launch (`k_parts.rs`). The vector path
// takes up to NORM_MAX_PARTS on the `_parts` entry points, issuing every part's loads
// before the adds; the general entries take any count on the strided path.
// `out_b`, when not null, receives a bf16 copy of the kernel's result (`out`, or the
// residual for NORM_THEN_ADD): the twin the next bf16 GEMM reads instead of narrowing.
// Launch contract (crates/strata-kernels/src/cuda/ops.rs `norm_threads`): grid = rows,
// blockDim.x a multiple of 32, at most 1024.

#define NORM_PLAIN 0          // out = norm(x)
#define NORM_ADD_THEN_NORM 1  // residual += x; out = norm(residual)
#define NORM_THEN_ADD 2       // residual = (residual + norm(x)) * post_scale
#define NORM_ADD_NORM 3       // residual = (residual + norm(x)) * post_scale; out = norm2(residual)

// float4 chunks per thread on the vector path (`NORM_VEC` in the launcher): two for the
// hidden sizes of interest (1536 -> 192 threads, 2560 -> 320 threads).
#define NORM_VEC 2

// The most parts of x the vector path adds (the launcher sends more to the general entry).
#define NORM_MAX_PARTS 4

// Weight kinds of the vector path's template: no weight, or a buffer's dtype code.
#define NORM_W_NONE (-1)

// Eight partials of shared memory summed as a balanced tree (four 16-byte loads).
__device__ __forceinline__ double sum8_f64(const double* p) {
    const double2 a = reinterpret_cast<const double2*>(p)[0];
    const double2 b = reinterpret_cast<const double2*>(p)[1];
    const double2 c = reinterpret_cast<const double2*>(p)[2];
    const double2 d = reinterpret_cast<const double2*>(p)[3];
    return ((a.x + a.y) + (b.x + b.y)) + ((c.x + c.y) + (d.x + d.y));
}

// Sum over the block of one double per thread, one barrier. `partial` is 32 doubles of
// shared memory (16-byte aligned) used by this reduction only. Warps reduce with shuffles
// and lane 0 stores the warp's sum; warp 0's lanes zero the slots from the warp count up
// to the tree size (8, 16 or 32: no warp writes those). After the barrier every thread
// sums the same slots in the same fixed tree, so all threads hold the same bits.
__device__ __forceinline__ double block_sum_f64_once(double v, double* partial) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5, slots = nw <= 8 ? 8 : (nw <= 16 ? 16 : 32);
    v = warp_sum_f64(v);
    if (lane == 0) partial[warp] = v;
    if (warp == 0 && lane >= nw && lane < slots) partial[lane] = 0.0;
    __syncthreads();
    double s = sum8_f64(partial);
    // Wider blocks add further groups of eight in turn (a loop keeps the registers low).
#pragma unroll 1
    for (int g = 8; g < slots; g += 8) s += sum8_f64(partial + g);
    return s;
}

// 1.0 / n in f64, computed where it stands: the asm keeps the compiler from sinking the
// division (a dozen dependent instructions) past the barrier onto the dependency chain;
// placed after the loads are issued, it runs while they are in flight.
__device__ __forceinline__ double recip_f64_here(int n) {
    double r;
    asm volatile("div.rn.f64 %0, %1, %2;" : "=d"(r) : "d"(1.0), "d"((double)n));
    return r;
}

// Sum of squares of four f32 values in f64 (each square is exact in f64).
__device__ __forceinline__ double sumsq4(float4 v) {
    const double x = v.x, y = v.y, z = v.z, w = v.w;
    return fma(x, x, y * y) + fma(z, z, w * w);
}

// The raw bits of four weights (chunk `c`): a 16-byte load for f32, 8 bytes for bf16/f16.
template <int WK>
__device__ __forceinline__ uint4 load_w4(const void* w, int c) {
    if (WK == STRATA_F32) return __ldg(reinterpret_cast<const uint4*>(w) + c);
    if (WK == STRATA_BF16 || WK == STRATA_F16) {
        const uint2 h = __ldg(reinterpret_cast<const uint2*>(w) + c);
        return make_uint4(h.x, h.y, 0u, 0u);
    }
    return make_uint4(0u, 0u, 0u, 0u);
}

// y = (v * inv) * (w + offset) per lane, from load_w4's bits (no weight: v * inv).
template <int WK>
__device__ __forceinline__ float4 scale4(float4 v, float inv, uint4 r, float offset) {
    float4 y = make_float4(__fmul_rn(v.x, inv), __fmul_rn(v.y, inv), __fmul_rn(v.z, inv),
                           __fmul_rn(v.w, inv));
    if (WK == NORM_W_NONE) return y;
    float4 g;
    if (WK == STRATA_F32) {
        g = make_float4(__uint_as_float(r.x), __uint_as_float(r.y), __uint_as_float(r.z),
                        __uint_as_float(r.w));
    } else if (WK == STRATA_BF16) {
        g = make_float4(__uint_as_float(r.x << 16), __uint_as_float(r.x & 0xffff0000u),
                        __uint_as_float(r.y << 16), __uint_as_float(r.y & 0xffff0000u));
    } else {
        g = make_float4(f16_to_f32((u16)(r.x & 0xffffu)), f16_to_f32((u16)(r.x >> 16)),
                        f16_to_f32((u16)(r.y & 0xffffu)), f16_to_f32((u16)(r.y >> 16)));
    }
    y.x = __fmul_rn(y.x, __fadd_rn(g.x, offset));
    y.y = __fmul_rn(y.y, __fadd_rn(g.y, offset));
    y.z = __fmul_rn(y.z, __fadd_rn(g.z, offset));
    y.w = __fmul_rn(y.w, __fadd_rn(g.w, offset));
    return y;
}

// Four values rounded to bf16 into a 16-bit row (8 bytes; `out_b` is the bf16 twin the
// next GEMM reads, see the launcher).
__device__ __forceinline__ void store_bf16x4(u16* out_b, u64 chunk, float4 v) {
    const u32 lo = (u32)f32_to_bf16_rne(v.x) | ((u32)f32_to_bf16_rne(v.y) << 16);
    const u32 hi = (u32)f32_to_bf16_rne(v.z) | ((u32)f32_to_bf16_rne(v.w) << 16);
    reinterpret_cast<uint2*>(out_b)[chunk] = make_uint2(lo, hi);
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                       __fadd_rn(a.w, b.w));
}

// (r + y) * s per lane.
__device__ __forceinline__ float4 add_scale4(float4 r, float4 y, float s) {
    const float4 t = add4(r, y);
    return make_float4(__fmul_rn(t.x, s), __fmul_rn(t.y, s), __fmul_rn(t.z, s),
                       __fmul_rn(t.w, s));
}

// The vector path: dim % 4 == 0 and dim / 4 <= NORM_VEC * blockDim.x. Every load of the
// row (x, the residual, both weights) is issued before the reduction; chunk k of a thread
// is float4 number threadIdx.x + k * blockDim.x of the row.
template <int MODE, int WK, int W2K, bool PARTS = false>
__device__ __forceinline__ void rms_norm_vec(const float* x, float* residual, const void* w,
                                             const void* w2, float offset, float* out,
                                             u16* out_b, int dim, float eps,
                                             float post_scale, double* red, int parts = 1) {
    const int nc = dim >> 2;
    const u64 row = (u64)blockIdx.x * nc;
    const float4* x4 = reinterpret_cast<const float4*>(x) + (PARTS ? row * parts : row);
    float4* r4 = reinterpret_cast<float4*>(residual) + row;
    float4* o4 = reinterpret_cast<float4*>(out) + row;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    float4 v[NORM_VEC], res[NORM_VEC];
    uint4 wr[NORM_VEC], w2r[NORM_VEC];
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        v[k] = zero;
        res[k] = zero;
        wr[k] = make_uint4(0u, 0u, 0u, 0u);
        w2r[k] = wr[k];
        if (c < nc) {
            v[k] = __ldg(x4 + c);
            if (PARTS) {
                float4 more[NORM_MAX_PARTS - 1];
#pragma unroll
                for (int q = 1; q < NORM_MAX_PARTS; ++q)
                    if (q < parts) more[q - 1] = __ldg(x4 + (u64)q * nc + c);
#pragma unroll
                for (int q = 1; q < NORM_MAX_PARTS; ++q)
                    if (q < parts) v[k] = add4(v[k], more[q - 1]);
            }
            if (MODE != NORM_PLAIN) res[k] = r4[c];
            wr[k] = load_w4<WK>(w, c);
            if (MODE == NORM_ADD_NORM) w2r[k] = load_w4<W2K>(w2, c);
        }
    }
    const double inv_dim = recip_f64_here(dim);
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        if (MODE == NORM_ADD_THEN_NORM) {
            v[k] = add4(res[k], v[k]);  // unused chunks stay zero
            if (threadIdx.x + k * blockDim.x < nc) r4[threadIdx.x + k * blockDim.x] = v[k];
        }
        // Unused chunks add an exact zero (no `0.0 +` on the chain for chunk 0).
        ss = k == 0 ? sumsq4(v[k]) : ss + sumsq4(v[k]);
    }
    ss = block_sum_f64_once(ss, red);
    // rsqrt, not 1 / sqrt: within an f32 ulp of the CPU reference (see the top).
    const float inv = (float)rsqrt(ss * inv_dim + (double)eps);
    double ss2 = 0.0;
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        const float4 y = scale4<WK>(v[k], inv, wr[k], offset);
        if (MODE == NORM_THEN_ADD || MODE == NORM_ADD_NORM) {
            res[k] = add_scale4(res[k], y, post_scale);
            if (c < nc) {
                r4[c] = res[k];
                if (MODE == NORM_THEN_ADD && out_b) store_bf16x4(out_b, row + c, res[k]);
            }
            if (MODE == NORM_ADD_NORM) {
                const double q = c < nc ? sumsq4(res[k]) : 0.0;
                ss2 = k == 0 ? q : ss2 + q;
            }
        } else if (c < nc) {
            o4[c] = y;
            if (out_b) store_bf16x4(out_b, row + c, y);
        }
    }
    if (MODE != NORM_ADD_NORM) return;
    ss2 = block_sum_f64_once(ss2, red + 32);
    const float inv2 = (float)rsqrt(ss2 * inv_dim + (double)eps);
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < nc) {
            const float4 y = scale4<W2K>(res[k], inv2, w2r[k], offset);
            o4[c] = y;
            if (out_b) store_bf16x4(out_b, row + c, y);
        }
    }
}

// Element i of this block's row of x: the sum of its parts in order.
__device__ __forceinline__ float x_at(const float* x, int i, int dim, int parts) {
    const float* r = x + (u64)blockIdx.x * parts * dim + i;
    float v = r[0];
    for (int q = 1; q < parts; ++q) v = __fadd_rn(v, r[(u64)q * dim]);
    return v;
}

// Any dim: scalar strided loops, the weights' dtype switched per element (a uniform
// branch). Each thread reads back only the residual elements it wrote itself.
template <int MODE>
__device__ __forceinline__ void rms_norm_strided(const float* x, float* residual,
                                                 const void* w, int w_dtype, const void* w2,
                                                 int w2_dtype, float offset, float* out,
                                                 u16* out_b, int dim, float eps,
                                                 float post_scale, double* red, int parts) {
    const u64 base = (u64)blockIdx.x * dim;
    const double inv_dim = recip_f64_here(dim);
    double ss = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = x_at(x, i, dim, parts);
        if (MODE == NORM_ADD_THEN_NORM) {
            v = __fadd_rn(residual[base + i], v);
            residual[base + i] = v;
        }
        ss += (double)v * (double)v;
    }
    ss = block_sum_f64_once(ss, red);
    const float inv = (float)rsqrt(ss * inv_dim + (double)eps);
    double ss2 = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = MODE == NORM_ADD_THEN_NORM ? residual[base + i] : x_at(x, i, dim, parts);
        float y = __fmul_rn(v, inv);
        if (w_dtype >= 0) y = __fmul_rn(y, __fadd_rn(load_as_f32(w, w_dtype, i), offset));
        if (MODE == NORM_THEN_ADD || MODE == NORM_ADD_NORM) {
            const float r = __fmul_rn(__fadd_rn(residual[base + i], y), post_scale);
            residual[base + i] = r;
            if (MODE == NORM_THEN_ADD && out_b) out_b[base + i] = f32_to_bf16_rne(r);
            if (MODE == NORM_ADD_NORM) ss2 += (double)r * (double)r;
        } else {
            out[base + i] = y;
            if (out_b) out_b[base + i] = f32_to_bf16_rne(y);
        }
    }
    if (MODE != NORM_ADD_NORM) return;
    ss2 = block_sum_f64_once(ss2, red + 32);
    const float inv2 = (float)rsqrt(ss2 * inv_dim + (double)eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float y = __fmul_rn(residual[base + i], inv2);
        if (w2_dtype >= 0) y = __fmul_rn(y, __fadd_rn(load_as_f32(w2, w2_dtype, i), offset));
        out[base + i] = y;
        if (out_b) out_b[base + i] = f32_to_bf16_rne(y);
    }
}

// One switch per call from a weight dtype code to the vector path's template parameter.
#define NORM_W_SWITCH(dtype, WK, ...)                 \
    switch (dtype) {                                  \
        case STRATA_F32: {                            \
            constexpr int WK = STRATA_F32;            \
            __VA_ARGS__;                              \
        } break;                                      \
        case STRATA_BF16: {                           \
            constexpr int WK = STRATA_BF16;           \
            __VA_ARGS__;                              \
        } break;                                      \
        case STRATA_F16: {                            \
            constexpr int WK = STRATA_F16;            \
            __VA_ARGS__;                              \
        } break;                                      \
        default: {                                    \
            constexpr int WK = NORM_W_NONE;           \
            __VA_ARGS__;                              \
        } break;                                      \
    }

// `w_dtype` < 0 means no weight (the scale-free norm). `w2` is the second norm's weight
// (NORM_ADD_NORM only); `post_scale` multiplies the residual after the add of NORM_THEN_ADD
// and NORM_ADD_NORM (1.0 leaves it exact). Every entry takes the same thirteen arguments;
// `mode` must match the entry (it is otherwise unused).
template <int MODE>
__device__ __forceinline__ void rms_norm_mode(const float* x, float* residual, const void* w,
                                              int w_dtype, const void* w2, int w2_dtype,
                                              float offset, float* out, u16* out_b, int dim,
                                              float eps, float post_scale, int parts) {
    __shared__ __align__(16) double red[MODE == NORM_ADD_NORM ? 64 : 32];
    // The vector path needs 16-byte aligned rows: dim % 4 == 0 and every buffer aligned
    // (whole allocations always are; the check only guards a caller passing a view). An
    // input in parts takes the strided path here (the `_parts` entries are the vector one).
    const u64 align = (u64)x | (u64)residual | (u64)w | (u64)w2 | (u64)out | ((u64)out_b << 1);
    if ((dim & 3) != 0 || (align & 15) != 0 || (dim >> 2) > NORM_VEC * (int)blockDim.x ||
        parts != 1) {
        rms_norm_strided<MODE>(x, residual, w, w_dtype, w2, w2_dtype, offset, out, out_b, dim,
                               eps, post_scale, red, parts);
        return;
    }
    if constexpr (MODE == NORM_ADD_NORM) {
        NORM_W_SWITCH(w_dtype, WK, NORM_W_SWITCH(w2_dtype, W2K,
            rms_norm_vec<MODE, WK, W2K>(x, residual, w, w2, offset, out, out_b, dim, eps,
                                        post_scale, red)))
    } else {
        NORM_W_SWITCH(w_dtype, WK,
            rms_norm_vec<MODE, WK, NORM_W_NONE>(x, residual, w, w2, offset, out, out_b, dim,
                                                eps, post_scale, red))
    }
}

// The parameters of every entry point (the launcher passes the same fourteen to each).
#define NORM_PARAMS                                                                     \
    (const float* x, float* residual, const void* w, int w_dtype, const void* w2,      \
     int w2_dtype, float offset, float* out, u16* out_b, int dim, float eps, int mode, \
     float post_scale, int parts)

#define NORM_ENTRY(NAME, MODE)                                                              \
    extern "C" __global__ void __launch_bounds__(1024) NAME NORM_PARAMS {                   \
        (void)mode;                                                                         \
        rms_norm_mode<MODE>(x, residual, w, w_dtype, w2, w2_dtype, offset, out, out_b, dim, \
                            eps, post_scale, parts);                                        \
    }

NORM_ENTRY(rms_norm_plain, NORM_PLAIN)
NORM_ENTRY(rms_norm_add_then_norm, NORM_ADD_THEN_NORM)
NORM_ENTRY(rms_norm_then_add, NORM_THEN_ADD)
NORM_ENTRY(rms_norm_add_norm, NORM_ADD_NORM)

// The model's cases with entry points of their own: f32 weights (how the model uploads its
// norm vectors) or bf16 weights (both of the same dtype, for NORM_ADD_NORM; none second
// otherwise) on the vector path, for rows of whole allocations (16-byte aligned) with
// dim % 4 == 0 and dim / 4 <= NORM_VEC * blockDim.x, which the launcher checks. Each holds
// one instantiation of rms_norm_vec and no strided loops: the general entries carry every
// weight dtype (sixteen copies for NORM_ADD_NORM), and a short kernel's time goes with its
// code (at 112 rows on an H200 their launches took 3.1-5.9 us for 1.1-1.5 us of
// multiprocessor work, mostly waiting on instruction fetch).
#define NORM_ENTRY_TYPED(NAME, MODE, WK)                                                    \
    extern "C" __global__ void __launch_bounds__(1024) NAME NORM_PARAMS {                   \
        (void)w_dtype;                                                                      \
        (void)w2_dtype;                                                                     \
        (void)mode;                                                                         \
        (void)parts;                                                                        \
        __shared__ __align__(16) double red[MODE == NORM_ADD_NORM ? 64 : 32];               \
        rms_norm_vec<MODE, WK, MODE == NORM_ADD_NORM ? WK : NORM_W_NONE>(                   \
            x, residual, w, w2, offset, out, out_b, dim, eps, post_scale, red);             \
    }

// The same for an input of 2 to NORM_MAX_PARTS parts (f32 weights, the model's case).
#define NORM_ENTRY_PARTS(NAME, MODE)                                                        \
    extern "C" __global__ void __launch_bounds__(1024) NAME NORM_PARAMS {                   \
        (void)w_dtype;                                                                      \
        (void)w2_dtype;                                                                     \
        (void)mode;                                                                         \
        __shared__ __align__(16) double red[MODE == NORM_ADD_NORM ? 64 : 32];               \
        rms_norm_vec<MODE, STRATA_F32, MODE == NORM_ADD_NORM ? STRATA_F32 : NORM_W_NONE,    \
                     true>(x, residual, w, w2, offset, out, out_b, dim, eps, post_scale,    \
                           red, parts);                                                     \
    }

NORM_ENTRY_TYPED(rms_norm_plain_bf16, NORM_PLAIN, STRATA_BF16)
NORM_ENTRY_TYPED(rms_norm_add_then_norm_bf16, NORM_ADD_THEN_NORM, STRATA_BF16)
NORM_ENTRY_TYPED(rms_norm_then_add_bf16, NORM_THEN_ADD, STRATA_BF16)
NORM_ENTRY_TYPED(rms_norm_add_norm_bf16, NORM_ADD_NORM, STRATA_BF16)
NORM_ENTRY_TYPED(rms_norm_plain_f32, NORM_PLAIN, STRATA_F32)
NORM_ENTRY_TYPED(rms_norm_add_then_norm_f32, NORM_ADD_THEN_NORM, STRATA_F32)
NORM_ENTRY_TYPED(rms_norm_then_add_f32, NORM_THEN_ADD, STRATA_F32)
NORM_ENTRY_TYPED(rms_norm_add_norm_f32, NORM_ADD_NORM, STRATA_F32)
NORM_ENTRY_PARTS(rms_norm_add_then_norm_f32_parts, NORM_ADD_THEN_NORM)
NORM_ENTRY_PARTS(rms_norm_then_add_f32_parts, NORM_THEN_ADD)
NORM_ENTRY_PARTS(rms_norm_add_norm_f32_parts, NORM_ADD_NORM)
