// Token embedding gather: out[t, :] = table[ids[t], :] * scale, the row widened to f32 first.
// ids were bounds-checked on the host.
//
// One block per (token, slice of EMB_SLICE values): Gemma-4's per-layer-input table has
// 8,960 values a row, and one block walking it alone is a chain of dependent passes
// (9.6 us at one token on an H200). 16-bit rows whose length is a multiple of 8 (so every
// row starts 16-byte aligned) are read eight values to a 16-byte load.

#define EMB_SLICE 2048

// Eight 16-bit values (bf16 or f16 bits) widened to f32 and scaled.
__device__ __forceinline__ void widen8(uint4 v, int dtype, float scale, float* o) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
    float f[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u16 lo = (u16)(w[j] & 0xffffu), hi = (u16)(w[j] >> 16);
        f[2 * j] = (dtype == STRATA_BF16 ? bf16_to_f32(lo) : f16_to_f32(lo)) * scale;
        f[2 * j + 1] = (dtype == STRATA_BF16 ? bf16_to_f32(hi) : f16_to_f32(hi)) * scale;
    }
    reinterpret_cast<float4*>(o)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(o)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

extern "C" __global__ void embedding(const void* table, int dtype, const u32* ids, float* out,
                                     int hidden, float scale) {
    const u64 t = blockIdx.x;
    const u64 row = (u64)ids[t] * hidden;
    const int begin = blockIdx.y * EMB_SLICE, end = min(hidden, begin + EMB_SLICE);
    float* o = out + t * hidden;
    if (dtype != STRATA_F32 && hidden % 8 == 0) {
        const uint4* src = reinterpret_cast<const uint4*>((const u16*)table + row);
        for (int c = begin / 8 + threadIdx.x; c < end / 8; c += blockDim.x)
            widen8(__ldg(src + c), dtype, scale, o + c * 8);
        return;
    }
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x)
        o[i] = load_as_f32(table, dtype, row + i) * scale;
}
