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
// computes round there too).
extern "C" __global__ void act_mul_bf16_in(const u16* gate, const u16* up, float* out,
                                           u16* out_b, u64 n, int act) {
    FOR_EACH_INDEX(i, n) {
        const float y = apply_act(act, bf16_to_f32(gate[i])) * bf16_to_f32(up[i]);
        out[i] = y;
        if (out_b) out_b[i] = f32_to_bf16_rne(y);
    }
}

// out[t, i] = act(gate[t, i]) * table[t * stride + offset + i] for i < cols: the gated
// product with a column slice of a wider table (Gemma-4's per-layer inputs) in one pass.
extern "C" __global__ void act_mul_slice(const float* gate, const float* table, float* out,
                                         u16* out_b, u64 n, u64 cols, u64 offset, u64 stride,
                                         int act) {
    FOR_EACH_INDEX(i, n) {
        const u64 t = i / cols, c = i % cols;
        const float y = apply_act(act, gate[i]) * table[t * stride + offset + c];
        out[i] = y;
        if (out_b) out_b[i] = f32_to_bf16_rne(y);
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
