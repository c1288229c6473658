/*
 * The yardstick for the float32 kernels' GFLOP/s: how fast the threads can issue the AVX2 FMA
 * every float32 GEMM and attention loop here is built on, with nothing else in the loop.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "cpu_kernels_f32.h"

#define FMA_CHAINS 12 /* independent accumulators: more than latency x issue width needs */

/*
 * GFLOP/s of `threads` threads (as many as the runtime starts) each running `rounds` rounds of
 * FMA_CHAINS independent _mm256_fmadd_ps (16 flops each) on registers, starting together: all
 * their flops over the slowest thread's seconds.
 */
double pc_f32_fma_gflops(int threads, int64_t rounds) {
    double slowest = 0.0;
    int team = 1;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) reduction(max : slowest)
    {
        const __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(0.5f);
        __m256 acc[FMA_CHAINS];
#pragma GCC unroll 12
        for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm256_setzero_ps();
#pragma omp single
        team = omp_get_num_threads(); /* the single's barrier starts the clocks together */
        const double start = omp_get_wtime();
        for (int64_t r = 0; r < rounds; r++) {
#pragma GCC unroll 12
            for (int i = 0; i < FMA_CHAINS; i++) {
                acc[i] = _mm256_fmadd_ps(a, b, acc[i]);
                __asm__ volatile("" : "+x"(acc[i])); /* the compiler may not fold the chain */
            }
        }
        slowest = omp_get_wtime() - start;
    }
    const double flops = (double)team * (double)rounds * FMA_CHAINS * 16.0;
    return slowest > 0.0 ? flops / slowest / 1e9 : 0.0;
}
