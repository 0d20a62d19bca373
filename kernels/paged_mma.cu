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
// every warp reads key j's slot once; the copies take it by shuffle.
__device__ __forceinline__ void load_tile(u16* kt, u16* vt, const u16* k_slab,
                                          const u16* v_slab, const u32* sl, long long j0,
                                          long long last, int n_kv_heads, int kvh, int d,
                                          int ld) {
    const int lane = threadIdx.x % 32;
    const u32 my_slot = j0 + lane <= last ? sl[j0 + lane] : 0u;
    const int chunks = d / 8;  // 16-byte pieces of a row
    // PM_KT * chunks = 4 d is a multiple of the block size: every lane runs every round.
    for (int c = threadIdx.x; c < PM_KT * chunks; c += PM_WARPS * 32) {
        const int key = c / chunks, part = c % chunks;
        const u32 slot = __shfl_sync(0xffffffffu, my_slot, key);
        const bool valid = j0 + key <= last;
        const u64 off = valid ? ((u64)slot * n_kv_heads + kvh) * d + part * 8 : 0;
        cp_async16(kt + key * ld + part * 8, k_slab + off, valid ? 16 : 0);
        cp_async16(vt + key * ld + part * 8, v_slab + off, valid ? 16 : 0);
    }
}

// Shared memory: Q [16][ld], K and V [n_stages][PM_KT][ld] (bf16, ld = d + PM_PAD), S
// [2][16][PM_KT] f32, P [16][PM_KT + PM_PAD] bf16, per-row factors [16] f32 (`smem_bytes` in
// cuda/paged_mma.rs computes the same sum). n_stages (2 or 3) tiles are in flight or in use
// at once: with 3, two tiles load while one is computed.
// At most 128 registers a thread (the 2): two d-256 blocks share a multiprocessor.
extern "C" __global__ void __launch_bounds__(PM_WARPS * 32, 2)
paged_attention_mma(const float* q, const u16* k_slab, const u16* v_slab, const u32* seqs,
                    const u32* row_seq, const u32* slots, float* out, float* ws_acc,
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
            load_tile(ks + st * PM_KT * ld, vs + st * PM_KT * ld, k_slab, v_slab, sl,
                      zlo + (long long)st * PM_KT, zhi, n_kv_heads, kvh, d, ld);
        cp_async_commit();
    }
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
                load_tile(ks + nb * PM_KT * ld, vs + nb * PM_KT * ld, k_slab, v_slab, sl,
                          zlo + (long long)ahead * PM_KT, zhi, n_kv_heads, kvh, d, ld);
            cp_async_commit();
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
            u32 a0, a1, a2, a3;
            ldmatrix_x4(a0, a1, a2, a3, ps + lm_row * ldp + kk + lm_col);
            const u16* vrow = vt + (kk + lm_row) * ld + col0 + lm_col;
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
        const float l = l_s[r];
        const u64 task = task0 + r;
        float* dst;
        float norm;
        if (n_splits == 1) {
            dst = out + task * d;
            norm = l > 0.0f ? 1.0f / l : 0.0f;
        } else {
            const u64 part = task * n_splits + z;
            dst = ws_acc + part * d;
            norm = 1.0f;
            if (warp == 0 && tq == 0) {
                ws_ml[2 * part] = m_s[r];
                ws_ml[2 * part + 1] = l;
            }
        }
#pragma unroll
        for (int nt = 0; nt < PM_MAX_NT; ++nt) {
            if (nt < n_tiles_d) {
                const int c = col0 + nt * 8 + 2 * tq;
                dst[c] = (o[nt][2 * half] + o_hi[r * d + c]) * norm;
                dst[c + 1] = (o[nt][2 * half + 1] + o_hi[r * d + c + 1]) * norm;
            }
        }
    }
#else
    __trap();
#endif
}
