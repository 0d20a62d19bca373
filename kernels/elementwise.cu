// Elementwise ops on f32 activations: gated activations, bare activation, softcap,
// add / mul / scale. Precise libm functions (tanhf, expf): NVRTC runs without fast math.

#define ACT_GELU_TANH 0
#define ACT_SILU 1

__device__ __forceinline__ float gelu_tanh(float x) {
    const float sqrt_2_over_pi = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * (x + 0.044715f * x * x * x)));
}

// x / (1 + e^-x): finite for every finite x.
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float apply_act(int act, float x) {
    return act == ACT_GELU_TANH ? gelu_tanh(x) : silu(x);
}

extern "C" __global__ void act_mul(const float* gate, const float* up, float* out, u64 n, int act) {
    FOR_EACH_INDEX(i, n) { out[i] = apply_act(act, gate[i]) * up[i]; }
}

// out[t, i] = act(gate[t, i]) * table[t * stride + offset + i] for i < cols: the gated
// product with a column slice of a wider table (Gemma-4's per-layer inputs) in one pass.
extern "C" __global__ void act_mul_slice(const float* gate, const float* table, float* out, u64 n,
                                         u64 cols, u64 offset, u64 stride, int act) {
    FOR_EACH_INDEX(i, n) {
        const u64 t = i / cols, c = i % cols;
        out[i] = apply_act(act, gate[i]) * table[t * stride + offset + c];
    }
}

extern "C" __global__ void activation(const float* x, float* out, u64 n, int act) {
    FOR_EACH_INDEX(i, n) { out[i] = apply_act(act, x[i]); }
}

extern "C" __global__ void softcap(float* x, u64 n, float cap) {
    FOR_EACH_INDEX(i, n) { x[i] = cap * tanhf(x[i] / cap); }
}

extern "C" __global__ void add(float* acc, const float* x, u64 n) {
    FOR_EACH_INDEX(i, n) { acc[i] += x[i]; }
}

extern "C" __global__ void mul(float* acc, const float* x, u64 n) {
    FOR_EACH_INDEX(i, n) { acc[i] *= x[i]; }
}

extern "C" __global__ void scale(float* x, u64 n, float s) {
    FOR_EACH_INDEX(i, n) { x[i] *= s; }
}
