/* The host's streaming read rate: the memory floor of CPU decode (docs/perf-notes.md).
 * Each thread sums its share of a 256 MiB buffer with 32-byte loads; six passes, GB/s each.
 *
 *   gcc -O2 -mavx2 -fopenmp scripts/bench/read-bandwidth.c -o /tmp/read-bandwidth
 *   OMP_NUM_THREADS=2 /tmp/read-bandwidth
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    size_t n = (size_t)256 << 20;
    char *a = aligned_alloc(64, n);
    if (!a) return 1;
    memset(a, 1, n);
    for (int pass = 0; pass < 6; pass++) {
        double t = omp_get_wtime();
        long long sink = 0;
#pragma omp parallel reduction(+ : sink)
        {
            __m256i acc = _mm256_setzero_si256();
            size_t share = n / omp_get_num_threads();
            const char *p = a + omp_get_thread_num() * share;
            for (size_t i = 0; i < share; i += 128) {
                acc = _mm256_add_epi8(acc, _mm256_load_si256((const __m256i *)(p + i)));
                acc = _mm256_add_epi8(acc, _mm256_load_si256((const __m256i *)(p + i + 32)));
                acc = _mm256_add_epi8(acc, _mm256_load_si256((const __m256i *)(p + i + 64)));
                acc = _mm256_add_epi8(acc, _mm256_load_si256((const __m256i *)(p + i + 96)));
            }
            sink += _mm256_extract_epi8(acc, 0); /* keeps the loads */
        }
        printf("%.1f GB/s%s\n", n / (omp_get_wtime() - t) / 1e9, sink == 12345 ? " " : "");
    }
    free(a);
    return 0;
}
