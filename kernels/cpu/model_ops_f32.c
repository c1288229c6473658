/*
 * The decoder's elementwise ops in float32 for x86-64 CPUs with AVX2 and FMA: RMSNorm (with
 * the residual add fused in), RoPE in place, SiLU-and-mul; and the store of new keys and
 * values into the paged pool. One pass over memory each, where
 * torch makes one per elementwise step; rows split over OpenMP threads when there are enough.
 * Results equal torch's float32 ops to rounding (the sum of squares and exp() run in another
 * order); each row's result depends on that row alone.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels_f32.h"
#include "simd_math_avx2.h"

#define INLINE static inline __attribute__((always_inline))
#define PARALLEL_ROWS 16 /* fewer rows than this run on one thread */

/* Sum of the 8 lanes. */
INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/*
 * out = weight * (r / sqrt(mean(r^2) + eps)) per row, r = x + residual with residual
 * overwritten by r (residual != NULL), else r = x. x, residual, out: [rows, hidden] with the
 * given row strides (out may be x); weight [hidden]. hidden a multiple of 8.
 */
void pc_f32_rms_norm(const float *x, int64_t x_stride, float *residual, int64_t res_stride,
                     const float *weight, float *out, int64_t out_stride, int64_t rows,
                     int64_t hidden, float eps, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows >= PARALLEL_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *rr = residual ? residual + r * res_stride : NULL;
        float *o = out + r * out_stride;
        __m256 squares = _mm256_setzero_ps();
        for (int64_t i = 0; i < hidden; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            if (rr) {
                v = _mm256_add_ps(v, _mm256_loadu_ps(rr + i));
                _mm256_storeu_ps(rr + i, v);
            }
            squares = _mm256_fmadd_ps(v, v, squares);
        }
        const float inv = 1.0f / sqrtf(hsum(squares) / (float)hidden + eps);
        const float *src = rr ? rr : xr;
        const __m256 scale = _mm256_set1_ps(inv);
        for (int64_t i = 0; i < hidden; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i),
                                                  _mm256_mul_ps(_mm256_loadu_ps(src + i), scale)));
    }
}

/* out[r] = silu(gate_up[r, :inter]) * gate_up[r, inter:], silu(g) = g / (1 + e^-g).
 * inter a multiple of 8. */
void pc_f32_silu_and_mul(const float *gate_up, int64_t gu_stride, float *out,
                         int64_t out_stride, int64_t rows, int64_t inter, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows >= PARALLEL_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * gu_stride, *u = g + inter;
        float *o = out + r * out_stride;
        for (int64_t i = 0; i < inter; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
        }
    }
}

/* RoPE, rotate-half layout, in place: x = x * cos + rotate_half(x) * sin per head, x
 * [tokens, heads, head_dim] (token and head strides), cos_sin [tokens, 2, head_dim] (token
 * stride cs_stride: the cos row, then the sin row). head_dim a multiple of 16. */
void pc_f32_rotary(float *x, int64_t token_stride, int64_t head_stride, const float *cos_sin,
                   int64_t cs_stride, int64_t tokens, int64_t num_heads, int64_t head_dim,
                   int num_threads) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (tokens >= PARALLEL_ROWS)
    for (int64_t t = 0; t < tokens; t++) {
        const float *cos = cos_sin + t * cs_stride, *sin = cos + head_dim;
        for (int64_t h = 0; h < num_heads; h++) {
            float *v = x + t * token_stride + h * head_stride;
            for (int64_t i = 0; i < half; i += 8) {
                const __m256 x1 = _mm256_loadu_ps(v + i), x2 = _mm256_loadu_ps(v + half + i);
                const __m256 lo = _mm256_sub_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(cos + i)),
                                                _mm256_mul_ps(x2, _mm256_loadu_ps(sin + i)));
                const __m256 hi = _mm256_add_ps(
                    _mm256_mul_ps(x2, _mm256_loadu_ps(cos + half + i)),
                    _mm256_mul_ps(x1, _mm256_loadu_ps(sin + half + i)));
                _mm256_storeu_ps(v + i, lo);
                _mm256_storeu_ps(v + half + i, hi);
            }
        }
    }
}

/*
 * Copies token t's keys and values (num_kv_heads rows of head_dim, at the given token and head
 * strides) into flat slot slots[t] of a float32 pool [num_slots][num_kv_heads][head_dim]; slot
 * -1 skips the token. Returns 0, or -1 (nothing written) when a slot is outside [-1, num_slots).
 */
int pc_f32_store_kv(const float *k, int64_t k_token_stride, int64_t k_head_stride,
                    const float *v, int64_t v_token_stride, int64_t v_head_stride,
                    float *k_cache, float *v_cache, const int64_t *slots, int64_t tokens,
                    int64_t num_kv_heads, int64_t head_dim, int64_t num_slots) {
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] < -1 || slots[t] >= num_slots) return -1;
    const size_t row_bytes = (size_t)head_dim * sizeof(float);
    const int64_t slot_elements = num_kv_heads * head_dim;
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        float *kd = k_cache + slots[t] * slot_elements, *vd = v_cache + slots[t] * slot_elements;
        for (int64_t h = 0; h < num_kv_heads; h++) {
            memcpy(kd + h * head_dim, k + t * k_token_stride + h * k_head_stride, row_bytes);
            memcpy(vd + h * head_dim, v + t * v_token_stride + h * v_head_stride, row_bytes);
        }
    }
    return 0;
}
