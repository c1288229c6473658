/*
 * The decoder's elementwise ops on bf16 activations (AVX-512), one pass over memory each:
 * RMSNorm with the residual add fused in, RoPE in place on a fused qkv tensor, SiLU(gate) * up,
 * and the copy of new keys/values into a bf16 paged pool.
 *
 * Every intermediate a torch bf16 op would round is rounded to bf16 here too (see each
 * function), so the results are torch's up to the order of the RMSNorm sum of squares and the
 * last bit of exp() inside SiLU. Rows run in parallel on OpenMP threads when there is enough
 * work to pay for waking them. Strides are in elements; the last dimension is contiguous.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "simd_math.h"

#define PARALLEL_MIN_ELEMENTS 8192 /* below this, one thread beats a team (usually awake) */

static int team(int64_t elements, int num_threads) {
    return elements >= PARALLEL_MIN_ELEMENTS && num_threads > 1 ? num_threads : 1;
}

/*
 * out[r] = bf16(weight * bf16(s * rsqrt(mean(s^2) + eps))), s = x[r] in float32.
 * With residual != NULL, first residual[r] = s = bf16(x[r] + residual[r]) (the add of the
 * residual stream), then s is normalized. out may be x itself (in place); it must not overlap
 * residual.
 */
void pc_rms_norm(const bf16 *x, int64_t x_stride, bf16 *residual, int64_t residual_stride,
                 const bf16 *weight, bf16 *out, int64_t out_stride, int64_t rows,
                 int64_t hidden, float eps, int num_threads) {
#pragma omp parallel for num_threads(team(rows * hidden, num_threads)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *xr = x + r * x_stride;
        bf16 *res = residual ? residual + r * residual_stride : NULL;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        for (int64_t d = 0; d < hidden; d += 16) {
            const __mmask16 m = lanes(hidden - d);
            __m512 s = load_bf16(xr + d, m);
            if (res) {
                s = round_bf16(_mm512_add_ps(s, load_bf16(res + d, m)));
                store_bf16(res + d, s, m);
            }
            if ((d / 16) & 1)
                acc1 = _mm512_fmadd_ps(s, s, acc1);
            else
                acc0 = _mm512_fmadd_ps(s, s, acc0);
        }
        const float mean = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) / (float)hidden;
        const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(mean + eps));
        const bf16 *src = res ? res : xr;
        bf16 *dst = out + r * out_stride;
        for (int64_t d = 0; d < hidden; d += 16) {
            const __mmask16 m = lanes(hidden - d);
            const __m512 normed = round_bf16(_mm512_mul_ps(load_bf16(src + d, m), inv));
            store_bf16(dst + d, _mm512_mul_ps(load_bf16(weight + d, m), normed), m);
        }
    }
}

/*
 * RoPE, rotate-half layout, in place on heads [0, num_heads) of x (token stride, head stride):
 * with half = head_dim / 2 and i < half,
 *   x[i]        <- bf16(bf16(x[i] * cos[i]) + bf16(-x[half + i] * sin[i]))
 *   x[half + i] <- bf16(bf16(x[half + i] * cos[half + i]) + bf16(x[i] * sin[half + i]))
 * the roundings of torch's `x * cos + rotate_half(x) * sin` in bf16. cos_sin holds each
 * token's cos row then its sin row ([tokens][2][head_dim], token stride cs_stride).
 */
void pc_rotary(bf16 *x, int64_t token_stride, int64_t head_stride, const bf16 *cos_sin,
               int64_t cs_stride, int64_t tokens, int64_t num_heads, int64_t head_dim,
               int num_threads) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(team(tokens * num_heads * head_dim, num_threads)) \
    schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const bf16 *cos = cos_sin + t * cs_stride, *sin = cos + head_dim;
        for (int64_t h = 0; h < num_heads; h++) {
            bf16 *row = x + t * token_stride + h * head_stride;
            for (int64_t i = 0; i < half; i += 16) {
                const __mmask16 m = lanes(half - i);
                const __m512 x1 = load_bf16(row + i, m), x2 = load_bf16(row + half + i, m);
                const __m512 c1 = load_bf16(cos + i, m), c2 = load_bf16(cos + half + i, m);
                const __m512 s1 = load_bf16(sin + i, m), s2 = load_bf16(sin + half + i, m);
                const __m512 neg_x2 = _mm512_sub_ps(_mm512_setzero_ps(), x2);
                const __m512 y1 = _mm512_add_ps(round_bf16(_mm512_mul_ps(x1, c1)),
                                                round_bf16(_mm512_mul_ps(neg_x2, s1)));
                const __m512 y2 = _mm512_add_ps(round_bf16(_mm512_mul_ps(x2, c2)),
                                                round_bf16(_mm512_mul_ps(x1, s2)));
                store_bf16(row + i, y1, m);
                store_bf16(row + half + i, y2, m);
            }
        }
    }
}

/*
 * out[r][i] = bf16(bf16(silu(g)) * u) with g = gate_up[r][i], u = gate_up[r][inter + i] and
 * silu(g) = g / (1 + e^-g) in float32, as torch's silu then mul_ in bf16.
 */
void pc_silu_and_mul(const bf16 *gate_up, int64_t gate_up_stride, bf16 *out,
                     int64_t out_stride, int64_t rows, int64_t inter, int num_threads) {
#pragma omp parallel for num_threads(team(rows * inter, num_threads)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *gate = gate_up + r * gate_up_stride, *up = gate + inter;
        bf16 *dst = out + r * out_stride;
        for (int64_t i = 0; i < inter; i += 16) {
            const __mmask16 m = lanes(inter - i);
            store_bf16(dst + i, silu_and_mul(load_bf16(gate + i, m), load_bf16(up + i, m)), m);
        }
    }
}

/*
 * Copies token t's keys and values (num_kv_heads rows of head_dim, at the given token and head
 * strides) into flat slot slots[t] of a bf16 pool [num_slots][num_kv_heads][head_dim]; slot -1
 * skips the token. Returns 0, or -1 (nothing written) when a slot is outside [-1, num_slots).
 */
int pc_store_kv(const bf16 *k, int64_t k_token_stride, int64_t k_head_stride, const bf16 *v,
                int64_t v_token_stride, int64_t v_head_stride, bf16 *k_cache, bf16 *v_cache,
                const int64_t *slots, int64_t tokens, int64_t num_kv_heads, int64_t head_dim,
                int64_t num_slots) {
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] < -1 || slots[t] >= num_slots) return -1;
    const int64_t row_bytes = head_dim * (int64_t)sizeof(bf16);
    const int64_t slot_elements = num_kv_heads * head_dim;
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        bf16 *kd = k_cache + slots[t] * slot_elements, *vd = v_cache + slots[t] * slot_elements;
        for (int64_t h = 0; h < num_kv_heads; h++) {
            memcpy(kd + h * head_dim, k + t * k_token_stride + h * k_head_stride, row_bytes);
            memcpy(vd + h * head_dim, v + t * v_token_stride + h * v_head_stride, row_bytes);
        }
    }
    return 0;
}

/*
 * Copy-on-write copies in every pool at once: pools[i] holds num_blocks blocks of block_bytes
 * bytes; for each pair p, the first bytes[p] bytes of block pairs[2p] (bytes NULL: all
 * block_bytes) are copied into block pairs[2p + 1] in every pool, the pairs in order. Returns
 * 0, or -1 (nothing copied) for a block id outside [0, num_blocks) or a byte count outside
 * [0, block_bytes].
 */
int pc_copy_blocks(char *const *pools, int64_t num_pools, int64_t block_bytes,
                   int64_t num_blocks, const int64_t *pairs, int64_t num_pairs,
                   const int64_t *bytes) {
    for (int64_t i = 0; i < 2 * num_pairs; i++)
        if (pairs[i] < 0 || pairs[i] >= num_blocks) return -1;
    for (int64_t p = 0; bytes && p < num_pairs; p++)
        if (bytes[p] < 0 || bytes[p] > block_bytes) return -1;
    for (int64_t pool = 0; pool < num_pools; pool++)
        for (int64_t p = 0; p < num_pairs; p++)
            memcpy(pools[pool] + pairs[2 * p + 1] * block_bytes,
                   pools[pool] + pairs[2 * p] * block_bytes,
                   (size_t)(bytes ? bytes[p] : block_bytes));
    return 0;
}
