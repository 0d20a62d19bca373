// Products and lookups of block-quantized weights kept on the device in their GGUF layout
// (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), row after row as the file stores them, and of
// bitsandbytes 4-bit matrices (NF4 / FP4) in a layout of 32-value sub-blocks (`QF_BNB4`).
//
// Every kernel decodes a weight row 32 values at a time ("a sub-block": a whole block of the
// 32-value formats, an eighth of a K-quant super-block) into registers, with the host
// decoder's f32 arithmetic rounded operation by operation (no fused multiply-add), so a
// decoded value is bit for bit the host's `dequantize`.
//
// Floor of the GEMV: each weight byte read once (4.5 bits a weight for Q4_K), so a decode
// step's products take (weight bytes) / (memory bandwidth). A lane decodes one sub-block
// (16 to 34 bytes) and dots it with the T rows of x it covers, read from shared memory.

__device__ __forceinline__ float f16_at(const u8* p) {
    return f16_to_f32((u16)p[0] | ((u16)p[1] << 8));
}

// `x` rounded to f16 (nearest even) and widened back.
__device__ __forceinline__ float f16_round(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return f16_to_f32(h);
}

// A K-quant's 6-bit scale and min of sub-block j (0..8) from its 12 packed bytes.
__device__ __forceinline__ void k_scale_min(const u8* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The 32 values of sub-block `s` of a row starting at `row`. The code bytes are read in
// the widest loads the format's alignment allows (16 bytes for Q4_K / Q5_K, whose blocks are
// whole 16-byte units; 2 bytes for the others), not byte by byte: the GEMV is bound by
// instructions as much as by bytes.
__device__ __forceinline__ void load16x2(const u8* p, u32* w) {
    const uint4 a = reinterpret_cast<const uint4*>(p)[0];
    const uint4 b = reinterpret_cast<const uint4*>(p)[1];
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}

// `n` bytes (a multiple of 4) from a 2-byte aligned address, as little-endian words.
template <int N>
__device__ __forceinline__ void load_even(const u8* p, u32* w) {
    const u16* h = reinterpret_cast<const u16*>(p);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) w[i] = (u32)h[2 * i] | ((u32)h[2 * i + 1] << 16);
}

__device__ __forceinline__ int byte_of(const u32* w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 255; }

template <int F>
__device__ __forceinline__ void decode32(const u8* __restrict__ row, int s, float* v) {
    if (F == QF_Q4_0) {
        const u8* b = row + (u64)s * 18;
        const float d = f16_at(b);
        u32 q[4];
        load_even<16>(b + 2, q);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int c = byte_of(q, i);
            v[i] = __fmul_rn(d, (float)((c & 15) - 8));
            v[i + 16] = __fmul_rn(d, (float)((c >> 4) - 8));
        }
    } else if (F == QF_Q5_0) {
        const u8* b = row + (u64)s * 22;
        const float d = f16_at(b);
        u32 hq[5];
        load_even<20>(b + 2, hq);  // qh (4 bytes), then qs (16)
        const u32 h = hq[0];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int c = byte_of(hq + 1, i);
            const int lo = (c & 15) | (((h >> i) & 1) << 4);
            const int hi = (c >> 4) | (((h >> (i + 16)) & 1) << 4);
            v[i] = __fmul_rn(d, (float)(lo - 16));
            v[i + 16] = __fmul_rn(d, (float)(hi - 16));
        }
    } else if (F == QF_Q8_0) {
        const u8* b = row + (u64)s * 34;
        const float d = f16_at(b);
        u32 q[8];
        load_even<32>(b + 2, q);
#pragma unroll
        for (int i = 0; i < 32; ++i) v[i] = __fmul_rn(d, (float)(signed char)byte_of(q, i));
    } else if (F == QF_Q4_K || F == QF_Q5_K) {
        constexpr int BYTES = F == QF_Q4_K ? 144 : 176;
        constexpr int QS = F == QF_Q4_K ? 16 : 48;
        const int j = s & 7;
        const u8* b = row + (u64)(s >> 3) * BYTES;
        int sc, mn;
        k_scale_min(b + 4, j, sc, mn);
        const float dj = __fmul_rn(f16_at(b), (float)sc);
        const float mj = __fmul_rn(f16_at(b + 2), (float)mn);
        u32 q[8];
        load16x2(b + QS + 32 * (j >> 1), q);
        const int shift = 4 * (j & 1);
        u32 h[8];
        if (F == QF_Q5_K) load16x2(b + 16, h);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            int c = (byte_of(q, l) >> shift) & 15;
            if (F == QF_Q5_K) c |= ((byte_of(h, l) >> j) & 1) << 4;
            v[l] = __fsub_rn(__fmul_rn(dj, (float)c), mj);
        }
    } else if (F == QF_BNB4) {
        // A row: a 68-byte head (the 16 f32 values a code stands for, then a u32 rounding:
        // 0 none, 1 bf16, 2 f16), then 20 bytes a sub-block (its block's f32 absmax and 16
        // bytes of codes, value 2i in the high nibble of byte i). A value is
        // bitsandbytes' `map[code] * absmax` in f32, rounded as the head says.
        const float* map = reinterpret_cast<const float*>(row);
        const u32 rounding = reinterpret_cast<const u32*>(row)[16];
        const u8* b = row + 68 + (u64)s * 20;
        const float amax = *reinterpret_cast<const float*>(b);
        const u32* qw = reinterpret_cast<const u32*>(b + 4);
        const u32 q[4] = {qw[0], qw[1], qw[2], qw[3]};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int c = byte_of(q, i);
            float hi = __fmul_rn(map[c >> 4], amax), lo = __fmul_rn(map[c & 15], amax);
            if (rounding == 1) {
                hi = bf16_to_f32(f32_to_bf16_rne(hi));
                lo = bf16_to_f32(f32_to_bf16_rne(lo));
            } else if (rounding == 2) {
                hi = f16_round(hi);
                lo = f16_round(lo);
            }
            v[2 * i] = hi;
            v[2 * i + 1] = lo;
        }
    } else {  // QF_Q6_K: ql[128], qh[64], scales[16] (int8), d
        const int j = s & 7;
        const u8* b = row + (u64)(s >> 3) * 210;
        const float d = f16_at(b + 208);
        const int h = j >> 2, c = j & 3;
        u32 ql[8], qh[8];
        load_even<32>(b + 64 * h + 32 * (c & 1), ql);
        load_even<32>(b + 128 + 32 * h, qh);
        const int nshift = 4 * (c >> 1), hshift = 2 * c;
        const float d0 = __fmul_rn(d, (float)(signed char)b[192 + 2 * j]);
        const float d1 = __fmul_rn(d, (float)(signed char)b[192 + 2 * j + 1]);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const int q = (((byte_of(ql, l) >> nshift) & 15) | (((byte_of(qh, l) >> hshift) & 3) << 4)) - 32;
            v[l] = __fmul_rn(l < 16 ? d0 : d1, (float)q);
        }
    }
}

// y[t, i] = x[t, :] . W[i, :] for the `rows` (<= T) rows of x; one warp an output feature,
// QUANT_GEMV_WARPS warps a block.
//
// Lane l decodes sub-block l of each stretch of 32, so it needs x's 32 values of that
// sub-block. Read straight from global memory, the 32 lanes' float4 loads fall 128 bytes
// apart, 32 separate L1 wavefronts a load where a contiguous one takes 4. So the block first
// copies a run of x (every warp of the block dots the same x) into shared memory with
// contiguous loads, a sub-block every QUANT_GEMV_PAD floats: the 4-float pad puts 8 lanes'
// float4 reads on 8 distinct bank groups, so each read is 4 wavefronts.
//
// At one request the kernel waits on load latency more than on bandwidth (a row of E2B's q is
// under 1 KB), so a warp's whole row is first requested into L2, and at one or two rows of x
// a lane takes 4 or 2 sub-blocks a run, their loads in flight together.
#define QUANT_GEMV_WARPS 4
#define QUANT_GEMV_PAD 36

template <int F, int T>
__device__ __forceinline__ void quant_gemv(const u8* __restrict__ w, u64 row_bytes, int k, int n,
                                           const float* __restrict__ x, int rows,
                                           float* __restrict__ y) {
    // Sub-blocks a lane takes a run (shared memory: T * RUN * 144 bytes, at most 36 KB).
    constexpr int SPL = T == 1 ? 4 : (T == 2 ? 2 : 1);
    constexpr int RUN = 32 * SPL;
    __shared__ __align__(16) float xs[T][RUN * QUANT_GEMV_PAD];
    const int lane = threadIdx.x & 31;
    const int feature = blockIdx.x * QUANT_GEMV_WARPS + (threadIdx.x >> 5);
    // A warp past the last feature still stages x and meets the barriers.
    const bool active = feature < n;
    const u8* row = w + (u64)(active ? feature : 0) * row_bytes;
    if (active) {
        for (u64 off = (u64)lane * 128; off < row_bytes; off += 32 * 128) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
        }
    }
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] = 0.0f;
    const int subs = k >> 5;
    for (int s0 = 0; s0 < subs; s0 += RUN) {
        const int run = min(RUN, subs - s0);
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t < rows) {
                const float4* src = reinterpret_cast<const float4*>(x + (u64)t * k + (u64)s0 * 32);
                for (int i = threadIdx.x; i < run * 8; i += QUANT_GEMV_WARPS * 32) {
                    *reinterpret_cast<float4*>(&xs[t][(i >> 3) * QUANT_GEMV_PAD + (i & 7) * 4]) = src[i];
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < SPL; ++j) {
            const int sub = lane + 32 * j;
            if (active && sub < run) {
                float v[32];
                decode32<F>(row, s0 + sub, v);
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    if (t < rows) {
                        const float4* xp = reinterpret_cast<const float4*>(&xs[t][sub * QUANT_GEMV_PAD]);
#pragma unroll
                        for (int q = 0; q < 8; ++q) {
                            const float4 a = xp[q];
                            acc[t] += v[4 * q] * a.x + v[4 * q + 1] * a.y + v[4 * q + 2] * a.z +
                                      v[4 * q + 3] * a.w;
                        }
                    }
                }
            }
        }
        __syncthreads();
    }
    if (!active) return;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float total = warp_sum_f32(acc[t]);
        if (lane == 0 && t < rows) y[(u64)t * n + feature] = total;
    }
}

// Rows of W decoded to a dense matrix: out row i = W[ids ? ids[i] : first + i] * scale, as
// f32 or bf16 (rounded to nearest even), `out_stride` values apart. One thread a sub-block;
// grid (rows, ceil(subs / blockDim.x)).
//
// Floor: the block bytes read once and the dense values written once (2.6 bytes a value for
// Q4_K into bf16). A thread's 32 values are stored as 16-byte words (4 for bf16, 8 for f32):
// the stores are most of this kernel's instructions, and scalar 2-byte stores made it an
// order of magnitude slower than its floor. `out_stride` and every row's start are
// multiples of 32 values, so each thread's run is 16-byte aligned.
template <int F>
__device__ __forceinline__ void quant_rows(const u8* __restrict__ w, u64 row_bytes, int k,
                                           const u32* __restrict__ ids, u64 first, float scale,
                                           void* out, int out_bf16, u64 out_stride) {
    const int s = blockIdx.y * blockDim.x + threadIdx.x;
    if (s >= (k >> 5)) return;
    const u64 i = blockIdx.x;
    const u64 src = ids ? (u64)ids[i] : first + i;
    float v[32];
    decode32<F>(w + src * row_bytes, s, v);
    const u64 at = i * out_stride + (u64)s * 32;
    if (out_bf16) {
        uint4* o = reinterpret_cast<uint4*>((u16*)out + at);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            u32 p[4];
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const int l = 8 * q + 2 * h;
                p[h] = (u32)f32_to_bf16_rne(__fmul_rn(v[l], scale)) |
                       ((u32)f32_to_bf16_rne(__fmul_rn(v[l + 1], scale)) << 16);
            }
            o[q] = make_uint4(p[0], p[1], p[2], p[3]);
        }
    } else {
        float4* o = reinterpret_cast<float4*>((float*)out + at);
#pragma unroll
        for (int q = 0; q < 8; ++q)
            o[q] = make_float4(__fmul_rn(v[4 * q], scale), __fmul_rn(v[4 * q + 1], scale),
                               __fmul_rn(v[4 * q + 2], scale), __fmul_rn(v[4 * q + 3], scale));
    }
}

#define QUANT_GEMV_ENTRY(NAME, F, T)                                                        \
    extern "C" __global__ void __launch_bounds__(QUANT_GEMV_WARPS * 32)                     \
        quant_gemv_##NAME##_##T(const u8* w, u64 row_bytes, int k, int n, const float* x,   \
                                int rows, float* y) {                                       \
        quant_gemv<F, T>(w, row_bytes, k, n, x, rows, y);                                   \
    }

#define QUANT_ENTRIES(NAME, F)                                                              \
    QUANT_GEMV_ENTRY(NAME, F, 1)                                                            \
    QUANT_GEMV_ENTRY(NAME, F, 2)                                                            \
    QUANT_GEMV_ENTRY(NAME, F, 4)                                                            \
    QUANT_GEMV_ENTRY(NAME, F, 8)                                                            \
    extern "C" __global__ void quant_rows_##NAME(const u8* w, u64 row_bytes, int k,          \
                                                 const u32* ids, u64 first, float scale,    \
                                                 void* out, int out_bf16, u64 out_stride) { \
        quant_rows<F>(w, row_bytes, k, ids, first, scale, out, out_bf16, out_stride);       \
    }

QUANT_ENTRIES(q4_0, QF_Q4_0)
QUANT_ENTRIES(q5_0, QF_Q5_0)
QUANT_ENTRIES(q8_0, QF_Q8_0)
QUANT_ENTRIES(q4_k, QF_Q4_K)
QUANT_ENTRIES(q5_k, QF_Q5_K)
QUANT_ENTRIES(q6_k, QF_Q6_K)
QUANT_ENTRIES(bnb4, QF_BNB4)

// dst[t, first + j] = src[t, j] for j < cols: a product computed for a slice of the weight's
// rows written into its columns of the full output.
extern "C" __global__ void quant_scatter_cols(const float* src, u64 rows, u64 cols, float* dst,
                                              u64 dst_cols, u64 first) {
    FOR_EACH_INDEX(i, rows * cols) {
        const u64 t = i / cols, j = i % cols;
        dst[t * dst_cols + first + j] = src[i];
    }
}
