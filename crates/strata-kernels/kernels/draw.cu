// Sampled tokens where the logits are: the host's draw (`sampling/draw.rs`, arithmetic in
// `sampling/weight.rs`) reproduced to the bit. Every weight is an integer (fixed point), so
// sums do not depend on the order they are taken in; the exponential is the host's sequence
// of IEEE operations, written with intrinsics that the compiler can neither fuse nor
// reorder.
//
// A first pass spreads each drawn row over several blocks (draw_first_pass); then one block a
// drawn row finishes it (draw_rows). A filtered draw (top-k, top-p, min-p) never sorts: each
// cut is a position in the rank order (value descending, ties to the lower id), found by a
// search that narrows a histogram of the live candidates (relative value at least -40): the
// first pass's 2048 bins of the relative value, then the bin found, its candidates gathered
// into shared memory and sorted where they fit, else level by level over 256-bin digits of
// the rank key (a pass over the row a level), then, among equal values, the id.

#define DRAW_THREADS 1024
#define DRAW_WARPS (DRAW_THREADS / 32)
#define DRAW_BINS0 2048
#define DRAW_BINS 256
// Relative values below this weigh 0 (WEIGHT_CUTOFF); the first level's bins are this
// range in steps of 1/51.2.
#define DRAW_CUTOFF -40.0f
#define DRAW_BIN_SCALE 51.2f
// Words of one draw's arguments (`draw_args` in cuda/picks.rs).
#define DRAW_ARG_WORDS 5
// Candidates of one first-level bin sorted in shared memory (more: one pass a level).
#define DRAW_GATHER 2048
// The first pass (draw_first_pass) runs DRAW_PASS_THREADS a block, several blocks a row, and
// leaves for draw_rows, a drawn row at a time: the first-level histogram (DRAW_HIST_WORDS
// u64: weights of DRAW_BINS0 bins, their counts as u32, then live, kept, kept weight and
// total, then the row's best value) and each value's bin (u16, DRAW_NO_BIN when not live).
#define DRAW_PASS_THREADS 256
#define DRAW_TOTALS (DRAW_BINS0 + DRAW_BINS0 / 2)
#define DRAW_BEST_WORD (DRAW_TOTALS + 4)
#define DRAW_HIST_WORDS (DRAW_TOTALS + 5)
#define DRAW_NO_BIN 0xffffu
#define DRAW_FILTERED 1u
#define DRAW_TOP_P 2u
// An entry that reports the row's logprobs (logprob_rows) instead of drawing: the first
// pass builds its histogram of the raw values (1/temperature = 1, no filter).
#define DRAW_LOGPROBS 4u
// Top logprobs an entry reports at most, and the u64 words of its report: the best value,
// the total weight, (token id << 32) | the token's value, the count, then (id << 32) |
// value of each top candidate in order (values as f32 bits).
#define LOGPROB_TOP_MAX 20
#define LOGPROB_WORDS (4 + LOGPROB_TOP_MAX)

// e^x for x in [-40, 0], exactly as `exp_neg` in weight.rs computes it.
__device__ __forceinline__ double draw_exp_neg(double x) {
    const double log2_e = __longlong_as_double(0x3ff71547652b82feLL);
    const double ln2_hi = __longlong_as_double(0x3fe62e42fee00000LL);
    const double ln2_lo = __longlong_as_double(0x3dea39ef35793c76LL);
    const double k = round(__dmul_rn(x, log2_e));
    double r = __fma_rn(-k, ln2_hi, x);
    r = __fma_rn(-k, ln2_lo, r);
    double p = __longlong_as_double(0x3de6124613a86d09LL);
    p = __fma_rn(p, r, __longlong_as_double(0x3e21eed8eff8d898LL));
    p = __fma_rn(p, r, __longlong_as_double(0x3e5ae64567f544e4LL));
    p = __fma_rn(p, r, __longlong_as_double(0x3e927e4fb7789f5cLL));
    p = __fma_rn(p, r, __longlong_as_double(0x3ec71de3a556c734LL));
    p = __fma_rn(p, r, __longlong_as_double(0x3efa01a01a01a01aLL));
    p = __fma_rn(p, r, __longlong_as_double(0x3f2a01a01a01a01aLL));
    p = __fma_rn(p, r, __longlong_as_double(0x3f56c16c16c16c17LL));
    p = __fma_rn(p, r, __longlong_as_double(0x3f81111111111111LL));
    p = __fma_rn(p, r, __longlong_as_double(0x3fa5555555555555LL));
    p = __fma_rn(p, r, __longlong_as_double(0x3fc5555555555555LL));
    p = __fma_rn(p, r, __longlong_as_double(0x3fe0000000000000LL));
    p = __fma_rn(p, r, 1.0);
    p = __fma_rn(p, r, 1.0);
    return __dmul_rn(p, __longlong_as_double((long long)(1023 + (long long)k) << 52));
}

// `fixed_weight`: floor(e^d * 2^shift).
__device__ __forceinline__ u64 draw_weight(float d, u32 shift) {
    if (!(d >= DRAW_CUTOFF)) return 0;
    const double scale = __longlong_as_double((long long)(1023 + shift) << 52);
    return (u64)__dmul_rn(draw_exp_neg((double)d), scale);
}

// The logit as the draw sees it (`scaled`): capped as `softcap` caps it, NaN as -inf,
// times 1/temperature, -0 as +0.
__device__ __forceinline__ float draw_scaled(float x, int has_cap, float cap, float inv_t) {
    if (has_cap) x = cap * tanhf(x / cap);
    if (x != x) x = NEG_INF;
    return __fadd_rn(__fmul_rn(x, inv_t), 0.0f);
}

__device__ __forceinline__ float draw_relative(float s, float max) {
    return s == max ? 0.0f : __fsub_rn(s, max);
}

// `rank`: smaller first in the candidate order.
__device__ __forceinline__ u32 draw_rank(float s) {
    const u32 b = __float_as_uint(s);
    return ~((b & 0x80000000u) ? ~b : (b | 0x80000000u));
}

// The value whose rank key is r (draw_rank inverted).
__device__ __forceinline__ float draw_unrank(u32 r) {
    const u32 o = ~r;
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// The first level's bin of a live relative value (monotone: a larger value, a lower bin).
__device__ __forceinline__ u32 draw_bin0(float d) {
    const int b = (int)__fmul_rn(-d, DRAW_BIN_SCALE);
    return b < DRAW_BINS0 - 1 ? (u32)b : DRAW_BINS0 - 1;
}

// floor(a * b / 2^s), 0 < s < 64.
__device__ __forceinline__ u64 draw_mul_shr(u64 a, u64 b, u32 s) {
    const u64 lo = a * b, hi = __umul64hi(a, b);
    return (hi << (64 - s)) | (lo >> s);
}

// Calls f(x, id) for every logit of the row, from one block: four 16-byte loads a thread in
// flight where the row allows it (one value at a time, a block streams a row at a few GB/s).
template <typename F>
__device__ __forceinline__ void draw_each(const float* row, u32 vocab, F f) {
    if ((vocab & 3u) == 0 && ((u64)row & 15u) == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        const u32 n4 = vocab / 4;
        u32 i = threadIdx.x;
        for (; i + 3 * DRAW_THREADS < n4; i += 4 * DRAW_THREADS) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = r4[i + u * DRAW_THREADS];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const u32 at = 4 * (i + u * DRAW_THREADS);
                f(v[u].x, at);
                f(v[u].y, at + 1);
                f(v[u].z, at + 2);
                f(v[u].w, at + 3);
            }
        }
        for (; i < n4; i += DRAW_THREADS) {
            const float4 v = r4[i];
            f(v.x, 4 * i);
            f(v.y, 4 * i + 1);
            f(v.z, 4 * i + 2);
            f(v.w, 4 * i + 3);
        }
    } else {
        for (u32 i = threadIdx.x; i < vocab; i += DRAW_THREADS) f(row[i], i);
    }
}

// Block-wide reductions (every thread gets the result). `scratch` holds DRAW_WARPS words.
__device__ __forceinline__ u64 draw_block_sum(u64 v, u64* scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    u64 t = 0;
    for (int w = 0; w < DRAW_WARPS; ++w) t += scratch[w];
    return t;
}

// (min, max) of v over the block, as one pass of two reductions.
__device__ __forceinline__ void draw_block_min_max(u32 lo, u32 hi, u64* scratch, u32* out_lo,
                                                   u32* out_hi) {
    for (int o = 16; o > 0; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) scratch[warp] = ((u64)hi << 32) | lo;
    __syncthreads();
    u32 l = 0xffffffffu, h = 0;
    for (int w = 0; w < DRAW_WARPS; ++w) {
        l = min(l, (u32)scratch[w]);
        h = max(h, (u32)(scratch[w] >> 32));
    }
    *out_lo = l;
    *out_hi = h;
}

// Exclusive prefix sum of v over the threads in order.
__device__ __forceinline__ u64 draw_block_exclusive(u64 v, u64* scratch) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    u64 inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 n = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += n;
    }
    __syncthreads();
    if (lane == 31) scratch[warp] = inc;
    __syncthreads();
    u64 before = 0;
    for (int w = 0; w < warp; ++w) before += scratch[w];
    return before + inc - v;
}

// The first id, in id order, where the running sum of wf(x, id) passes `target` (below the
// row's sum of wf). Each thread takes a contiguous stretch of ids; the stretches' sums are
// scanned in order and the thread whose stretch holds the crossing walks it.
template <typename WF>
__device__ u32 draw_walk_ids(const float* row, u32 vocab, WF wf, u64 target, u64* scratch,
                             u32* result) {
    const u32 per = ((vocab + DRAW_THREADS - 1) / DRAW_THREADS + 3) & ~3u;
    const u32 from = min(vocab, threadIdx.x * per), to = min(vocab, from + per);
    u64 mine = 0;
    for (u32 j = from; j < to; ++j) mine += wf(row[j], j);
    const u64 before = draw_block_exclusive(mine, scratch);
    if (threadIdx.x == 0) *result = 0xffffffffu;
    __syncthreads();
    if (mine > 0 && before <= target && target < before + mine) {
        u64 cum = before;
        for (u32 j = from; j < to; ++j) {
            cum += wf(row[j], j);
            if (cum > target) {
                *result = j;
                break;
            }
        }
    }
    __syncthreads();
    return *result;
}

// Shared state of draw_rows.
struct DrawShared {
    u32 count0[DRAW_BINS0];
    u64 mass0[DRAW_BINS0];
    u32 count[DRAW_BINS];
    u64 mass[DRAW_BINS];
    u32 min_id[DRAW_BINS];
    // A first-level bin's candidates as (rank << 32) | id, when they fit.
    u64 gathered[DRAW_GATHER];
    u64 scratch[DRAW_WARPS];
    u32 found_bin, result, gathered_n;
    u64 found_count, found_mass;
};

// Search modes: the position of the target-th candidate; the first position whose running
// weight reaches the target; the first whose running weight passes it.
#define DRAW_BY_COUNT 0
#define DRAW_REACHES 1
#define DRAW_PASSES 2

// Over `bins` bins (counts, masses) after `above` (count, mass) of earlier candidates: the
// first non-empty bin where the search's target is met, with the count and mass before it.
// One warp: each lane scans a run of bins, then the lanes' totals are scanned in order.
__device__ void draw_find_bin(const u32* count, const u64* mass, u32 bins, int mode, u64 target,
                              u64 above_count, u64 above_mass, DrawShared* sh) {
    if (threadIdx.x >= 32) return;
    const u32 lane = threadIdx.x, per = bins / 32;
    u64 c = 0, m = 0;
    for (u32 b = lane * per; b < (lane + 1) * per; ++b) {
        c += count[b];
        m += mass[b];
    }
    u64 ci = c, mi = m;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 nc = __shfl_up_sync(0xffffffffu, ci, o), nm = __shfl_up_sync(0xffffffffu, mi, o);
        if (lane >= (u32)o) {
            ci += nc;
            mi += nm;
        }
    }
    u64 bc = above_count + ci - c, bm = above_mass + mi - m;
    const bool lane_met = mode == DRAW_BY_COUNT  ? bc + c >= target
                          : mode == DRAW_REACHES ? c > 0 && bm + m >= target
                                                 : bm + m > target;
    const u32 first = __ffs(__ballot_sync(0xffffffffu, lane_met)) - 1;
    if (lane == first) {
        for (u32 b = lane * per; b < (lane + 1) * per; ++b) {
            const bool met = mode == DRAW_BY_COUNT  ? bc + count[b] >= target
                             : mode == DRAW_REACHES ? count[b] > 0 && bm + mass[b] >= target
                                                    : bm + mass[b] > target;
            if (met) {
                sh->found_bin = b;
                sh->found_count = bc;
                sh->found_mass = bm;
                break;
            }
            bc += count[b];
            bm += mass[b];
        }
    }
}

// A position in the rank order found by draw_search: the candidate's id, how many come up to
// and including it, and their weight.
struct DrawPos {
    u32 id;
    u64 count, mass;
};

// draw_search's end when the first-level bin `bin` holds at most DRAW_GATHER candidates:
// one pass gathers them, a bitonic sort puts them in rank order, and a scan of their
// weights finds the position.
__device__ DrawPos draw_search_gathered(const float* row, const u16* bins, u32 vocab, int has_cap,
                                        float cap, float inv_t, float best, u32 shift, int mode,
                                        u64 target, u32 bin, u64 above_count, u64 above_mass,
                                        DrawShared* sh) {
    const u32 n = sh->count0[bin];
    __syncthreads();
    if (threadIdx.x == 0) {
        sh->gathered_n = 0;
        sh->result = 0xffffffffu;
    }
    __syncthreads();
    // The first pass noted each value's bin: only the bin's values are read again.
    const auto gather = [&](u32 b, u32 id) {
        if (b == bin) {
            const float s = draw_scaled(row[id], has_cap, cap, inv_t);
            const u32 at = atomicAdd(&sh->gathered_n, 1u);
            sh->gathered[at] = ((u64)draw_rank(s) << 32) | id;
        }
    };
    if ((vocab & 7u) == 0 && ((u64)bins & 15u) == 0) {
        const uint4* b8 = reinterpret_cast<const uint4*>(bins);
        const u32 n8 = vocab / 8;
        for (u32 i = threadIdx.x; i < n8; i += DRAW_THREADS) {
            const uint4 v = b8[i];
            const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                gather(w[k] & 0xffffu, 8 * i + 2 * k);
                gather(w[k] >> 16, 8 * i + 2 * k + 1);
            }
        }
    } else {
        for (u32 i = threadIdx.x; i < vocab; i += DRAW_THREADS) gather(bins[i], i);
    }
    u32 p = 1;
    while (p < n) p <<= 1;
    for (u32 i = n + threadIdx.x; i < p; i += DRAW_THREADS) sh->gathered[i] = ~0ull;
    __syncthreads();
    for (u32 k = 2; k <= p; k <<= 1) {
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            for (u32 i = threadIdx.x; i < p; i += DRAW_THREADS) {
                const u32 o = i ^ j;
                if (o > i) {
                    const u64 a = sh->gathered[i], b = sh->gathered[o];
                    if ((a > b) == ((i & k) == 0)) {
                        sh->gathered[i] = b;
                        sh->gathered[o] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    // Thread t holds positions 2t and 2t + 1.
    u64 w[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
        const u32 i = 2 * threadIdx.x + k;
        if (i < n) {
            const float s = draw_unrank((u32)(sh->gathered[i] >> 32));
            w[k] = draw_weight(draw_relative(s, best), shift);
        }
    }
    u64 cum = above_mass + draw_block_exclusive(w[0] + w[1], sh->scratch);
    for (int k = 0; k < 2; ++k) {
        const u32 i = 2 * threadIdx.x + k;
        cum += w[k];
        const bool met = mode == DRAW_BY_COUNT  ? above_count + i + 1 >= target
                         : mode == DRAW_REACHES ? cum >= target
                                                : cum > target;
        if (i < n && met) {
            atomicMin(&sh->result, i);
            break;
        }
    }
    __syncthreads();
    const u32 at = sh->result;
    DrawPos pos;
    pos.id = (u32)sh->gathered[at];
    pos.count = above_count + at + 1;
    // The weight through `at`: its owner stopped its running sum there.
    if (at / 2 == threadIdx.x) sh->found_mass = cum;
    __syncthreads();
    pos.mass = sh->found_mass;
    __syncthreads();
    return pos;
}

// The position the search `mode` / `target` ends at. The first level (sh->count0 / mass0) is
// filled by the caller.
__device__ DrawPos draw_search(const float* row, const u16* bins, u32 vocab, int has_cap, float cap,
                               float inv_t, float best, u32 shift, int mode, u64 target,
                               DrawShared* sh) {
    draw_find_bin(sh->count0, sh->mass0, DRAW_BINS0, mode, target, 0, 0, sh);
    __syncthreads();
    const u32 bin = sh->found_bin;
    u64 above_count = sh->found_count, above_mass = sh->found_mass;
    if (sh->count0[bin] <= DRAW_GATHER) {
        return draw_search_gathered(row, bins, vocab, has_cap, cap, inv_t, best, shift, mode,
                                    target, bin, above_count, above_mass, sh);
    }
    // The bin's candidates are a run of rank keys: its first and last.
    u32 lo = 0xffffffffu, hi = 0;
    draw_each(row, vocab, [&](float x, u32) {
        const float s = draw_scaled(x, has_cap, cap, inv_t);
        const float d = draw_relative(s, best);
        if (d >= DRAW_CUTOFF && draw_bin0(d) == bin) {
            const u32 r = draw_rank(s);
            lo = min(lo, r);
            hi = max(hi, r);
        }
    });
    u32 rlo, rhi;
    draw_block_min_max(lo, hi, sh->scratch, &rlo, &rhi);
    // Digits of (rank - rlo), 8 bits a level from the top, until one rank is left.
    u64 base = rlo;
    int bits = rhi == rlo ? 0 : 32 - __clz(rhi - rlo);
    u64 at_count = 0, at_mass = 0;
    u32 at_min_id = 0;
    bool first_pass = true;
    while (bits > 0 || first_pass) {
        const int step = bits >= 8 ? 8 : bits;
        const int low = bits - step;
        for (u32 b = threadIdx.x; b < DRAW_BINS; b += DRAW_THREADS) {
            sh->count[b] = 0;
            sh->mass[b] = 0;
            sh->min_id[b] = 0xffffffffu;
        }
        __syncthreads();
        const u64 span = 1ull << bits;
        draw_each(row, vocab, [&](float x, u32 id) {
            const float s = draw_scaled(x, has_cap, cap, inv_t);
            const u64 r = draw_rank(s);
            if (r >= base && r - base < span) {
                const float d = draw_relative(s, best);
                if (!(d >= DRAW_CUTOFF)) return;
                const u32 digit = (u32)((r - base) >> low);
                atomicAdd(&sh->count[digit], 1u);
                const u64 w = draw_weight(d, shift);
                if (w) atomicAdd(&sh->mass[digit], (unsigned long long)w);
                atomicMin(&sh->min_id[digit], id);
            }
        });
        __syncthreads();
        draw_find_bin(sh->count, sh->mass, DRAW_BINS, mode, target, above_count, above_mass, sh);
        __syncthreads();
        const u32 digit = sh->found_bin;
        above_count = sh->found_count;
        above_mass = sh->found_mass;
        at_count = sh->count[digit];
        at_mass = sh->mass[digit];
        at_min_id = sh->min_id[digit];
        base += (u64)digit << low;
        bits = low;
        first_pass = false;
        __syncthreads();
    }
    // `at_count` candidates share the rank `base` and its weight: the j-th of them by id.
    const u64 w = at_mass / at_count;
    u64 j;
    if (mode == DRAW_BY_COUNT) {
        j = target - above_count;
    } else if (mode == DRAW_REACHES) {
        j = target <= above_mass ? 1 : (target - above_mass + w - 1) / w;
    } else {
        j = (target - above_mass) / w + 1;
    }
    DrawPos pos;
    pos.count = above_count + j;
    pos.mass = above_mass + j * w;
    if (j == 1) {
        pos.id = at_min_id;
    } else {
        const u32 key = (u32)base;
        pos.id = draw_walk_ids(
            row, vocab,
            [&](float x, u32) -> u64 {
                return draw_rank(draw_scaled(x, has_cap, cap, inv_t)) == key ? 1 : 0;
            },
            j - 1, sh->scratch, &sh->result);
    }
    return pos;
}

// One drawn row's arguments (DRAW_ARG_WORDS u64 a draw: uniform (53 bits), top_p * 2^32,
// row | top_k << 32, bits of 1/temperature | bits of ln(min_p) << 32, flags) and its best
// scaled value, which the argmax's key holds (the capped value's ordered bits; scaling is
// monotone, so its scaled value is the best scaled value).
struct DrawArgs {
    u64 u, top_p32;
    u32 row, top_k, flags;
    float inv_t, min_rel, best;
};

// Entry b's arguments without its best value.
__device__ __forceinline__ DrawArgs draw_args_of(const unsigned long long* args, u32 b) {
    const unsigned long long* a = args + (u64)b * DRAW_ARG_WORDS;
    DrawArgs d;
    d.u = a[0];
    d.top_p32 = a[1];
    d.row = (u32)a[2];
    d.top_k = (u32)(a[2] >> 32);
    d.inv_t = __uint_as_float((u32)a[3]);
    d.min_rel = __uint_as_float((u32)(a[3] >> 32));
    d.flags = (u32)a[4];
    d.best = NEG_INF;
    return d;
}

// Entry b's arguments, its best value from its row's argmax key.
__device__ __forceinline__ DrawArgs draw_args(const unsigned long long* args, u32 b,
                                              const unsigned long long* keys) {
    DrawArgs d = draw_args_of(args, b);
    d.best = draw_scaled(draw_unrank(~(u32)(keys[d.row] >> 32)), 0, 0.0f, d.inv_t);
    return d;
}

// The first pass's histogram of entry `h` into shared memory (draw_search's first level).
__device__ __forceinline__ void draw_load_first_level(const unsigned long long* h,
                                                      DrawShared* sh) {
    const u32* counts = reinterpret_cast<const u32*>(h + DRAW_BINS0);
    for (u32 b = threadIdx.x; b < DRAW_BINS0; b += DRAW_THREADS) {
        sh->mass0[b] = h[b];
        sh->count0[b] = counts[b];
    }
}

// The length of a run of ids whose weights an unfiltered draw sums together: a multiple of a
// warp's 128 ids, at most DRAW_BINS0 runs a row.
__device__ __forceinline__ u32 draw_run(u32 vocab) {
    return 128u * ((vocab + 128u * DRAW_BINS0 - 1) / (128u * DRAW_BINS0));
}

// The first pass over the drawn rows, spread over gridDim.y blocks a row, each a stretch of
// `slice` ids (a multiple of 128). An unfiltered draw: each run's weight (hist[0..]). A
// filtered one: the first-level histogram, the row's totals and each value's bin. All sums
// are of integers, so the blocks' order does not matter. `hist` is zeroed by the launcher.
extern "C" __global__ void __launch_bounds__(DRAW_PASS_THREADS)
draw_first_pass(const float* logits, const unsigned long long* keys,
                const unsigned long long* args, unsigned long long* hist, u16* bins, u32 vocab,
                int has_cap, float cap, u32 shift, u32 slice) {
    __shared__ u32 count[DRAW_BINS0];
    __shared__ u64 mass[DRAW_BINS0];
    const DrawArgs a = draw_args(args, blockIdx.x, keys);
    unsigned long long* h = hist + (u64)blockIdx.x * DRAW_HIST_WORDS;
    // Kept for logprob_rows, which runs after draw_rows has written drawn ids over the keys.
    if (blockIdx.y == 0 && threadIdx.x == 0) h[DRAW_BEST_WORD] = __float_as_uint(a.best);
    if (a.best == NEG_INF) return;
    const float* row = logits + (u64)a.row * vocab;
    u16* bin_of = bins + (u64)blockIdx.x * vocab;
    const u32 from = blockIdx.y * slice, to = min(vocab, from + slice);
    const u32 lane = threadIdx.x % 32;
    const bool aligned = (vocab & 3u) == 0 && ((u64)row & 15u) == 0;
    const auto rel = [&](float x) {
        return draw_relative(draw_scaled(x, has_cap, cap, a.inv_t), a.best);
    };
    if (!(a.flags & DRAW_FILTERED)) {
        const u32 run = draw_run(vocab);
        // A warp's 32 lanes take 128 consecutive ids (four each), all in one run; two such
        // stretches a round, both loads issued before either is used.
        const auto run_weight = [&](u32 id, bool whole, float4 v) {
            if (whole) {
                return draw_weight(rel(v.x), shift) + draw_weight(rel(v.y), shift) +
                       draw_weight(rel(v.z), shift) + draw_weight(rel(v.w), shift);
            }
            u64 w = 0;
            for (u32 k = id; k < min(id + 4, to); ++k) w += draw_weight(rel(row[k]), shift);
            return w;
        };
        const auto add_run = [&](u32 at, u64 w) {
            for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
            if (lane == 0 && w) atomicAdd(h + at / run, (unsigned long long)w);
        };
        for (u32 at = from + 4 * (threadIdx.x - lane); at < to; at += 8 * DRAW_PASS_THREADS) {
            const u32 at2 = at + 4 * DRAW_PASS_THREADS;
            const u32 id = at + 4 * lane, id2 = at2 + 4 * lane;
            const bool whole = aligned && id + 3 < to, whole2 = aligned && id2 + 3 < to;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v2 = v;
            if (whole) v = *reinterpret_cast<const float4*>(row + id);
            if (whole2) v2 = *reinterpret_cast<const float4*>(row + id2);
            add_run(at, run_weight(id, whole, v));
            if (at2 < to) add_run(at2, run_weight(id2, whole2, v2));
        }
        return;
    }
    for (u32 b = threadIdx.x; b < DRAW_BINS0; b += DRAW_PASS_THREADS) {
        count[b] = 0;
        mass[b] = 0;
    }
    __syncthreads();
    u64 live = 0, kept = 0, kept_mass = 0, total = 0;
    const auto visit = [&](float x, u32 id) {
        const float d = rel(x);
        const u64 w = draw_weight(d, shift);
        if (d >= a.min_rel) {
            kept += 1;
            kept_mass += w;
        }
        total += w;
        u16 bin = DRAW_NO_BIN;
        if (d >= DRAW_CUTOFF) {
            live += 1;
            bin = (u16)draw_bin0(d);
            atomicAdd(&count[bin], 1u);
            // A logprobs entry searches by count alone: its bins' weights go unread.
            if (w && !(a.flags & DRAW_LOGPROBS)) atomicAdd(&mass[bin], (unsigned long long)w);
        }
        bin_of[id] = bin;
    };
    if (aligned) {
        // Two 16-byte loads a thread in flight before their values are visited.
        const auto visit4 = [&](u32 id, bool whole, float4 v) {
            if (whole) {
                visit(v.x, id);
                visit(v.y, id + 1);
                visit(v.z, id + 2);
                visit(v.w, id + 3);
            } else {
                for (u32 k = id; k < to; ++k) visit(row[k], k);
            }
        };
        for (u32 id = from + 4 * threadIdx.x; id < to; id += 8 * DRAW_PASS_THREADS) {
            const u32 id2 = id + 4 * DRAW_PASS_THREADS;
            const bool whole = id + 3 < to, whole2 = id2 + 3 < to;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v2 = v;
            if (whole) v = *reinterpret_cast<const float4*>(row + id);
            if (whole2) v2 = *reinterpret_cast<const float4*>(row + id2);
            visit4(id, whole, v);
            if (id2 < to) visit4(id2, whole2, v2);
        }
    } else {
        for (u32 id = from + threadIdx.x; id < to; id += DRAW_PASS_THREADS) visit(row[id], id);
    }
    __syncthreads();
    u32* counts = reinterpret_cast<u32*>(h + DRAW_BINS0);
    for (u32 b = threadIdx.x; b < DRAW_BINS0; b += DRAW_PASS_THREADS) {
        if (count[b]) atomicAdd(counts + b, count[b]);
        if (mass[b]) atomicAdd(h + b, (unsigned long long)mass[b]);
    }
    const u64 sums[4] = {live, kept, kept_mass, total};
    for (int k = 0; k < 4; ++k) {
        u64 v = sums[k];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && v) atomicAdd(h + DRAW_TOTALS + k, (unsigned long long)v);
    }
}

// An unfiltered draw: the first id, in id order, whose running weight passes
// floor(total * u / 2^53). The first pass summed the weights of runs of ids (`run`); the run
// holding the crossing is found from those sums and walked by one warp.
__device__ u32 draw_in_id_order(const float* row, u32 vocab, int has_cap, float cap, float inv_t,
                                float best, u32 shift, u64 u, DrawShared* sh) {
    const u32 run = draw_run(vocab);
    const u32 lane = threadIdx.x % 32;
    __syncthreads();
    if (threadIdx.x == 0) sh->result = 0;
    u64 t = 0;
    for (u32 b = threadIdx.x; b < DRAW_BINS0; b += DRAW_THREADS) {
        sh->count0[b] = 0;
        t += sh->mass0[b];
    }
    const u64 target = draw_mul_shr(draw_block_sum(t, sh->scratch), u, 53);
    draw_find_bin(sh->count0, sh->mass0, DRAW_BINS0, DRAW_PASSES, target, 0, 0, sh);
    __syncthreads();
    if (threadIdx.x < 32) {
        const u32 from = sh->found_bin * run, to = min(vocab, from + run);
        u64 cum = sh->found_mass;
        for (u32 at = from; at < to; at += 32) {
            const u32 id = at + lane;
            const u64 w = id < to ? draw_weight(draw_relative(draw_scaled(row[id], has_cap, cap,
                                                                          inv_t),
                                                              best),
                                                shift)
                                  : 0;
            u64 inc = w;
            for (int o = 1; o < 32; o <<= 1) {
                const u64 n = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= (u32)o) inc += n;
            }
            const u32 hit = __ballot_sync(0xffffffffu, cum + inc > target);
            if (hit) {
                if (lane == (u32)(__ffs(hit) - 1)) sh->result = id;
                break;
            }
            cum += __shfl_sync(0xffffffffu, inc, 31);
        }
    }
    __syncthreads();
    return sh->result;
}

// Draws row args[b].row of `logits` into keys[row] (low half: ~id, as argmax_rows writes it),
// from draw_first_pass's histogram and bins; the launcher has run argmax_rows over the rows
// first, whose key stays where every value is -inf or NaN (nothing to draw from, the host
// falls back to the argmax too).
extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
draw_rows(const float* logits, unsigned long long* keys, const unsigned long long* args,
          const unsigned long long* hist, const u16* bins, u32 vocab, int has_cap, float cap,
          u32 shift) {
    __shared__ DrawShared sh;
    const DrawArgs a = draw_args(args, blockIdx.x, keys);
    if (a.best == NEG_INF) return;
    const float* row = logits + (u64)a.row * vocab;
    const unsigned long long* h = hist + (u64)blockIdx.x * DRAW_HIST_WORDS;
    const u16* bin_of = bins + (u64)blockIdx.x * vocab;
    draw_load_first_level(h, &sh);
    if (!(a.flags & DRAW_FILTERED)) {
        const u32 id =
            draw_in_id_order(row, vocab, has_cap, cap, a.inv_t, a.best, shift, a.u, &sh);
        if (threadIdx.x == 0) keys[a.row] = (1ull << 32) | (u64)(0xffffffffu - id);
        return;
    }
    __syncthreads();
    const u64* totals = h + DRAW_TOTALS;
    const u64 live = totals[0], kept = totals[1], kept_mass = totals[2], total = totals[3];
    // The cut: the first `keep` candidates, weighing `keep_mass`.
    u64 keep = live, keep_mass = total;
    if (a.top_k > 0 && a.top_k < live) {
        const DrawPos k = draw_search(row, bin_of, vocab, has_cap, cap, a.inv_t, a.best, shift,
                                      DRAW_BY_COUNT, a.top_k, &sh);
        keep = k.count;
        keep_mass = k.mass;
    }
    if (a.flags & DRAW_TOP_P) {
        const DrawPos p = draw_search(row, bin_of, vocab, has_cap, cap, a.inv_t, a.best, shift,
                                      DRAW_REACHES, draw_mul_shr(keep_mass, a.top_p32, 32), &sh);
        if (p.count < keep) {
            keep = p.count;
            keep_mass = p.mass;
        }
    }
    if (kept < keep) {
        keep = kept;
        keep_mass = kept_mass;
    }
    const DrawPos d = draw_search(row, bin_of, vocab, has_cap, cap, a.inv_t, a.best, shift,
                                  DRAW_PASSES, draw_mul_shr(keep_mass, a.u, 53), &sh);
    if (threadIdx.x == 0) keys[a.row] = (1ull << 32) | (u64)(0xffffffffu - d.id);
}

// The candidate order as one key, smallest first: value descending, then id ascending.
__device__ __forceinline__ u64 draw_order_key(float s, u32 id) {
    return ((u64)draw_rank(s) << 32) | id;
}

// Minimum of v over the block (every thread gets it). `scratch` holds DRAW_WARPS words.
__device__ __forceinline__ u64 draw_block_min(u64 v, u64* scratch) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, (u64)__shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    u64 m = ~0ull;
    for (int w = 0; w < DRAW_WARPS; ++w) m = min(m, scratch[w]);
    return m;
}

// The logprobs of row args[first + b].row (`token_logprobs` in sampling/logprobs.rs is the
// definition): writes LOGPROB_WORDS words to out[b], from which the host takes ln of the
// total. Runs after draw_rows, so the row's key holds its token, drawn or greedy; the best
// value comes from the first pass. The top candidates: the n-th found by the draws' search
// (by count, over this entry's histogram of raw values), then one pass over the noted bins
// gathers every candidate up to it. When fewer than n candidates are live (within 40 of the
// best), the rest are taken one at a time, the next smallest order key among the others,
// a pass over the row each (rare: a very peaked row, or a top list longer than the row's
// finite values).
extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
logprob_rows(const float* logits, const unsigned long long* keys,
             const unsigned long long* args, const unsigned long long* hist, const u16* bins,
             unsigned long long* out, u32 vocab, int has_cap, float cap, u32 shift, u32 first) {
    __shared__ DrawShared sh;
    __shared__ u64 top[LOGPROB_TOP_MAX];
    __shared__ u32 top_n;
    const u32 e = first + blockIdx.x;
    const DrawArgs a = draw_args_of(args, e);
    const u32 r = a.row;
    const u32 n = min(min(a.top_k, vocab), (u32)LOGPROB_TOP_MAX);
    const unsigned long long* h = hist + (u64)e * DRAW_HIST_WORDS;
    const float best = __uint_as_float((u32)h[DRAW_BEST_WORD]);
    const u64 live = h[DRAW_TOTALS], total = h[DRAW_TOTALS + 3];
    const float* row = logits + (u64)r * vocab;
    const u16* bin_of = bins + (u64)e * vocab;
    const auto value = [&](u32 id) { return draw_scaled(row[id], has_cap, cap, 1.0f); };
    draw_load_first_level(h, &sh);
    if (threadIdx.x == 0) top_n = 0;
    __syncthreads();
    const auto keep = [&](u64 key) {
        const u32 at = atomicAdd(&top_n, 1u);
        if (at < LOGPROB_TOP_MAX) top[at] = key;
    };
    if (n > 0 && n <= live) {
        const DrawPos p = draw_search(row, bin_of, vocab, has_cap, cap, 1.0f, best, shift,
                                      DRAW_BY_COUNT, n, &sh);
        const float s = value(p.id);
        const u64 last = draw_order_key(s, p.id);
        const u32 bin = draw_bin0(draw_relative(s, best));
        for (u32 id = threadIdx.x; id < vocab; id += DRAW_THREADS) {
            const u32 b = bin_of[id];
            if (b < bin) {
                keep(draw_order_key(value(id), id));
            } else if (b == bin) {
                const u64 k = draw_order_key(value(id), id);
                if (k <= last) keep(k);
            }
        }
    } else if (n > 0) {
        // A row of -inf and NaN alone has no bins noted (the first pass left it at once):
        // every id is one of the others.
        const bool noted = best != NEG_INF;
        for (u32 id = threadIdx.x; noted && id < vocab; id += DRAW_THREADS) {
            if (bin_of[id] != DRAW_NO_BIN) keep(draw_order_key(value(id), id));
        }
        u64 prev = 0;
        for (u32 k = (u32)live; k < n; ++k) {
            u64 m = ~0ull;
            for (u32 id = threadIdx.x; id < vocab; id += DRAW_THREADS) {
                if (noted && bin_of[id] != DRAW_NO_BIN) continue;
                const u64 key = draw_order_key(value(id), id);
                if ((k == live || key > prev) && key < m) m = key;
            }
            prev = draw_block_min(m, sh.scratch);
            if (threadIdx.x == 0) keep(prev);
        }
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    const u32 found = min(top_n, (u32)LOGPROB_TOP_MAX);
    for (u32 i = 1; i < found; ++i) {
        const u64 k = top[i];
        u32 j = i;
        for (; j > 0 && top[j - 1] > k; --j) top[j] = top[j - 1];
        top[j] = k;
    }
    unsigned long long* o = out + (u64)blockIdx.x * LOGPROB_WORDS;
    const u32 token = 0xffffffffu - (u32)keys[r];
    const float tv = token < vocab ? value(token) : NEG_INF;
    o[0] = __float_as_uint(best);
    o[1] = total;
    o[2] = ((u64)token << 32) | __float_as_uint(tv);
    o[3] = found;
    for (u32 i = 0; i < found; ++i) {
        const u32 id = (u32)top[i];
        o[4 + i] = ((u64)id << 32) | __float_as_uint(draw_unrank((u32)(top[i] >> 32)));
    }
}
