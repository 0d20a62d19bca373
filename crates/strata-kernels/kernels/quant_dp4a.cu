// Products of GGUF block weights (the layouts of `quant.cu`) with x quantized to 8 bits:
// integer dot products four codes at a time (`dp4a`) in place of decoding each weight to f32.
//
// Why: the f32 path (`quant_gemv_*`) spends about 16 instructions a weight on unpacking,
// scaling and multiplying, so it runs far under the memory bound. Here x is quantized once a
// product (`quant_x8`) to blocks of 32 int8 codes with a scale d and s = d * (sum of the
// codes), and a weight's 32-value sub-block meets the x block at the same positions: its
// codes are unpacked four at a time into bytes, dotted with x's codes by one dp4a, and the
// sub-block's scale (and, for the formats with an offset or a min, x's block sum s) applies
// once to the integer sum. A result is therefore the exact product of the decoded weights
// with x quantized and dequantized (up to f32 rounding of a few terms a block), not with x
// itself.
//
// Work unit: 32 weights a lane, chosen per format so that a lane's code bytes are contiguous
// and every code bit it loads is used:
//   Q4_0, Q5_0, Q8_0: one block.
//   Q4_K, Q5_K: 16 code bytes of a sub-block pair (2p, 2p + 1): the low nibbles are values
//     16h .. 16h + 15 of sub-block 2p, the high ones the same values of 2p + 1.
//   Q6_K: 16 bytes of ql (and the matching qh) shared by sub-blocks j and j + 2: values
//     16h .. 16h + 15 of both, one 16-value scale each.
// One warp an output feature, DOT_WARPS warps a block; x's codes come straight from global
// memory (a row of them is k bytes, L1-resident across the block's warps).

#define DOT_WARPS 4

__device__ __forceinline__ u32 ld32(const u8* p) { return *reinterpret_cast<const u32*>(p); }
__device__ __forceinline__ u32 ld16(const u8* p) { return *reinterpret_cast<const u16*>(p); }
__device__ __forceinline__ float f16_lo(u32 w) { return f16_to_f32((u16)(w & 0xffff)); }

__device__ __forceinline__ int dot4(u32 a, u32 b, int c) { return __dp4a((int)a, (int)b, c); }

// N little-endian words from a 2-byte aligned address (the 18-, 22-, 34- and 210-byte
// blocks are no better aligned): aligned 4-byte loads and a funnel shift, the last half word
// loaded alone so nothing past the range is read.
template <int N>
__device__ __forceinline__ void load_words(const u8* p, u32* out) {
    const u64 a = reinterpret_cast<u64>(p);
    const u8* base = reinterpret_cast<const u8*>(a & ~(u64)3);
    const u32 sh = (u32)(a & 2) * 8;
    u32 w[N + 1];
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = ld32(base + 4 * i);
    w[N] = sh ? ld16(base + 4 * N) : 0u;
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

// Bit i of the nibble n to bit 4 of byte i (Q5_0's fifth code bit for four values).
__device__ __forceinline__ u32 spread_bits(u32 n) { return ((n * 0x00204081u) & 0x01010101u) << 4; }

// Four 6-bit codes (bytes 0..63) minus 32 each, as signed bytes: with the top bit of each
// byte set first, the subtraction never borrows across bytes.
__device__ __forceinline__ u32 minus32(u32 q) { return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u; }

// x's 16 codes at `off` bytes into a row of codes, as four words.
__device__ __forceinline__ uint4 x16(const u8* xq, u64 off) {
    return *reinterpret_cast<const uint4*>(xq + off);
}

__device__ __forceinline__ int dot16(const u32* q, uint4 x, int c) {
    c = dot4(q[0], x.x, c);
    c = dot4(q[1], x.y, c);
    c = dot4(q[2], x.z, c);
    return dot4(q[3], x.w, c);
}

// The 6-bit scales and mins of K-quant sub-blocks 2p and 2p + 1 from the header's packed
// bytes (words s0 = bytes 0..3, s1 = 4..7, s2 = 8..11), by shifts and selects so that no
// register array is indexed at run time.
__device__ __forceinline__ void k_pair_scales(u32 s0, u32 s1, u32 s2, int p, int* sc, int* mn) {
    const int i = 16 * (p & 1);  // bit offset of byte (2p) & 3
    const u32 a = s0 >> i, b = s1 >> i, c = s2 >> i;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const u32 ae = (a >> (8 * e)) & 255, be = (b >> (8 * e)) & 255, ce = (c >> (8 * e)) & 255;
        if (p < 2) {
            sc[e] = ae & 63;
            mn[e] = be & 63;
        } else {
            sc[e] = (ce & 15) | ((ae >> 6) << 4);
            mn[e] = (ce >> 4) | ((be >> 6) << 4);
        }
    }
}

// acc[t] += (unit u of the row) . (the same 32 positions of x row t), t < rows.
template <int F, int T>
__device__ __forceinline__ void dot_unit(const u8* __restrict__ row, int u,
                                         const u8* __restrict__ xq,
                                         const float2* __restrict__ xds, int k, int rows,
                                         float* acc) {
    const int xblocks = k >> 5;
    if (F == QF_Q4_0 || F == QF_Q5_0 || F == QF_Q8_0) {
        constexpr int BYTES = F == QF_Q4_0 ? 18 : (F == QF_Q5_0 ? 22 : 34);
        const u8* b = row + (u64)u * BYTES;
        const float dw = f16_to_f32((u16)ld16(b));
        u32 lo[4], hi[4];
        if (F == QF_Q8_0) {
            u32 q[8];
            load_words<8>(b + 2, q);
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                lo[m] = q[m];
                hi[m] = q[m + 4];
            }
        } else if (F == QF_Q4_0) {
            u32 q[4];
            load_words<4>(b + 2, q);
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                lo[m] = q[m] & 0x0f0f0f0fu;
                hi[m] = (q[m] >> 4) & 0x0f0f0f0fu;
            }
        } else {
            u32 q[5];  // qh, then the 16 code bytes
            load_words<5>(b + 2, q);
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                lo[m] = (q[m + 1] & 0x0f0f0f0fu) | spread_bits((q[0] >> (4 * m)) & 15);
                hi[m] = ((q[m + 1] >> 4) & 0x0f0f0f0fu) | spread_bits((q[0] >> (16 + 4 * m)) & 15);
            }
        }
        // Q4_0 and Q5_0 codes carry an offset (8, 16): sum (c - o) x = dot - o * sum x.
        constexpr float OFF = F == QF_Q4_0 ? 8.0f : (F == QF_Q5_0 ? 16.0f : 0.0f);
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t < rows) {
                const u8* xr = xq + (u64)t * k + (u64)u * 32;
                int s = dot16(lo, x16(xr, 0), 0);
                s = dot16(hi, x16(xr, 16), s);
                const float2 ds = xds[(u64)t * xblocks + u];
                acc[t] += OFF == 0.0f ? dw * (ds.x * (float)s) : dw * (ds.x * (float)s - OFF * ds.y);
            }
        }
    } else if (F == QF_Q4_K || F == QF_Q5_K) {
        constexpr int BYTES = F == QF_Q4_K ? 144 : 176;
        constexpr int QS = F == QF_Q4_K ? 16 : 48;
        const int sb = u >> 3, p = (u >> 1) & 3, h = u & 1;
        const u8* b = row + (u64)sb * BYTES;
        const uint4 head = *reinterpret_cast<const uint4*>(b);  // d, dmin, 12 scale bytes
        int sc[2], mn[2];
        k_pair_scales(head.y, head.z, head.w, p, sc, mn);
        const float d = f16_lo(head.x), dmin = f16_lo(head.x >> 16);
        const float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
        const float m0 = dmin * (float)mn[0], m1 = dmin * (float)mn[1];
        const uint4 qv = *reinterpret_cast<const uint4*>(b + QS + 32 * p + 16 * h);
        const u32 q[4] = {qv.x, qv.y, qv.z, qv.w};
        u32 lo[4], hi[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            lo[m] = q[m] & 0x0f0f0f0fu;
            hi[m] = (q[m] >> 4) & 0x0f0f0f0fu;
        }
        if (F == QF_Q5_K) {
            const uint4 hv = *reinterpret_cast<const uint4*>(b + 16 + 16 * h);
            const u32 qh[4] = {hv.x, hv.y, hv.z, hv.w};
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                lo[m] |= ((qh[m] >> (2 * p)) & 0x01010101u) << 4;
                hi[m] |= ((qh[m] >> (2 * p + 1)) & 0x01010101u) << 4;
            }
        }
        const int xb = 8 * sb + 2 * p;  // x blocks xb (low nibbles) and xb + 1 (high)
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t < rows) {
                const u8* xr = xq + (u64)t * k + (u64)xb * 32 + 16 * h;
                const int s0 = dot16(lo, x16(xr, 0), 0);
                const int s1 = dot16(hi, x16(xr, 32), 0);
                const float4 ds = *reinterpret_cast<const float4*>(xds + (u64)t * xblocks + xb);
                // w = d_j c - m_j: the min meets the whole x block, so one lane of the two
                // that share the sub-block pair takes it.
                const float mins = h ? 0.0f : m0 * ds.y + m1 * ds.w;
                acc[t] += ds.x * (d0 * (float)s0) + ds.z * (d1 * (float)s1) - mins;
            }
        }
    } else {  // QF_Q6_K: ql[128], qh[64], scales[16] (int8), d
        const int sb = u >> 3, hh = u >> 2 & 1, c = (u >> 1) & 1, h = u & 1;
        const u8* b = row + (u64)sb * 210;
        u32 ql[4], qh[4];
        load_words<4>(b + 64 * hh + 32 * c + 16 * h, ql);
        load_words<4>(b + 128 + 32 * hh + 16 * h, qh);
        const int j0 = 4 * hh + c;  // low nibbles; high nibbles are sub-block j0 + 2
        const float d = f16_to_f32((u16)ld16(b + 208));
        const float d0 = d * (float)(signed char)b[192 + 2 * j0 + h];
        const float d1 = d * (float)(signed char)b[192 + 2 * j0 + 4 + h];
        u32 lo[4], hi[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            lo[m] = minus32((ql[m] & 0x0f0f0f0fu) | (((qh[m] >> (2 * c)) & 0x03030303u) << 4));
            hi[m] = minus32(((ql[m] >> 4) & 0x0f0f0f0fu) | (((qh[m] >> (2 * c + 4)) & 0x03030303u) << 4));
        }
        const int xb = 8 * sb + j0;
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t < rows) {
                const u8* xr = xq + (u64)t * k + (u64)xb * 32 + 16 * h;
                const int s0 = dot16(lo, x16(xr, 0), 0);
                const int s1 = dot16(hi, x16(xr, 64), 0);
                const float2* dr = xds + (u64)t * xblocks + xb;
                acc[t] += dr[0].x * (d0 * (float)s0) + dr[2].x * (d1 * (float)s1);
            }
        }
    }
}

// y[t, i] = x8[t, :] . W[i, :] for the `rows` (<= T) rows of quantized x.
//
// At one row a lane takes two units at a time so that two sets of loads are in flight (a
// row of E2B's q is under 1 KB: latency, not bandwidth, bounds it); the row is also
// requested into L2 up front.
template <int F, int T>
__device__ __forceinline__ void quant_dot(const u8* __restrict__ w, u64 row_bytes, int k, int n,
                                          const u8* __restrict__ xq,
                                          const float2* __restrict__ xds, int rows,
                                          float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int feature = blockIdx.x * DOT_WARPS + (threadIdx.x >> 5);
    if (feature >= n) return;
    const u8* row = w + (u64)feature * row_bytes;
    for (u64 off = (u64)lane * 128; off < row_bytes; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
    }
    constexpr int UPL = T == 1 ? 2 : 1;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] = 0.0f;
    const int units = k >> 5;
    for (int u0 = lane; u0 < units; u0 += 32 * UPL) {
#pragma unroll
        for (int j = 0; j < UPL; ++j) {
            const int u = u0 + 32 * j;
            if (u < units) dot_unit<F, T>(row, u, xq, xds, k, rows, acc);
        }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float total = warp_sum_f32(acc[t]);
        if (lane == 0 && t < rows) y[(u64)t * n + feature] = total;
    }
}

// x (f32, `blocks` runs of 32 values, row after row) to int8 codes and per-block (d, s):
// d = max |x| / 127, code = round-to-even(x * (1 / d)), s = d * (sum of the 32 codes). Eight
// threads a block, four values each. The host test repeats these f32 operations exactly.
extern "C" __global__ void quant_x8(const float* __restrict__ x, u64 blocks, u32* __restrict__ xq,
                                    float2* __restrict__ xds) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = (i >> 3) < blocks;
    const float4 v = live ? reinterpret_cast<const float4*>(x)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id);
    const int q2 = __float2int_rn(v.z * id), q3 = __float2int_rn(v.w * id);
    int sum = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (!live) return;
    xq[i] = (u32)(q0 & 255) | ((u32)(q1 & 255) << 8) | ((u32)(q2 & 255) << 16) | ((u32)(q3 & 255) << 24);
    if ((i & 7) == 0) xds[i >> 3] = make_float2(d, d * (float)sum);
}

#define QUANT_DOT_ENTRY(NAME, F, T)                                                         \
    extern "C" __global__ void __launch_bounds__(DOT_WARPS * 32)                             \
        quant_dot_##NAME##_##T(const u8* w, u64 row_bytes, int k, int n, const u8* xq,       \
                               const float2* xds, int rows, float* y) {                      \
        quant_dot<F, T>(w, row_bytes, k, n, xq, xds, rows, y);                               \
    }

#define QUANT_DOT_ENTRIES(NAME, F) \
    QUANT_DOT_ENTRY(NAME, F, 1)    \
    QUANT_DOT_ENTRY(NAME, F, 2)    \
    QUANT_DOT_ENTRY(NAME, F, 4)    \
    QUANT_DOT_ENTRY(NAME, F, 8)

QUANT_DOT_ENTRIES(q4_0, QF_Q4_0)
QUANT_DOT_ENTRIES(q5_0, QF_Q5_0)
QUANT_DOT_ENTRIES(q8_0, QF_Q8_0)
QUANT_DOT_ENTRIES(q4_k, QF_Q4_K)
QUANT_DOT_ENTRIES(q5_k, QF_Q5_K)
QUANT_DOT_ENTRIES(q6_k, QF_Q6_K)
