// How fast blocks shaped like the 128-token tile of kernels/skinny_gemm.cu read a weight
// matrix, without the tile's arithmetic: each block takes 128 weight rows (one tile, no k
// split) through a ring of cp.async stages with a block barrier a stage, as the tile does,
// and the patterns differ only in where a stage's bytes lie:
//   rows     - the row-major weight: 128 bytes (64 bf16) from each of 128 rows, rows k x 2
//              bytes apart (the layout the tile reads today);
//   tiled    - the same stage stored as one contiguous 16 KB (a tile-major layout);
//   rows256  - 256 bytes from each row a stage (twice the k a stage);
// each with the 128 token rows of the stage (read from L2, as the tile does) or without.
// The reference is cudaMemcpyAsync of the same bytes. L2 is overwritten before each timed
// launch, so the weights come from DRAM.
//
// Standalone (nvcc, not the engine's NVRTC): on a GPU machine,
//   nvcc -O3 -std=c++17 -arch=sm_90 scripts/bench/weight_stream.cu -o /tmp/weight_stream
//   /tmp/weight_stream
// prints GB/s of weight bytes for each pattern on the gated products' shapes of Gemma-4
// E2B and E4B (gate and up stacked as one matrix).

#include <cstdio>
#include <initializer_list>
#include <cuda_runtime.h>

#define CHECK(x)                                                                         \
    do {                                                                                 \
        cudaError_t e = (x);                                                             \
        if (e != cudaSuccess) {                                                          \
            std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));       \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

__device__ __forceinline__ void copy16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                     (unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src));
}

template <int N>
__device__ __forceinline__ void wait_groups() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// One block a tile of 128 rows; ROW bytes of each row a stage; TILED: a stage's 128 x ROW
// bytes contiguous; X: the stage's 128 token rows too (from `x`, 128 rows of k_bytes).
// gridDim.y splits k: block (tile, part) takes part y of the tile's stages.
template <int STAGES, int ROW, bool TILED, bool X>
__global__ void __launch_bounds__(256, 2)
    stream_tiles(const char* w, const char* x, long long k_bytes, float* sink) {
    extern __shared__ __align__(16) char smem[];
    constexpr int WB = 128 * ROW, SB = WB * (X ? 2 : 1), PIECES = ROW / 16;
    const int all = (int)(k_bytes / ROW);
    const int first = blockIdx.y * all / gridDim.y;
    const int stages = (blockIdx.y + 1) * all / gridDim.y - first;
    const long long tile = blockIdx.x;
    auto load = [&](int s, int buf) {
        char* dst = smem + buf * SB;
        for (int c = threadIdx.x; c < WB / 16; c += 256) {
            const int row = c / PIECES, piece = c % PIECES;
            const char* src = TILED ? w + (tile * all + first + s) * WB + c * 16
                                    : w + (tile * 128 + row) * k_bytes + (first + s) * ROW +
                                          piece * 16;
            copy16(dst + c * 16, src);
            if (X) copy16(dst + WB + c * 16, x + row * k_bytes + (first + s) * ROW + piece * 16);
        }
    };
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < stages) load(i, i);
        asm volatile("cp.async.commit_group;\n");
    }
    for (int i = 0; i < stages; ++i) {
        wait_groups<STAGES - 2>();
        __syncthreads();
        if (i + STAGES - 1 < stages) load(i + STAGES - 1, (i + STAGES - 1) % STAGES);
        asm volatile("cp.async.commit_group;\n");
        // Use the stage (one value a thread), as the tile's multiply does before the next
        // barrier lets its buffer be refilled.
        acc += reinterpret_cast<const float*>(smem + (i % STAGES) * SB)[threadIdx.x];
    }
    wait_groups<0>();
    if (acc == 1234.5f) sink[0] = acc;
}

struct Shape {
    const char* name;
    long long rows, k;
};

// A plain streaming read: 16-byte loads, four in flight a thread, a grid-stride loop.
__global__ void __launch_bounds__(256) read_all(const uint4* w, long long n, float* sink) {
    unsigned acc = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = __ldcs(w + i + u * stride);
#pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].w;
    }
    for (; i < n; i += stride) acc ^= __ldcs(w + i).y;
    if (acc == 12345u) sink[0] = (float)acc;
}

// GB/s of `bytes` for the best of 10 timed runs of `launch` (after two untimed ones), each
// after L2 is overwritten by a memset of `flush`.
template <class Launch>
float best_gbps(size_t bytes, char* flush, size_t flush_bytes, Launch launch) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float best = 1e30f;
    for (int it = 0; it < 12; ++it) {
        cudaMemsetAsync(flush, it, flush_bytes);
        cudaEventRecord(a);
        launch();
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        if (it > 1 && ms < best) best = ms;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return (float)bytes / (best * 1e-3f) / 1e9f;
}

template <int STAGES, int ROW, bool TILED, bool X>
float time_pattern(const Shape& s, const char* w, const char* x, float* sink, char* flush,
                   size_t flush_bytes, int split = 1) {
    constexpr int SMEM = STAGES * 128 * ROW * (X ? 2 : 1);
    cudaFuncSetAttribute(stream_tiles<STAGES, ROW, TILED, X>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    return best_gbps((size_t)s.rows * s.k * 2, flush, flush_bytes, [&] {
        stream_tiles<STAGES, ROW, TILED, X>
            <<<dim3((unsigned)(s.rows / 128), split), 256, SMEM>>>(w, x, s.k * 2, sink);
    });
}

int main() {
    const Shape shapes[] = {
        {"E2B gate+up (2 x 6144 x 1536)", 12288, 1536},
        {"E2B double-wide gate+up (2 x 12288 x 1536)", 24576, 1536},
        {"E4B gate+up (2 x 10240 x 2560)", 20480, 2560},
    };
    const size_t max_bytes = 24576ull * 1536 * 2 > 20480ull * 2560 * 2 ? 24576ull * 1536 * 2
                                                                        : 20480ull * 2560 * 2;
    const size_t flush_bytes = 256ull << 20;
    char *w, *w2, *x, *flush;
    float* sink;
    CHECK(cudaMalloc(&w, max_bytes));
    CHECK(cudaMalloc(&w2, max_bytes));
    CHECK(cudaMalloc(&x, 128ull * 2560 * 2));
    CHECK(cudaMalloc(&flush, flush_bytes));
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMemset(w, 1, max_bytes));
    CHECK(cudaMemset(x, 1, 128ull * 2560 * 2));
    int dev;
    cudaDeviceProp prop;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("%s, %d multiprocessors; GB/s of weight bytes (best of 10)\n", prop.name,
                prop.multiProcessorCount);
    for (const Shape& s : shapes) {
        const size_t bytes = (size_t)s.rows * s.k * 2;
        std::printf("%s, %.1f MB, %lld blocks\n", s.name, bytes / 1e6, s.rows / 128);
        std::printf("  copy (reads and writes it)       %7.0f\n",
                    best_gbps(bytes, flush, flush_bytes, [&] {
                        cudaMemcpyAsync(w2, w, bytes, cudaMemcpyDeviceToDevice);
                    }));
        std::printf("  rows, tokens too, 3 stages       %7.0f\n",
                    time_pattern<3, 128, false, true>(s, w, x, sink, flush, flush_bytes));
        std::printf("  tiled, tokens too, 3 stages      %7.0f\n",
                    time_pattern<3, 128, true, true>(s, w, x, sink, flush, flush_bytes));
        std::printf("  rows, weights only, 6 stages     %7.0f\n",
                    time_pattern<6, 128, false, false>(s, w, x, sink, flush, flush_bytes));
        std::printf("  tiled, weights only, 6 stages    %7.0f\n",
                    time_pattern<6, 128, true, false>(s, w, x, sink, flush, flush_bytes));
        std::printf("  rows256, weights only, 3 stages  %7.0f\n",
                    time_pattern<3, 256, false, false>(s, w, x, sink, flush, flush_bytes));
        std::printf("  rows, tokens too, k split 2      %7.0f\n",
                    time_pattern<3, 128, false, true>(s, w, x, sink, flush, flush_bytes, 2));
        std::printf("  rows, weights only, 6, split 2   %7.0f\n",
                    time_pattern<6, 128, false, false>(s, w, x, sink, flush, flush_bytes, 2));
        std::printf("  rows, weights only, 6, split 4   %7.0f\n",
                    time_pattern<6, 128, false, false>(s, w, x, sink, flush, flush_bytes, 4));
        for (int blocks : {264, 528, 1056, 4224})
            std::printf("  plain read, %4d blocks          %7.0f\n", blocks,
                        best_gbps(bytes, flush, flush_bytes, [&] {
                            read_all<<<blocks, 256>>>(reinterpret_cast<const uint4*>(w),
                                                      (long long)(bytes / 16), sink);
                        }));
    }
    CHECK(cudaGetLastError());
    return 0;
}
