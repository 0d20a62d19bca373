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

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// 16 bytes from global to shared memory; `bytes` 0 zero-fills the destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }

// Waits until at most `pending` (0 or 1) of this thread's newest copy groups are in flight.
__device__ __forceinline__ void cp_async_wait(int pending) {
    if (pending == 0) asm volatile("cp.async.wait_group 0;\n");
    else asm volatile("cp.async.wait_group 1;\n");
}

__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3,
                                                  const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

// c += a (16 x 16, row-major bf16) x b (16 x 8, column-major bf16), f32 accumulators.
__device__ __forceinline__ void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Copies keys j0 .. j0 + PM_KT - 1 (those up to `last`) of a KV head into a tile; rows past
// `last` are zero-filled so they add nothing (their probabilities are zero too). Lane j of
// every warp reads key j's slot once; the copies take it by shuffle. THREADS is the block
// size; PM_KT * chunks = 4 d is a multiple of 32, so every lane of a warp runs the same
// rounds (the shuffle needs them all).
template <int THREADS, bool STEP = false>
__device__ __forceinline__ void load_tile_slot(u16* kt, u16* vt, const u16* k_slab,
                                               const u16* v_slab, u32 my_slot, long long j0,
                                               long long last, int n_kv_heads, int kvh, int d,
                                               int ld) {
    const int chunks = d / 8;  // 16-byte pieces of a row
    // Piece c is (key c / chunks, part c % chunks). With STEP the loop steps both instead
    // of dividing every round (fewer instructions, two more registers: the decode kernel,
    // at its register cap, keeps the divisions).
    int key = threadIdx.x / chunks, part = threadIdx.x % chunks;
    const int key_step = THREADS / chunks, part_step = THREADS % chunks;
    for (int c = threadIdx.x; c < PM_KT * chunks; c += THREADS) {
        if (!STEP) {
            key = c / chunks;
            part = c % chunks;
        }
        const u32 slot = __shfl_sync(0xffffffffu, my_slot, key);
        const bool valid = j0 + key <= last;
        const u64 off = valid ? ((u64)slot * n_kv_heads + kvh) * d + part * 8 : 0;
        cp_async16(kt + key * ld + part * 8, k_slab + off, valid ? 16 : 0);
        cp_async16(vt + key * ld + part * 8, v_slab + off, valid ? 16 : 0);
        if (STEP) {
            key += key_step;
            part += part_step;
            if (part >= chunks) {
                part -= chunks;
                ++key;
            }
        }
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
// split's workspace row, unscaled, with the row's (max, sum) written by one thread.
struct OutRow {
    float* dst;
    u16* dst_b;
    float norm;
};

__device__ __forceinline__ OutRow out_row(float* out, u16* out_b, float* ws_acc, float* ws_ml,
                                          u64 task, int d, int n_splits, int z, float m,
                                          float l, bool writes_ml) {
    if (n_splits == 1)
        return {out + task * d, out_b ? out_b + task * d : nullptr, l > 0.0f ? 1.0f / l : 0.0f};
    const u64 part = task * n_splits + z;
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

// Lane j's slot of the tile starting at key j0 (0 past `last`).
__device__ __forceinline__ u32 tile_slot(const u32* sl, long long j0, long long last) {
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
                    int dense_min_q, int n_stages) {
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

    const u64 t = blockIdx.x;
    const int kvh = blockIdx.y;
    const int z = blockIdx.z;
    const int group = n_heads / n_kv_heads;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    // The row's visible keys and this split's share, exactly as `paged_attention`.
    const u32* sq = seqs + 5 * (u64)row_seq[t];
    const long long qp = (long long)sq[2] + ((long long)t - (long long)sq[0]);
    const long long k_start = sq[3];
    const u32* sl = slots + sq[4];
    long long lo = 0, hi = qp - k_start;
    if (window >= 0 && qp - window + 1 - k_start > lo) lo = qp - window + 1 - k_start;
    if (dense_min_q > 0 && (int)sq[1] >= dense_min_q) hi = lo - 1;
    // Splits take whole tiles: a short row leaves the later splits empty instead of giving
    // every split a sliver of a tile.
    long long chunk = (hi - lo + n_splits) / n_splits;
    chunk = (chunk + PM_KT - 1) / PM_KT * PM_KT;
    const long long zlo = lo + (long long)z * chunk;
    long long zhi = zlo + chunk - 1;
    if (zhi > hi) zhi = hi;
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
    // The group's query rows as bf16 (four values a thread per round, every load of a
    // thread issued before its first store); rows past the group are zero.
    const float4* qsrc = (const float4*)(q + (t * n_heads + (u64)kvh * group) * d);
    const int q4 = group * d / 4;
    for (int i0 = 0; i0 < q4; i0 += 4 * PM_WARPS * 32) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = i0 + u * PM_WARPS * 32 + threadIdx.x;
            if (i < q4) v[u] = qsrc[i];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = i0 + u * PM_WARPS * 32 + threadIdx.x;
            if (i < q4) {
                const int r = 4 * i / d, c = 4 * i % d;
                u16* dst = qs + r * ld + c;
                dst[0] = f32_to_bf16_rne(v[u].x);
                dst[1] = f32_to_bf16_rne(v[u].y);
                dst[2] = f32_to_bf16_rne(v[u].z);
                dst[3] = f32_to_bf16_rne(v[u].w);
            }
        }
    }
    for (int i = group * d + threadIdx.x; i < PM_ROWS * d; i += blockDim.x)
        qs[(i / d) * ld + i % d] = 0;

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
                                   l_s[r], warp == 0 && tq == 0);
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
// bf16 slab, bf16 mode. Where the decode kernel above gives a block one token's query group
// (16 mma rows, half of them empty for a group of 8), a block here takes PF_ROWS = 64 rows:
// `tpb` consecutive tokens times the group's query heads (row r is token t0 + r / group,
// head r % group), so each key and value row is read from memory once per 64 query rows.
// Per tile of PM_KT keys, PF_WARPS = 16 warps:
//   1. S = Q K^T (64 x PM_KT): warp w computes rows 16 (w / 4) .. + 15 against keys
//      8 (w % 4) .. + 7 over the whole head_dim;
//   2. the online softmax, one lane per key, rows w, w + 16, w + 32, w + 48 a warp, each row
//      masked to its own token's keys (causal and window);
//   3. O += P V: warp w accumulates rows 16 (w / 4) .. + 15 over columns (w % 4) d / 4 ..
//      + d / 4 in registers (64 floats a lane at d 512).
// Blocks are issued last tokens first: under the causal mask they have the most keys, and
// starting them first keeps the grid's tail short. Splits (few blocks: short prompts) cut
// the block's key range in whole tiles as the decode kernel does; a row with no key in a
// split writes a zero sum, which `paged_combine` skips.
//
// Floor (E2B, 4096 tokens): the full layers' K and V cross from L2 once per 64 query rows
// (4096 / 8 blocks x ~2048 keys x 2 KB = 2.1 GB a layer); the mma work (2 x 64 x d flops a
// key for each product, about half of it masked-out in the causal triangle's diagonal
// tiles only) is ~1 TFLOP for the model, a few ms at the tensor rate mma.sync reaches.

#define PF_ROWS 64
#define PF_WARPS 16

// A finite f32 rounded to bf16 (nearest even) in one instruction: the probabilities, which
// are never NaN (f32_to_bf16_rne keeps NaN payloads, for the KV store's bit-exactness).
__device__ __forceinline__ u16 bf16_rn_finite(float x) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
}

// Shared memory: Q [64][ld], K and V [n_stages][PM_KT][ld] (bf16, ld = d + PM_PAD), S
// [64][PM_KT] f32, P [64][PM_KT + PM_PAD] bf16, per-row factors [64] f32, per-row key
// bounds [2][64] i32
// (`prefill_smem_bytes` in cuda/paged_mma.rs computes the same sum). One block a
// multiprocessor: 512 threads at up to 128 registers fill the register file.
// `q`, `out` and `out_b` (the bf16 twin, or null) start at the sequence's first row; `sl` at
// its first slot.
extern "C" __global__ void __launch_bounds__(PF_WARPS * 32, 1)
prefill_attention_mma(const float* q, const u16* k_slab, const u16* v_slab, const u32* sl,
                      float* out, u16* out_b, float* ws_acc, float* ws_ml, int n_heads,
                      int n_kv_heads, int d, float scale, long long window, int has_softcap,
                      float softcap, int n_splits, int n_stages, int q_len, long long q_pos0,
                      long long k_start, int tpb) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) unsigned char smem[];
    const int ld = d + PM_PAD;
    const int ldp = PM_KT + PM_PAD;
    u16* qs = (u16*)smem;
    u16* ks = qs + PF_ROWS * ld;
    u16* vs = ks + n_stages * PM_KT * ld;
    float* ss = (float*)(vs + n_stages * PM_KT * ld);  // [64][PM_KT]
    u16* ps = (u16*)(ss + PF_ROWS * PM_KT);
    float* row_f = (float*)(ps + PF_ROWS * ldp);
    int* row_lo = (int*)(row_f + PF_ROWS);  // [64] each row's first and last visible key
    int* row_hi = row_lo + PF_ROWS;

    const int kvh = blockIdx.y;
    const int z = blockIdx.z;
    const int group = n_heads / n_kv_heads;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * tpb;
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
    chunk = (chunk + PM_KT - 1) / PM_KT * PM_KT;
    const int zlo = lo + z * chunk;
    const int zhi = min(zlo + chunk - 1, hi);
    const int n_tiles = zhi >= zlo ? (zhi - zlo + PM_KT) / PM_KT : 0;
    // Rows' key bounds, once per block (the softmax would otherwise divide by the group
    // size every tile); rows past the block's tokens see no key. Read after the first
    // barrier of the tile loop.
    if (threadIdx.x < PF_ROWS) {
        const int r = threadIdx.x;
        const int rhi = hi0 + r / group;
        row_lo[r] = win >= 0 ? max(0, rhi - win + 1) : 0;
        row_hi[r] = r < rows_used ? min(rhi, zhi) : -1;
    }

    for (int st = 0; st + 1 < n_stages; ++st) {
        if (st < n_tiles)
            load_tile<PF_WARPS * 32>(ks + st * PM_KT * ld, vs + st * PM_KT * ld, k_slab,
                                     v_slab, sl, zlo + st * PM_KT, zhi, n_kv_heads, kvh, d,
                                     ld);
        cp_async_commit();
    }
    // Each lane's slot of the next tile to load, read one iteration ahead so the tile's
    // copies never wait on it.
    u32 next_slot = tile_slot(sl, zlo + (n_stages - 1) * PM_KT, zhi);
    // Query rows as bf16, four values a thread per load; rows past the block's tokens are
    // zero. A token's group of heads is contiguous in q.
    {
        const int q4 = PF_ROWS * d / 4;
        const int dq = d / 4;
        for (int i0 = 0; i0 < q4; i0 += 4 * PF_WARPS * 32) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int i = i0 + u * PF_WARPS * 32 + threadIdx.x;
                const int r = i / dq;
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (i < q4 && r < rows_used) {
                    const u64 tok = t0 + r / group;
                    const u64 head = (u64)kvh * group + r % group;
                    v[u] = ((const float4*)(q + (tok * n_heads + head) * d))[i % dq];
                }
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int i = i0 + u * PF_WARPS * 32 + threadIdx.x;
                if (i < q4) {
                    u16* dst = qs + (i / dq) * ld + 4 * (i % dq);
                    dst[0] = f32_to_bf16_rne(v[u].x);
                    dst[1] = f32_to_bf16_rne(v[u].y);
                    dst[2] = f32_to_bf16_rne(v[u].z);
                    dst[3] = f32_to_bf16_rne(v[u].w);
                }
            }
        }
    }

    const int g = lane / 4, tq = lane % 4;
    const int lm_row = (lane % 8) + 8 * ((lane / 8) % 2), lm_col = 8 * (lane / 16);
    const int rg = warp / 4, quarter = warp % 4;  // row group; key group (S) / column quarter (P V)
    const int n_tiles_d = d / 32;
    const int col0 = quarter * (d / 4);

    float o[PM_MAX_NT][4];
#pragma unroll
    for (int nt = 0; nt < PM_MAX_NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m_run[4], l_run[4];  // rows warp + 16 i (the same in every lane)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m_run[i] = NEG_INF;
        l_run[i] = 0.0f;
    }

    for (int it = 0; it < n_tiles; ++it) {
        const int buf = it % n_stages;
        const int j0 = zlo + it * PM_KT;
        u16* kt = ks + buf * PM_KT * ld;
        u16* vt = vs + buf * PM_KT * ld;
        cp_async_wait(n_stages - 2);
        __syncthreads();  // tile `it` landed; every warp is done with tile it - 1
        {
            const int ahead = it + n_stages - 1;
            const int nb = ahead % n_stages;
            if (ahead < n_tiles)
                load_tile_slot<PF_WARPS * 32, true>(ks + nb * PM_KT * ld,
                                                    vs + nb * PM_KT * ld,
                                              k_slab, v_slab, next_slot, zlo + ahead * PM_KT,
                                              zhi, n_kv_heads, kvh, d, ld);
            cp_async_commit();
            next_slot = tile_slot(sl, zlo + (ahead + 1) * PM_KT, zhi);
        }

        // S for rows 16 rg .. + 15 and keys 8 quarter .. + 7; four accumulators (a quarter
        // of each 64 columns of head_dim each) keep four mma chains in flight.
        {
            float s[4][4];
#pragma unroll
            for (int c = 0; c < 4; ++c) s[c][0] = s[c][1] = s[c][2] = s[c][3] = 0.0f;
            const u16* krow = kt + (quarter * 8 + lane % 8) * ld + 8 * (lane / 8);
            const u16* qrow = qs + (rg * 16 + lm_row) * ld + lm_col;
            for (int kk = 0; kk < d; kk += 64) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    u32 b0, b1, b2, b3, a0, a1, a2, a3;
                    ldmatrix_x4(b0, b1, b2, b3, krow + kk + 32 * h);
                    ldmatrix_x4(a0, a1, a2, a3, qrow + kk + 32 * h);
                    mma_bf16(s[2 * h], a0, a1, a2, a3, b0, b1);
                    ldmatrix_x4(a0, a1, a2, a3, qrow + kk + 32 * h + 16);
                    mma_bf16(s[2 * h + 1], a0, a1, a2, a3, b2, b3);
                }
            }
            float* sr = ss + (rg * 16 + g) * PM_KT + quarter * 8 + 2 * tq;
            sr[0] = (s[0][0] + s[1][0]) + (s[2][0] + s[3][0]);
            sr[1] = (s[0][1] + s[1][1]) + (s[2][1] + s[3][1]);
            sr[8 * PM_KT] = (s[0][2] + s[1][2]) + (s[2][2] + s[3][2]);
            sr[8 * PM_KT + 1] = (s[0][3] + s[1][3]) + (s[2][3] + s[3][3]);
        }
        __syncthreads();

        // Online softmax, one lane per key, each row masked to its token's keys; the warp's
        // four rows go through each shuffle step together (four independent chains). A row
        // with no visible key yet keeps max -inf: its factors use 0 in place of the max so
        // nothing turns NaN (its sum stays 0). Rows past the block's tokens compute on
        // nothing and store nothing.
        {
            const int j = j0 + lane;
            float x[4], mx[4], pf[4];
            bool valid[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = warp + PF_WARPS * i;
                valid[i] = j >= row_lo[r] && j <= row_hi[r];
                x[i] = NEG_INF;
                if (valid[i]) {
                    x[i] = ss[r * PM_KT + lane] * scale;
                    if (has_softcap) x[i] = softcap * tanhf(x[i] / softcap);
                }
                mx[i] = x[i];
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], off));
            }
            float corr[4];
            u16 pb[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float m_new = fmaxf(m_run[i], mx[i]);
                const float m_use = m_new == NEG_INF ? 0.0f : m_new;
                corr[i] = __expf(m_run[i] - m_use);
                pb[i] = valid[i] ? bf16_rn_finite(__expf(x[i] - m_use)) : (u16)0;
                pf[i] = bf16_to_f32(pb[i]);
                m_run[i] = m_new;
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
                for (int i = 0; i < 4; ++i) pf[i] += __shfl_xor_sync(0xffffffffu, pf[i], off);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = warp + PF_WARPS * i;
                l_run[i] = l_run[i] * corr[i] + pf[i];
                if (r < rows_used) {
                    ps[r * ldp + lane] = pb[i];
                    if (lane == 0) row_f[r] = corr[i];
                }
            }
        }
        __syncthreads();

        // O = O * corr + P V over this warp's rows and columns. Once the rows' maxima
        // settle every factor is exactly 1: the warp then skips the multiplies (same bits).
        const float c_lo = row_f[rg * 16 + g], c_hi = row_f[rg * 16 + g + 8];
        if (__any_sync(0xffffffffu, c_lo != 1.0f || c_hi != 1.0f)) {
#pragma unroll
            for (int nt = 0; nt < PM_MAX_NT; ++nt) {
                o[nt][0] *= c_lo;
                o[nt][1] *= c_lo;
                o[nt][2] *= c_hi;
                o[nt][3] *= c_hi;
            }
        }
#pragma unroll
        for (int kk = 0; kk < PM_KT; kk += 16)
            pv_step(o, ps + (rg * 16 + lm_row) * ldp + kk + lm_col,
                    vt + (kk + lm_row) * ld + col0 + lm_col, n_tiles_d);
    }

    // Rows' (max, sum) through shared memory (S's space: every warp is past its last read).
    float* m_s = ss;
    float* l_s = ss + PF_ROWS;
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            m_s[warp + PF_WARPS * i] = m_run[i];
            l_s[warp + PF_WARPS * i] = l_run[i];
        }
    }
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = rg * 16 + g + 8 * half;
        if (r >= rows_used) continue;
        const u64 task = (u64)(t0 + r / group) * n_heads + (u64)kvh * group + r % group;
        const OutRow dst = out_row(out, out_b, ws_acc, ws_ml, task, d, n_splits, z, m_s[r],
                                   l_s[r], quarter == 0 && tq == 0);
#pragma unroll
        for (int nt = 0; nt < PM_MAX_NT; ++nt) {
            if (nt < n_tiles_d) {
                const int c = col0 + nt * 8 + 2 * tq;
                store_pair(dst, c, o[nt][2 * half], o[nt][2 * half + 1]);
            }
        }
    }
#else
    __trap();
#endif
}
