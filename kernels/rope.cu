// RoPE in place on x [tokens, n_heads, head_dim]: one thread per rotated pair.
// Angle = (f32)pos * inv_freq in f32, precise sincosf (no fast math), as the CPU does.
// A zero frequency leaves its pair untouched (exact pass-through for partial RoPE).

extern "C" __global__ void rope(float* x, const u32* positions, const float* inv_freq,
                                int tokens, int n_heads, int head_dim, int interleaved) {
    const int half = head_dim / 2;
    const u64 pairs = (u64)tokens * n_heads * half;
    FOR_EACH_INDEX(idx, pairs) {
        const int i = (int)(idx % half);
        const u64 row = idx / half;  // token * n_heads + head
        const float f = inv_freq[i];
        if (f == 0.0f) continue;
        const u32 t = (u32)(row / n_heads);
        const float angle = (float)positions[t] * f;
        float s, c;
        sincosf(angle, &s, &c);
        const u64 base = row * head_dim;
        const u64 ia = interleaved ? base + 2 * i : base + i;
        const u64 ib = interleaved ? base + 2 * i + 1 : base + i + half;
        const float a = x[ia], b = x[ib];
        x[ia] = a * c - b * s;
        x[ib] = b * c + a * s;
    }
}
