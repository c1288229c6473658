/*
 * Seconds the fused decoder layers spend in each of their phases, summed over calls while
 * profiling is on (off by default: then a phase costs one branch). Process-wide counters,
 * updated by the thread that calls the layers: meant for one forward at a time, as the
 * benchmarks run them. And the yardstick for those seconds: how fast the threads can issue
 * the bf16 dot-product instruction every GEMM and attention loop is built on.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"

static int enabled = 0;
static double seconds[PC_NUM_PHASES];

void pc_profile_enable(int on) { enabled = on != 0; }

void pc_profile_read(double *out, int reset) {
    memcpy(out, seconds, sizeof(seconds));
    if (reset) memset(seconds, 0, sizeof(seconds));
}

double pc_phase_start(void) { return enabled ? omp_get_wtime() : 0.0; }

void pc_phase_end(int phase, double *since) {
    if (!enabled) return;
    const double now = omp_get_wtime();
    seconds[phase] += now - *since;
    *since = now;
}

#define DOT_CHAINS 24 /* independent accumulators: more than the instruction's latency needs */

/*
 * GFLOP/s of `threads` threads (as many as the runtime starts) each running `rounds` rounds of
 * DOT_CHAINS independent _mm512_dpbf16_ps (64 flops each) on registers, starting together:
 * all their flops over the slowest thread's seconds.
 */
double pc_bf16_dot_gflops(int threads, int64_t rounds) {
    double slowest = 0.0;
    int team = 1;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) reduction(max : slowest)
    {
        const __m512bh ones = (__m512bh)_mm512_set1_epi32(0x3F803F80); /* bf16 pairs (1, 1) */
        __m512 acc[DOT_CHAINS];
#pragma GCC unroll 24
        for (int i = 0; i < DOT_CHAINS; i++) acc[i] = _mm512_setzero_ps();
#pragma omp single
        team = omp_get_num_threads(); /* the single's barrier starts the clocks together */
        const double start = omp_get_wtime();
        for (int64_t r = 0; r < rounds; r++) {
#pragma GCC unroll 24
            for (int i = 0; i < DOT_CHAINS; i++) {
                acc[i] = _mm512_dpbf16_ps(acc[i], ones, ones);
                __asm__ volatile("" : "+v"(acc[i])); /* the compiler may not fold the chain */
            }
        }
        slowest = omp_get_wtime() - start;
    }
    const double flops = (double)team * (double)rounds * DOT_CHAINS * 64.0;
    return slowest > 0.0 ? flops / slowest / 1e9 : 0.0;
}
