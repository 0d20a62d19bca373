// The KV pool on the device: storing K/V rows into a slab, and attention that reads keys and
// values through a slot table (paged attention).
//
// A slab holds `slots` token rows; row (slot, head) starts at element (slot * n_kv_heads +
// head) * head_dim of the K (and V) array, in one of five element formats (KV_* below). The
// 8-bit formats keep one f32 scale per (slot, head): value = code * scale, with scale =
// max|x| / Q (Q = 448 for e4m3, 127 for int8). Encoding here is bit-for-bit the host's
// (`strata_kv::quant::encode_row`), so a slab written on the GPU equals one written on the CPU.

#define KV_F32 0
#define KV_BF16 1
#define KV_F16 2
#define KV_FP8 3
#define KV_INT8 4

#define E4M3_MAX 448.0f
#define INT8_QMAX 127.0f

__device__ __forceinline__ u16 f32_to_f16_rne(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// Nearest e4m3fn code, ties to even, saturating at +-448 (the host's `encode_e4m3`).
__device__ __forceinline__ unsigned char f32_to_e4m3(float x) {
    if (x != x) return 0x7f;
    const unsigned char sign = (__float_as_uint(x) >> 31) ? 0x80 : 0;
    const float mag = fminf(fabsf(x), E4M3_MAX);
    unsigned char code;
    if (mag < (1.0f / 64.0f)) {
        code = (unsigned char)rintf(mag / (1.0f / 512.0f));
    } else {
        int e = (int)((__float_as_uint(mag) >> 23) & 0xff) - 127;
        const float mantissa = mag / __uint_as_float((u32)(e + 127) << 23) - 1.0f;
        int m = (int)rintf(mantissa * 8.0f);
        if (m == 8) {
            m = 0;
            e += 1;
        }
        code = (unsigned char)(((e + 7) << 3) | m);
    }
    return sign | code;
}

__device__ __forceinline__ float e4m3_to_f32(unsigned char c) {
    const int e = (c >> 3) & 0x0f, m = c & 0x07;
    float mag;
    if (e == 0x0f && m == 0x07) mag = __int_as_float(0x7fc00000);
    else if (e == 0) mag = (float)m / 512.0f;
    else mag = __uint_as_float(((u32)(e - 7 + 127) << 23) | ((u32)m << 20));
    return (c & 0x80) ? -mag : mag;
}

// Element `i` of a slab array of `format`, without the row scale.
__device__ __forceinline__ float kv_load(const unsigned char* p, int format, u64 i) {
    switch (format) {
        case KV_BF16: return bf16_to_f32(((const u16*)p)[i]);
        case KV_F16: return f16_to_f32(((const u16*)p)[i]);
        case KV_FP8: return e4m3_to_f32(p[i]);
        case KV_INT8: return (float)((const signed char*)p)[i];
        default: return ((const float*)p)[i];
    }
}

__device__ __forceinline__ void kv_put(unsigned char* p, int format, u64 i, float x) {
    switch (format) {
        case KV_BF16: ((u16*)p)[i] = f32_to_bf16_rne(x); break;
        case KV_F16: ((u16*)p)[i] = f32_to_f16_rne(x); break;
        case KV_FP8: p[i] = f32_to_e4m3(x); break;
        case KV_INT8: {
            const float q = fminf(fmaxf(roundf(x), -INT8_QMAX), INT8_QMAX);
            ((signed char*)p)[i] = (signed char)(int)q;
            break;
        }
        default: ((float*)p)[i] = x;
    }
}

#define STORE_THREADS 128

__device__ float block_max_abs(const float* x, int d, float* red) {
    float m = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) m = fmaxf(m, fabsf(x[i]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
    __syncthreads();
    float all = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; ++w) all = fmaxf(all, red[w]);
    __syncthreads();
    return all;
}

// Encodes one (token, head) row of `src` into `dst` at `row`; returns nothing, writes the
// row's scale for 8-bit formats.
__device__ void store_row(const float* src, unsigned char* dst, float* scales, int format, u64 row,
                          int d, float* red) {
    float inv = 1.0f;
    if (format == KV_FP8 || format == KV_INT8) {
        const float amax = block_max_abs(src, d, red);
        const float scale = amax / (format == KV_FP8 ? E4M3_MAX : INT8_QMAX);
        inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        if (threadIdx.x == 0) scales[row] = scale;
    }
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float x = format == KV_FP8 || format == KV_INT8 ? src[i] * inv : src[i];
        kv_put(dst, format, row * d + i, x);
    }
}

// Grid: (tokens, n_kv_heads). Row t of k and v ([T, n_kv_heads, d] f32) goes to slots[t].
extern "C" __global__ void __launch_bounds__(STORE_THREADS)
kv_store(const float* k, const float* v, const u32* slots, unsigned char* k_slab,
         unsigned char* v_slab, float* k_scales, float* v_scales, int n_kv_heads, int d,
         int format) {
    __shared__ float red[STORE_THREADS / 32];
    const u64 t = blockIdx.x;
    const int h = blockIdx.y;
    const u64 src = (t * n_kv_heads + h) * d;
    const u64 row = (u64)slots[t] * n_kv_heads + h;
    store_row(k + src, k_slab, k_scales, format, row, d, red);
    store_row(v + src, v_slab, v_scales, format, row, d, red);
}

// kv_store for a bf16 slab (the default KV format) with even d: its own entry point, so a
// decode step's store runs only its own code (the general one inlines every format's
// encoder behind a switch per element: ~800 instructions for a few pairs a thread). Same
// grid; a thread writes value pairs (i, i + 1) as one 4-byte word, each rounded as kv_put
// rounds it.
extern "C" __global__ void __launch_bounds__(STORE_THREADS)
kv_store_bf16(const float* k, const float* v, const u32* slots, u32* k_slab, u32* v_slab,
              int n_kv_heads, int d) {
    const u64 t = blockIdx.x;
    const int h = blockIdx.y, half_d = d >> 1;
    const u64 src = (t * n_kv_heads + h) * half_d;
    const u64 row = ((u64)slots[t] * n_kv_heads + h) * half_d;
    const float2* k2 = reinterpret_cast<const float2*>(k) + src;
    const float2* v2 = reinterpret_cast<const float2*>(v) + src;
    for (int i = threadIdx.x; i < half_d; i += STORE_THREADS) {
        const float2 a = k2[i], b = v2[i];
        k_slab[row + i] = (u32)f32_to_bf16_rne(a.x) | ((u32)f32_to_bf16_rne(a.y) << 16);
        v_slab[row + i] = (u32)f32_to_bf16_rne(b.x) | ((u32)f32_to_bf16_rne(b.y) << 16);
    }
}

// ---- paged attention ---------------------------------------------------------------------
//
// Sequences are described by 5 u32 each: q_offset, q_len, q_start, k_start, slot_offset.
// Query row t (of sequence s) sits at position q_start + (t - q_offset); the sequence's keys
// are positions k_start .. q_start + q_len - 1, key j's slot is slots[slot_offset + j].
// row_seq[t] names t's sequence.
//
// One block of PA_WARPS warps per (query row, head, split); split `z` of `n_splits` walks
// the z-th of n_splits equal parts of the row's visible keys. Each warp takes every PA_WARPS-th
// key with its own online softmax; warps merge in shared memory. With one split the block
// writes the normalised output; otherwise it writes (max, sum, unnormalised acc) to the
// workspace and `paged_combine` merges the splits.

#define PA_MAX_D 512
#define PA_WARPS 4
#define PA_PER_LANE (PA_MAX_D / 32)

extern "C" __global__ void __launch_bounds__(PA_WARPS * 32)
paged_attention(const float* q, const unsigned char* k_slab, const unsigned char* v_slab,
                const float* k_scales, const float* v_scales, const u32* seqs,
                const u32* row_seq, const u32* slots, float* out, float* ws_acc, float* ws_ml,
                int n_heads, int n_kv_heads, int d, int format, float scale, long long window,
                int has_softcap, float softcap, int n_splits, int dense_min_q) {
    __shared__ float q_row[PA_MAX_D];
    __shared__ float warp_max[PA_WARPS];
    __shared__ float warp_sum[PA_WARPS];
    __shared__ float warp_acc[PA_WARPS][PA_MAX_D];

    const u64 t = blockIdx.x;
    const int h = blockIdx.y;
    const int z = blockIdx.z;
    const int kvh = h / (n_heads / n_kv_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bool scaled = format == KV_FP8 || format == KV_INT8;

    const u32* sq = seqs + 5 * (u64)row_seq[t];
    const long long qp = (long long)sq[2] + ((long long)t - (long long)sq[0]);
    const long long k_start = sq[3];
    const u32* sl = slots + sq[4];
    // Visible keys (as indices j from k_start): causal up to qp, and inside the window.
    long long lo = 0, hi = qp - k_start;  // inclusive
    if (window >= 0 && qp - window + 1 - k_start > lo) lo = qp - window + 1 - k_start;
    // Rows of a sequence the dense path attends (q_len >= dense_min_q > 0) get an empty key
    // range here: zeros, overwritten by that path.
    if (dense_min_q > 0 && (int)sq[1] >= dense_min_q) hi = lo - 1;
    // This row's visible keys, split evenly: the grid's split count is fixed (a captured
    // graph replays it unchanged) while each row's key count grows.
    const long long chunk = (hi - lo + n_splits) / n_splits;
    const long long zlo = lo + (long long)z * chunk;
    long long zhi = zlo + chunk - 1;
    if (zhi > hi) zhi = hi;

    const float* qsrc = q + (t * n_heads + h) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) q_row[i] = qsrc[i];
    __syncthreads();

    float m = NEG_INF, l = 0.0f;
    float acc[PA_PER_LANE];
#pragma unroll
    for (int j = 0; j < PA_PER_LANE; ++j) acc[j] = 0.0f;

    for (long long j = zlo + warp; j <= zhi; j += PA_WARPS) {
        const u64 row = (u64)sl[j] * n_kv_heads + kvh;
        const u64 base = row * d;
        const float ks = scaled ? k_scales[row] : 1.0f;
        const float vs = scaled ? v_scales[row] : 1.0f;
        float dot = 0.0f;
#pragma unroll
        for (int jj = 0; jj < PA_PER_LANE; ++jj) {
            const int i = lane + 32 * jj;
            if (i < d) dot += q_row[i] * kv_load(k_slab, format, base + i);
        }
        dot = warp_sum_f32(dot) * ks;
        float s = dot * scale;
        if (has_softcap) s = softcap * tanhf(s / softcap);
        const float m_new = fmaxf(m, s);
        const float correction = expf(m - m_new);
        const float p = expf(s - m_new);
        l = l * correction + p;
        const float pv = p * vs;
#pragma unroll
        for (int jj = 0; jj < PA_PER_LANE; ++jj) {
            const int i = lane + 32 * jj;
            if (i < d) acc[jj] = acc[jj] * correction + pv * kv_load(v_slab, format, base + i);
        }
        m = m_new;
    }

    if (lane == 0) {
        warp_max[warp] = m;
        warp_sum[warp] = l;
    }
#pragma unroll
    for (int jj = 0; jj < PA_PER_LANE; ++jj) {
        const int i = lane + 32 * jj;
        if (i < d) warp_acc[warp][i] = acc[jj];
    }
    __syncthreads();

    float gmax = NEG_INF;
    for (int w = 0; w < PA_WARPS; ++w)
        if (warp_sum[w] > 0.0f) gmax = fmaxf(gmax, warp_max[w]);
    float total = 0.0f;
    float weight[PA_WARPS];
    for (int w = 0; w < PA_WARPS; ++w) {
        weight[w] = warp_sum[w] > 0.0f ? expf(warp_max[w] - gmax) : 0.0f;
        total += warp_sum[w] * weight[w];
    }
    const u64 task = t * n_heads + h;
    if (n_splits == 1) {
        float* dst = out + task * d;
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < PA_WARPS; ++w) o += warp_acc[w][i] * weight[w];
            dst[i] = total > 0.0f ? o / total : 0.0f;
        }
    } else {
        const u64 part = task * n_splits + z;
        float* dst = ws_acc + part * d;
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < PA_WARPS; ++w) o += warp_acc[w][i] * weight[w];
            dst[i] = o;
        }
        if (threadIdx.x == 0) {
            ws_ml[2 * part] = gmax;
            ws_ml[2 * part + 1] = total;
        }
    }
}

// Grid (query row x head, column chunks of 128): merges the splits' partial softmax
// results. Warp 0 of each block turns the splits' (max, sum) pairs into weights; every
// thread then sums one column over the splits (the column chunks give a batch of one row
// enough blocks to read the workspace in parallel). `out_b`, when not null, receives the
// result in bf16 too (the o projection's GEMM operand).
#define PA_MAX_SPLITS 64  // MAX_SPLITS in cuda/paged.rs
#define COMBINE_COLS 128
#define COMBINE_BATCH 16

extern "C" __global__ void __launch_bounds__(COMBINE_COLS)
paged_combine(const float* ws_acc, const float* ws_ml, float* out, u16* out_b, int d,
              int n_splits) {
    __shared__ float weight[PA_MAX_SPLITS];
    __shared__ float total_sum;
    const u64 task = blockIdx.x;
    const u64 first = task * n_splits;
    if (threadIdx.x < 32) {
        // A lane's (max, sum) pairs are loaded once, all before the first use.
        const int lane = threadIdx.x;
        float2 ml[PA_MAX_SPLITS / 32];
#pragma unroll
        for (int j = 0; j < PA_MAX_SPLITS / 32; ++j) {
            const int z = lane + 32 * j;
            ml[j] = z < n_splits ? reinterpret_cast<const float2*>(ws_ml)[first + z]
                                 : make_float2(NEG_INF, 0.0f);
        }
        float gmax = NEG_INF;
#pragma unroll
        for (int j = 0; j < PA_MAX_SPLITS / 32; ++j)
            if (ml[j].y > 0.0f) gmax = fmaxf(gmax, ml[j].x);
        for (int o = 16; o > 0; o >>= 1) gmax = fmaxf(gmax, __shfl_xor_sync(0xffffffffu, gmax, o));
        float total = 0.0f;
#pragma unroll
        for (int j = 0; j < PA_MAX_SPLITS / 32; ++j) {
            const int z = lane + 32 * j;
            if (z < n_splits) {
                const float w = ml[j].y > 0.0f ? expf(ml[j].x - gmax) : 0.0f;
                weight[z] = w;
                total += ml[j].y * w;
            }
        }
        total = warp_sum_f32(total);
        if (lane == 0) total_sum = total;
    }
    __syncthreads();
    const float total = total_sum;
    const int i = blockIdx.y * COMBINE_COLS + threadIdx.x;
    if (i >= d) return;
    float o = 0.0f;
    // Empty splits (weight 0: rows shorter than the grid's split count) add nothing. The
    // splits go in groups of COMBINE_BATCH whose loads are all issued before the first
    // add (the adds stay in split order): one L2 round trip a group, not one per few
    // splits (a batch-1 step's 64 splits were 16 dependent rounds). Every split block
    // writes its whole part of the workspace, empty ones included, so every load reads
    // written values.
    const float* col = ws_acc + first * d + i;
    int z = 0;
    for (; z + COMBINE_BATCH <= n_splits; z += COMBINE_BATCH) {
        float a[COMBINE_BATCH];
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; ++u) a[u] = col[(u64)(z + u) * d];
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; ++u)
            if (weight[z + u] != 0.0f) o = fmaf(a[u], weight[z + u], o);
    }
    for (; z < n_splits; ++z)
        if (weight[z] != 0.0f) o = fmaf(col[(u64)z * d], weight[z], o);
    const float y = total > 0.0f ? o / total : 0.0f;
    out[task * d + i] = y;
    if (out_b) out_b[task * d + i] = f32_to_bf16_rne(y);
}

// Grid: sequences. A decode graph's slot table written from its sequences' pages, so the
// host sends a page id a page instead of a slot a key: `buf` holds each sequence's first
// page index (n_seqs of them), then the pages; sequence s reads positions k_start .. q_start +
// q_len, position p in page buf[n_seqs + first + p / page_size - k_start / page_size] at slot
// page * page_size + p % page_size, stored at slots[slot_offset + p - k_start]
// (`expand_page_slots` in paged.rs is the same on the host).
extern "C" __global__ void __launch_bounds__(256)
expand_page_slots(const u32* seqs, const u32* buf, u32* slots, u32 page_size, u32 n_seqs) {
    const u32* sq = seqs + 5 * blockIdx.x;  // q_offset, q_len, q_start, k_start, slot_offset
    const u32 k_start = sq[3], end = sq[2] + sq[1], off = sq[4];
    const u32 first = n_seqs + buf[blockIdx.x], lo = k_start / page_size;
    for (u32 p = k_start + threadIdx.x; p < end; p += blockDim.x)
        slots[off + p - k_start] = buf[first + p / page_size - lo] * page_size + p % page_size;
}

// ---- dense attention for long query runs (prefill) ---------------------------------------
//
// A sequence with many query rows is attended with GEMMs (`cuda/dense_attention.rs`):
// its visible keys and values are gathered from the slab into dense f32 [keys, n_kv_heads, d]
// arrays, scores S = Q K^T come from one batched GEMM per KV head, `masked_softmax` turns
// each row of S into probabilities in place, and a second GEMM writes P V into the output.

// Grid: (keys, n_kv_heads). Key j's row comes from slots[j], dequantized (times its scale).
extern "C" __global__ void __launch_bounds__(128)
kv_gather(const unsigned char* k_slab, const unsigned char* v_slab, const float* k_scales,
          const float* v_scales, const u32* slots, float* k_out, float* v_out, int n_kv_heads,
          int d, int format) {
    const u64 j = blockIdx.x;
    const int h = blockIdx.y;
    const u64 row = (u64)slots[j] * n_kv_heads + h;
    const bool scaled = format == KV_FP8 || format == KV_INT8;
    const float ks = scaled ? k_scales[row] : 1.0f;
    const float vs = scaled ? v_scales[row] : 1.0f;
    const u64 dst = (j * n_kv_heads + h) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        k_out[dst + i] = kv_load(k_slab, format, row * d + i) * ks;
        v_out[dst + i] = kv_load(v_slab, format, row * d + i) * vs;
    }
}

__device__ float block_reduce(float v, bool is_max, float* red) {
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float all = is_max ? NEG_INF : 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; ++w) all = is_max ? fmaxf(all, red[w]) : all + red[w];
    __syncthreads();
    return all;
}

// One block per row of S ([rows, n_keys], row r = query r % tile of one head). Query r sits
// at position q_pos0 + r % tile, key j at k_pos0 + j; scores are scaled, soft-capped and
// masked (causal, window) as paged_attention does, then replaced by their softmax.
extern "C" __global__ void __launch_bounds__(256)
masked_softmax(float* s, int n_keys, int tile, long long q_pos0, long long k_pos0, float scale,
               int has_softcap, float softcap, long long window) {
    __shared__ float red[8];
    float* row = s + (u64)blockIdx.x * n_keys;
    const long long qp = q_pos0 + (long long)(blockIdx.x % tile);
    float m = NEG_INF;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
        const long long kp = k_pos0 + j;
        float v = NEG_INF;
        if (kp <= qp && (window < 0 || qp - kp < window)) {
            v = row[j] * scale;
            if (has_softcap) v = softcap * tanhf(v / softcap);
        }
        row[j] = v;
        m = fmaxf(m, v);
    }
    m = block_reduce(m, true, red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
        const float p = row[j] == NEG_INF ? 0.0f : expf(row[j] - m);
        row[j] = p;
        sum += p;
    }
    sum = block_reduce(sum, false, red);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) row[j] *= inv;
}
