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

#include "layer_common.cuh"

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

// Grid-wide barrier among the consumer threads (the producer warp never joins).
__device__ void grid_sync(unsigned long long* count) {
    csync();
    if (threadIdx.x == 0) grid_arrive_wait(count);
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

int main() {
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    Model m = build_model();
    std::vector<Layer>& L = m.L;
    Bufs& b = m.b;
    const size_t total = m.total;
    unsigned long long* count;
    CHECK(cudaMalloc(&count, 8));
    CHECK(cudaMemset(count, 0, 8));

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
    auto capture = [&](auto body) { return capture_graph(s, body); };
    // LS_PROFILE=<mode bits>: two plain launches of the model kernel with those bits and
    // nothing else, for a profiler (ncu -k persistent_layers --launch-skip 1 ...)
    if (const char* pm = std::getenv("LS_PROFILE")) {
        for (int i = 0; i < 2; ++i) launch(0, LAYERS, SLOT, std::atoi(pm));
        CHECK(cudaStreamSynchronize(s));
        return 0;
    }
    // the last residual both forms write (the persistent kernel ends at the last projection)
    const float* last = b.hb + (3 * LAYERS - 1) * H;
    std::printf("E2B-shaped layers without attention, one token, %d SMs: %.3f GB of weights, "
                "%d B shared memory a persistent block (%d KB of ring)\n",
                sms, total / 1e9, HEAD + RING + MAXI * 4, RING / 1024);
    Reporter report{s, last, total};
    report.header();
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
