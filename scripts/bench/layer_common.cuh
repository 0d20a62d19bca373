// Shared by layer_stream.cu and layer_direct.cu: E2B's decode chain at one token without
// attention (shapes, random weights, the residual steps) and that chain as launches in a
// CUDA graph, the reference both persistent kernels are timed and checked against.
#pragma once

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

// Thread 0's half of a grid-wide barrier on a counter that only grows: every barrier of
// every launch takes exactly gridDim.x arrivals, so old / grid names the barrier being
// waited for. The caller brackets it with its block's own barrier.
__device__ void grid_arrive_wait(unsigned long long* count) {
    __threadfence();
    const unsigned long long g = gridDim.x;
    const unsigned long long target = (atomicAdd(count, 1ull) / g + 1) * g;
    unsigned long long now;
    do {
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(count));
    } while (now < target);
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

// Records what `body` queues on `s` as a graph, instantiated.
template <class F>
cudaGraphExec_t capture_graph(cudaStream_t s, F body) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    body();
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&e, g, 0));
    return e;
}

// Times graphs (best and median of 20 replays) and prints a row each: the weight rate and
// how far the residual row `last` lies from the reference's (the row printed with `is_ref`).
struct Reporter {
    cudaStream_t s;
    const float* last;
    size_t total;
    std::vector<float> ref = std::vector<float>(H), out = std::vector<float>(H);

    void header() const {
        std::printf("%-34s %9s %9s %8s %12s\n", "variant", "best ms", "median", "TB/s",
                    "max |d|/max");
    }
    void operator()(const char* name, cudaGraphExec_t e, bool is_ref) {
        const Timing t = time_graph(e, s, 20);
        CHECK(cudaMemcpy(is_ref ? ref.data() : out.data(), last, H * 4, cudaMemcpyDeviceToHost));
        float dmax = 0.f, rmax = 0.f;
        for (int i = 0; i < H; ++i) {
            dmax = std::max(dmax, std::fabs(out[i] - ref[i]));
            rmax = std::max(rmax, std::fabs(ref[i]));
        }
        std::printf("%-34s %9.3f %9.3f %8.2f %12.2e\n", name, t.best, t.median,
                    total / (t.best * 1e-3) / 1e12, is_ref ? 0.f : dmax / rmax);
    }
};

// The 35 layers' random weights (uploaded to `c_layers` as well), the activation buffers
// and the norm weights; `total` gets the weight bytes.
struct Model {
    std::vector<Layer> L;
    Bufs b;
    size_t total;
};

inline Model build_model() {
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
    CHECK(cudaDeviceSynchronize());
    return {L, b, total};
}
