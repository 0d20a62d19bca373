// Whether a KV slab read by many layers stays in L2 between the layers' weight streams.
// Gemma-4's KV-shared layers all read the K/V of one earlier layer (E2B's sliding ones: 52 MB
// at 100 sequences of 512 keys); between two such reads a layer streams about 126 MB of
// weights through cuBLAS. Each simulated layer here reads the slab (one kernel, 16-byte
// loads) and then runs cuBLAS products of E2B's KV-shared layer shapes at 100 rows (q, o,
// gate and up as one, down); the slab read's time is compared across cache policies:
//   plain                     - ordinary loads;
//   evict_last F              - loads with an L2::evict_last policy on a fraction F of them;
//   plain + window persist    - the persisting L2 set-aside at its maximum and an access
//                               policy window over the slab on the stream around the read;
//   evict_last 1.0 + setaside - the hinted loads with the set-aside;
//   evict_first               - loads hinted to leave L2 first.
//
// Standalone (nvcc, not the engine's NVRTC): on a GPU machine,
//   nvcc -O3 -arch=sm_90 scripts/bench/l2_retention.cu -o /tmp/l2_retention -lcublas
//   for mb in 52 105 26; do /tmp/l2_retention $mb; done
// (52 MB: E2B's slab at 100 sequences; 105: E4B's; 26: half of E2B's).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); exit(1);} } while (0)

// mode 0 plain, 1 evict_last fractional(frac), 2 evict_first
__global__ void kv_read(const uint4* __restrict__ p, size_t n, int mode, float frac, unsigned* out) {
    unsigned acc = 0;
    unsigned long long pol = 0;
    if (mode == 1) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, %1;" : "=l"(pol) : "f"(frac));
    if (mode == 2) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned a, b, c, d;
        if (mode == 0) {
            uint4 v = p[i]; a = v.x; b = v.y; c = v.z; d = v.w;
        } else {
            asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                         : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p + i), "l"(pol));
        }
        acc ^= a ^ b ^ c ^ d;
    }
    if (acc == 0x12345678) out[0] = acc;
}

int main(int argc, char** argv) {
    cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0));
    printf("L2 %d MB, persistingL2CacheMaxSize %d MB, accessPolicyMaxWindowSize %d MB, SMs %d\n",
           pr.l2CacheSize >> 20, pr.persistingL2CacheMaxSize >> 20, pr.accessPolicyMaxWindowSize >> 20, pr.multiProcessorCount);
    size_t kv_mb = argc > 1 ? atoi(argv[1]) : 52;
    int rows = 100, layers = 16;
    size_t kv_bytes = kv_mb << 20;
    // per layer: q 1536->2048, o 2048->1536, gate/up 1536->24576, down 12288->1536
    int shapes[4][2] = {{1536, 2048}, {2048, 1536}, {1536, 24576}, {12288, 1536}};
    size_t per_layer = 0; for (auto& s : shapes) per_layer += (size_t)s[0] * s[1] * 2;
    void *kv, *w, *x, *y; unsigned* out;
    CK(cudaMalloc(&kv, kv_bytes)); CK(cudaMemset(kv, 1, kv_bytes));
    CK(cudaMalloc(&w, per_layer * layers)); CK(cudaMemset(w, 0, per_layer * layers));
    CK(cudaMalloc(&x, rows * 12288 * 2)); CK(cudaMemset(x, 0, rows * 12288 * 2));
    CK(cudaMalloc(&y, rows * 24576 * 2)); CK(cudaMalloc(&out, 4));
    cublasHandle_t h; cublasCreate(&h);
    cudaStream_t st; CK(cudaStreamCreate(&st)); cublasSetStream(h, st);
    float one = 1, zero = 0;
    std::vector<cudaEvent_t> ev(2 * layers + 2);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    struct V { const char* name; int mode; float frac; size_t persist; };
    V vs[] = {{"plain", 0, 0, 0}, {"evict_last 1.0", 1, 1.0f, 0}, {"evict_last 0.75", 1, 0.75f, 0},
              {"evict_last 0.5", 1, 0.5f, 0}, {"plain + window persist", 0, 0, 1}, {"evict_last 1.0 + setaside", 1, 1.0f, 1},
              {"evict_first", 2, 1.0f, 0}, {"plain", 0, 0, 0}};
    for (auto& v : vs) {
        CK(cudaCtxResetPersistingL2Cache());
        size_t lim = v.persist ? pr.persistingL2CacheMaxSize : 0;
        CK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, lim));
        cudaStreamAttrValue a = {};
        if (v.persist == 1 && v.mode == 0) {
            a.accessPolicyWindow.base_ptr = kv;
            a.accessPolicyWindow.num_bytes = kv_bytes < (size_t)pr.accessPolicyMaxWindowSize ? kv_bytes : pr.accessPolicyMaxWindowSize;
            a.accessPolicyWindow.hitRatio = std::min(1.0f, (float)lim / a.accessPolicyWindow.num_bytes);
            a.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
            a.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
        }
        for (int rep = 0; rep < 4; rep++) {
            double kv_ms = 0, gemm_ms = 0;
            CK(cudaEventRecord(ev[0], st));
            for (int l = 0; l < layers; l++) {
                if (v.persist == 1 && v.mode == 0) CK(cudaStreamSetAttribute(st, cudaStreamAttributeAccessPolicyWindow, &a));
                kv_read<<<pr.multiProcessorCount * 4, 256, 0, st>>>((const uint4*)kv, kv_bytes / 16, v.mode, v.frac, out);
                if (v.persist == 1 && v.mode == 0) { cudaStreamAttrValue z = {}; z.accessPolicyWindow.num_bytes = 0; CK(cudaStreamSetAttribute(st, cudaStreamAttributeAccessPolicyWindow, &z)); }
                CK(cudaEventRecord(ev[2 * l + 1], st));
                char* wl = (char*)w + per_layer * l;
                for (auto& s : shapes) {
                    int K = s[0], N = s[1];
                    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, rows, K, &one, wl, CUDA_R_16BF, K, x, CUDA_R_16BF, K,
                                 &zero, y, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                    wl += (size_t)K * N * 2;
                }
                CK(cudaEventRecord(ev[2 * l + 2], st));
            }
            CK(cudaStreamSynchronize(st));
            float t;
            for (int l = 0; l < layers; l++) {
                CK(cudaEventElapsedTime(&t, l ? ev[2 * l] : ev[0], ev[2 * l + 1])); kv_ms += t;
                CK(cudaEventElapsedTime(&t, ev[2 * l + 1], ev[2 * l + 2])); gemm_ms += t;
            }
            if (rep > 0) printf("%-28s kv %.1f MB: kv read %.2f us/layer (%.2f TB/s), gemms %.2f us/layer\n", v.name, kv_bytes / 1048576.0,
                   kv_ms * 1000 / layers, kv_bytes / (kv_ms / layers * 1e-3) / 1e12, gemm_ms * 1000 / layers);
        }
    }
    return 0;
}
