// Whether a persistent kernel whose warps read the weights straight from global memory, as
// the chain's GEMVs do, beats the chain of launches at one token (Gemma-4 E2B's shapes
// without attention, bf16 weights, f32 activations; the same layers as layer_stream.cu).
//
// layer_stream.cu's persistent kernel fed eight consumer warps a block from a producer
// thread's bulk copies, and the consumers could not keep up. Here every warp of one large
// block a multiprocessor is a GEMV warp: an item is one row (gate and up: one row of each)
// over one k segment, a lane holds its up to eight 16-byte pieces of it in registers, and
// the block's staged input sits in shared memory. Products meet at a grid-wide barrier as
// in layer_stream.cu, with one difference: before it, each warp already issues the loads
// of its first item of the next product (the weights do not depend on the activations),
// so memory keeps streaming while the grid waits and each block stages its next input (the
// residual steps recomputed by every block from the rows in L2, as in layer_stream.cu).
// The down projection's k is cut into segments of 2048 and o's into two; each segment's
// partial rows go to a buffer of their own and the residual step after them adds them in
// segment order, so the results do not depend on timing.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 scripts/bench/layer_direct.cu -o /tmp/layer_direct
//   /tmp/layer_direct
// prints ms a step for the chain and for the kernel with each `mode` (best and median of
// 20 graph replays), their weight bytes per second and how far the last residual lies from
// the chain's. Build switches: -DLD_THREADS (threads of the block, 512 by default) and
// -DLD_BLOCKS (blocks a multiprocessor, 1 by default).

#include "layer_common.cuh"

#ifndef LD_THREADS
#define LD_THREADS 512
#endif
#ifndef LD_BLOCKS
#define LD_BLOCKS 1
#endif
constexpr int DT = LD_THREADS, DW = DT / 32, DBLK = LD_BLOCKS;
#ifndef LD_SEG
#define LD_SEG 1536
#endif
constexpr int SEG = LD_SEG;            // the down projection's k segments
constexpr int O_SEGS = 2;              // o's k segments (1024 each)
constexpr int MAX_SEGS = MAXI / SEG;   // down segments at most
constexpr int NL = SEG / 256;          // a lane's 16-byte pieces of an item at most
constexpr int NU = 6;                  // the same of the up row (k = 1536)
constexpr int NV = (H + DT - 1) / DT;  // a thread's values of a residual row

// `mode` bits, to take the kernel apart (the results are then wrong; the timing is what is
// asked): 1 no grid barriers; 2 no loads issued before a barrier (a warp's first item is
// loaded after the input is staged, as a launch would).
enum { NO_GRID = 1, NO_PREFETCH = 2 };

__device__ float dsum(float v, float* red) {
    const int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < DW; ++i) s += red[i];
    __syncthreads();
    return s;
}

// The grid-wide barrier for the whole block.
__device__ void dgrid_sync(unsigned long long* count) {
    __syncthreads();
    if (threadIdx.x == 0) grid_arrive_wait(count);
    __syncthreads();
}

struct DProd {
    const __nv_bfloat16 *w, *u;  // u: the up rows of the gated product
    int n, k, segs;
};

__device__ DProd dprod(int l, int ph) {
    const Layer& y = c_layers[l];
    switch (ph) {
        case 0: return {y.w[0], nullptr, y.n_qkv, H, 1};
        case 1: return {y.w[1], nullptr, H, ATT, O_SEGS};
        case 2: return {y.w[2], y.w[3], y.inter, H, 1};
        case 3: return {y.w[4], nullptr, H, y.inter, y.inter / SEG};
        case 4: return {y.w[5], nullptr, PLE, H, 1};
        default: return {y.w[6], nullptr, H, PLE, 1};
    }
}

// The rows block `blk` of G takes: blocks are dealt round the k segments (block b takes
// segment b % segs, so it stages one segment's input), and a segment's warps take its rows
// in turn.
struct DWalk {
    int seg, row0, stride, kl, pieces;  // pieces: a lane's 16-byte pieces of a row segment
    __device__ DWalk(const DProd& p, int blk, int G, int warp) {
        seg = blk % p.segs;
        row0 = (blk / p.segs) * DW + warp;
        stride = (G - seg + p.segs - 1) / p.segs * DW;
        kl = p.k / p.segs;
        pieces = kl / 256;
    }
};

__device__ __forceinline__ void load_item(const DProd& p, const DWalk& wk, int row, int lane,
                                          uint4 (&w)[NL], uint4 (&u)[NU]) {
    const uint4* wr =
        reinterpret_cast<const uint4*>(p.w + (size_t)row * p.k + (size_t)wk.seg * wk.kl) + lane;
#pragma unroll
    for (int i = 0; i < NL; ++i)
        if (i < wk.pieces) w[i] = ld_stream(wr + 32 * i);
    if (p.u) {
        const uint4* ur = reinterpret_cast<const uint4*>(p.u + (size_t)row * p.k) + lane;
#pragma unroll
        for (int i = 0; i < NU; ++i)
            if (i < wk.pieces) u[i] = ld_stream(ur + 32 * i);
    }
}

template <int N>
__device__ __forceinline__ float dot_item(const uint4 (&w)[N], const float* xs, int pieces,
                                          int lane) {
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i)
        if (i < pieces) {
            const int c = lane + 32 * i;
            s += dot8(w[i], x4[2 * c], x4[2 * c + 1]);
        }
    return s;
}

// A thread's values of row `a` (the sum of `parts` rows H apart; zeros where `a` is null)
// and of row `b`, through L2; returns the sum of a's squares over them.
__device__ float dload(const float* a, int parts, const float* b, float (&av)[NV],
                       float (&bv)[NV]) {
    float ss = 0.f;
    for (int j = 0; j < NV; ++j) {
        const int i = threadIdx.x + DT * j;
        av[j] = bv[j] = 0.f;
        if (i >= H) continue;
        if (a)
            for (int s = 0; s < parts; ++s) av[j] += ldcg(a + s * H + i);
        bv[j] = ldcg(b + i);
        ss += av[j] * av[j];
    }
    return ss;
}

// The input of product `ph` of layer l (segment `seg` of `kl` values) into `xs`, with the
// residual step before it where there is one (block 0 stores the new residual row).
__device__ void stage(const Bufs& b, int l, int ph, int seg, int kl, float* xs, float* red,
                      const float* opart, const float* dpart, bool store) {
    __syncthreads();  // every warp is done with the last input
    const int t = threadIdx.x;
    float av[NV], hv[NV];
    if (ph == 0) {
        // h3 = (h2 + norm(q) w4) scale of the layer before; x = norm(h3) w5
        const float* h2 = l ? b.hb + (3 * (l - 1) + 2) * H : b.hb;
        const float ss = dload(l ? b.q : nullptr, 1, h2, av, hv);
        if (l) {
            const float r = rsqrtf(dsum(ss, red) / H + EPS), s = c_layers[l - 1].scale;
            for (int j = 0; j < NV; ++j) {
                const int i = t + DT * j;
                if (i < H) hv[j] = (hv[j] + av[j] * r * b.w4[i]) * s;
            }
        }
        float s2 = 0.f;
        for (int j = 0; j < NV; ++j) s2 += hv[j] * hv[j];
        const float r2 = rsqrtf(dsum(s2, red) / H + EPS);
        for (int j = 0; j < NV; ++j) {
            const int i = t + DT * j;
            if (i >= H) continue;
            if (store && l) b.hb[3 * l * H + i] = hv[j];
            xs[i] = hv[j] * r2 * b.w5[i];
        }
    } else if (ph == 2 || ph == 4) {
        // 2: h1 = h + norm(o) w1, x = norm(h1) w2; 4: h2 = h1 + norm(d) w3, x = h2
        const float* h = b.hb + (3 * l + (ph == 2 ? 0 : 1)) * H;
        const float* part = ph == 2 ? opart : dpart;
        const int parts = ph == 2 ? O_SEGS : c_layers[l].inter / SEG;
        const float r = rsqrtf(dsum(dload(part, parts, h, av, hv), red) / H + EPS);
        const float* w = ph == 2 ? b.w1 : b.w3;
        float s2 = 0.f;
        for (int j = 0; j < NV; ++j) {
            const int i = t + DT * j;
            if (i < H) hv[j] += av[j] * r * w[i];
            s2 += hv[j] * hv[j];
        }
        const float r2 = ph == 2 ? rsqrtf(dsum(s2, red) / H + EPS) : 1.f;
        for (int j = 0; j < NV; ++j) {
            const int i = t + DT * j;
            if (i >= H) continue;
            if (store) b.hb[(3 * l + (ph == 2 ? 1 : 2)) * H + i] = hv[j];
            xs[i] = ph == 2 ? hv[j] * r2 * b.w2[i] : hv[j];
        }
    } else {
        // 1: the attention stand-in's output (half the first 2048 of q / k / v); 3: the
        // gated product's segment; 5: the per-layer-input gate's 256
        const float* src = ph == 1 ? b.qkv : ph == 3 ? b.g : b.p;
        const float f = ph == 1 ? 0.5f : 1.f;
        for (int i = t; i < kl; i += DT) xs[i] = f * ldcg(src + seg * kl + i);
    }
    __syncthreads();
}

__global__ void __launch_bounds__(DT, DBLK)
    persistent_direct(Bufs b, unsigned long long* count, float* opart, float* dpart, int mode) {
    __shared__ __align__(16) float xs[SEG];
    __shared__ float red[DW];
    const int G = gridDim.x, blk = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool prefetch = !(mode & NO_PREFETCH);
    uint4 w[NL], u[NU];
    bool have = false;  // w / u hold the warp's first item of the product
    {
        const DProd p = dprod(0, 0);
        const DWalk wk(p, blk, G, warp);
        if (prefetch && wk.row0 < p.n) {
            load_item(p, wk, wk.row0, lane, w, u);
            have = true;
        }
    }
    for (int l = 0; l < LAYERS; ++l)
        for (int ph = 0; ph < PHASES; ++ph) {
            const DProd p = dprod(l, ph);
            const DWalk wk(p, blk, G, warp);
            stage(b, l, ph, wk.seg, wk.kl, xs, red, opart, dpart, blk == 0);
            for (int r = wk.row0; r < p.n; r += wk.stride) {
                if (!have) load_item(p, wk, r, lane, w, u);
                have = false;
                const float a = warp_sum(dot_item(w, xs, wk.pieces, lane));
                const float c = p.u ? warp_sum(dot_item(u, xs, wk.pieces, lane)) : 0.f;
                if (lane) continue;
                switch (ph) {
                    case 0: b.qkv[r] = a; break;
                    case 1: opart[wk.seg * H + r] = a; break;
                    case 2: b.g[r] = gelu(a) * c; break;
                    case 3: dpart[wk.seg * H + r] = a; break;
                    case 4: b.p[r] = gelu(a) * c_layers[l].slice[r]; break;
                    default: b.q[r] = a;
                }
            }
            if (l == LAYERS - 1 && ph == PHASES - 1) break;
            // the next product's first item: its weights need not wait for the barrier
            const int nl = ph == PHASES - 1 ? l + 1 : l, nph = (ph + 1) % PHASES;
            const DProd np = dprod(nl, nph);
            const DWalk nw(np, blk, G, warp);
            if (prefetch && nw.row0 < np.n) {
                load_item(np, nw, nw.row0, lane, w, u);
                have = true;
            }
            if (!(mode & NO_GRID)) dgrid_sync(count);
        }
}

int main() {
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    Model m = build_model();
    const Bufs& b = m.b;
    unsigned long long* count;
    CHECK(cudaMalloc(&count, 8));
    CHECK(cudaMemset(count, 0, 8));
    float *opart, *dpart;
    CHECK(cudaMalloc(&opart, O_SEGS * H * 4));
    CHECK(cudaMalloc(&dpart, MAX_SEGS * H * 4));
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, persistent_direct));
    int resident = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, persistent_direct, DT, 0));
    std::printf("E2B-shaped layers without attention, one token, %d SMs: %.3f GB of weights; "
                "%d blocks of %d threads a multiprocessor (%d resident), %d registers, %zu B "
                "local\n",
                sms, m.total / 1e9, DBLK, DT, resident, fa.numRegs, fa.localSizeBytes);
    if (resident < DBLK) {
        std::printf("the blocks do not fit a multiprocessor\n");
        return 1;
    }
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto launch = [&](int mode) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(sms * DBLK);
        cfg.blockDim = dim3(DT);
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        CHECK(cudaLaunchKernelEx(&cfg, persistent_direct, b, count, opart, dpart, mode));
    };
    auto capture = [&](auto body) { return capture_graph(s, body); };
    if (const char* pm = std::getenv("LD_PROFILE")) {  // for ncu: two launches, nothing else
        for (int i = 0; i < 2; ++i) launch(std::atoi(pm));
        CHECK(cudaStreamSynchronize(s));
        return 0;
    }
    const float* last = b.hb + (3 * LAYERS - 1) * H;
    Reporter report{s, last, m.total};
    report.header();
    const struct {
        const char* name;
        int mode;
    } variants[] = {{"direct (one launch)", 0},
                    {"  no loads before a barrier", NO_PREFETCH},
                    {"  no grid barriers", NO_GRID},
                    {"  neither", NO_GRID | NO_PREFETCH}};
    for (int round = 0; round < 2; ++round) {
        report("chain (10 launches a layer)", capture([&] { chain_step(s, m.L, b); }), true);
        for (const auto& v : variants) report(v.name, capture([&] { launch(v.mode); }), false);
    }
    return 0;
}
