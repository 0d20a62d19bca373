// Paged attention on tensor cores for bf16 slabs (the backend's bf16 speed mode).
//
// One block of PM_WARPS warps per (query row, KV head, split) serves every query head of the
// KV head at once: the group's query vectors (rounded to bf16) are the 16 rows of the mma's
// A operand, so each key and value row is read from memory once per group, not once per
// query head as in `paged_attention`. Keys go in tiles of PM_KT:
//   1. the tile's K and V rows are copied to shared memory with cp.async, two or three
//      buffers deep (the next tiles' copies run while this one is computed);
//   2. S = Q K^T (16 x PM_KT, f32): warp w takes keys 8 (w % 4) .. + 7 over half w / 4 of
//      head_dim (the two halves are added in the softmax);
//   3. the online softmax: warp w owns rows w and w + 8 (one lane per key), keeps their
//      running max and sum, writes the tile's probabilities as bf16 and each row's
//      rescaling factor;
//   4. O += P V (16 x head_dim, f32 in registers): warp w takes keys 16 (w / 4) .. + 15 into
//      a quarter of head_dim; the two key halves' partial outputs are summed at the end.
// Eight warps rather than four: each warp's share of a tile is a latency chain (mma, shuffles,
// barriers), and a block with half the chain per warp keeps twice the bytes moving.
// Outputs and the split workspace use `paged_attention`'s layout, so `paged_combine`
// merges splits of either kernel.
//
// Floor: a decode step reads each visible K and V row once (2 x head_dim x 2 bytes a key
// per KV head); the mma work (2 x 16 x head_dim flops a key for each product) is far below
// the H200's tensor rate, so the kernel is bound by how many bytes it keeps in flight.

#define PM_KT 32
#define PM_WARPS 8
#define PM_ROWS 16
#define PM_PAD 8
#define PM_MAX_D 512
#define PM_MAX_NT (PM_MAX_D / 32)  // 8-column output tiles a warp owns (a quarter of d)

// Copies keys j0 .. j0 + PM_KT - 1 (those up to `last`) of a KV head into a tile; rows past
// `last` are zero-filled so they add nothing (their probabilities are zero too). Lane j of
// every warp reads key j's slot once; the copies take it by shuffle. THREADS is the block
// size; PM_KT * chunks = 4 d is a multiple of 32, so every lane of a warp runs the same
// rounds (the shuffle needs them all).
template <int THREADS>
__device__ __forceinline__ void load_tile_slot(u16* kt, u16* vt, const u16* k_slab,
                                               const u16* v_slab, u32 my_slot, long long j0,
                                               long long last, int n_kv_heads, int kvh, int d,
                                               int ld) {
    const int chunks = d / 8;  // 16-byte pieces of a row
    for (int c = threadIdx.x; c < PM_KT * chunks; c += THREADS) {
        const int key = c / chunks, part = c % chunks;
        const u32 slot = __shfl_sync(0xffffffffu, my_slot, key);
        const bool valid = j0 + key <= last;
        const u64 off = valid ? ((u64)slot * n_kv_heads + kvh) * d + part * 8 : 0;
        cp_async16(kt + key * ld + part * 8, k_slab + off, valid ? 16 : 0);
        cp_async16(vt + key * ld + part * 8, v_slab + off, valid ? 16 : 0);
    }
}

// O += P V for one 16-key step: P's 16 rows x 16 keys (bf16, ldmatrix address `prow`) times
// those keys' values over this warp's columns (`vrow`), two 8-column tiles an ldmatrix.
__device__ __forceinline__ void pv_step(float (&o)[PM_MAX_NT][4], const u16* prow,
                                        const u16* vrow, int n_tiles_d) {
    u32 a0, a1, a2, a3;
    ldmatrix_x4(a0, a1, a2, a3, prow);
#pragma unroll
    for (int nt = 0; nt < PM_MAX_NT; nt += 2) {
        if (nt < n_tiles_d) {
            u32 b0, b1, b2, b3;
            ldmatrix_x4_trans(b0, b1, b2, b3, vrow + nt * 8);
            mma_bf16(o[nt], a0, a1, a2, a3, b0, b1);
            mma_bf16(o[nt + 1], a0, a1, a2, a3, b2, b3);
        }
    }
}

// Where a block's result rows go. Unsplit: the output row, scaled by 1 / sum, and its bf16
// twin when the launcher passed one (`out_b`: the o projection's GEMM reads it). Split: the
// split's workspace row, unscaled, with the row's (max, sum) written by one thread. The
// workspace starts at task `ws_skip` (a decode launch over a span of rows from `row0` holds
// only the span's parts).
struct OutRow {
    float* dst;
    u16* dst_b;
    float norm;
};

__device__ __forceinline__ OutRow out_row(float* out, u16* out_b, float* ws_acc, float* ws_ml,
                                          u64 task, int d, int n_splits, int z, float m,
                                          float l, bool writes_ml, u64 ws_skip = 0) {
    if (n_splits == 1)
        return {out + task * d, out_b ? out_b + task * d : nullptr, l > 0.0f ? 1.0f / l : 0.0f};
    const u64 part = (task - ws_skip) * n_splits + z;
    if (writes_ml) {
        ws_ml[2 * part] = m;
        ws_ml[2 * part + 1] = l;
    }
    return {ws_acc + part * d, nullptr, 1.0f};
}

// Columns c and c + 1 (c even) of a result row, and of its twin: one 8-byte and one 4-byte
// store (rows start at multiples of d, a multiple of 64).
__device__ __forceinline__ void store_pair(const OutRow& o, int c, float a, float b) {
    const float x = a * o.norm, y = b * o.norm;
    *reinterpret_cast<float2*>(o.dst + c) = make_float2(x, y);
    if (o.dst_b)
        *reinterpret_cast<u32*>(o.dst_b + c) =
            (u32)f32_to_bf16_rne(x) | ((u32)f32_to_bf16_rne(y) << 16);
}

// Lane j's slot of the tile starting at key j0 (0 past `last`); key indices are 64-bit in
// the decode kernel, 32-bit in the prefill kernel.
template <typename I>
__device__ __forceinline__ u32 tile_slot(const u32* sl, I j0, I last) {
    const int lane = threadIdx.x % 32;
    return j0 + lane <= last ? sl[j0 + lane] : 0u;
}

template <int THREADS>
__device__ __forceinline__ void load_tile(u16* kt, u16* vt, const u16* k_slab,
                                          const u16* v_slab, const u32* sl, long long j0,
                                          long long last, int n_kv_heads, int kvh, int d,
                                          int ld) {
    load_tile_slot<THREADS>(kt, vt, k_slab, v_slab, tile_slot(sl, j0, last), j0, last,
                            n_kv_heads, kvh, d, ld);
}

// A decode row's keys for split z of n_splits: [zlo, zhi] (empty when zhi < zlo), exactly as
// `paged_attention` reads them; splits take whole tiles of KT keys (a short row leaves the
// later splits empty instead of giving every split a sliver of a tile). `sl` gets the
// row's first slot.
struct KeyRange {
    long long zlo, zhi;
    const u32* sl;
};

// With `n_tok` > 1, rows t .. t + n_tok - 1 (tokens of one sequence) take the union of their
// keys: the first row's window start to the last row's position.
template <int KT>
__device__ __forceinline__ KeyRange decode_key_range(const u32* seqs, const u32* row_seq,
                                                     const u32* slots, u64 t, int z,
                                                     int n_splits, long long window,
                                                     int dense_min_q, int n_tok = 1) {
    const u32* sq = seqs + 5 * (u64)row_seq[t];
    const long long qp = (long long)sq[2] + ((long long)t - (long long)sq[0]);
    const long long k_start = sq[3];
    long long lo = 0, hi = qp + n_tok - 1 - k_start;
    if (window >= 0 && qp - window + 1 - k_start > lo) lo = qp - window + 1 - k_start;
    if (dense_min_q > 0 && (int)sq[1] >= dense_min_q) hi = lo - 1;
    long long chunk = (hi - lo + n_splits) / n_splits;
    chunk = (chunk + KT - 1) / KT * KT;
    const long long zlo = lo + (long long)z * chunk;
    long long zhi = zlo + chunk - 1;
    if (zhi > hi) zhi = hi;
    return {zlo, zhi, slots + sq[4]};
}

// f32 -> f16 bits, round to nearest even.
__device__ __forceinline__ u16 f32_to_f16_bits(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// Row t's query vectors of KV head kvh's group into `qs` [PM_ROWS][ld] as bf16, or f16 with
// F16 (four values a thread per round, every load of a thread issued before its first
// store); rows past the group are zero. With `n_tok` > 1, rows t .. t + n_tok - 1 one after
// the other (row r: token r / group, head r % group). The block's THREADS threads all take
// part.
template <int THREADS, bool F16 = false>
__device__ __forceinline__ void load_group_q(u16* qs, const float* q, u64 t, int n_heads,
                                             int kvh, int group, int d, int ld, int n_tok = 1) {
    const int per_tok = group * d / 4;  // float4s of a token's group
    const int q4 = n_tok * per_tok;
    for (int i0 = 0; i0 < q4; i0 += 4 * THREADS) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = i0 + u * THREADS + threadIdx.x;
            if (i < q4) {
                const int tok = i / per_tok;
                v[u] = ((const float4*)(q + ((t + tok) * n_heads + (u64)kvh * group) * d))
                    [i % per_tok];
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = i0 + u * THREADS + threadIdx.x;
            if (i < q4) {
                const int r = 4 * i / d, c = 4 * i % d;
                u16* dst = qs + r * ld + c;
                if (F16) {
                    dst[0] = f32_to_f16_bits(v[u].x);
                    dst[1] = f32_to_f16_bits(v[u].y);
                    dst[2] = f32_to_f16_bits(v[u].z);
                    dst[3] = f32_to_f16_bits(v[u].w);
                } else {
                    dst[0] = f32_to_bf16_rne(v[u].x);
                    dst[1] = f32_to_bf16_rne(v[u].y);
                    dst[2] = f32_to_bf16_rne(v[u].z);
                    dst[3] = f32_to_bf16_rne(v[u].w);
                }
            }
        }
    }
    for (int i = n_tok * group * d + threadIdx.x; i < PM_ROWS * d; i += THREADS)
        qs[(i / d) * ld + i % d] = 0;
}

// Shared memory: Q [16][ld], K and V [n_stages][PM_KT][ld] (bf16, ld = d + PM_PAD), S
// [2][16][PM_KT] f32, P [16][PM_KT + PM_PAD] bf16, per-row factors [16] f32 (`smem_bytes` in
// cuda/paged_mma.rs computes the same sum). n_stages (2 or 3) tiles are in flight or in use
// at once: with 3, two tiles load while one is computed.
// At most 128 registers a thread (the 2): two d-256 blocks share a multiprocessor.
extern "C" __global__ void __launch_bounds__(PM_WARPS * 32, 2)
paged_attention_mma(const float* q, const u16* k_slab, const u16* v_slab, const u32* seqs,
                    const u32* row_seq, const u32* slots, float* out, u16* out_b, float* ws_acc,
                    float* ws_ml, int n_heads, int n_kv_heads, int d, float scale,
                    long long window, int has_softcap, float softcap, int n_splits,
                    int dense_min_q, int n_stages, int row0) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) unsigned char smem[];
    const int ld = d + PM_PAD;
    const int ldp = PM_KT + PM_PAD;
    u16* qs = (u16*)smem;
    u16* ks = qs + PM_ROWS * ld;
    u16* vs = ks + n_stages * PM_KT * ld;
    float* ss = (float*)(vs + n_stages * PM_KT * ld);  // [2][16][PM_KT]: S over each half of d
    u16* ps = (u16*)(ss + 2 * PM_ROWS * PM_KT);
    float* row_f = (float*)(ps + PM_ROWS * ldp);

    // Block x attends row row0 + x (a launch over a span of the batch's rows).
    const u64 t = (u64)row0 + blockIdx.x;
    const int kvh = blockIdx.y;
    const int z = blockIdx.z;
    const int group = n_heads / n_kv_heads;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    // The row's visible keys and this split's share, exactly as `paged_attention`.
    const KeyRange kr =
        decode_key_range<PM_KT>(seqs, row_seq, slots, t, z, n_splits, window, dense_min_q);
    const long long zlo = kr.zlo, zhi = kr.zhi;
    const u32* sl = kr.sl;
    const int n_tiles = zhi >= zlo ? (int)((zhi - zlo + PM_KT) / PM_KT) : 0;

    // The first n_stages - 1 tiles go in flight before anything else; every stage commits a
    // group (empty past the last tile) so the wait counts stay uniform.
    for (int st = 0; st + 1 < n_stages; ++st) {
        if (st < n_tiles)
            load_tile<PM_WARPS * 32>(ks + st * PM_KT * ld, vs + st * PM_KT * ld, k_slab,
                                     v_slab, sl, zlo + (long long)st * PM_KT, zhi, n_kv_heads,
                                     kvh, d, ld);
        cp_async_commit();
    }
    // Each lane's slot of the next tile to load, read one iteration ahead so the tile's
    // copies never wait on it.
    u32 next_slot = tile_slot(sl, zlo + (long long)(n_stages - 1) * PM_KT, zhi);
    load_group_q<PM_WARPS * 32>(qs, q, t, n_heads, kvh, group, d, ld);

    // Fragment coordinates (PTX mma.m16n8k16): lane holds rows g and g + 8, columns
    // 2 tq and 2 tq + 1 of each 8-wide accumulator tile.
    const int g = lane / 4, tq = lane % 4;
    // ldmatrix.x4 row addresses: lanes 8i .. 8i + 7 give matrix i's rows.
    const int lm_row = (lane % 8) + 8 * ((lane / 8) % 2), lm_col = 8 * (lane / 16);
    // Warp w: S for keys 8 (w % 4) .. + 7 over half w / 4 of head_dim; P V for keys
    // 16 (w / 4) .. + 15 into columns (w % 4) d / 4 .. + d / 4 (the two key halves' partial
    // outputs are summed at the end).
    const int quarter = warp % 4, half_id = warp / 4;
    const int n_tiles_d = d / 32;  // 8-column output tiles per warp
    const int col0 = quarter * (d / 4);

    float o[PM_MAX_NT][4];
#pragma unroll
    for (int nt = 0; nt < PM_MAX_NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    // Running max and sum of rows warp + 8 rr (the same in every lane).
    float m_run[2], l_run[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        m_run[r] = NEG_INF;
        l_run[r] = 0.0f;
    }

    for (int it = 0; it < n_tiles; ++it) {
        const int buf = it % n_stages;
        const long long j0 = zlo + (long long)it * PM_KT;
        u16* kt = ks + buf * PM_KT * ld;
        u16* vt = vs + buf * PM_KT * ld;
        cp_async_wait(n_stages - 2);
        __syncthreads();  // tile `it` landed; every warp is done with tile it - 1
        {
            // Tile it + n_stages - 1 into the buffer tile it - 1 used.
            const int ahead = it + n_stages - 1;
            const int nb = ahead % n_stages;
            if (ahead < n_tiles)
                load_tile_slot<PM_WARPS * 32>(ks + nb * PM_KT * ld, vs + nb * PM_KT * ld,
                                              k_slab, v_slab, next_slot,
                                              zlo + (long long)ahead * PM_KT, zhi, n_kv_heads,
                                              kvh, d, ld);
            cp_async_commit();
            next_slot = tile_slot(sl, zlo + (long long)(ahead + 1) * PM_KT, zhi);
        }

        // S for this warp's 8 keys and half of d, two k-steps of 16 per K load; two
        // accumulators halve the chain of dependent mma instructions.
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const u16* krow = kt + (quarter * 8 + lane % 8) * ld + 8 * (lane / 8);
        const int d_half = d / 2;
        for (int kk = half_id * d_half; kk < (half_id + 1) * d_half; kk += 32) {
            u32 b0, b1, b2, b3, a0, a1, a2, a3;
            ldmatrix_x4(b0, b1, b2, b3, krow + kk);
            ldmatrix_x4(a0, a1, a2, a3, qs + lm_row * ld + kk + lm_col);
            mma_bf16(s, a0, a1, a2, a3, b0, b1);
            ldmatrix_x4(a0, a1, a2, a3, qs + lm_row * ld + kk + 16 + lm_col);
            mma_bf16(s2, a0, a1, a2, a3, b2, b3);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i] += s2[i];
        float* sh = ss + half_id * PM_ROWS * PM_KT;
        sh[g * PM_KT + quarter * 8 + 2 * tq] = s[0];
        sh[g * PM_KT + quarter * 8 + 2 * tq + 1] = s[1];
        sh[(g + 8) * PM_KT + quarter * 8 + 2 * tq] = s[2];
        sh[(g + 8) * PM_KT + quarter * 8 + 2 * tq + 1] = s[3];
        __syncthreads();

        // Online softmax, one lane per key; warp w takes rows w and w + 8 of the group
        // (rows past it feed only output rows nobody writes).
        const bool valid = j0 + lane <= zhi;
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const int r = warp + PM_WARPS * rr;
            if (r >= group) break;
            float x = NEG_INF;
            if (valid) {
                x = (ss[r * PM_KT + lane] + ss[(PM_ROWS + r) * PM_KT + lane]) * scale;
                if (has_softcap) x = softcap * tanhf(x / softcap);
            }
            float mx = x;
            for (int off = 16; off > 0; off >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(m_run[rr], mx);  // finite: key j0 is always valid
            // The hardware exponential (ex2.approx): its error is far below the bf16
            // rounding of the probabilities that follows.
            const float corr = __expf(m_run[rr] - m_new);
            const u16 pb = valid ? f32_to_bf16_rne(__expf(x - m_new)) : (u16)0;
            l_run[rr] = l_run[rr] * corr + warp_sum_f32(bf16_to_f32(pb));
            m_run[rr] = m_new;
            ps[r * ldp + lane] = pb;
            if (lane == 0) row_f[r] = corr;
        }
        __syncthreads();

        // O = O * corr + P V over this warp's columns.
        const float c_lo = row_f[g], c_hi = row_f[g + 8];
#pragma unroll
        for (int nt = 0; nt < PM_MAX_NT; ++nt) {
            o[nt][0] *= c_lo;
            o[nt][1] *= c_lo;
            o[nt][2] *= c_hi;
            o[nt][3] *= c_hi;
        }
        {
            const int kk = 16 * half_id;
            pv_step(o, ps + lm_row * ldp + kk + lm_col, vt + (kk + lm_row) * ld + col0 + lm_col,
                    n_tiles_d);
        }
    }

    // Rows' (max, sum) to shared memory for the writers; the second key half's partial
    // outputs through the (now idle) K tiles to the warps of the first half.
    float* m_s = ss;
    float* l_s = ss + PM_ROWS;
    float* o_hi = (float*)ks;  // [16][d]
    __syncthreads();
    if (lane == 0) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            m_s[warp + PM_WARPS * rr] = m_run[rr];
            l_s[warp + PM_WARPS * rr] = l_run[rr];
        }
    }
    if (half_id == 1) {
#pragma unroll
        for (int nt = 0; nt < PM_MAX_NT; ++nt) {
            if (nt < n_tiles_d) {
                const int c = col0 + nt * 8 + 2 * tq;
                o_hi[g * d + c] = o[nt][0];
                o_hi[g * d + c + 1] = o[nt][1];
                o_hi[(g + 8) * d + c] = o[nt][2];
                o_hi[(g + 8) * d + c + 1] = o[nt][3];
            }
        }
    }
    __syncthreads();
    if (half_id == 1) return;
    const u64 task0 = t * n_heads + (u64)kvh * group;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = g + 8 * half;
        if (r >= group) continue;
        const OutRow dst = out_row(out, out_b, ws_acc, ws_ml, task0 + r, d, n_splits, z, m_s[r],
                                   l_s[r], warp == 0 && tq == 0, (u64)row0 * n_heads);
#pragma unroll
        for (int nt = 0; nt < PM_MAX_NT; ++nt) {
            if (nt < n_tiles_d) {
                const int c = col0 + nt * 8 + 2 * tq;
                store_pair(dst, c, o[nt][2 * half] + o_hi[r * d + c],
                           o[nt][2 * half + 1] + o_hi[r * d + c + 1]);
            }
        }
    }
#else
    __trap();
#endif
}

// Prefill attention on tensor cores: the long query runs of one sequence (prefill chunks),
// bf16 slab, bf16 mode, in the FlashAttention-2 layout. A block of PF_WARPS = 8 warps
// takes ROWS query rows: `tpb` consecutive tokens times the group's query heads (row r is
// token t0 + r / group, head r % group), so each key and value row crosses from L2 once per
// ROWS query rows. Each warp owns 16 rows and a slice of head_dim (CS slices: all of it for
// d up to 256, half of it past that, so the output stays at 128 registers a lane):
//   1. S = Q K^T for its 16 rows and the tile's KT keys, over its slice of d, in registers;
//      with two slices the pair of warps adds each other's partial S through shared memory
//      (a 64-thread named barrier);
//   2. the online softmax in registers: a row's keys live in the four lanes of a quad,
//      so its max takes two shuffles; each row masked to its own token's keys;
//   3. the probabilities, rounded to bf16, are already the A fragments of O += P V (the
//      accumulator layout of one mma is the operand layout of the next), over the warp's
//      slice of the output columns.
// One block-wide barrier a tile (the K/V buffers' hand-over); nothing of S or P touches
// shared memory in the one-slice form.
// Blocks are issued last tokens first: under the causal mask they have the most keys, and
// starting them first keeps the grid's tail short. Splits (few blocks: short prompts) cut
// the block's key range in whole tiles as the decode kernel does; a row with no key in a
// split writes a zero sum, which `paged_combine` skips.
//
// Floor (E2B, 4096 tokens): about 1.4 TFLOP of mma for the model (2 x rows x d flops a key
// for each product; the diagonal tiles' masked half included), a few ms at the rate
// mma.sync reaches on an H200. K and V cross from L2 once per block: at d 512 (64 rows a
// block, all the output registers allow) that is 2.1 GB a full layer, which the d-512 kernel
// reads at about 2.6 TB/s (`docs/perf-notes.md`).

#define PF_WARPS 8

// 2^x, the hardware approximation (2^-inf = 0).
__device__ __forceinline__ float ex2_approx(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// The sum of the two bf16 values a pack holds (what the probabilities add to the row sum).
__device__ __forceinline__ float sum_bf16x2(u32 p) {
    return __uint_as_float(p << 16) + __uint_as_float(p & 0xffff0000u);
}

// Slab formats of the 8-bit entry points (`KV_*` in paged.cu).
#define DA_BF16 1
#define DA_FP8 3
#define DA_INT8 4

// Two codes (bits 0-15 of w) of format FMT as an f16 pair (the first in the low half).
// e4m3 on sm_89 and later is one conversion; before, the code's exponent and mantissa bits
// are placed in an f16 (exponent field 0 gives the subnormals) and the bias moved by 2^8,
// which is exact (there code 0x7f, NaN, reads as 480; the slab encoder writes it only for a
// NaN input). int8: the biased code as the mantissa of 1024 + c + 128, less 1152.
template <int FMT>
__device__ __forceinline__ u32 codes_to_f16x2(u32 w) {
    u32 r;
    if (FMT == DA_FP8) {
#if __CUDA_ARCH__ >= 890
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((unsigned short)(w & 0xffffu)));
#else
        const u32 t = __byte_perm(w, 0u, 0x4140);
        const u32 bits = ((t & 0x007f007fu) << 7) | ((t & 0x00800080u) << 8);
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(bits), "r"(0x5c005c00u));
#endif
    } else {
        const u32 t = __byte_perm(w ^ 0x8080u, 0x64u, 0x4140);
        asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(t), "r"(0x64806480u));
    }
    return r;
}

// Eight codes (two words) of format FMT as four f16 pairs.
template <int FMT>
__device__ __forceinline__ uint4 codes8_to_f16(uint2 w) {
    return make_uint4(codes_to_f16x2<FMT>(w.x), codes_to_f16x2<FMT>(w.x >> 16),
                      codes_to_f16x2<FMT>(w.y), codes_to_f16x2<FMT>(w.y >> 16));
}

// c += a x b as `mma_bf16`, on f16 operands.
__device__ __forceinline__ void mma_f16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                        u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One mma of the decode kernel: f16 operands for the 8-bit slabs, bf16 otherwise.
template <bool F16>
__device__ __forceinline__ void mma_of(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                       u32 b1) {
    if (F16) mma_f16(c, a0, a1, a2, a3, b0, b1);
    else mma_bf16(c, a0, a1, a2, a3, b0, b1);
}

// f32 -> f16 and back, rounded to nearest even.
__device__ __forceinline__ float round_f16(float x) { return f16_to_f32(f32_to_f16_bits(x)); }

// Two f32 rounded to f16 in one register, `lo` in the low half.
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 4 bytes from global to shared memory (cp.async.ca: the only form below 16 bytes); `bytes` 0
// zero-fills.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(bytes));
}

// Lane j's slots of the tile starting at key j0: keys j0 + j + 32 h (0 past `last`).
template <int KT>
__device__ __forceinline__ void tile_slots(u32 (&slot)[KT / 32], const u32* sl, int j0,
                                           int last) {
#pragma unroll
    for (int h = 0; h < KT / 32; ++h) slot[h] = tile_slot(sl, j0 + 32 * h, last);
}

// Copies keys j0 .. j0 + KT - 1 (those up to `last`) of a KV head into a K and a V tile;
// rows past `last` are zero-filled (their probabilities are zero too). Warp w copies keys
// w, w + PF_WARPS, ...: the key, its slot (by shuffle from the lane that read it) and its
// row address are the same across the warp, and the lanes take the row's 16-byte pieces.
// Key w + PF_WARPS i sits in slot register PF_WARPS i / 32 (w < PF_WARPS divides 32).
// `row` is the slab's elements a slot (KV heads x d), `head` the KV head's offset in it.
template <int KT, int D>
__device__ __forceinline__ void load_kv_tile(u16* kt, u16* vt, const u16* k_slab,
                                             const u16* v_slab, const u32 (&slot)[KT / 32],
                                             int j0, int last, u32 row, u32 head) {
    constexpr int ld = D + PM_PAD, chunks = D / 8;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // The lane's first piece, in shared memory (bytes) and in the slab; a warp's next key
    // is PF_WARPS rows further on, a lane's next piece 32 pieces (256 values) along.
    const u32 kdst = smem_addr(kt + warp * ld + lane * 8);
    const u32 vdst = smem_addr(vt + warp * ld + lane * 8);
    const u32 step = PF_WARPS * ld * 2;
    const u16* ksrc = k_slab + head + lane * 8;
    const u16* vsrc = v_slab + head + lane * 8;
#pragma unroll
    for (int i = 0; i < KT / PF_WARPS; ++i) {
        const int key = warp + PF_WARPS * i;
        const u32 s = __shfl_sync(0xffffffffu, slot[PF_WARPS * i / 32], key % 32);
        const bool valid = j0 + key <= last;
        const u64 off = valid ? (u64)s * row : 0;
#pragma unroll
        for (int u = 0; u < (chunks + 31) / 32; ++u) {
            if (chunks % 32 == 0 || lane + 32 * u < chunks) {
                cp_async16_to(kdst + i * step + 512 * u, ksrc + off + 256 * u, valid ? 16 : 0);
                cp_async16_to(vdst + i * step + 512 * u, vsrc + off + 256 * u, valid ? 16 : 0);
            }
        }
    }
}

// An 8-bit slab's tile for the prefill kernel (`raw_tile_bytes`): keys j0 .. j0 + KT - 1's K
// codes [KT][D], V codes [KT][D] (bytes), then their K and V scales [KT] each (f32); keys past
// `last` are zero-filled. Warp w copies keys w, w + PF_WARPS, ..., its lanes the rows'
// 16-byte pieces (a row's pieces over consecutive lanes); threads 0 .. 2 KT - 1 copy the
// scales, thread i key i % KT's, whose slot its own lane holds.
template <int KT, int D>
__host__ __device__ constexpr int raw_tile_bytes() {
    return KT * 2 * D + 2 * KT * 4;
}
template <int KT, int D>
__device__ __forceinline__ void load_raw_tile(unsigned char* st, const unsigned char* k_slab,
                                              const unsigned char* v_slab,
                                              const float* k_scales, const float* v_scales,
                                              const u32 (&slot)[KT / 32], int j0, int last,
                                              int n_kv_heads, int kvh) {
    constexpr int RP = D / 16;                    // pieces of a row of codes
    constexpr int ITEMS = (KT / PF_WARPS) * RP;   // a warp's (key, piece) pairs: 32 k
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 row = (u32)(n_kv_heads * D), head = (u32)(kvh * D);
#pragma unroll
    for (int c0 = 0; c0 < ITEMS; c0 += 32) {
        const int c = c0 + lane, u = c / RP, pc = c % RP;
        const int key = warp + PF_WARPS * u;
        // Key `key`'s slot is lane key % 32's register key / 32 (every lane shuffles).
        u32 s = 0;
#pragma unroll
        for (int h = 0; h < KT / 32; ++h) {
            const u32 x = __shfl_sync(0xffffffffu, slot[h], key % 32);
            if (key / 32 == h) s = x;
        }
        const bool valid = j0 + key <= last;
        const u64 off = valid ? (u64)s * row + head + pc * 16 : 0;
        cp_async16(st + key * D + pc * 16, k_slab + off, valid ? 16 : 0);
        cp_async16(st + KT * D + key * D + pc * 16, v_slab + off, valid ? 16 : 0);
    }
    if (threadIdx.x < 2 * KT) {
        const int key = threadIdx.x % KT;
        u32 s = 0;
#pragma unroll
        for (int h = 0; h < KT / 32; ++h)
            if (key / 32 == h) s = slot[h];
        const bool valid = j0 + key <= last;
        const u64 r = valid ? (u64)s * n_kv_heads + kvh : 0;
        const float* src = threadIdx.x < KT ? k_scales : v_scales;
        cp_async4(st + 2 * KT * D + 4 * threadIdx.x, src + r, valid ? 4 : 0);
    }
}

// The codes of a raw tile (`load_raw_tile`) as f16 K and V tiles [KT][ld] (exact for every
// e4m3 and int8 code), all of the block's threads, 16 codes a piece.
template <int KT, int D, int FMT>
__device__ __forceinline__ void convert_raw_tile(u16* kf, u16* vf, const unsigned char* st) {
    constexpr int RP = D / 16, ld = D + PM_PAD, PIECES = 2 * KT * RP;
    static_assert(PIECES % (PF_WARPS * 32) == 0, "whole rounds of the block");
#pragma unroll
    for (int p0 = 0; p0 < PIECES; p0 += PF_WARPS * 32) {
        const int p = p0 + threadIdx.x;
        const int tensor = p / (KT * RP), r = p % (KT * RP) / RP, pc = p % RP;
        const uint4 w = *(const uint4*)(st + tensor * KT * D + r * D + pc * 16);
        u16* dst = (tensor ? vf : kf) + r * ld + pc * 16;
        *(uint4*)dst = codes8_to_f16<FMT>(make_uint2(w.x, w.y));
        *(uint4*)(dst + 8) = codes8_to_f16<FMT>(make_uint2(w.z, w.w));
    }
}

// Shared memory: Q [ROWS][ld], K and V [n_stages][KT][ld] (bf16, ld = d + PM_PAD), and with
// two slices the partial S exchange [PF_WARPS][KT / 8][32] float4 (`prefill_smem_bytes` in
// cuda/paged_mma.rs computes the same sum). An 8-bit slab (FMT fp8 or int8) has Q in f16,
// n_stages raw tiles (`raw_tile_bytes`) in place of the K and V stages, then one f16 K and
// one f16 V tile [KT][ld], then the exchange (`prefill_smem_bytes` with the format). One
// block a multiprocessor: 256 threads at up to 255 registers. `q`, `out` and `out_b` (the
// bf16 twin, or null) start at the sequence's first row; `sl` at its first slot; the scales
// are null for bf16.
//
// 8-bit slabs: each tile's codes are converted once, by the whole block, into the f16 tiles
// the mma reads (a second block barrier a tile), so the products are the bf16 kernel's on
// f16 operands; as in the decode kernel the scales stay out of them: a key's K scale
// multiplies its column of S (f32), its V scale its probability before P is rounded to f16.
template <int D, int FMT>
__device__ __forceinline__ void prefill_attention_body(
    unsigned char* smem, const float* q, const unsigned char* k_slab,
    const unsigned char* v_slab, const float* k_scales, const float* v_scales, const u32* sl,
    float* out, u16* out_b, float* ws_acc, float* ws_ml, int n_heads, int n_kv_heads,
    float scale, long long window, int has_softcap, float softcap, int n_splits, int n_stages,
    int q_len, long long q_pos0, long long k_start, int tpb, int bx, int nbx) {
#if __CUDA_ARCH__ >= 800
    constexpr bool RAW = FMT != DA_BF16;
    constexpr int CS = D > 256 ? 2 : 1;    // slices of d (warps on the same rows)
    constexpr int KT = CS == 2 ? 32 : 64;  // keys a tile
    constexpr int DS = D / CS;             // columns of a warp's slice
    constexpr int NT = DS / 8;             // its 8-column output tiles
    constexpr int ROWS = 16 * PF_WARPS / CS;
    constexpr int NS = KT / 8;  // S accumulator tiles (8 keys each)
    constexpr int ld = D + PM_PAD;
    constexpr int RAW_TILE = raw_tile_bytes<KT, D>();
    u16* qs = (u16*)smem;
    u16* ks = qs + ROWS * ld;
    u16* vs = ks + n_stages * KT * ld;
    float4* xs = (float4*)(vs + n_stages * KT * ld);
    // 8-bit: the raw stages, the converted tiles, the exchange.
    unsigned char* raws = (unsigned char*)(qs + ROWS * ld);
    u16* kf = (u16*)(raws + n_stages * RAW_TILE);
    u16* vf = kf + KT * ld;
    if (RAW) xs = (float4*)(vf + KT * ld);

    const int kvh = blockIdx.y;
    const int z = blockIdx.z;
    const int group = n_heads / n_kv_heads;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rg = warp / CS, cs = warp % CS;  // row group; slice of d
    // The sequence's token blocks run last first (`bx` of `nbx`): the causal triangle's
    // long blocks start early.
    const int t0 = (nbx - 1 - bx) * tpb;
    const int n_tok = min(tpb, q_len - t0);
    const int rows_used = n_tok * group;

    // Visible keys (indices from k_start, 32-bit: a sequence's slot list is far shorter)
    // of token t: lo(t) ..= hi(t); both grow with t. The block's range runs from its first
    // token's lo to its last token's hi. A window longer than every key list is no window.
    const int hi0 = (int)(q_pos0 + t0 - k_start);
    const int win = window >= 0 && window <= hi0 + tpb ? (int)window : -1;
    const int lo = win >= 0 ? max(0, hi0 - win + 1) : 0;
    const int hi = hi0 + n_tok - 1;
    int chunk = (hi - lo + n_splits) / n_splits;
    chunk = (chunk + KT - 1) / KT * KT;
    const int zlo = lo + z * chunk;
    const int zhi = min(zlo + chunk - 1, hi);
    const int n_tiles = zhi >= zlo ? (zhi - zlo + KT) / KT : 0;

    // Fragment coordinates (PTX mma.m16n8k16): lane holds rows g and g + 8 of its warp's 16,
    // columns 2 tq and 2 tq + 1 of each 8-wide accumulator tile.
    const int g = lane / 4, tq = lane % 4;
    // The lane's two rows' key bounds (rows past the block's tokens see no key).
    int row_lo[2], row_hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = rg * 16 + g + 8 * h;
        const int rhi = hi0 + r / group;
        row_lo[h] = win >= 0 ? max(0, rhi - win + 1) : 0;
        row_hi[h] = r < rows_used ? min(rhi, zhi) : -1;
    }

    const u32 row = (u32)(n_kv_heads * D), head = (u32)(kvh * D);
    u32 slot[KT / 32];
    // Tile i's copies into stage i % n_stages.
    auto load = [&](int i) {
        const int sb = i % n_stages;
        if constexpr (RAW)
            load_raw_tile<KT, D>(raws + sb * RAW_TILE, k_slab, v_slab, k_scales, v_scales, slot,
                                 zlo + i * KT, zhi, n_kv_heads, kvh);
        else
            load_kv_tile<KT, D>(ks + sb * KT * ld, vs + sb * KT * ld, (const u16*)k_slab,
                                (const u16*)v_slab, slot, zlo + i * KT, zhi, row, head);
    };
    for (int st = 0; st + 1 < n_stages; ++st) {
        if (st < n_tiles) {
            tile_slots<KT>(slot, sl, zlo + st * KT, zhi);
            load(st);
        }
        cp_async_commit();
    }
    // Each lane's slots of the next tile to load, read one iteration ahead so the tile's
    // copies never wait on them.
    tile_slots<KT>(slot, sl, zlo + (n_stages - 1) * KT, zhi);
    // Query rows as bf16: warp w takes rows w, w + PF_WARPS, ..., its lanes four values at
    // a time; rows past the block's tokens are zero.
#pragma unroll 4
    for (int r = warp; r < ROWS; r += PF_WARPS) {
        u32* dst = (u32*)(qs + r * ld);
        const u64 head_row = (u64)(t0 + r / group) * n_heads + (u64)kvh * group + r % group;
        const float4* src = (const float4*)(q + head_row * D);
#pragma unroll
        for (int c = lane; c < D / 4; c += 32) {
            const float4 v = r < rows_used ? src[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            dst[2 * c] = RAW ? pack_f16x2(v.x, v.y) : pack_bf16x2(v.x, v.y);
            dst[2 * c + 1] = RAW ? pack_f16x2(v.z, v.w) : pack_bf16x2(v.z, v.w);
        }
    }

    // ldmatrix.x4 row addresses: lanes 8i .. 8i + 7 give matrix i's rows. Q (A operand):
    // rows 0-7 / 8-15 by (lane / 8) % 2, columns 0-7 / 8-15 by lane / 16. K (B operand, two
    // key tiles): keys 0-7 / 8-15 by lane / 16, columns by (lane / 8) % 2.
    const int lm_row = (lane % 8) + 8 * ((lane / 8) % 2), lm_col = 8 * (lane / 16);
    const int kb_row = (lane % 8) + 8 * (lane / 16), kb_col = 8 * ((lane / 8) % 2);
    const int col0 = cs * DS;

    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    // Rows g and g + 8: running max (the same in the quad) and this lane's share of the sum.
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f};
    // Without a softcap S stays unscaled (scale > 0 keeps its maxima) and the scale goes
    // into the exponent's one FFMA: p = 2^(s c2 - m c2), c2 = scale log2(e).
    const bool raw = !has_softcap && scale > 0.0f;
    const float c2 = (raw ? scale : 1.0f) * 1.4426950408889634f;

    for (int it = 0; it < n_tiles; ++it) {
        const int buf = it % n_stages;
        const int j0 = zlo + it * KT;
        const u16* kt = RAW ? kf : ks + buf * KT * ld;
        const u16* vt = RAW ? vf : vs + buf * KT * ld;
        // 8-bit: this tile's K scales then V scales (f32), in its raw stage.
        const float* tsc = (const float*)(raws + buf * RAW_TILE + 2 * KT * D);
        cp_async_wait(n_stages - 2);
        __syncthreads();  // tile `it` landed; every warp is done with tile it - 1
        {
            const int ahead = it + n_stages - 1;
            if (ahead < n_tiles) load(ahead);
            cp_async_commit();
            tile_slots<KT>(slot, sl, zlo + (ahead + 1) * KT, zhi);
        }
        if constexpr (RAW) {
            convert_raw_tile<KT, D, FMT>(kf, vf, raws + buf * RAW_TILE);
            __syncthreads();  // the f16 tiles are whole
        }

        // S over the warp's slice of d: one Q fragment a 16-column step, two key tiles an
        // ldmatrix of K; the NS accumulators are NS independent mma chains.
        float s[NS][4];
#pragma unroll
        for (int j = 0; j < NS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        {
            const u16* qrow = qs + (rg * 16 + lm_row) * ld + col0 + lm_col;
            const u16* krow = kt + kb_row * ld + col0 + kb_col;
#pragma unroll
            for (int kk = 0; kk < DS; kk += 16) {
                u32 a0, a1, a2, a3;
                ldmatrix_x4(a0, a1, a2, a3, qrow + kk);
#pragma unroll
                for (int p = 0; p < NS / 2; ++p) {
                    u32 b0, b1, b2, b3;
                    ldmatrix_x4(b0, b1, b2, b3, krow + p * 16 * ld + kk);
                    mma_of<RAW>(s[2 * p], a0, a1, a2, a3, b0, b1);
                    mma_of<RAW>(s[2 * p + 1], a0, a1, a2, a3, b2, b3);
                }
            }
        }
        if (CS == 2) {
            // The pair's partial S: the same lane holds the same elements in both warps,
            // and both add them in either order (the same bits: the softmax below must
            // agree across the pair).
            float4* mine = xs + warp * NS * 32 + lane;
#pragma unroll
            for (int j = 0; j < NS; ++j)
                mine[j * 32] = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
            asm volatile("bar.sync %0, 64;\n" ::"r"(1 + rg));
            const float4* other = xs + (warp ^ 1) * NS * 32 + lane;
#pragma unroll
            for (int j = 0; j < NS; ++j) {
                const float4 v = other[j * 32];
                s[j][0] += v.x;
                s[j][1] += v.y;
                s[j][2] += v.z;
                s[j][3] += v.w;
            }
        }

        if constexpr (RAW) {
            // Each key's K scale on its column (both warps of a pair alike).
#pragma unroll
            for (int j = 0; j < NS; ++j) {
                const float2 kc = *(const float2*)(tsc + 8 * j + 2 * tq);
                s[j][0] *= kc.x;
                s[j][1] *= kc.y;
                s[j][2] *= kc.x;
                s[j][3] *= kc.y;
            }
        }
        // Online softmax: element e of tile j is row g + 8 (e / 2), key j0 + 8 j + 2 tq +
        // e % 2. A row with no visible key yet keeps max -inf; its factors use 0 in place
        // of the max so nothing turns NaN (its sum stays 0). Tiles every row of the warp sees
        // whole (all but the causal diagonal and the window's edge) skip the mask.
        if (has_softcap) {
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[j][e] = softcap * tanhf(s[j][e] * scale / softcap);
        } else if (!raw) {
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[j][e] *= scale;
        }
        const int j1 = j0 + KT - 1;
        if (!__all_sync(0xffffffffu, j0 >= row_lo[0] && j0 >= row_lo[1] && j1 <= row_hi[0] &&
                                         j1 <= row_hi[1])) {
#pragma unroll
            for (int j = 0; j < NS; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e / 2, key = j0 + 8 * j + 2 * tq + (e % 2);
                    if (key < row_lo[h] || key > row_hi[h]) s[j][e] = NEG_INF;
                }
            }
        }
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int j = 0; j < NS; ++j) {
            mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
        }
        float corr[2], m_use[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            const float m_new = fmaxf(m_run[h], mx[h]);
            m_use[h] = m_new == NEG_INF ? 0.0f : m_new;
            corr[h] = ex2_approx((m_run[h] - m_use[h]) * c2);
            m_use[h] *= c2;
            m_run[h] = m_new;
        }
        // P as bf16 A fragments: keys 16 k2 .. + 15 are accumulator tiles 2 k2 and 2 k2 + 1.
        // The hardware exponential (ex2.approx): its error is far below the bf16 rounding.
        // 8-bit: f16, each probability times its key's V scale; the row sum takes the
        // probabilities as f16 rounds them (the decode kernel's convention).
        u32 pa[NS / 2][4];
        float ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k2 = 0; k2 < NS / 2; ++k2) {
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int j = 2 * k2 + u / 2, h = u % 2;
                const float e0 = ex2_approx(fmaf(s[j][2 * h], c2, -m_use[h]));
                const float e1 = ex2_approx(fmaf(s[j][2 * h + 1], c2, -m_use[h]));
                if constexpr (RAW) {
                    const float2 vc = *(const float2*)(tsc + KT + 8 * j + 2 * tq);
                    pa[k2][u] = pack_f16x2(e0 * vc.x, e1 * vc.y);
                    ls[h] += round_f16(e0) + round_f16(e1);
                } else {
                    const u32 p = pack_bf16x2(e0, e1);
                    pa[k2][u] = p;
                    ls[h] += sum_bf16x2(p);
                }
            }
        }
        l_run[0] = l_run[0] * corr[0] + ls[0];
        l_run[1] = l_run[1] * corr[1] + ls[1];

        // O = O * corr + P V over the warp's rows and slice. Once the rows' maxima settle
        // every factor is exactly 1: the warp then skips the multiplies (same bits).
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                o[nt][0] *= corr[0];
                o[nt][1] *= corr[0];
                o[nt][2] *= corr[1];
                o[nt][3] *= corr[1];
            }
        }
        const u16* vrow = vt + lm_row * ld + col0 + lm_col;
#pragma unroll
        for (int k2 = 0; k2 < NS / 2; ++k2) {
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                u32 b0, b1, b2, b3;
                ldmatrix_x4_trans(b0, b1, b2, b3, vrow + k2 * 16 * ld + nt * 8);
                mma_of<RAW>(o[nt], pa[k2][0], pa[k2][1], pa[k2][2], pa[k2][3], b0, b1);
                mma_of<RAW>(o[nt + 1], pa[k2][0], pa[k2][1], pa[k2][2], pa[k2][3], b2, b3);
            }
        }
    }

    // The quad's sums, then the rows out: the whole row's (max, sum) from slice 0's lane tq 0.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = rg * 16 + g + 8 * h;
        if (r >= rows_used) continue;
        const u64 task = (u64)(t0 + r / group) * n_heads + (u64)kvh * group + r % group;
        // The max in scaled units, as `paged_combine` reads it.
        const float m = raw ? m_run[h] * scale : m_run[h];
        const OutRow dst = out_row(out, out_b, ws_acc, ws_ml, task, D, n_splits, z, m, l_run[h],
                                   cs == 0 && tq == 0);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            store_pair(dst, col0 + nt * 8 + 2 * tq, o[nt][2 * h], o[nt][2 * h + 1]);
    }
#else
    __trap();
#endif
}

// Several sequences' query runs in one launch (`prefill_attention_mma_seqs_d<D>`): block x
// belongs to run s of `runs` when first[s] <= x < first[s + 1], and run s is sequence
// seq[s] of the batch's packed table `seqs` (row offset, query rows, first query position,
// first key position, first slot: `pack_seqs` in cuda/paged.rs). `q`, `out` and `out_b` start
// at the batch's row 0, the split workspace at row `row_base`. Passed by value, so a launch
// needs no upload; must match `PrefillRuns` in cuda/prefill_attention.rs.
#define PF_MAX_RUNS 32
struct PrefillRuns {
    int n;
    int seq[PF_MAX_RUNS];
    int first[PF_MAX_RUNS + 1];
};

// One entry point per head_dim and slab format: `prefill_attention_mma_d<D>` (bf16) and
// `prefill_attention_mma_{fp8,int8}_d<D>`, each with its `_seqs_` twin. Up to d 256 a block
// takes 128 rows (each warp all of d) in 64-key tiles; at d 512 64 rows, each pair of warps
// splitting d, in 32-key tiles (the shared memory of Q and two stages of K and V). The
// slab's arguments: bf16 codes alone, or an 8-bit slab's codes and scales (as
// `paged_attention` takes them).
#define PF_SLAB_BF16 const u16 *k_slab, const u16 *v_slab
#define PF_PASS_BF16 (const unsigned char*)k_slab, (const unsigned char*)v_slab, nullptr, nullptr
#define PF_SLAB_RAW                                                                 \
    const unsigned char *k_slab, const unsigned char *v_slab, const float *k_scales, \
        const float *v_scales
#define PF_PASS_RAW k_slab, v_slab, k_scales, v_scales
#define PREFILL_ATTENTION_KERNEL(NAME, SEQS, FMT, SLAB, PASS, D)                                \
    extern "C" __global__ void __launch_bounds__(PF_WARPS * 32, 1) NAME##_d##D(                  \
        const float* q, SLAB, const u32* sl, float* out, u16* out_b, float* ws_acc,              \
        float* ws_ml, int n_heads, int n_kv_heads, float scale, long long window,                \
        int has_softcap, float softcap, int n_splits, int n_stages, int q_len, long long q_pos0, \
        long long k_start, int tpb) {                                                            \
        extern __shared__ __align__(16) unsigned char smem[];                                    \
        prefill_attention_body<D, FMT>(smem, q, PASS, sl, out, out_b, ws_acc, ws_ml, n_heads,    \
                                       n_kv_heads, scale, window, has_softcap, softcap,          \
                                       n_splits, n_stages, q_len, q_pos0, k_start, tpb,          \
                                       blockIdx.x, gridDim.x);                                   \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(PF_WARPS * 32, 1) SEQS##_d##D(                  \
        const float* q, SLAB, const u32* slots, const u32* seqs, float* out, u16* out_b,         \
        float* ws_acc, float* ws_ml, int n_heads, int n_kv_heads, float scale, long long window, \
        int has_softcap, float softcap, int n_splits, int n_stages, int tpb, long long row_base, \
        PrefillRuns runs) {                                                                      \
        extern __shared__ __align__(16) unsigned char smem[];                                    \
        int s = 0;                                                                               \
        while (s + 1 < runs.n && (int)blockIdx.x >= runs.first[s + 1]) ++s;                     \
        const u32* sq = seqs + 5 * (u64)runs.seq[s];                                             \
        const u64 vals = (u64)sq[0] * n_heads * D;                                               \
        const u64 parts = ((u64)sq[0] - row_base) * n_heads * n_splits;                          \
        prefill_attention_body<D, FMT>(                                                          \
            smem, q + vals, PASS, slots + sq[4], out + vals, out_b ? out_b + vals : nullptr,     \
            ws_acc + parts * D, ws_ml + parts * 2, n_heads, n_kv_heads, scale, window,           \
            has_softcap, softcap, n_splits, n_stages, (int)sq[1], (long long)sq[2],              \
            (long long)sq[3], tpb, (int)blockIdx.x - runs.first[s],                              \
            runs.first[s + 1] - runs.first[s]);                                                  \
    }
#define PREFILL_ATTENTION_KERNELS(D)                                                            \
    PREFILL_ATTENTION_KERNEL(prefill_attention_mma, prefill_attention_mma_seqs, DA_BF16,        \
                             PF_SLAB_BF16, PF_PASS_BF16, D)                                     \
    PREFILL_ATTENTION_KERNEL(prefill_attention_mma_fp8, prefill_attention_mma_fp8_seqs, DA_FP8, \
                             PF_SLAB_RAW, PF_PASS_RAW, D)                                       \
    PREFILL_ATTENTION_KERNEL(prefill_attention_mma_int8, prefill_attention_mma_int8_seqs,       \
                             DA_INT8, PF_SLAB_RAW, PF_PASS_RAW, D)

PREFILL_ATTENTION_KERNELS(64)
PREFILL_ATTENTION_KERNELS(128)
PREFILL_ATTENTION_KERNELS(256)
PREFILL_ATTENTION_KERNELS(512)

// Decode attention on tensor cores in the FlashAttention-2 layout (`decode_attention_mma_d<D>`):
// the tensor-core paged attention's work (one block per query row, KV head and key split,
// the group's query heads as the 16 rows of the mma) without its three block barriers a
// tile. With `tpb` > 1 a block takes that many consecutive rows of one sequence (a
// verification's tokens: row r of the mma is token r / group, head r % group), walks the
// union of their keys once and masks each row by its own token's position and window. The
// block's eight warps form two groups of four that walk alternate tiles of DA_KT keys, each
// group with its own K/V buffers; within a group warp w owns a quarter of head_dim:
//   1. S = Q K^T over its quarter (Q's A fragments stay in registers for the whole loop);
//      the four partial S go through shared memory behind a barrier of the group alone and
//      every warp adds them in the same order, so all four hold the same S;
//   2. the online softmax in registers (a row's keys in the four lanes of a quad);
//   3. the bf16 probabilities are the A fragment of O += P V over the warp's quarter of the
//      output columns, as in the prefill kernel.
// Each group copies its next tile while it computes this one. At the end the second group's
// (max, sum, O) are merged into the first's; results and the split workspace are the
// decode kernel's, so `paged_combine` merges splits of any of the kernels.
//
// The 8-bit slabs (e4m3 or int8 codes with one f32 scale per key and KV head) take the same
// kernel (`decode_attention_mma_{fp8,int8}_d<D>`) on f16 mma, which holds every e4m3 and
// int8 code exactly (two codes an instruction on sm_89 and later). A stage holds the tile's
// raw codes and scales (half the bytes of a bf16 tile, copied the same way). S's B
// fragments are converted straight from four consecutive codes of a K row, so Q's A
// fragments take head dims in the same order; V, which P V reads transposed, is converted
// by each warp for its own quarter of head_dim into an f16 tile the group shares, read as a
// bf16 stage is (a warp reads only the columns it converted: no barrier beyond the warp's).
// The scales stay out of the products: a key's K scale multiplies its column of S (f32),
// its V scale its probability before the probabilities are rounded to f16 for P V. Q and P
// are f16 here (finer than bf16; the range, 65504, is far beyond normed queries and scaled
// probabilities).

#define DA_KT 16
#define DA_GW 4
#define DA_GROUPS (PM_WARPS / DA_GW)


// A stage of an 8-bit slab: the K codes [DA_KT][KRS], the V codes [DA_KT][VRS] (bytes),
// then the keys' K scales [DA_KT] and V scales [DA_KT] (f32). The rows are padded so that
// their reads meet distinct banks: a K row (KRS = D + 16 bytes) is read four bytes a lane
// for the mma's B fragments, eight rows a warp; a V row (VRS = 5 D / 4) sixteen bytes a
// lane by quarter rows for the conversion. Three stages a group: a tile of codes is half a
// bf16 tile's bytes, so the copies run two tiles ahead to keep as many bytes in flight.
#define DA_RAW_STAGES 3
template <int D>
__host__ __device__ constexpr int raw_k_row_bytes() {
    return D + 16;
}
template <int D>
__host__ __device__ constexpr int raw_v_row_bytes() {
    return D + D / 4;
}
template <int D>
__host__ __device__ constexpr int raw_stage_bytes() {
    return DA_KT * (raw_k_row_bytes<D>() + raw_v_row_bytes<D>()) + 2 * DA_KT * 4;
}

// Shared memory: Q [PM_ROWS][ld], then per group two stages of a K and a V tile
// [DA_KT][ld] (bf16, ld = D + PM_PAD), then the partial S exchange [DA_GROUPS][DA_GW][8][32]
// f32 (`decode_smem_bytes` in cuda/paged_mma.rs computes the same sum). For an 8-bit slab a
// group has three raw stages (`raw_stage_bytes`) and then one f16 V tile [DA_KT][ld], the
// converted V (`decode_scaled_smem_bytes`).
template <int D, int FMT>
__device__ __forceinline__ void decode_attention_body(
    unsigned char* smem, const float* q, const unsigned char* k_slab,
    const unsigned char* v_slab, const float* k_scales, const float* v_scales, const u32* seqs,
    const u32* row_seq, const u32* slots, float* out, u16* out_b, float* ws_acc, float* ws_ml,
    int n_heads, int n_kv_heads, float scale, long long window, int has_softcap,
    float softcap, int n_splits, int dense_min_q, int row0, int tpb) {
    constexpr bool RAW = FMT != DA_BF16;
    constexpr int ld = D + PM_PAD;
    constexpr int DQ = D / DA_GW;  // columns a warp owns
    constexpr int KS = DQ / 16;    // 16-deep k-steps of its share of S
    constexpr int NT = DQ / 8;     // 8-column output tiles
    constexpr int PIECES = D / 8;  // 16-byte pieces of a K or V row (bf16)
    constexpr int RAW_PIECES = D / 16;  // 16-byte pieces of a row of codes
    constexpr int KRS = raw_k_row_bytes<D>(), VRS = raw_v_row_bytes<D>();
    constexpr int V_CODES = DA_KT * KRS;             // a stage's V codes
    constexpr int SCALES = DA_KT * (KRS + VRS);      // and its scales
    constexpr int TILE = 2 * DA_KT * ld;  // a bf16 stage: K then V
    constexpr int RAW_STAGE = raw_stage_bytes<D>();
    // A group's bytes: two bf16 stages, or three raw stages and the converted V tile.
    constexpr int GROUP_BYTES =
        RAW ? DA_RAW_STAGES * RAW_STAGE + DA_KT * ld * 2 : 2 * TILE * 2;
    u16* qs = (u16*)smem;
    unsigned char* kv = smem + PM_ROWS * ld * 2;
    float* sx = (float*)(kv + DA_GROUPS * GROUP_BYTES);

    // A launch over a span of the batch's rows; a block takes `tpb` consecutive rows of one
    // sequence (the tokens a verification checks), each key and value read once for them.
    const u64 t = (u64)row0 + (u64)blockIdx.x * tpb;
    const int kvh = blockIdx.y, z = blockIdx.z;
    const int group = n_heads / n_kv_heads;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int grp = warp / DA_GW, wq = warp % DA_GW;
    const int g = lane / 4, tq = lane % 4;
    const int lm_row = (lane % 8) + 8 * ((lane / 8) % 2), lm_col = 8 * (lane / 16);

    const KeyRange kr = decode_key_range<DA_KT>(seqs, row_seq, slots, t, z, n_splits, window,
                                                dense_min_q, tpb);
    const long long zlo = kr.zlo, zhi = kr.zhi;
    // This lane's rows g and g + 8 see keys [row_lo, row_hi] (key indices as zlo's): their
    // token's own position and window within the block's union.
    long long row_lo[2], row_hi[2];
    {
        const u32* sq = seqs + 5 * (u64)row_seq[t];
        const long long qp0 = (long long)sq[2] + ((long long)t - (long long)sq[0]) - sq[3];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = g + 8 * h;
            const long long qp = qp0 + (r < tpb * group ? r / group : 0);
            row_hi[h] = qp < zhi ? qp : zhi;
            row_lo[h] = window >= 0 && qp - window + 1 > 0 ? qp - window + 1 : 0;
        }
    }
    const int n_tiles = zhi >= zlo ? (int)((zhi - zlo + DA_KT) / DA_KT) : 0;
    // This group's tiles: grp, grp + DA_GROUPS, ...
    const int mine = n_tiles > grp ? (n_tiles - grp + DA_GROUPS - 1) / DA_GROUPS : 0;
    unsigned char* gbase = kv + grp * GROUP_BYTES;
    u16* gbuf = (u16*)gbase;                       // bf16: the two stages
    u16* dec = (u16*)(gbase + DA_RAW_STAGES * RAW_STAGE);  // 8-bit: V as f16
    const u32 row = (u32)n_kv_heads * D, head = (u32)kvh * D;

    // Copies the group's local tile i into stage i % 2: warp wq takes keys wq, wq + 4, ...
    // (slot by shuffle from lane key of `slot`), its lanes the row's 16-byte pieces; keys
    // past zhi are zero-filled.
    auto load = [&](int i, u32 slot) {
        const long long j0 = zlo + (long long)(grp + DA_GROUPS * i) * DA_KT;
        if constexpr (!RAW) {
            const u16* k16 = (const u16*)k_slab;
            const u16* v16 = (const u16*)v_slab;
            u16* kt = gbuf + (i % 2) * TILE;
            u16* vt = kt + DA_KT * ld;
#pragma unroll
            for (int u = 0; u < DA_KT / DA_GW; ++u) {
                const int key = wq + DA_GW * u;
                const u32 s = __shfl_sync(0xffffffffu, slot, key);
                const bool valid = j0 + key <= zhi;
                const u64 off = valid ? (u64)s * row + head : 0;
#pragma unroll
                for (int pc = lane; pc < PIECES; pc += 32) {
                    cp_async16(kt + key * ld + pc * 8, k16 + off + pc * 8, valid ? 16 : 0);
                    cp_async16(vt + key * ld + pc * 8, v16 + off + pc * 8, valid ? 16 : 0);
                }
            }
        } else {
            unsigned char* st = gbase + (i % DA_RAW_STAGES) * RAW_STAGE;
            float* ks = (float*)(st + SCALES);
            // The slots of this warp's keys wq, wq + 4, ... (every lane takes part).
            u32 s4[DA_KT / DA_GW];
#pragma unroll
            for (int u = 0; u < DA_KT / DA_GW; ++u)
                s4[u] = __shfl_sync(0xffffffffu, slot, wq + DA_GW * u);
            // The warp's keys' pieces, spread over all its lanes.
#pragma unroll
            for (int c0 = 0; c0 < (DA_KT / DA_GW) * RAW_PIECES; c0 += 32) {
                const int c = c0 + lane;
                if (c < (DA_KT / DA_GW) * RAW_PIECES) {
                    const int u = c / RAW_PIECES, pc = c % RAW_PIECES;
                    const int key = wq + DA_GW * u;
                    const bool valid = j0 + key <= zhi;
                    const u64 off = valid ? (u64)s4[u] * row + head : 0;
                    cp_async16(st + key * KRS + pc * 16, k_slab + off + pc * 16, valid ? 16 : 0);
                    cp_async16(st + V_CODES + key * VRS + pc * 16, v_slab + off + pc * 16,
                               valid ? 16 : 0);
                }
            }
            if (lane < DA_KT / DA_GW) {
                const int key = wq + DA_GW * lane;
                const bool valid = j0 + key <= zhi;
                const u64 r = valid ? (u64)s4[lane] * n_kv_heads + kvh : 0;
                cp_async4(ks + key, k_scales + r, valid ? 4 : 0);
                cp_async4(ks + DA_KT + key, v_scales + r, valid ? 4 : 0);
            }
        }
        cp_async_commit();
    };
    // Lane j (< DA_KT) holds the slot of key j of local tile i (0 past zhi).
    auto tile_slot_of = [&](int i) -> u32 {
        const long long j = zlo + (long long)(grp + DA_GROUPS * i) * DA_KT + lane % DA_KT;
        return i < mine && j <= zhi ? kr.sl[j] : 0u;
    };

    u32 slot = tile_slot_of(0);
    if (mine > 0) load(0, slot);
    slot = tile_slot_of(1);
    if (RAW) {
        // Two tiles ahead: tile 1's copies (an empty group when there is none) go now too.
        if (mine > 1) load(1, slot);
        else cp_async_commit();
        slot = tile_slot_of(2);
    }
    load_group_q<PM_WARPS * 32, RAW>(qs, q, t, n_heads, kvh, group, D, ld, tpb);
    __syncthreads();
    // Q's A fragments over this warp's quarter of head_dim, for the whole loop. 8-bit: the
    // B fragments come from four consecutive codes of a K row (below), so the mma's k
    // positions 2 tq, 2 tq + 1, 2 tq + 8, 2 tq + 9 hold head dims 4 tq .. 4 tq + 3 of each
    // 16; Q's fragments are read in the same order.
    u32 qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        if (RAW) {
            const u16* q0 = qs + g * ld + wq * DQ + 16 * ks + 4 * tq;
            qa[ks][0] = *(const u32*)q0;
            qa[ks][1] = *(const u32*)(q0 + 8 * ld);
            qa[ks][2] = *(const u32*)(q0 + 2);
            qa[ks][3] = *(const u32*)(q0 + 8 * ld + 2);
        } else {
            ldmatrix_x4(qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3],
                        qs + lm_row * ld + wq * DQ + 16 * ks + lm_col);
        }
    }

    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f};
    float* my_sx = sx + (grp * DA_GW + wq) * 8 * 32;
    const float* grp_sx = sx + grp * DA_GW * 8 * 32;

    for (int i = 0; i < mine; ++i) {
        const long long j0 = zlo + (long long)(grp + DA_GROUPS * i) * DA_KT;
        // Tile i landed for the whole group; every warp of it is done with tile i - 1 (its
        // stage and the S exchange). 8-bit: tile i + 1's copies stay in flight, tile i + 2's
        // go out (every iteration commits one group, empty past the last tile).
        if (RAW) cp_async_wait(1);
        else cp_async_wait(0);
        asm volatile("bar.sync %0, %1;" ::"r"(1 + grp), "r"(DA_GW * 32));
        if (RAW) {
            if (i + 2 < mine) load(i + 2, slot);
            else cp_async_commit();
            slot = tile_slot_of(i + 3);
        } else {
            if (i + 1 < mine) load(i + 1, slot);
            slot = tile_slot_of(i + 2);
        }
        const u16* kt = gbuf + (i % 2) * TILE;
        const u16* vt = kt + DA_KT * ld;
        const unsigned char* st = gbase + (i % DA_RAW_STAGES) * RAW_STAGE;  // 8-bit only
        // 8-bit slabs: the tile's K and V scales of keys 2 tq, 2 tq + 1, 8 + 2 tq and
        // 9 + 2 tq, the keys of this lane's S elements and probabilities.
        float2 ksc[2] = {{1.0f, 1.0f}, {1.0f, 1.0f}}, vsc[2] = {{1.0f, 1.0f}, {1.0f, 1.0f}};
        if constexpr (RAW) {
            // This warp's quarter of the tile's V codes as f16, 16 codes a piece: consecutive
            // lanes take consecutive pieces of a quarter row, then the next rows.
            const float* ks = (const float*)(st + SCALES);
            constexpr int QP = DQ / 16;  // pieces of a quarter row
            __syncwarp();  // this warp's reads of the previous converted tile are done
#pragma unroll
            for (int r = 0; r < (QP + 1) / 2; ++r) {
                const int it = lane + 32 * r;
                const int row = it / QP, p = it % QP;
                if (row < DA_KT) {
                    const uint4 w = *(const uint4*)(st + V_CODES + row * VRS + wq * DQ + 16 * p);
                    u16* dst = dec + row * ld + wq * DQ + 16 * p;
                    *(uint4*)dst = codes8_to_f16<FMT>(make_uint2(w.x, w.y));
                    *(uint4*)(dst + 8) = codes8_to_f16<FMT>(make_uint2(w.z, w.w));
                }
            }
#pragma unroll
            for (int hk = 0; hk < 2; ++hk) {
                ksc[hk] = *(const float2*)(ks + 8 * hk + 2 * tq);
                vsc[hk] = *(const float2*)(ks + DA_KT + 8 * hk + 2 * tq);
            }
            __syncwarp();
            vt = dec;
        }

        // Partial S over this warp's quarter: keys 0-7 and 8-15.
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            u32 b0, b1, b2, b3;
            if constexpr (RAW) {
                // Keys g and 8 + g, head dims 4 tq .. 4 tq + 3 of this 16: one word of codes
                // each, two conversions each.
                const unsigned char* kr = st + g * KRS + wq * DQ + 16 * ks + 4 * tq;
                const u32 w0 = *(const u32*)kr, w1 = *(const u32*)(kr + 8 * KRS);
                b0 = codes_to_f16x2<FMT>(w0);
                b1 = codes_to_f16x2<FMT>(w0 >> 16);
                b2 = codes_to_f16x2<FMT>(w1);
                b3 = codes_to_f16x2<FMT>(w1 >> 16);
            } else {
                ldmatrix_x4(b0, b1, b2, b3,
                            kt + ((lane % 8) + 8 * (lane / 16)) * ld + wq * DQ + 16 * ks +
                                8 * ((lane / 8) % 2));
            }
            mma_of<RAW>(s[0], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
            mma_of<RAW>(s[1], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b2, b3);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) my_sx[e * 32 + lane] = s[e / 4][e % 4];
        asm volatile("bar.sync %0, %1;" ::"r"(1 + grp), "r"(DA_GW * 32));
        // The whole S, added in warp order (the same bits in all four warps).
        float x[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float v = grp_sx[e * 32 + lane];
#pragma unroll
            for (int w = 1; w < DA_GW; ++w) v += grp_sx[(w * 8 + e) * 32 + lane];
            // Element e: key 8 (e / 4) + 2 tq + e % 2 of row g + 8 ((e / 2) % 2).
            const int key = 8 * (e / 4) + 2 * tq + e % 2;
            if (RAW) v *= e % 2 ? ksc[e / 4].y : ksc[e / 4].x;
            v *= scale;
            if (has_softcap) v = softcap * tanhf(v / softcap);
            const int h = (e / 2) % 2;
            x[e] = j0 + key <= row_hi[h] && j0 + key >= row_lo[h] ? v : NEG_INF;
        }
        u32 pa[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // Row g + 8 h: elements 2 h, 2 h + 1 (keys 0-7) and 4 + 2 h, 5 + 2 h (keys 8-15).
            float mx = fmaxf(fmaxf(x[2 * h], x[2 * h + 1]), fmaxf(x[4 + 2 * h], x[5 + 2 * h]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // Finite once a row has met a key. With one token a block key j0 is always valid;
            // a token before the block's last may find none in this tile (its keys end
            // earlier), and then its probabilities are 0 and nothing is rescaled.
            const float m_new = fmaxf(m_run[h], mx);
            const float m_sub = m_new == NEG_INF ? 0.0f : m_new;
            const float corr = __expf(m_run[h] - m_sub);
            float ps;
            if constexpr (RAW) {
                // The row sum takes the probabilities as f16 rounds them; P V takes each
                // times its key's V scale.
                const float e0 = __expf(x[2 * h] - m_sub), e1 = __expf(x[2 * h + 1] - m_sub);
                const float e2 = __expf(x[4 + 2 * h] - m_sub), e3 = __expf(x[5 + 2 * h] - m_sub);
                ps = (round_f16(e0) + round_f16(e1)) + (round_f16(e2) + round_f16(e3));
                pa[h] = pack_f16x2(e0 * vsc[0].x, e1 * vsc[0].y);
                pa[2 + h] = pack_f16x2(e2 * vsc[1].x, e3 * vsc[1].y);
            } else {
                const u16 p0 = f32_to_bf16_rne(__expf(x[2 * h] - m_sub));
                const u16 p1 = f32_to_bf16_rne(__expf(x[2 * h + 1] - m_sub));
                const u16 p2 = f32_to_bf16_rne(__expf(x[4 + 2 * h] - m_sub));
                const u16 p3 = f32_to_bf16_rne(__expf(x[5 + 2 * h] - m_sub));
                ps = (bf16_to_f32(p0) + bf16_to_f32(p1)) + (bf16_to_f32(p2) + bf16_to_f32(p3));
                // A fragment: a0 / a1 rows g / g + 8 keys 2 tq (+1), a2 / a3 keys 8 + 2 tq (+1).
                pa[h] = (u32)p0 | ((u32)p1 << 16);
                pa[2 + h] = (u32)p2 | ((u32)p3 << 16);
            }
            ps += __shfl_xor_sync(0xffffffffu, ps, 1);
            ps += __shfl_xor_sync(0xffffffffu, ps, 2);
            l_run[h] = l_run[h] * corr + ps;
            m_run[h] = m_new;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                o[nt][2 * h] *= corr;
                o[nt][2 * h + 1] *= corr;
            }
        }
        // O += P V over this warp's quarter of the columns.
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            u32 b0, b1, b2, b3;
            ldmatrix_x4_trans(b0, b1, b2, b3, vt + lm_row * ld + wq * DQ + nt * 8 + lm_col);
            mma_of<RAW>(o[nt], pa[0], pa[1], pa[2], pa[3], b0, b1);
            mma_of<RAW>(o[nt + 1], pa[0], pa[1], pa[2], pa[3], b2, b3);
        }
    }
    cp_async_wait(0);

    // The second group's (max, sum, O) into the first's, through the idle K/V stages:
    // O as [DA_GW][NT][4][32] f32 in fragment order, the row statistics [32][4].
    __syncthreads();
    float* mo = (float*)kv;
    float* ml = mo + DA_GW * NT * 4 * 32;
    if (grp == 1) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) mo[((wq * NT + nt) * 4 + e) * 32 + lane] = o[nt][e];
        if (wq == 0) {
            ml[lane * 4 + 0] = m_run[0];
            ml[lane * 4 + 1] = m_run[1];
            ml[lane * 4 + 2] = l_run[0];
            ml[lane * 4 + 3] = l_run[1];
        }
    }
    __syncthreads();
    if (grp == 1) return;
    float f_a[2], f_b[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float mb = ml[lane * 4 + h], lb = ml[lane * 4 + 2 + h];
        const float m = fmaxf(m_run[h], mb);
        // A group without keys holds (-inf, 0, 0): its factor is 0.
        f_a[h] = m_run[h] == NEG_INF ? 0.0f : __expf(m_run[h] - m);
        f_b[h] = mb == NEG_INF ? 0.0f : __expf(mb - m);
        l_run[h] = l_run[h] * f_a[h] + lb * f_b[h];
        m_run[h] = m;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = g + 8 * h;
        if (r >= tpb * group) continue;
        const u64 task = (t + r / group) * n_heads + (u64)kvh * group + r % group;
        const OutRow dst = out_row(out, out_b, ws_acc, ws_ml, task, D, n_splits, z,
                                   m_run[h], l_run[h], wq == 0 && tq == 0, (u64)row0 * n_heads);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const float* ob = mo + ((wq * NT + nt) * 4 + 2 * h) * 32 + lane;
            store_pair(dst, wq * DQ + nt * 8 + 2 * tq, o[nt][2 * h] * f_a[h] + ob[0] * f_b[h],
                       o[nt][2 * h + 1] * f_a[h] + ob[32] * f_b[h]);
        }
    }
}

// One entry point per head_dim, the decode kernel's parameters (`n_stages` unused: two
// stages a group). Up to d 256 two blocks share a multiprocessor.
#define DECODE_ATTENTION_KERNEL(D, BLOCKS)                                                      \
    extern "C" __global__ void __launch_bounds__(PM_WARPS * 32, BLOCKS)                         \
        decode_attention_mma_d##D(const float* q, const u16* k_slab, const u16* v_slab,         \
                                  const u32* seqs, const u32* row_seq, const u32* slots,        \
                                  float* out, u16* out_b, float* ws_acc, float* ws_ml,          \
                                  int n_heads, int n_kv_heads, int d, float scale,              \
                                  long long window, int has_softcap, float softcap,             \
                                  int n_splits, int dense_min_q, int n_stages, int row0,        \
                                  int tpb) {                                                    \
        extern __shared__ __align__(16) unsigned char smem[];                                  \
        decode_attention_body<D, DA_BF16>(                                                      \
            smem, q, (const unsigned char*)k_slab, (const unsigned char*)v_slab, nullptr,       \
            nullptr, seqs, row_seq, slots, out, out_b, ws_acc, ws_ml, n_heads, n_kv_heads,      \
            scale, window, has_softcap, softcap, n_splits, dense_min_q, row0, tpb);             \
    }

// The 8-bit slabs' entry points: the slab's arguments as `paged_attention` takes them (codes,
// then the per-(slot, KV head) scales), the rest as above.
#define DECODE_ATTENTION_SCALED_KERNEL(NAME, FMT, D, BLOCKS)                                    \
    extern "C" __global__ void __launch_bounds__(PM_WARPS * 32, BLOCKS) NAME##_d##D(            \
        const float* q, const unsigned char* k_slab, const unsigned char* v_slab,               \
        const float* k_scales, const float* v_scales, const u32* seqs, const u32* row_seq,      \
        const u32* slots, float* out, u16* out_b, float* ws_acc, float* ws_ml, int n_heads,     \
        int n_kv_heads, int d, float scale, long long window, int has_softcap, float softcap,   \
        int n_splits, int dense_min_q, int n_stages, int row0, int tpb) {                       \
        extern __shared__ __align__(16) unsigned char smem[];                                  \
        decode_attention_body<D, FMT>(smem, q, k_slab, v_slab, k_scales, v_scales, seqs,        \
                                      row_seq, slots, out, out_b, ws_acc, ws_ml, n_heads,       \
                                      n_kv_heads, scale, window, has_softcap, softcap,          \
                                      n_splits, dense_min_q, row0, tpb);                        \
    }

DECODE_ATTENTION_KERNEL(64, 2)
DECODE_ATTENTION_KERNEL(128, 2)
DECODE_ATTENTION_KERNEL(256, 2)
DECODE_ATTENTION_KERNEL(512, 1)
DECODE_ATTENTION_SCALED_KERNEL(decode_attention_mma_fp8, DA_FP8, 64, 2)
DECODE_ATTENTION_SCALED_KERNEL(decode_attention_mma_fp8, DA_FP8, 128, 2)
DECODE_ATTENTION_SCALED_KERNEL(decode_attention_mma_fp8, DA_FP8, 256, 2)
DECODE_ATTENTION_SCALED_KERNEL(decode_attention_mma_fp8, DA_FP8, 512, 1)
DECODE_ATTENTION_SCALED_KERNEL(decode_attention_mma_int8, DA_INT8, 64, 2)
DECODE_ATTENTION_SCALED_KERNEL(decode_attention_mma_int8, DA_INT8, 128, 2)
DECODE_ATTENTION_SCALED_KERNEL(decode_attention_mma_int8, DA_INT8, 256, 2)
DECODE_ATTENTION_SCALED_KERNEL(decode_attention_mma_int8, DA_INT8, 512, 1)
