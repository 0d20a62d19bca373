// Elementwise ops on f32 activations: gated activations, bare activation, softcap,
// add / mul / scale. The activations live in common.cuh (the gated GEMV uses them too).

// `out_b`, when not null, receives the result rounded to bf16 as well: the operand of the
// bf16 GEMM that reads `out` next (which then skips its narrowing pass).
extern "C" __global__ void act_mul(const float* gate, const float* up, float* out, u16* out_b,
                                   u64 n, int act) {
    FOR_EACH_INDEX(i, n) {
        const float y = apply_act(act, gate[i]) * up[i];
        out[i] = y;
        if (out_b) out_b[i] = f32_to_bf16_rne(y);
    }
}

// act_mul over bf16 gate and up: in the bf16 mode a gated MLP's two GEMMs write bf16
// (half the bytes of f32 out of the GEMM and into this pass; the activations a bf16 model
// computes round there too). Eight values a thread in 16-byte loads and stores (the pass
// is bound by memory; every buffer starts an allocation, so the vectors align), the last
// n % 8 one at a time. `out` null: the bf16 copy alone (the down projection's GEMM reads
// nothing else; 6 bytes a value instead of 10).
__device__ __forceinline__ float act_mul_pair_lo(int act, u32 g, u32 u) {
    return apply_act(act, __uint_as_float(g << 16)) * __uint_as_float(u << 16);
}

__device__ __forceinline__ float act_mul_pair_hi(int act, u32 g, u32 u) {
    return apply_act(act, __uint_as_float(g & 0xffff0000u)) * __uint_as_float(u & 0xffff0000u);
}

// Eight values from 16-byte vectors of bf16 gate and up, written from value `at` of out
// (f32, unless null) and out_b (bf16, unless null).
__device__ __forceinline__ void act_mul_bf16_8(int act, uint4 g, uint4 u, float* out, u16* out_b,
                                               u64 at) {
    const u32 gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w};
    float y[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        y[2 * j] = act_mul_pair_lo(act, gw[j], uw[j]);
        y[2 * j + 1] = act_mul_pair_hi(act, gw[j], uw[j]);
    }
    if (out) {
        float4* o = reinterpret_cast<float4*>(out + at);
        o[0] = make_float4(y[0], y[1], y[2], y[3]);
        o[1] = make_float4(y[4], y[5], y[6], y[7]);
    }
    if (out_b) {
        u32 b[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            b[j] = (u32)f32_to_bf16_rne(y[2 * j]) | ((u32)f32_to_bf16_rne(y[2 * j + 1]) << 16);
        *reinterpret_cast<uint4*>(out_b + at) = make_uint4(b[0], b[1], b[2], b[3]);
    }
}

extern "C" __global__ void act_mul_bf16_in(const u16* gate, const u16* up, float* out,
                                           u16* out_b, u64 n, int act) {
    const u64 groups = n / 8;
    FOR_EACH_INDEX(v, groups) {
        const uint4 g = reinterpret_cast<const uint4*>(gate)[v];
        const uint4 u = reinterpret_cast<const uint4*>(up)[v];
        act_mul_bf16_8(act, g, u, out, out_b, 8 * v);
    }
    FOR_EACH_INDEX(t, n - groups * 8) {
        const u64 i = groups * 8 + t;
        const float y = apply_act(act, bf16_to_f32(gate[i])) * bf16_to_f32(up[i]);
        if (out) out[i] = y;
        if (out_b) out_b[i] = f32_to_bf16_rne(y);
    }
}

// act_mul_bf16_in where one batched GEMM wrote both products of a row side by side: row r
// of `y` holds 2 n bf16 values, the gate's from `gate_at` and the up's from `up_at` (0 and
// n, either way round). Grid (rows, groups of 8 columns / blockDim); n % 8 == 0, so every
// vector is 16-byte aligned.
extern "C" __global__ void act_mul_bf16_pairs(const u16* y, float* out, u16* out_b, u64 n,
                                              u64 gate_at, u64 up_at, int act) {
    const u64 r = blockIdx.x, v = (u64)blockIdx.y * blockDim.x + threadIdx.x;
    if (8 * v >= n) return;
    const u16* row = y + 2 * n * r;
    const uint4 g = reinterpret_cast<const uint4*>(row + gate_at)[v];
    const uint4 u = reinterpret_cast<const uint4*>(row + up_at)[v];
    act_mul_bf16_8(act, g, u, out, out_b, n * r + 8 * v);
}

// out[t, i] = act(gate[t, i]) * table[t * stride + offset + i] for i < cols: the gated
// product with a column slice of a wider table (Gemma-4's per-layer inputs) in one pass.
// One entry point per activation (each holds only its own function); grid (rows, column
// chunks of 256), so no 64-bit division splits a flat index into row and column.
template <int ACT>
__device__ __forceinline__ void act_mul_slice_rows(const float* gate, const float* table,
                                                   float* out, u16* out_b, u64 cols,
                                                   u64 offset, u64 stride) {
    const u64 c = (u64)blockIdx.y * blockDim.x + threadIdx.x, t = blockIdx.x;
    if (c >= cols) return;
    const u64 i = t * cols + c;
    const float y = apply_act(ACT, gate[i]) * table[t * stride + offset + c];
    out[i] = y;
    if (out_b) out_b[i] = f32_to_bf16_rne(y);
}

extern "C" __global__ void act_mul_slice_gelu_tanh(const float* gate, const float* table,
                                                   float* out, u16* out_b, u64 cols,
                                                   u64 offset, u64 stride) {
    act_mul_slice_rows<ACT_GELU_TANH>(gate, table, out, out_b, cols, offset, stride);
}

extern "C" __global__ void act_mul_slice_silu(const float* gate, const float* table, float* out,
                                              u16* out_b, u64 cols, u64 offset, u64 stride) {
    act_mul_slice_rows<ACT_SILU>(gate, table, out, out_b, cols, offset, stride);
}

extern "C" __global__ void act_mul_slice_sigmoid(const float* gate, const float* table,
                                                 float* out, u16* out_b, u64 cols, u64 offset,
                                                 u64 stride) {
    act_mul_slice_rows<ACT_SIGMOID>(gate, table, out, out_b, cols, offset, stride);
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
