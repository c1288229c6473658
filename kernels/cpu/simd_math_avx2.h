/*
 * Vector math for the AVX2/FMA float32 kernels (no AVX-512): 2^x and e^x on 8 lanes.
 */
#ifndef PREFIXCACHE_SIMD_MATH_AVX2_H
#define PREFIXCACHE_SIMD_MATH_AVX2_H

#include <immintrin.h>
#include <math.h>

/* 2^x, lane-wise: 2^round(x) * p(x - round(x)) with a degree-6 polynomial on [-0.5, 0.5]
 * (relative error ~2e-7, exactly 1 at x = 0); x below -126 (-inf included) gives exactly 0,
 * x from 128 up +inf; x must not be NaN. */
static inline __attribute__((always_inline)) __m256 exp2_avx2(__m256 x) {
    const __m256 seen = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
    const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(128.0f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(127.0f));
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5353362e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3398874e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504109e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022651e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    const __m256 scaled = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), bits));
    return _mm256_blendv_ps(_mm256_and_ps(scaled, seen), _mm256_set1_ps(INFINITY), over);
}

/* e^x = 2^(x log2 e), lane-wise (see exp2_avx2). */
static inline __attribute__((always_inline)) __m256 exp_avx2(__m256 x) {
    return exp2_avx2(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)));
}

#endif
