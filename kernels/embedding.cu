// Token embedding gather: out[t, :] = table[ids[t], :] * scale, the row widened to f32 first.
// One block per token; ids were bounds-checked on the host.

extern "C" __global__ void embedding(const void* table, int dtype, const u32* ids, float* out,
                                     int hidden, float scale) {
    const u64 t = blockIdx.x;
    const u64 row = (u64)ids[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        out[t * hidden + i] = load_as_f32(table, dtype, row + i) * scale;
    }
}
