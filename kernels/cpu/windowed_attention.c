/*
 * Sliding-window attention over a paged KV pool for x86-64 CPUs with AVX2 and FMA: each query
 * token at position p sees exactly the keys at positions max(0, p - W + 1) .. p, all read from
 * the pool through its sequence's block table (the step's new keys are stored there first).
 *
 * Every (query token, kv head) is one work item and computes its rows alone, in an order fixed
 * by the token's own key range: scores 8 keys at a time from the range's first key (a dot
 * product over head_dim in 8 lanes each, summed in a fixed tree), the last few one by one, the row's max, probabilities 8 keys at a time from the range's
 * first key, their sum in 8 lanes then a fixed tree, and the values' weighted sum key by key.
 * So a token's output does not depend on the other tokens of the call, on how its prompt was
 * chunked or cached, or on whether it came as a prefill row or a decode step.
 *
 * q, the pools and out are float32 or bf16 (bf16 read by widening, written rounded to nearest
 * even). Layouts: q [tokens][heads][D] with strides, pools [rows][block_size][kv_heads][D]
 * contiguous, out [tokens][heads][D] contiguous. D is a multiple of 8, at most 256.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd_math_avx2.h"

#define MAX_D 256
#define MAX_GROUP 16

typedef uint16_t bf16;

static inline __m256 load8(const void *base, int64_t index, int is_bf16) {
    if (!is_bf16) return _mm256_loadu_ps((const float *)base + index);
    const __m128i raw = _mm_loadu_si128((const __m128i *)((const bf16 *)base + index));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

static inline float hsum8(__m256 x) { /* ((0+4) + (2+6)) + ((1+5) + (3+7)), always */
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/* The lane sums of a[0..7], in that order: one fixed tree per lane, as hsum8 is one. */
static inline __m256 hsum8x8(const __m256 a[8]) {
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20),
                         _mm256_permute2f128_ps(t0, t1, 0x31));
}

static inline bf16 to_bf16(float x) { /* round to nearest even (x is finite) */
    uint32_t bits;
    memcpy(&bits, &x, 4);
    bits += 0x7FFF + ((bits >> 16) & 1);
    return (bf16)(bits >> 16);
}

/* The pool row of key j of the sequence with block table `table`. */
static inline int64_t key_row(const int32_t *table, int64_t j, int block_size) {
    return (int64_t)table[j / block_size] * block_size + j % block_size;
}

/* ov[g][d0 .. d0 + DB) += sum over keys j in order of p[g][j] * v_j[d0 .. d0 + DB), for heads
 * g < GB: the same fused multiply-adds, in the same order for each lane, as key by key over
 * all heads and chunks, but with the GB x DB sums in registers (GB * DB <= 8). `p` rows are
 * `p_stride` apart; `rows[j]` is key j's value row (element offset); `ov` is [GB][MAX_D / 8]. */
static inline __attribute__((always_inline)) void values_block_n(
    const int GB, const int DB, const void *v_cache, int kv_bf16, const int64_t *rows, int n,
    const float *p, int p_stride, int d0, __m256 (*ov)[MAX_D / 8]) {
    __m256 acc[4][8];
    for (int g = 0; g < GB; g++)
        for (int dd = 0; dd < DB; dd++) acc[g][dd] = ov[g][d0 + dd];
    for (int j = 0; j < n; j++) {
        __m256 v[8];
        for (int dd = 0; dd < DB; dd++) v[dd] = load8(v_cache, rows[j] + 8 * (d0 + dd), kv_bf16);
        for (int g = 0; g < GB; g++) {
            const __m256 weight = _mm256_broadcast_ss(p + g * p_stride + j);
            for (int dd = 0; dd < DB; dd++) acc[g][dd] = _mm256_fmadd_ps(weight, v[dd], acc[g][dd]);
        }
    }
    for (int g = 0; g < GB; g++)
        for (int dd = 0; dd < DB; dd++) ov[g][d0 + dd] = acc[g][dd];
}

/* values_block_n with GB and DB as compile-time constants (so its sums stay in registers). */
static void values_block(int gb, int db, const void *v_cache, int kv_bf16, const int64_t *rows,
                         int n, const float *p, int p_stride, int d0, __m256 (*ov)[MAX_D / 8]) {
#define VALUES_BLOCK(G_, D_) \
    if (gb == G_ && db == D_) \
        return values_block_n(G_, D_, v_cache, kv_bf16, rows, n, p, p_stride, d0, ov);
    VALUES_BLOCK(4, 2) VALUES_BLOCK(4, 1) VALUES_BLOCK(2, 4) VALUES_BLOCK(2, 2)
    VALUES_BLOCK(2, 1) VALUES_BLOCK(1, 8) VALUES_BLOCK(1, 4) VALUES_BLOCK(1, 2)
    VALUES_BLOCK(1, 1)
#undef VALUES_BLOCK
}

void wa_windowed_attention(const void *q, int q_bf16, int64_t q_tok, int64_t q_head,
                           const void *k_cache, const void *v_cache, int kv_bf16,
                           const int32_t *block_tables, int64_t bt_row, const int32_t *seq_of,
                           const int64_t *pos_of, int64_t num_tokens, int num_heads,
                           int num_kv_heads, int D, int block_size, int window, float scale,
                           void *out, int out_bf16, int num_threads) {
    const int G = num_heads / num_kv_heads;
    const int64_t items = num_tokens * num_kv_heads;
#pragma omp parallel num_threads(num_threads)
    {
        float *scores = malloc(sizeof(float) * (size_t)G * ((size_t)window + 8));
        int64_t *rows = malloc(sizeof(int64_t) * (size_t)window); /* a row's values, in the pool */
        __m256 qv[MAX_GROUP][MAX_D / 8];
        __m256 ov[MAX_GROUP][MAX_D / 8];
        float kwide[8][MAX_D]; /* 8 bf16 keys widened once for all the group's heads */
#pragma omp for schedule(dynamic, 4)
        for (int64_t item = 0; item < items; item++) {
            const int64_t t = item / num_kv_heads;
            const int h = (int)(item % num_kv_heads);
            const int32_t *table = block_tables + (int64_t)seq_of[t] * bt_row;
            const int64_t p = pos_of[t];
            const int64_t lo = p - window + 1 > 0 ? p - window + 1 : 0;
            const int n = (int)(p - lo + 1);
            for (int g = 0; g < G; g++)
                for (int d = 0; d < D / 8; d++)
                    qv[g][d] = load8(q, t * q_tok + (int64_t)(h * G + g) * q_head + 8 * d,
                                     q_bf16);
            int j = 0;
            for (; j + 8 <= n; j += 8) { /* scores, 8 keys at a time from key lo */
                const float *krow[8]; /* the 8 keys in float32: the pool's rows, or widened */
                for (int i = 0; i < 8; i++) {
                    const int64_t at =
                        (key_row(table, lo + j + i, block_size) * num_kv_heads + h) * D;
                    if (!kv_bf16) {
                        krow[i] = (const float *)k_cache + at;
                        continue;
                    }
                    for (int d = 0; d < D / 8; d++)
                        _mm256_storeu_ps(kwide[i] + 8 * d, load8(k_cache, at + 8 * d, 1));
                    krow[i] = kwide[i];
                }
                for (int g = 0; g < G; g++) {
                    __m256 acc[8];
                    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
                    for (int d = 0; d < D / 8; d++)
                        for (int i = 0; i < 8; i++)
                            acc[i] = _mm256_fmadd_ps(qv[g][d], _mm256_loadu_ps(krow[i] + 8 * d),
                                                     acc[i]);
                    _mm256_storeu_ps(scores + g * (window + 8) + j,
                                     _mm256_mul_ps(hsum8x8(acc), _mm256_set1_ps(scale)));
                }
            }
            for (; j < n; j++) { /* the last keys, one by one */
                const int64_t row = key_row(table, lo + j, block_size) * num_kv_heads + h;
                for (int g = 0; g < G; g++) {
                    __m256 acc = _mm256_setzero_ps();
                    for (int d = 0; d < D / 8; d++)
                        acc = _mm256_fmadd_ps(qv[g][d], load8(k_cache, row * D + 8 * d, kv_bf16),
                                              acc);
                    scores[g * (window + 8) + j] = hsum8(acc) * scale;
                }
            }
            float sum[MAX_GROUP];
            for (int g = 0; g < G; g++) { /* probabilities 8 keys at a time from key lo */
                float *s = scores + g * (window + 8);
                float m = s[0];
                for (int j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
                for (int j = n; j < ((n + 7) & ~7); j++) s[j] = -INFINITY;
                const __m256 mv = _mm256_set1_ps(m);
                __m256 l = _mm256_setzero_ps();
                for (int j = 0; j < n; j += 8) {
                    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
                    _mm256_storeu_ps(s + j, e);
                    l = _mm256_add_ps(l, e);
                }
                sum[g] = hsum8(l);
                for (int d = 0; d < D / 8; d++) ov[g][d] = _mm256_setzero_ps();
            }
            for (int j = 0; j < n; j++) /* the values' pool rows */
                rows[j] = (key_row(table, lo + j, block_size) * num_kv_heads + h) * D;
            /* values, key by key, in blocks of heads x 8-lane chunks held in registers */
            for (int g0 = 0; g0 < G;) {
                const int gb = G - g0 >= 4 ? 4 : G - g0 >= 2 ? 2 : 1;
                for (int d0 = 0; d0 < D / 8;) {
                    int db = gb == 4 ? 2 : gb == 2 ? 4 : 8;
                    while (db > D / 8 - d0) db /= 2;
                    values_block(gb, db, v_cache, kv_bf16, rows, n, scores + g0 * (window + 8),
                                 window + 8, d0, &ov[g0][0]);
                    d0 += db;
                }
                g0 += gb;
            }
            for (int g = 0; g < G; g++) {
                const __m256 inv = _mm256_set1_ps(1.0f / sum[g]);
                const int64_t base = (t * num_heads + h * G + g) * (int64_t)D;
                for (int d = 0; d < D / 8; d++) {
                    float lanes[8];
                    _mm256_storeu_ps(lanes, _mm256_mul_ps(ov[g][d], inv));
                    if (out_bf16)
                        for (int i = 0; i < 8; i++) ((bf16 *)out)[base + 8 * d + i] = to_bf16(lanes[i]);
                    else
                        memcpy((float *)out + base + 8 * d, lanes, sizeof(lanes));
                }
            }
        }
        free(scores);
        free(rows);
    }
}
