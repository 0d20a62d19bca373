// Whether a persistent kernel that streams a decoder layer's weights through shared memory
// without stopping at the layer's data dependencies beats the same layer as a chain of
// launches, at one token (Gemma-4 E2B's shapes, bf16 weights, f32 activations).
//
// The layer here is the decode step's chain without attention: q / k / v (q alone on the
// KV-shared layers), a stand-in for attention (the first 2048 outputs scaled), o, the
// post-attention add and pre-MLP norm, gate and up with the tanh GELU, down, the
// post-MLP add, the per-layer-input gate (GELU times a table slice) and projection, and
// the scaled add with the next layer's input norm. 35 layers: 15 with q / k / v and a
// 6144-wide MLP, 20 with q alone and a 12288-wide MLP, 3.63 GB of weights.
//
//   chain      - one launch per product and per norm (10 a layer), in a CUDA graph; the
//                products are warp-a-row GEMVs with two 16-byte loads in flight a lane;
//   layer      - one persistent launch a layer (one block a multiprocessor): a producer
//                warp streams the block's rows of every product, in order, through a ring
//                of shared-memory slots with bulk copies, while eight consumer warps take
//                the products one after another with a grid-wide barrier between them
//                (each block recomputes the norms it needs from the row in L2);
//   model      - the same, one launch for all 35 layers, so the stream never stops;
// then the model kernel taken apart (`mode` bits: without its arithmetic, its staging, its
// grid barriers, with the producer's copies from every lane instead of bulk copies), rings
// of 64 to 224 KB, and the tiles of each product claimed from a counter instead of owned by
// a block (timing only).
//
// Standalone (nvcc, not the engine's NVRTC): on a GPU machine,
//   nvcc -O3 -std=c++17 -arch=sm_90 scripts/bench/layer_stream.cu -o /tmp/layer_stream
//   /tmp/layer_stream
// prints ms a step for each (best and median of 20 graph replays), their weight bytes per
// second, and how far the last residual lies from the chain's (the persistent kernel adds a
// row's pieces in shared memory in whatever order the threads reach them, so the figures
// differ in the last bits; the taken-apart variants compute nothing meaningful).
// Built with -DLS_BLOCKS=2 it runs two persistent blocks a multiprocessor (28 KB slots, a
// 56 KB ring each); LS_PROFILE=<mode bits> runs the model kernel twice and nothing else.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                         \
    do {                                                                                 \
        cudaError_t err_ = (x);                                                             \
        if (err_ != cudaSuccess) {                                                        \
            std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));     \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

constexpr int H = 1536, ATT = 2048, PLE = 256, LAYERS = 35, OWNERS = 15, MAXI = 12288;
constexpr float EPS = 1e-6f;
constexpr int PHASES = 6;  // q/k/v, o, gate+up, down, per-layer-input gate, projection

struct Layer {
    const __nv_bfloat16* w[7];  // qkv, o, gate, up, down, ple gate, ple projection
    int n_qkv, inter;
    const float* slice;
    float scale;
};
__constant__ Layer c_layers[LAYERS];

struct Bufs {
    float *hb, *xn, *qkv, *att, *o, *g, *d, *p, *q;
    const float *w1, *w2, *w3, *w4, *w5;
};

// ---------------------------------------------------------------- shared helpers

__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
    float s = bf_lo(w.x) * a.x;
    s = fmaf(bf_hi(w.x), a.y, s);
    s = fmaf(bf_lo(w.y), a.z, s);
    s = fmaf(bf_hi(w.y), a.w, s);
    s = fmaf(bf_lo(w.z), b.x, s);
    s = fmaf(bf_hi(w.z), b.y, s);
    s = fmaf(bf_lo(w.w), b.z, s);
    s = fmaf(bf_hi(w.w), b.w, s);
    return s;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float gelu(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

// The 256 threads that compute (all of a chain kernel's block; the persistent kernel's
// consumer warps) meet at named barrier 1, which the producer warp never joins.
__device__ __forceinline__ void csync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    csync();
    float s = 0.f;
    for (int i = 0; i < 8; ++i) s += red[i];
    csync();
    return s;
}

__device__ __forceinline__ float ldcg(const float* p) { return __ldcg(p); }

// A thread's six values of the row `a` (zeros where `a` is null) and of `b`, read through
// L2; returns the sum of a's squares over the thread's values.
__device__ float load_pair(const float* a, const float* b, float (&av)[6], float (&bv)[6]) {
    float ss = 0.f;
    for (int j = 0; j < 6; ++j) {
        const int i = threadIdx.x + 256 * j;
        av[j] = a ? ldcg(a + i) : 0.f;
        bv[j] = ldcg(b + i);
        ss += av[j] * av[j];
    }
    return ss;
}

// The three residual steps, written once for both forms. Each reads its inputs through L2
// (other blocks wrote them), writes the new residual when `store`, and the next product's
// input to `x` (global memory for the chain, shared memory for the persistent kernel).
// h1 = h + norm(o) w1; x = norm(h1) w2
__device__ void step_add_norm(const float* o, const float* h, float* h1, float* x,
                              const float* w1, const float* w2, bool store, float* red) {
    float ov[6], hv[6];
    const float r = rsqrtf(block_sum(load_pair(o, h, ov, hv), red) / H + EPS);
    float s2 = 0.f;
    for (int j = 0; j < 6; ++j) {
        const int i = threadIdx.x + 256 * j;
        hv[j] += ov[j] * r * w1[i];
        s2 += hv[j] * hv[j];
    }
    const float r2 = rsqrtf(block_sum(s2, red) / H + EPS);
    for (int j = 0; j < 6; ++j) {
        const int i = threadIdx.x + 256 * j;
        if (store) h1[i] = hv[j];
        x[i] = hv[j] * r2 * w2[i];
    }
}

// h2 = h1 + norm(d) w3; x = h2
__device__ void step_then_add(const float* d, const float* h1, float* h2, float* x,
                              const float* w3, bool store, float* red) {
    float dv[6], hv[6];
    const float r = rsqrtf(block_sum(load_pair(d, h1, dv, hv), red) / H + EPS);
    for (int j = 0; j < 6; ++j) {
        const int i = threadIdx.x + 256 * j;
        hv[j] += dv[j] * r * w3[i];
        if (store) h2[i] = hv[j];
        x[i] = hv[j];
    }
}

// h3 = (h2 + norm(q) w4) scale; x = norm(h3) w5 (without q: x = norm(h2) w5, the first layer)
__device__ void step_add_scale_norm(const float* q, const float* h2, float* h3, float* x,
                                    const float* w4, const float* w5, float scale,
                                    bool store, float* red) {
    float qv[6], hv[6];
    const float ss = load_pair(q, h2, qv, hv);
    if (q) {
        const float r = rsqrtf(block_sum(ss, red) / H + EPS);
        for (int j = 0; j < 6; ++j) {
            const int i = threadIdx.x + 256 * j;
            hv[j] = (hv[j] + qv[j] * r * w4[i]) * scale;
        }
    }
    float s2 = 0.f;
    for (int j = 0; j < 6; ++j) s2 += hv[j] * hv[j];
    const float r2 = rsqrtf(block_sum(s2, red) / H + EPS);
    for (int j = 0; j < 6; ++j) {
        const int i = threadIdx.x + 256 * j;
        if (store && q) h3[i] = hv[j];
        x[i] = hv[j] * r2 * w5[i];
    }
}

// ---------------------------------------------------------------- the chain

// SPLIT warps a row over k; EPI 0 plain, 1 gated (W and W2: gelu(W x) * (W2 x)),
// 2 per-layer-input gate (gelu(W x) * slice).
template <int SPLIT, int EPI>
__global__ void __launch_bounds__(256) gemv(const __nv_bfloat16* W, const __nv_bfloat16* W2,
                                            const float* x, float* y, int n, int k,
                                            const float* slice) {
    __shared__ float red[2][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (8 / SPLIT) + warp / SPLIT, part = warp % SPLIT;
    float a = 0.f, b = 0.f;
    if (row < n) {
        const int kp = k / SPLIT, pieces = kp / 8;
        const uint4* wr = reinterpret_cast<const uint4*>(W + (size_t)row * k + part * kp);
        const uint4* ur = EPI == 1
                              ? reinterpret_cast<const uint4*>(W2 + (size_t)row * k + part * kp)
                              : nullptr;
        const float4* xr = reinterpret_cast<const float4*>(x + part * kp);
        for (int i = lane; i < pieces; i += 64) {
            const bool two = i + 32 < pieces;
            const uint4 w0 = ld_stream(wr + i);
            uint4 w1 = make_uint4(0, 0, 0, 0), u0 = w1, u1 = w1;
            if (two) w1 = ld_stream(wr + i + 32);
            if (EPI == 1) {
                u0 = ld_stream(ur + i);
                if (two) u1 = ld_stream(ur + i + 32);
            }
            float4 xa = __ldg(xr + 2 * i), xb = __ldg(xr + 2 * i + 1);
            a += dot8(w0, xa, xb);
            if (EPI == 1) b += dot8(u0, xa, xb);
            if (two) {
                xa = __ldg(xr + 2 * (i + 32));
                xb = __ldg(xr + 2 * (i + 32) + 1);
                a += dot8(w1, xa, xb);
                if (EPI == 1) b += dot8(u1, xa, xb);
            }
        }
    }
    a = warp_sum(a);
    b = warp_sum(b);
    if (SPLIT > 1) {
        if (lane == 0) {
            red[0][warp] = a;
            red[1][warp] = b;
        }
        __syncthreads();
        if (part == 0) {
            a = 0.f;
            b = 0.f;
            for (int s = 0; s < SPLIT; ++s) {
                a += red[0][warp + s];
                b += red[1][warp + s];
            }
        }
    }
    if (part == 0 && lane == 0 && row < n)
        y[row] = EPI == 0 ? a : EPI == 1 ? gelu(a) * b : gelu(a) * slice[row];
}

__global__ void __launch_bounds__(256) attention_standin(const float* qkv, float* o) {
    for (int i = threadIdx.x + blockIdx.x * 256; i < ATT; i += 256 * gridDim.x)
        o[i] = 0.5f * qkv[i];
}

__global__ void __launch_bounds__(256) k_add_norm(Bufs b, int l) {
    __shared__ float red[8];
    step_add_norm(b.o, b.hb + (3 * l) * H, b.hb + (3 * l + 1) * H, b.xn, b.w1, b.w2, true, red);
}
__global__ void __launch_bounds__(256) k_then_add(Bufs b, int l) {
    __shared__ float red[8];
    step_then_add(b.d, b.hb + (3 * l + 1) * H, b.hb + (3 * l + 2) * H, b.xn, b.w3, true, red);
}
__global__ void __launch_bounds__(256) k_add_scale_norm(Bufs b, int l, float scale) {
    __shared__ float red[8];
    // l < 0: the first layer's input norm
    if (l < 0)
        step_add_scale_norm(nullptr, b.hb, nullptr, b.xn, b.w4, b.w5, 1.f, false, red);
    else
        step_add_scale_norm(b.q, b.hb + (3 * l + 2) * H, b.hb + (3 * l + 3) * H, b.xn, b.w4,
                            b.w5, scale, true, red);
}

template <int SPLIT, int EPI>
void launch_gemv(cudaStream_t s, const __nv_bfloat16* W, const __nv_bfloat16* W2,
                 const float* x, float* y, int n, int k, const float* slice) {
    const int rows = 8 / SPLIT;
    gemv<SPLIT, EPI><<<(n + rows - 1) / rows, 256, 0, s>>>(W, W2, x, y, n, k, slice);
}

void chain_step(cudaStream_t s, const std::vector<Layer>& L, const Bufs& b) {
    k_add_scale_norm<<<1, 256, 0, s>>>(b, -1, 1.f);
    for (int l = 0; l < LAYERS; ++l) {
        const Layer& y = L[l];
        launch_gemv<2, 0>(s, y.w[0], nullptr, b.xn, b.qkv, y.n_qkv, H, nullptr);
        attention_standin<<<1, 256, 0, s>>>(b.qkv, b.att);
        launch_gemv<4, 0>(s, y.w[1], nullptr, b.att, b.o, H, ATT, nullptr);
        k_add_norm<<<1, 256, 0, s>>>(b, l);
        launch_gemv<1, 1>(s, y.w[2], y.w[3], b.xn, b.g, y.inter, H, nullptr);
        launch_gemv<4, 0>(s, y.w[4], nullptr, b.g, b.d, H, y.inter, nullptr);
        k_then_add<<<1, 256, 0, s>>>(b, l);
        launch_gemv<8, 2>(s, y.w[5], nullptr, b.xn, b.p, PLE, H, y.slice);
        launch_gemv<1, 0>(s, y.w[6], nullptr, b.p, b.q, H, PLE, nullptr);
        k_add_scale_norm<<<1, 256, 0, s>>>(b, l, y.scale);
    }
}

// ---------------------------------------------------------------- the persistent kernel

// `mode` bits, to take the kernel apart: 1 the consumers skip the arithmetic, 2 no grid
// barriers, 4 no input staging (the results are then wrong; the timing is what is asked),
// 8 the producer warp copies with 16-byte cp.async from every lane instead of bulk copies.
// 16 (with 1 and 4 only): the tiles of a product are not owned by blocks but taken from a
// counter per product in `claims` (zeroed before each launch), so a block that streams
// faster takes more of them; the grid barrier then waits for the last tile, not the
// slowest block's share.
enum { SKIP_MATH = 1, SKIP_GRID = 2, SKIP_STAGE = 4, LANE_COPIES = 8, CLAIM = 16 };
// LS_BLOCKS: persistent blocks a multiprocessor (1, or 2 with a 56 KB ring of 28 KB slots,
// so that twice the consumer warps share a multiprocessor), a compile-time switch
#ifndef LS_BLOCKS
#define LS_BLOCKS 1
#endif
constexpr int BLOCKS = LS_BLOCKS, SLOT = BLOCKS == 1 ? 32768 : 28672;
constexpr int CONSUMERS = 256, THREADS = CONSUMERS + 32, MAXROWS = 128;
constexpr int RING = BLOCKS == 1 ? 160 * 1024 : 2 * SLOT;
constexpr int MAX_SLOTS = 32, HEAD = 2 * MAX_SLOTS * 8 + (8 + 2 * MAXROWS) * 4;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t* m, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(m)), "r"(count));
}
__device__ __forceinline__ void mbar_wait(uint64_t* m, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
            "selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(smem_addr(m)), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* m) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(m)) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* full) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                     smem_addr(full)),
                 "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(full))
        : "memory");
}

// `rows` runs of `bytes` each, `src_stride` apart in global memory, to `dst` at `pitch`
// bytes a run, all completing on `full` (armed here for their sum).
__device__ __forceinline__ void bulk_load_rows(char* dst, int pitch, const char* src,
                                               long long src_stride, int rows, uint32_t bytes,
                                               uint64_t* full) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                     smem_addr(full)),
                 "r"(rows * bytes)
                 : "memory");
    for (int r = 0; r < rows; ++r)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(smem_addr(dst + r * pitch)),
            "l"(src + r * src_stride), "r"(bytes), "r"(smem_addr(full))
            : "memory");
}

// Grid-wide barrier on a counter that only grows: every barrier of every launch takes
// exactly gridDim.x arrivals, so old / grid names the barrier being waited for.
__device__ void grid_sync(unsigned long long* count) {
    csync();
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned long long g = gridDim.x;
        const unsigned long long target = (atomicAdd(count, 1ull) / g + 1) * g;
        unsigned long long now;
        do {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(count));
        } while (now < target);
    }
    csync();
}

struct Product {
    const __nv_bfloat16* w[2];
    int n, k, mats;
};

__device__ Product product(int l, int phase) {
    const Layer& y = c_layers[l];
    switch (phase) {
        case 0: return {{y.w[0], nullptr}, y.n_qkv, H, 1};
        case 1: return {{y.w[1], nullptr}, H, ATT, 1};
        case 2: return {{y.w[2], y.w[3]}, y.inter, H, 2};
        case 3: return {{y.w[4], nullptr}, H, y.inter, 1};
        case 4: return {{y.w[5], nullptr}, PLE, H, 1};
        default: return {{y.w[6], nullptr}, H, PLE, 1};
    }
}

// How block `blk` of `G` walks a product: its rows [r0, r0 + rows) in tiles of R rows by S
// columns (S = min(k, 2048), at most 16 rows and `slot` bytes a tile), row tiles outer,
// column segments inner; a tile is one ring slot, R bulk copies of S columns, each row
// 16 bytes past the last (`pitch`), so that 16 threads reading the same columns of 16 rows
// hit different banks.
struct Walk {
    int r0, rows, S, segs, R;
    __device__ Walk(const Product& pr, int blk, int G, int slot) {
        r0 = (int)((long long)pr.n * blk / G);
        rows = (int)((long long)pr.n * (blk + 1) / G) - r0;
        S = min(pr.k, 2048);
        segs = pr.k / S;
        R = min(16, slot / (2 * S + 16));
    }
    __device__ int pitch() const { return 2 * S + 16; }
    __device__ int tiles() const { return (rows + R - 1) / R; }
};

// Layers [l0, l1) in one launch. Block b owns rows [n b / G, n (b + 1) / G) of every
// product and streams them, tile by tile, through the ring.
__global__ void __launch_bounds__(THREADS, BLOCKS)
    persistent_layers(Bufs b, unsigned long long* count, int l0, int l1, int slot, int mode,
                      int ring_bytes, int* claims) {
    // shared memory: the ring's barriers, a reduction's partials and the row sums (HEAD
    // bytes), then the ring, then the staged input (MAXI floats, left out when not staged)
    extern __shared__ __align__(128) char smem[];
    const int slots = ring_bytes / slot;
    uint64_t* full = reinterpret_cast<uint64_t*>(smem);
    uint64_t* empty = full + slots;
    float* red = reinterpret_cast<float*>(smem + 2 * MAX_SLOTS * 8);  // [8]
    float* acc = red + 8;                                            // [2][MAXROWS]
    char* ring = smem + HEAD;
    float* xs = reinterpret_cast<float*>(ring + ring_bytes);
    __shared__ int tag[MAX_SLOTS];  // CLAIM: the tile a slot holds, -1 for a product's end
    const int G = gridDim.x, blk = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < slots; ++s) {
            mbar_init(full + s, mode & LANE_COPIES ? 32 : 1);
            mbar_init(empty + s, CONSUMERS / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    for (int i = threadIdx.x; i < 2 * MAXROWS; i += THREADS) acc[i] = 0.f;
    __syncthreads();

    if (warp == CONSUMERS / 32 && (mode & CLAIM)) {  // the producer, tiles claimed
        if (lane == 0) {
            uint32_t it = 0;
            for (int l = l0; l < l1; ++l)
                for (int ph = 0; ph < PHASES; ++ph) {
                    const Product pr = product(l, ph);
                    const Walk wk(pr, 0, 1, slot);  // the whole matrix
                    const int tiles = wk.tiles(), per_mat = tiles * wk.segs;
                    for (;; ++it) {
                        const int s = it % slots;
                        const int c = atomicAdd(claims + l * PHASES + ph, 1);
                        mbar_wait(empty + s, ((it / slots) & 1) ^ 1);
                        if (c >= per_mat * pr.mats) {
                            tag[s] = -1;
                            mbar_arrive(full + s);
                            ++it;
                            break;
                        }
                        const int m = c / per_mat, t = (c % per_mat) / wk.segs, sg = c % wk.segs;
                        const int rr = min(wk.R, pr.n - t * wk.R);
                        const uint32_t seg_bytes = wk.S * 2;
                        const char* src = reinterpret_cast<const char*>(
                            pr.w[m] + ((long long)(t * wk.R)) * pr.k + sg * wk.S);
                        char* dst = ring + (size_t)s * slot;
                        tag[s] = c;
                        bulk_load_rows(dst, wk.pitch(), src, (long long)pr.k * 2, rr, seg_bytes,
                                       full + s);
                    }
                }
        }
        return;
    }
    if (mode & CLAIM) {  // the consumers, timing only (no arithmetic, nothing staged)
        uint32_t it = 0;
        for (int l = l0; l < l1; ++l)
            for (int ph = 0; ph < PHASES; ++ph) {
                for (;; ++it) {
                    const int s = it % slots;
                    mbar_wait(full + s, (it / slots) & 1);
                    const int c = tag[s];
                    __syncwarp();
                    if (lane == 0) mbar_arrive(empty + s);
                    if (c < 0) {
                        ++it;
                        break;
                    }
                }
                const bool last = l == l1 - 1 && ph == PHASES - 1;
                if (!last && !(mode & SKIP_GRID)) grid_sync(count);
            }
        return;
    }
    if (warp == CONSUMERS / 32) {  // the producer
        if (lane == 0 || (mode & LANE_COPIES)) {
            uint32_t it = 0;
            for (int l = l0; l < l1; ++l)
                for (int ph = 0; ph < PHASES; ++ph) {
                    const Product pr = product(l, ph);
                    const Walk wk(pr, blk, G, slot);
                    for (int m = 0; m < pr.mats; ++m)
                        for (int t = 0; t < wk.tiles(); ++t)
                            for (int sg = 0; sg < wk.segs; ++sg, ++it) {
                                const int s = it % slots;
                                const int rr = min(wk.R, wk.rows - t * wk.R);
                                const uint32_t seg_bytes = wk.S * 2;
                                const char* src = reinterpret_cast<const char*>(
                                    pr.w[m] + ((long long)(wk.r0 + t * wk.R)) * pr.k + sg * wk.S);
                                char* dst = ring + (size_t)s * slot;
                                mbar_wait(empty + s, ((it / slots) & 1) ^ 1);
                                if (mode & LANE_COPIES) {
                                    const int per_row = wk.S / 8;
                                    for (int c = lane; c < rr * per_row; c += 32) {
                                        const int r = c / per_row, o = (c - r * per_row) * 16;
                                        asm volatile(
                                            "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                                                smem_addr(dst + r * wk.pitch() + o)),
                                            "l"(src + (long long)r * pr.k * 2 + o)
                                            : "memory");
                                    }
                                    asm volatile(
                                        "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(
                                            smem_addr(full + s))
                                        : "memory");
                                } else {
                                    bulk_load_rows(dst, wk.pitch(), src, (long long)pr.k * 2, rr,
                                                   seg_bytes, full + s);
                                }
                            }
                }
        }
        return;
    }

    uint32_t it = 0;
    for (int l = l0; l < l1; ++l) {
        const Layer& y = c_layers[l];
        const float* h = b.hb + (3 * l) * H;
        for (int ph = 0; ph < PHASES; ++ph) {
            // this product's input, into xs
            switch (mode & SKIP_STAGE ? -1 : ph) {
                case -1:
                    break;
                case 0:
                    if (l == 0)
                        step_add_scale_norm(nullptr, h, nullptr, xs, b.w4, b.w5, 1.f, false, red);
                    else
                        step_add_scale_norm(b.q, h - H, const_cast<float*>(h), xs, b.w4, b.w5,
                                            c_layers[l - 1].scale, blk == 0, red);
                    break;
                case 1:
                    for (int i = threadIdx.x; i < ATT; i += CONSUMERS) xs[i] = 0.5f * ldcg(b.qkv + i);
                    break;
                case 2:
                    step_add_norm(b.o, h, b.hb + (3 * l + 1) * H, xs, b.w1, b.w2, blk == 0, red);
                    break;
                case 3:
                    for (int i = threadIdx.x; i < y.inter; i += CONSUMERS) xs[i] = ldcg(b.g + i);
                    break;
                case 4:
                    step_then_add(b.d, b.hb + (3 * l + 1) * H, b.hb + (3 * l + 2) * H, xs, b.w3,
                                  blk == 0, red);
                    break;
                default:
                    for (int i = threadIdx.x; i < PLE; i += CONSUMERS) xs[i] = ldcg(b.p + i);
            }
            csync();
            const Product pr = product(l, ph);
            const Walk wk(pr, blk, G, slot);
            // thread t takes row t % 16 of each tile and the (t / 16)-th sixteenth of its
            // columns, adds over the tile's segments in a register, and adds that to the
            // row's sum in shared memory once a tile: no reduction across lanes
            const int tr = threadIdx.x % 16, chunk = wk.S / 16, c0 = (threadIdx.x / 16) * chunk;
            for (int m = 0; m < pr.mats; ++m) {
                float* am = acc + m * MAXROWS;
                for (int t = 0; t < wk.tiles(); ++t) {
                    const int rr = min(wk.R, wk.rows - t * wk.R);
                    float sum = 0.f;
                    for (int sg = 0; sg < wk.segs; ++sg, ++it) {
                        const int s = it % slots;
                        mbar_wait(full + s, (it / slots) & 1);
                        if (tr < rr && !(mode & SKIP_MATH)) {
                            const char* wrow = ring + (size_t)s * slot + tr * wk.pitch() + c0 * 2;
                            const float* xr = xs + sg * wk.S + c0;
                            for (int j = 0; j < chunk; j += 8) {
                                const uint4 wv = *reinterpret_cast<const uint4*>(wrow + j * 2);
                                const float4 xa = *reinterpret_cast<const float4*>(xr + j);
                                const float4 xb = *reinterpret_cast<const float4*>(xr + j + 4);
                                sum += dot8(wv, xa, xb);
                            }
                        }
                        __syncwarp();
                        if (lane == 0) mbar_arrive(empty + s);
                    }
                    if (tr < rr) atomicAdd(am + t * wk.R + tr, sum);
                }
            }
            csync();
            float* out = ph == 0 ? b.qkv : ph == 1 ? b.o : ph == 2 ? b.g : ph == 3 ? b.d
                       : ph == 4 ? b.p : b.q;
            for (int r = threadIdx.x; r < wk.rows; r += CONSUMERS) {
                const float a = acc[r], u = acc[MAXROWS + r];
                out[wk.r0 + r] =
                    ph == 2 ? gelu(a) * u : ph == 4 ? gelu(a) * y.slice[wk.r0 + r] : a;
                acc[r] = 0.f;
                acc[MAXROWS + r] = 0.f;
            }
            const bool last = l == l1 - 1 && ph == PHASES - 1;
            if (!last && !(mode & SKIP_GRID)) grid_sync(count);
        }
    }
}

// ---------------------------------------------------------------- the host

__global__ void fill_bf16(__nv_bfloat16* w, size_t n, float amp, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15;
        x *= 2246822519u;
        x ^= x >> 13;
        w[i] = __float2bfloat16(amp * ((x & 0xffffff) / 8388608.f - 1.f));
    }
}

__nv_bfloat16* weight(size_t rows, size_t k, uint32_t seed, size_t& total) {
    __nv_bfloat16* w;
    CHECK(cudaMalloc(&w, rows * k * 2));
    fill_bf16<<<1024, 256>>>(w, rows * k, std::sqrt(3.f / k), seed);
    total += rows * k * 2;
    return w;
}

float* vec(size_t n, float lo, float hi, uint32_t seed) {
    std::vector<float> h(n);
    uint32_t x = seed;
    for (auto& v : h) {
        x = x * 1664525u + 1013904223u;
        v = lo + (hi - lo) * (x >> 8) / 16777216.f;
    }
    float* d;
    CHECK(cudaMalloc(&d, n * 4));
    CHECK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
    return d;
}

struct Timing {
    float best, median;
};

Timing time_graph(cudaGraphExec_t g, cudaStream_t s, int reps) {
    cudaEvent_t a, z;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&z));
    for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(g, s));
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaGraphLaunch(g, s));
        CHECK(cudaEventRecord(z, s));
        CHECK(cudaEventSynchronize(z));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, z));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return {t[0], t[t.size() / 2]};
}

int main() {
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    size_t total = 0;
    std::vector<Layer> L(LAYERS);
    for (int l = 0; l < LAYERS; ++l) {
        Layer& y = L[l];
        const bool owner = l < OWNERS;
        y.n_qkv = owner ? ATT + 2 * 256 : ATT;
        y.inter = owner ? 6144 : 12288;
        const uint32_t s = 1000u * (l + 1);
        y.w[0] = weight(y.n_qkv, H, s + 1, total);
        y.w[1] = weight(H, ATT, s + 2, total);
        y.w[2] = weight(y.inter, H, s + 3, total);
        y.w[3] = weight(y.inter, H, s + 4, total);
        y.w[4] = weight(H, y.inter, s + 5, total);
        y.w[5] = weight(PLE, H, s + 6, total);
        y.w[6] = weight(H, PLE, s + 7, total);
        y.slice = vec(PLE, -1.f, 1.f, s + 8);
        y.scale = 0.5f + 0.01f * l;
    }
    CHECK(cudaMemcpyToSymbol(c_layers, L.data(), sizeof(Layer) * LAYERS));
    Bufs b{};
    b.hb = vec((3 * LAYERS + 1) * H, -1.f, 1.f, 7);
    CHECK(cudaMalloc(&b.xn, MAXI * 4));
    CHECK(cudaMalloc(&b.qkv, MAXI * 4));
    CHECK(cudaMalloc(&b.att, MAXI * 4));
    CHECK(cudaMalloc(&b.o, MAXI * 4));
    CHECK(cudaMalloc(&b.g, MAXI * 4));
    CHECK(cudaMalloc(&b.d, MAXI * 4));
    CHECK(cudaMalloc(&b.p, MAXI * 4));
    CHECK(cudaMalloc(&b.q, MAXI * 4));
    b.w1 = vec(H, 0.5f, 1.5f, 11);
    b.w2 = vec(H, 0.5f, 1.5f, 12);
    b.w3 = vec(H, 0.5f, 1.5f, 13);
    b.w4 = vec(H, 0.5f, 1.5f, 14);
    b.w5 = vec(H, 0.5f, 1.5f, 15);
    unsigned long long* count;
    CHECK(cudaMalloc(&count, 8));
    CHECK(cudaMemset(count, 0, 8));
    CHECK(cudaDeviceSynchronize());

    // 227 KB is what one block may have on sm_90; the static `tag` array takes from it
    const size_t smem_max = 232448 - 1024;
    CHECK(cudaFuncSetAttribute(persistent_layers, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)smem_max));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // LS_COOP=0: a plain launch (one block a multiprocessor is resident anyway when the
    // GPU is otherwise idle), for drivers that refuse cooperative launches in a capture.
    const bool coop = !(std::getenv("LS_COOP") && std::getenv("LS_COOP")[0] == '0');
    int* claims;
    CHECK(cudaMalloc(&claims, LAYERS * PHASES * 4));
    auto launch = [&](int l0, int l1, int slot, int mode, int ring = RING) {
        if (mode & CLAIM) CHECK(cudaMemsetAsync(claims, 0, LAYERS * PHASES * 4, s));
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(sms * BLOCKS);
        cfg.blockDim = dim3(THREADS);
        const bool no_input = (mode & SKIP_STAGE) && (mode & SKIP_MATH);
        cfg.dynamicSmemBytes = HEAD + ring + (no_input ? 0 : MAXI * 4);
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
        cfg.attrs = attr;
        cfg.numAttrs = coop ? 1 : 0;
        CHECK(cudaLaunchKernelEx(&cfg, persistent_layers, b, count, l0, l1, slot, mode, ring,
                                     claims));
    };
    auto capture = [&](auto body) {
        cudaGraph_t g;
        cudaGraphExec_t e;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        body();
        CHECK(cudaStreamEndCapture(s, &g));
        CHECK(cudaGraphInstantiate(&e, g, 0));
        return e;
    };
    // LS_PROFILE=<mode bits>: two plain launches of the model kernel with those bits and
    // nothing else, for a profiler (ncu -k persistent_layers --launch-skip 1 ...)
    if (const char* pm = std::getenv("LS_PROFILE")) {
        for (int i = 0; i < 2; ++i) launch(0, LAYERS, SLOT, std::atoi(pm));
        CHECK(cudaStreamSynchronize(s));
        return 0;
    }
    std::vector<float> ref(H), out(H);
    // the last residual both forms write (the persistent kernel ends at the last projection)
    const float* last = b.hb + (3 * LAYERS - 1) * H;
    std::printf("E2B-shaped layers without attention, one token, %d SMs: %.3f GB of weights, "
                "%d B shared memory a persistent block (%d KB of ring)\n",
                sms, total / 1e9, HEAD + RING + MAXI * 4, RING / 1024);
    std::printf("%-34s %9s %9s %8s %12s\n", "variant", "best ms", "median", "TB/s", "max |d|/max");
    auto report = [&](const char* name, cudaGraphExec_t e, bool is_ref) {
        const Timing t = time_graph(e, s, 20);
        CHECK(cudaMemcpy(is_ref ? ref.data() : out.data(), last, H * 4, cudaMemcpyDeviceToHost));
        float dmax = 0.f, rmax = 0.f;
        for (int i = 0; i < H; ++i) {
            dmax = std::max(dmax, std::fabs(out[i] - ref[i]));
            rmax = std::max(rmax, std::fabs(ref[i]));
        }
        std::printf("%-34s %9.3f %9.3f %8.2f %12.2e\n", name, t.best, t.median,
                    total / (t.best * 1e-3) / 1e12, is_ref ? 0.f : dmax / rmax);
    };
    for (int round = 0; round < 2; ++round) {
        report("chain (10 launches a layer)", capture([&] { chain_step(s, L, b); }), true);
        for (int slot : {SLOT, 16384}) {
            char name[64];
            std::snprintf(name, sizeof name, "layer (a launch a layer), slot %dK", slot / 1024);
            report(name, capture([&] {
                       for (int l = 0; l < LAYERS; ++l) launch(l, l + 1, slot, 0);
                   }),
                   false);
            std::snprintf(name, sizeof name, "model (one launch), slot %dK", slot / 1024);
            report(name, capture([&] { launch(0, LAYERS, slot, 0); }), false);
        }
        if (round) break;
        // taken apart (model, slot 32K); the last column is meaningless past the first row
        const struct {
            const char* name;
            int mode;
        } parts[] = {{"  lane cp.async producer", LANE_COPIES},
                     {"  no grid barriers", SKIP_GRID},
                     {"  no staging", SKIP_STAGE},
                     {"  no arithmetic", SKIP_MATH},
                     {"  stream + barriers only", SKIP_MATH | SKIP_STAGE},
                     {"  stream only", SKIP_MATH | SKIP_STAGE | SKIP_GRID},
                     {"  stream only, lane cp.async", SKIP_MATH | SKIP_STAGE | SKIP_GRID | LANE_COPIES},
                     {"  arithmetic, no barriers/staging", SKIP_STAGE | SKIP_GRID}};
        for (const auto& pt : parts)
            report(pt.name, capture([&] { launch(0, LAYERS, SLOT, pt.mode); }), false);
        // how much of the barriers' cost a deeper or shallower ring hides (nothing staged or read,
        // so the input's 48 KB can hold ring)
        report("  stream + barriers, tiles claimed",
               capture([&] { launch(0, LAYERS, SLOT, SKIP_MATH | SKIP_STAGE | CLAIM); }), false);
        report("  stream only, tiles claimed",
               capture([&] {
                   launch(0, LAYERS, SLOT, SKIP_MATH | SKIP_STAGE | SKIP_GRID | CLAIM);
               }),
               false);
        if (BLOCKS == 1) {  // rings past what two blocks a multiprocessor can have
            report("  stream + barriers, tiles claimed, 224 KB",
                   capture([&] { launch(0, LAYERS, SLOT, SKIP_MATH | SKIP_STAGE | CLAIM, 224 * 1024); }),
                   false);
            for (int kb : {64, 128, 224}) {
                char name[64];
                std::snprintf(name, sizeof name, "  stream + barriers, ring %d KB", kb);
                report(name, capture([&] {
                           launch(0, LAYERS, SLOT, SKIP_MATH | SKIP_STAGE, kb * 1024);
                       }),
                       false);
                std::snprintf(name, sizeof name, "  stream only, ring %d KB", kb);
                report(name, capture([&] {
                           launch(0, LAYERS, SLOT, SKIP_MATH | SKIP_STAGE | SKIP_GRID, kb * 1024);
                       }),
                       false);
            }
        }
    }
    return 0;
}
