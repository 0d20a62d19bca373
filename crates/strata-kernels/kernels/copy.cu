// Data movement: 2-D strided copies (4- and 2-byte elements) and widening 16-bit weights to
// f32 (the matmul path feeds cuBLAS SGEMM so f32 activations keep f32 accuracy).

#define STRIDED_COPY(NAME, T)                                                               \
    extern "C" __global__ void NAME(const T* src, T* dst, u64 rows, u64 cols, u64 src_offset, \
                                    u64 src_stride, u64 dst_offset, u64 dst_stride) {       \
        FOR_EACH_INDEX(i, rows * cols) {                                                    \
            const u64 r = i / cols, c = i % cols;                                           \
            dst[dst_offset + r * dst_stride + c] = src[src_offset + r * src_stride + c];    \
        }                                                                                   \
    }

STRIDED_COPY(copy_strided_b32, u32)
STRIDED_COPY(copy_strided_b16, u16)

extern "C" __global__ void widen_to_f32(const void* src, int dtype, float* dst, u64 n) {
    FOR_EACH_INDEX(i, n) { dst[i] = load_as_f32(src, dtype, i); }
}

// f32 -> bf16 bits, round to nearest even: the activation side of a bf16 GEMM.
extern "C" __global__ void narrow_to_bf16(const float* src, u16* dst, u64 n) {
    FOR_EACH_INDEX(i, n) { dst[i] = f32_to_bf16_rne(src[i]); }
}
