/*
 * Helpers shared by the CPU kernels: bf16 storage as uint16_t, float32 <-> bf16 conversion of
 * 16-lane vectors (masked for row tails), and a vectorized 2^x.
 *
 * bf16 -> float32 is exact (a shift). float32 -> bf16 rounds to nearest even (vcvtneps2bf16),
 * as torch's conversion does, except that the instruction flushes subnormals to zero.
 * (grow_buffer, which the kernels also use from here, lives in thread_scratch.h.)
 */
#ifndef PREFIXCACHE_SIMD_MATH_H
#define PREFIXCACHE_SIMD_MATH_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "thread_scratch.h"

typedef uint16_t bf16; /* also in cpu_kernels.h: C11 allows the identical repeat */

#define INLINE static inline __attribute__((always_inline))

/* 16 bf16 values at p (lanes outside m read as 0) as float32. */
INLINE __m512 load_bf16(const bf16 *p, __mmask16 m) {
    const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

/* Stores the lanes of x selected by m at p, rounded to bf16. */
INLINE void store_bf16(bf16 *p, __m512 x, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(x));
}

/* x rounded to bf16 and widened back: the value a bf16 tensor op would store. */
INLINE __m512 round_bf16(__m512 x) {
    const __m256i raw = (__m256i)_mm512_cvtneps_pbh(x);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

/* Lanes [0, n) of 16 (n >= 16: all). */
INLINE __mmask16 lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* 2^x = 2^floor(x) * 2^f with f = x - floor(x) in [0, 1) (vreduceps): a degree-5 minimax
 * polynomial for 2^f (relative error 1.6e-7 in float32), scaled by vscalefps, which itself
 * takes floor(x). Very negative x (down to -1e38) gives 0; x must not be -inf or NaN. */
static inline __m512 exp2_ps(__m512 x) {
    const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(1.8775763211698725e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.98934094749726e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5826317333923375e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.401536172874479e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931530731720384e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999999250640293e-1f));
    return _mm512_scalef_ps(p, x);
}

/* e^x = 2^(x log2 e): the product's rounding error is recovered with an fma and applied to
 * first order, so the result stays within ~2 ulp. Overflows to +inf and underflows to 0 where
 * float32 does (x must not be -inf or NaN). */
static inline __m512 exp_ps(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 t = _mm512_mul_ps(x, log2e);
    const __m512 err = _mm512_fmsub_ps(x, log2e, t); /* x log2 e - t, exactly */
    const __m512 correction = _mm512_fmadd_ps(err, _mm512_set1_ps(0.69314718055994531f),
                                              _mm512_set1_ps(1.0f));
    return _mm512_mul_ps(exp2_ps(t), correction);
}

/* bf16(bf16(silu(g)) * u) for bf16 values g and u (exact in float32), silu(g) = g / (1 + e^-g)
 * in float32: torch's silu, then mul_, in bf16. The result is to be stored as bf16. */
INLINE __m512 silu_and_mul(__m512 g, __m512 u) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = round_bf16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    return _mm512_mul_ps(silu, u);
}

#endif
