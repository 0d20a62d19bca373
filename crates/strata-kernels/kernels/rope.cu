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

// 1 / rms of a register-held row (lane l holds elements l + 32 j): the sum of squares in
// f64 over the warp, then rms_norm's f32 scale.
template <int E>
__device__ __forceinline__ float head_rms_inv(const float (&v)[E], float eps) {
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < E; ++j) ss += (double)v[j] * (double)v[j];
    ss = warp_sum_f64(ss);
    return (float)(1.0 / sqrt(ss / (32 * E) + (double)eps));
}

// Rotates a register-held row's half-split pairs (elements j and j + E / 2 of a lane) by
// pos * f[j]; a zero frequency leaves its pair untouched.
template <int E>
__device__ __forceinline__ void rotate_half_regs(float (&v)[E], const float* f, float pos) {
#pragma unroll
    for (int j = 0; j < E / 2; ++j) {
        if (f[j] == 0.0f) continue;
        float s, c;
        sincosf(pos * f[j], &s, &c);
        const float a = v[j], b = v[j + E / 2];
        v[j] = a * c - b * s;
        v[j + E / 2] = b * c + a * s;
    }
}

// One (token, head) row with head_dim = 32 E held in registers: lane l holds elements
// l + 32 j. A rotated pair (i, i + head_dim / 2) then sits in one lane (j and j + E / 2),
// and an interleaved pair (2i, 2i + 1) in lanes l and l ^ 1 at the same j. Every load is
// issued first and the row is written once: the same arithmetic as the generic loop
// below, without its store -> reload round trips.
template <int E>
__device__ __forceinline__ void head_norm_rope_regs(float* xr, const void* w, int w_dtype,
                                                    float offset, float eps, bool rotate,
                                                    const u32* pos_at, const float* inv_freq,
                                                    int interleaved) {
    constexpr int D = 32 * E;
    const int lane = threadIdx.x & 31;
    float v[E], g[E], f[E];
    const float pos = rotate ? (float)*pos_at : 0.0f;
#pragma unroll
    for (int j = 0; j < E; ++j) {
        const int i = lane + 32 * j;
        v[j] = xr[i];
        // The pair's frequency: element i's pair index.
        const int p = interleaved ? i / 2 : (j < E / 2 ? i : i - D / 2);
        f[j] = rotate ? inv_freq[p] : 0.0f;
    }
    // One branch on the weight's dtype for all E loads.
    switch (w_dtype) {
        case STRATA_BF16:
#pragma unroll
            for (int j = 0; j < E; ++j) g[j] = bf16_to_f32(((const u16*)w)[lane + 32 * j]);
            break;
        case STRATA_F16:
#pragma unroll
            for (int j = 0; j < E; ++j) g[j] = f16_to_f32(((const u16*)w)[lane + 32 * j]);
            break;
        case STRATA_F32:
#pragma unroll
            for (int j = 0; j < E; ++j) g[j] = ((const float*)w)[lane + 32 * j];
            break;
        default:
#pragma unroll
            for (int j = 0; j < E; ++j) g[j] = 0.0f;
    }
    const float inv = head_rms_inv<E>(v, eps);
#pragma unroll
    for (int j = 0; j < E; ++j) {
        v[j] = v[j] * inv;
        if (w_dtype >= 0) v[j] = v[j] * (g[j] + offset);
    }
    if (rotate) {
        if (interleaved) {
#pragma unroll
            for (int j = 0; j < E; ++j) {
                const float other = __shfl_xor_sync(0xffffffffu, v[j], 1);
                if (f[j] == 0.0f) continue;
                float s, c;
                sincosf(pos * f[j], &s, &c);
                // Even lanes hold a (the pair's first element), odd lanes b.
                v[j] = (lane & 1) == 0 ? v[j] * c - other * s : v[j] * c + other * s;
            }
        } else {
            rotate_half_regs<E>(v, f, pos);
        }
    }
#pragma unroll
    for (int j = 0; j < E; ++j) xr[lane + 32 * j] = v[j];
}

// The (token, head) row of a warp and its segment's fields; false past the last row.
struct HeadRow {
    float* xr;
    const void* w;
    int w_dtype;
    bool rotate;
    const u32* pos_at;
    int row;      // token * n_heads + head
    int n_heads;  // the segment's
};

__device__ __forceinline__ bool head_row(const HeadSegs& segs, const u32* positions, int tokens,
                                         int head_dim, HeadRow& r) {
    const int seg = blockIdx.y;
    const int n_heads = pick3(segs.n_heads, seg);
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= tokens * n_heads) return false;
    r.xr = pick3(segs.x, seg) + (u64)row * head_dim;
    r.w = pick3(segs.w, seg);
    r.w_dtype = pick3(segs.w_dtype, seg);
    r.rotate = pick3(segs.rope, seg) != 0;
    r.pos_at = positions + row / n_heads;
    r.row = row;
    r.n_heads = n_heads;
    return true;
}

// One entry point per head_dim of the register path: each holds only its own code (one
// kernel with every width and the strided loops was three times as long, and its launches
// took 7.7 us at 112 tokens on an H200 for about 2 us of work on the multiprocessors).
#define HEAD_NORM_ROPE_REGS(D)                                                                  \
    extern "C" __global__ void head_norm_rope_d##D(HeadSegs segs, const u32* positions,        \
                                                   const float* inv_freq, float offset,       \
                                                   float eps, int tokens, int head_dim,       \
                                                   int interleaved) {                         \
        HeadRow r;                                                                             \
        if (!head_row(segs, positions, tokens, D, r)) return;                                  \
        head_norm_rope_regs<D / 32>(r.xr, r.w, r.w_dtype, offset, eps, r.rotate, r.pos_at,     \
                                    inv_freq, interleaved);                                    \
    }

HEAD_NORM_ROPE_REGS(64)
HEAD_NORM_ROPE_REGS(128)
HEAD_NORM_ROPE_REGS(256)
HEAD_NORM_ROPE_REGS(512)

// The model's case on an entry point of its own (`head_norm_rope_f32_d<D>`): f32 weights
// or none, the half-split rotation (not interleaved). Each block takes one straight path
// for its segment (weighted and rotated for q and k, plain for v), with no dtype switch
// and no style test among the element loops: a short kernel's time goes with the
// instruction stream it runs (the same lesson as the norms' typed entry points). The
// arithmetic is head_norm_rope_regs's, in the same order, so the results are the same bits.
// `kv`, when not null, is the row's place in a bf16 K or V slab: the result also goes there,
// rounded as `kv_store_bf16` rounds it. The row is read from `xin`, the sum of its `parts`
// parts `pstride` apart added in order in f32 (a product split over k; one part: `xin` is
// `xr`, the row in place).
template <int E, bool W, bool ROT>
__device__ __forceinline__ void head_norm_rope_f32(float* xr, const float* w, float offset,
                                                   float eps, const u32* pos_at,
                                                   const float* inv_freq, u16* kv,
                                                   const float* xin, int parts, u64 pstride) {
    const int lane = threadIdx.x & 31;
    float v[E], g[E], f[E / 2];
    const float pos = ROT ? (float)*pos_at : 0.0f;
#pragma unroll
    for (int j = 0; j < E; ++j) {
        v[j] = xin[lane + 32 * j];
        if (W) g[j] = w[lane + 32 * j];
    }
    for (int p = 1; p < parts; ++p) {
        float t[E];
#pragma unroll
        for (int j = 0; j < E; ++j) t[j] = xin[p * pstride + lane + 32 * j];
#pragma unroll
        for (int j = 0; j < E; ++j) v[j] += t[j];
    }
    if (ROT) {
#pragma unroll
        for (int j = 0; j < E / 2; ++j) f[j] = inv_freq[lane + 32 * j];
    }
    const float inv = head_rms_inv<E>(v, eps);
#pragma unroll
    for (int j = 0; j < E; ++j) {
        v[j] = v[j] * inv;
        if (W) v[j] = v[j] * (g[j] + offset);
    }
    if (ROT) rotate_half_regs<E>(v, f, pos);
#pragma unroll
    for (int j = 0; j < E; ++j) xr[lane + 32 * j] = v[j];
    if (kv) {
#pragma unroll
        for (int j = 0; j < E; ++j) kv[lane + 32 * j] = f32_to_bf16_rne(v[j]);
    }
}

// The launcher takes these only when every segment's weight is f32 or absent and the
// rotation is half-split; `interleaved` is then 0 and unused. `kv` is null, or the row's
// place in a bf16 slab (see `head_norm_rope_store_f32_d<D>`).
template <int D>
__device__ __forceinline__ void head_norm_rope_f32_row(const HeadRow& r, const float* inv_freq,
                                                       float offset, float eps, u16* kv,
                                                       const float* xin, int parts,
                                                       u64 pstride) {
    const float* w = (const float*)r.w;
    if (r.w_dtype == STRATA_F32) {
        if (r.rotate)
            head_norm_rope_f32<D / 32, true, true>(r.xr, w, offset, eps, r.pos_at, inv_freq, kv,
                                                   xin, parts, pstride);
        else
            head_norm_rope_f32<D / 32, true, false>(r.xr, w, offset, eps, r.pos_at, inv_freq, kv,
                                                    xin, parts, pstride);
    } else if (r.rotate) {
        head_norm_rope_f32<D / 32, false, true>(r.xr, w, offset, eps, r.pos_at, inv_freq, kv, xin,
                                                parts, pstride);
    } else {
        head_norm_rope_f32<D / 32, false, false>(r.xr, w, offset, eps, r.pos_at, inv_freq, kv, xin,
                                                 parts, pstride);
    }
}

#define HEAD_NORM_ROPE_F32(D)                                                                   \
    extern "C" __global__ void head_norm_rope_f32_d##D(HeadSegs segs, const u32* positions,    \
                                                       const float* inv_freq, float offset,   \
                                                       float eps, int tokens, int head_dim,   \
                                                       int interleaved) {                     \
        (void)interleaved;                                                                     \
        HeadRow r;                                                                             \
        if (!head_row(segs, positions, tokens, D, r)) return;                                  \
        head_norm_rope_f32_row<D>(r, inv_freq, offset, eps, nullptr, r.xr, 1, 0);              \
    }

HEAD_NORM_ROPE_F32(64)
HEAD_NORM_ROPE_F32(128)
HEAD_NORM_ROPE_F32(256)
HEAD_NORM_ROPE_F32(512)

// A KV-owning layer's q, k and v prepared and k and v stored into bf16 slabs in the same
// launch (segments 0, 1, 2 = q, k, v), so a decode step has no `kv_store_bf16` launch after
// it. Row (token t, head h) of k or v goes to slab row slots[t] * n_kv_heads + h, where
// kv_store_bf16 would put it, with the same rounding; x keeps the f32 result as well.
#define HEAD_NORM_ROPE_STORE_F32(D)                                                             \
    extern "C" __global__ void head_norm_rope_store_f32_d##D(                                  \
        HeadSegs segs, const u32* positions, const float* inv_freq, float offset, float eps,  \
        int tokens, int head_dim, int interleaved, const u32* slots, u16* k_slab,              \
        u16* v_slab) {                                                                         \
        (void)interleaved;                                                                     \
        HeadRow r;                                                                             \
        if (!head_row(segs, positions, tokens, D, r)) return;                                  \
        u16* kv = nullptr;                                                                     \
        if (blockIdx.y > 0) {                                                                  \
            const u64 dst = (u64)slots[r.row / r.n_heads] * r.n_heads + r.row % r.n_heads;     \
            kv = (blockIdx.y == 1 ? k_slab : v_slab) + dst * D;                                \
        }                                                                                      \
        head_norm_rope_f32_row<D>(r, inv_freq, offset, eps, kv, r.xr, 1, 0);                   \
    }

HEAD_NORM_ROPE_STORE_F32(64)
HEAD_NORM_ROPE_STORE_F32(128)
HEAD_NORM_ROPE_STORE_F32(256)
HEAD_NORM_ROPE_STORE_F32(512)

// The same on a product in parts (`Backend::head_norm_rope_parts_idx`): segment 0 alone,
// its `x` the output [tokens, n_heads, D]; row (t, h)'s input is the sum of `parts` rows of
// `xin [tokens, parts, n_heads * D]`, so the product before it needs no reduce of its own
// (a KV-shared layer's q). f32 weights or none, half-split rotation, as above.
#define HEAD_NORM_ROPE_PARTS_F32(D)                                                             \
    extern "C" __global__ void head_norm_rope_parts_f32_d##D(                                  \
        HeadSegs segs, const u32* positions, const float* inv_freq, float offset, float eps,  \
        int tokens, int head_dim, int interleaved, const float* xin, int parts) {              \
        (void)interleaved;                                                                     \
        HeadRow r;                                                                             \
        if (!head_row(segs, positions, tokens, D, r)) return;                                  \
        const u64 width = (u64)r.n_heads * D;                                                  \
        const int t = r.row / r.n_heads, h = r.row % r.n_heads;                                \
        const float* in = xin + (u64)t * parts * width + (u64)h * D;                           \
        head_norm_rope_f32_row<D>(r, inv_freq, offset, eps, nullptr, in, parts, width);        \
    }

HEAD_NORM_ROPE_PARTS_F32(64)
HEAD_NORM_ROPE_PARTS_F32(128)
HEAD_NORM_ROPE_PARTS_F32(256)
HEAD_NORM_ROPE_PARTS_F32(512)

// Other head_dims: strided passes over the row in memory.
extern "C" __global__ void head_norm_rope(HeadSegs segs, const u32* positions,
                                          const float* inv_freq, float offset, float eps,
                                          int tokens, int head_dim, int interleaved) {
    HeadRow r;
    if (!head_row(segs, positions, tokens, head_dim, r)) return;
    const int lane = threadIdx.x & 31;
    float* xr = r.xr;
    const void* w = r.w;
    const int w_dtype = r.w_dtype;
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
    if (!r.rotate) return;
    __syncwarp();  // the rotation pairs elements written by other lanes
    const int half = head_dim / 2;
    const float pos = (float)*r.pos_at;
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
