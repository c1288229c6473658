/*
 * Paged attention in float32 for x86-64 CPUs with AVX2 and FMA: float32 queries over a
 * float32 KV pool, the engine's path when it computes in float32 (its default on CPUs without
 * native bf16 dot products, such as AMD Zen 2/3 and most Intel client chips). No AVX-512.
 *
 * Flash-attention style: online softmax in float32, the score matrix is never materialized.
 * The query rows of a kv head are (query token, query head of the group) pairs, so a GQA
 * group's heads share one read of K/V. Rows sit in the vector lanes (8 a ymm, a tile of RV
 * ymm = 8, 16 or 24 rows), so keys and values are read straight from the pool, one float at a
 * time, as broadcasts, and nothing of the pool is ever transposed or copied:
 *
 *   S[j] (8 rows a ymm)   = sum_d Qt[d] * k_j[d]      (Qt: the tile's queries transposed,
 *                                                      scaled by scale * log2 e)
 *   online softmax on S, per lane (exp2 polynomial)
 *   Ot[d] (8 rows a ymm) += sum_j P[j] * v_j[d]       (Ot: the output transposed, in L1)
 *
 * so the softmax's row maxima and sums are lane-wise vector operations. A tile of 24 rows
 * scores 4 keys at a time and updates 4 output dims at a time (12 accumulators each); a tile
 * of 16 rows 6 keys (12) and 4 dims (8); a tile of 8 rows 12 keys and 8 dims. A tile of one
 * query token's heads (a decode step) turns this around, keys in the lanes
 * (attend_token_rows), with the same arithmetic.
 *
 * Key j of a sequence is cache token j for j < ncache (found through the block table), else
 * new token (qs + j - ncache) of k/v. Query token t sees keys [0, lim0 + t): prefill
 * lim0 = ncache + 1 (the cached keys and itself), decode lim0 = the sequence's cached length.
 * Work items are row tiles of one (sequence, kv head), taken dynamically by the threads.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd_math_avx2.h"

#define KB 48      /* keys per online-softmax step: a multiple of 6 and of 12 */
#define MAX_D 256  /* largest head_dim (a multiple of 8) */
#define TILE 24    /* rows of the widest tile (RV = 3 ymm) */
#define LOG2E 1.44269504088896341f

#define INLINE static inline __attribute__((always_inline))

/* the row of the keys and values a block is padded with past its last key */
static const float zero_row[MAX_D] __attribute__((aligned(32)));

typedef struct {
    int64_t qs; /* row of the sequence's first query token in q / out / k / v */
    int nq;     /* query tokens */
    int ncache; /* keys read from the cache */
    int lim0;   /* keys visible to query token 0 */
} seq_info;

typedef struct {
    int seq, kh, r0, r1; /* rows [r0, r1) of kv head kh of sequence seq (at most TILE) */
} tile_item;

typedef struct {
    const float *q, *k, *v, *k_cache, *v_cache;
    int64_t q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head;
    const int32_t *block_tables;
    int64_t bt_row;
    float *out;
    const seq_info *seqs;
    int num_kv_heads, group, head_dim, block_size;
    float qscale; /* scale * log2 e */
} attention_args;

/* The rows of keys [j0, j0 + n) of kv head kh of sequence s and of their values: pool rows
 * (through the block table, one division for the run) for cached keys, else new-token rows. */
INLINE void key_rows(const attention_args *a, int s, int kh, int j0, int n, const float **krow,
                     const float **vrow) {
    const seq_info *si = &a->seqs[s];
    const int32_t *table = a->block_tables + (int64_t)s * a->bt_row;
    const int64_t row = (int64_t)a->num_kv_heads * a->head_dim; /* floats per pool slot */
    int block = j0 / a->block_size, slot = j0 % a->block_size, j = 0;
    for (; j < n && j0 + j < si->ncache; j++) {
        const int64_t at = ((int64_t)table[block] * a->block_size + slot) * row + kh * a->head_dim;
        krow[j] = a->k_cache + at;
        vrow[j] = a->v_cache + at;
        if (++slot == a->block_size) slot = 0, block++;
    }
    for (; j < n; j++) {
        const int64_t t = si->qs + j0 + j - si->ncache;
        krow[j] = a->k + t * a->k_tok + kh * a->k_head;
        vrow[j] = a->v + t * a->v_tok + kh * a->v_head;
    }
}

/* One row tile: RV ymm of rows (8 * RV lanes), NKQ keys scored at a time, NDV output dims
 * updated at a time (RV * NKQ and RV * NDV accumulators). */
INLINE void attend_tile(const attention_args *a, const tile_item *it, const int RV,
                        const int NKQ, const int NDV) {
    const int D = a->head_dim, group = a->group, lanes = 8 * RV;
    const seq_info *si = &a->seqs[it->seq];
    const int n = it->r1 - it->r0;
    float qt[MAX_D * TILE] __attribute__((aligned(32)));  /* [D][lanes] */
    float ot[MAX_D * TILE] __attribute__((aligned(32)));  /* [D][lanes] */
    float sp[KB * TILE] __attribute__((aligned(32)));     /* [KB][lanes]: scores, then P */
    int32_t lim[TILE] __attribute__((aligned(32)));
    const float *krow[KB], *vrow[KB];

    for (int i = 0; i < lanes; i++) { /* lanes past the tile repeat its last row */
        const int row = it->r0 + (i < n ? i : n - 1), t = row / group;
        const int head = it->kh * group + row % group;
        const float *src = a->q + (si->qs + t) * a->q_tok + head * a->q_head;
        for (int d = 0; d < D; d++) qt[d * lanes + i] = src[d] * a->qscale;
        lim[i] = si->lim0 + t;
    }
    for (int i = 0; i < D * lanes; i++) ot[i] = 0.0f;
    const int lim_min = lim[0], lim_max = lim[lanes - 1];
    __m256 m[3], l[3];
    __m256i limv[3];
    for (int rv = 0; rv < RV; rv++) {
        m[rv] = _mm256_set1_ps(-INFINITY);
        l[rv] = _mm256_setzero_ps();
        limv[rv] = _mm256_load_si256((const __m256i *)(lim + 8 * rv));
    }

    for (int kb0 = 0; kb0 < lim_max; kb0 += KB) {
        const int nk = lim_max - kb0 < KB ? lim_max - kb0 : KB;
        const int nkp = (nk + NKQ - 1) / NKQ * NKQ; /* keys scored, padded with zero rows */
        key_rows(a, it->seq, it->kh, kb0, nk, krow, vrow);
        for (int j = nk; j < nkp; j++) krow[j] = vrow[j] = zero_row;
        /* S = Qt . K: NKQ keys x RV row vectors at a time */
        for (int j0 = 0; j0 < nkp; j0 += NKQ) {
            __m256 acc[12][3];
            for (int j = 0; j < NKQ; j++)
                for (int rv = 0; rv < RV; rv++) acc[j][rv] = _mm256_setzero_ps();
            for (int d = 0; d < D; d++) {
                __m256 qv[3];
                for (int rv = 0; rv < RV; rv++) qv[rv] = _mm256_load_ps(qt + d * lanes + 8 * rv);
                for (int j = 0; j < NKQ; j++) {
                    const __m256 kd = _mm256_broadcast_ss(krow[j0 + j] + d);
                    for (int rv = 0; rv < RV; rv++)
                        acc[j][rv] = _mm256_fmadd_ps(qv[rv], kd, acc[j][rv]);
                }
            }
            for (int j = 0; j < NKQ; j++)
                for (int rv = 0; rv < RV; rv++)
                    _mm256_store_ps(sp + (j0 + j) * lanes + 8 * rv, acc[j][rv]);
        }
        /* keys past a row's limit (and the padding) score -inf */
        if (kb0 + nkp > lim_min) {
            for (int j = 0; j < nkp; j++) {
                const __m256i key = _mm256_set1_epi32(kb0 + j);
                for (int rv = 0; rv < RV; rv++) {
                    const __m256 seen = _mm256_castsi256_ps(_mm256_cmpgt_epi32(limv[rv], key));
                    float *s = sp + j * lanes + 8 * rv;
                    _mm256_store_ps(s, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY),
                                                        _mm256_load_ps(s), seen));
                }
            }
        }
        /* online softmax, lane-wise; every row sees key 0, so m is finite after block 0 */
        __m256 alpha[3];
        for (int rv = 0; rv < RV; rv++) {
            __m256 bm = _mm256_set1_ps(-INFINITY);
            for (int j = 0; j < nkp; j++) bm = _mm256_max_ps(bm, _mm256_load_ps(sp + j * lanes + 8 * rv));
            const __m256 m_new = _mm256_max_ps(m[rv], bm);
            alpha[rv] = exp2_avx2(_mm256_sub_ps(m[rv], m_new));
            __m256 sum = _mm256_setzero_ps();
            for (int j = 0; j < nkp; j++) {
                float *s = sp + j * lanes + 8 * rv;
                const __m256 p = exp2_avx2(_mm256_sub_ps(_mm256_load_ps(s), m_new));
                _mm256_store_ps(s, p);
                sum = _mm256_add_ps(sum, p);
            }
            l[rv] = _mm256_fmadd_ps(l[rv], alpha[rv], sum);
            m[rv] = m_new;
        }
        /* Ot = alpha Ot + P V: NDV dims x RV row vectors at a time */
        for (int d0 = 0; d0 < D; d0 += NDV) {
            __m256 acc[8][3];
            for (int d = 0; d < NDV; d++)
                for (int rv = 0; rv < RV; rv++)
                    acc[d][rv] = _mm256_mul_ps(_mm256_load_ps(ot + (d0 + d) * lanes + 8 * rv),
                                               alpha[rv]);
            for (int j = 0; j < nkp; j++) {
                __m256 p[3];
                for (int rv = 0; rv < RV; rv++) p[rv] = _mm256_load_ps(sp + j * lanes + 8 * rv);
                for (int d = 0; d < NDV; d++) {
                    const __m256 vd = _mm256_broadcast_ss(vrow[j] + d0 + d);
                    for (int rv = 0; rv < RV; rv++)
                        acc[d][rv] = _mm256_fmadd_ps(p[rv], vd, acc[d][rv]);
                }
            }
            for (int d = 0; d < NDV; d++)
                for (int rv = 0; rv < RV; rv++)
                    _mm256_store_ps(ot + (d0 + d) * lanes + 8 * rv, acc[d][rv]);
        }
    }

    float inv[TILE] __attribute__((aligned(32)));
    for (int rv = 0; rv < RV; rv++)
        _mm256_store_ps(inv + 8 * rv, _mm256_div_ps(_mm256_set1_ps(1.0f), l[rv]));
    for (int i = 0; i < n; i++) {
        const int row = it->r0 + i, t = row / group, head = it->kh * group + row % group;
        float *dst = a->out + (si->qs + t) * a->o_tok + head * a->o_head;
        for (int d = 0; d < D; d++) dst[d] = ot[d * lanes + i] * inv[i];
    }
}

/* 8 vectors of 8 floats transposed in place: r[d] lane j <- r[j] lane d. */
INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* A tile whose rows are one query token's heads (at most 8, head_dim a multiple of 64): the
 * keys in the lanes instead of the rows, each key and value row read whole, so a decode step's
 * 1-8 rows fill the vectors. The arithmetic is attend_tile's, operation for operation (the
 * same dot products summed over d in order, the same KB-key softmax steps, the same sums over
 * keys in order), so its outputs are bitwise attend_tile's. */
static void attend_token_rows(const attention_args *a, const tile_item *it) {
    const int D = a->head_dim, group = a->group, n = it->r1 - it->r0;
    const seq_info *si = &a->seqs[it->seq];
    const int t = it->r0 / group, lim = si->lim0 + t;
    float q[8][MAX_D] __attribute__((aligned(32)));
    float o[8][MAX_D] __attribute__((aligned(32)));
    float sp[8][KB] __attribute__((aligned(32))); /* [rows][keys]: scores, then P */
    float m[8], l[8];
    const float *krow[KB], *vrow[KB];
    for (int i = 0; i < n; i++) {
        const int head = it->kh * group + (it->r0 + i) % group;
        const float *src = a->q + (si->qs + t) * a->q_tok + head * a->q_head;
        for (int d = 0; d < D; d++) {
            q[i][d] = src[d] * a->qscale;
            o[i][d] = 0.0f;
        }
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    for (int kb0 = 0; kb0 < lim; kb0 += KB) {
        const int nk = lim - kb0 < KB ? lim - kb0 : KB;
        const int nkp = (nk + 7) / 8 * 8;
        key_rows(a, it->seq, it->kh, kb0, nk, krow, vrow);
        for (int j = nk; j < nkp; j++) krow[j] = vrow[j] = zero_row;
        /* S = q . K, 8 keys at a time: 8x8 blocks of K transposed, dims in order */
        for (int j0 = 0; j0 < nkp; j0 += 8) {
            __m256 acc[8];
            for (int i = 0; i < n; i++) acc[i] = _mm256_setzero_ps();
            for (int d0 = 0; d0 < D; d0 += 8) {
                __m256 kt[8];
                for (int j = 0; j < 8; j++) kt[j] = _mm256_loadu_ps(krow[j0 + j] + d0);
                transpose8(kt);
                for (int i = 0; i < n; i++)
                    for (int d = 0; d < 8; d++)
                        acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(&q[i][d0 + d]), kt[d], acc[i]);
            }
            const __m256i key = _mm256_add_epi32(_mm256_set1_epi32(kb0 + j0),
                                                 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            const __m256 seen = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(lim), key));
            for (int i = 0; i < n; i++)
                _mm256_store_ps(&sp[i][j0],
                                _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), acc[i], seen));
        }
        for (int i = 0; i < n; i++) {
            __m256 bm = _mm256_set1_ps(-INFINITY);
            for (int j0 = 0; j0 < nkp; j0 += 8) bm = _mm256_max_ps(bm, _mm256_load_ps(&sp[i][j0]));
            float lane[8] __attribute__((aligned(32)));
            _mm256_store_ps(lane, bm);
            float m_new = m[i];
            for (int j = 0; j < 8; j++) m_new = lane[j] > m_new ? lane[j] : m_new;
            _mm256_store_ps(lane, exp2_avx2(_mm256_set1_ps(m[i] - m_new)));
            const float alpha = lane[0];
            float sum = 0.0f;
            for (int j0 = 0; j0 < nkp; j0 += 8) {
                const __m256 p = exp2_avx2(_mm256_sub_ps(_mm256_load_ps(&sp[i][j0]),
                                                         _mm256_set1_ps(m_new)));
                _mm256_store_ps(&sp[i][j0], p);
                for (int j = 0; j < 8; j++) sum += sp[i][j0 + j];
            }
            l[i] = fmaf(l[i], alpha, sum);
            m[i] = m_new;
            /* O = alpha O + P V, 64 dims (8 vectors) at a time, keys in order */
            for (int d0 = 0; d0 < D; d0 += 64) {
                __m256 acc[8];
                for (int c = 0; c < 8; c++)
                    acc[c] = _mm256_mul_ps(_mm256_load_ps(&o[i][d0 + 8 * c]), _mm256_set1_ps(alpha));
                for (int j = 0; j < nkp; j++) {
                    const __m256 p = _mm256_broadcast_ss(&sp[i][j]);
                    for (int c = 0; c < 8; c++)
                        acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vrow[j] + d0 + 8 * c), acc[c]);
                }
                for (int c = 0; c < 8; c++) _mm256_store_ps(&o[i][d0 + 8 * c], acc[c]);
            }
        }
    }
    for (int i = 0; i < n; i++) {
        const float inv = 1.0f / l[i]; /* rounded as attend_tile's vector division */
        const int head = it->kh * group + (it->r0 + i) % group;
        float *dst = a->out + (si->qs + t) * a->o_tok + head * a->o_head;
        for (int d = 0; d < D; d++) dst[d] = o[i][d] * inv;
    }
}

static void run_tile(const attention_args *a, const tile_item *it) {
    const int n = it->r1 - it->r0;
    if (n <= 8 && a->head_dim % 64 == 0 && it->r0 / a->group == (it->r1 - 1) / a->group)
        attend_token_rows(a, it);
    else if (n > 16)
        attend_tile(a, it, 3, 4, 4);
    else if (n > 8)
        attend_tile(a, it, 2, 6, 4);
    else
        attend_tile(a, it, 1, 12, 8);
}

/*
 * out[t, h, :] = softmax(scale * q[t, h] . keys) . values over the keys query token t sees.
 *
 * q [num_tokens, num_heads, head_dim], k / v [num_tokens, num_kv_heads, head_dim] (the new
 * tokens' keys and values, prefill only), out [num_tokens, num_heads, head_dim]: float32
 * with the given token and head strides and unit stride along head_dim. k_cache / v_cache
 * [num_blocks, block_size, num_kv_heads, head_dim] float32, contiguous. block_tables int32
 * [num_seqs, >= max_blocks] with row stride bt_row.
 * Prefill (starts != NULL): sequence s has query tokens [starts[s], starts[s + 1]) after
 * lens[s] cached ones; token t of it sees the cached keys and the new ones up to itself.
 * Decode (starts == NULL): sequence s has query token s, which sees its lens[s] cached keys
 * (the current token's among them); with lens[s] == 0 its output is 0.
 * Returns 0, or -1 bad starts, -2 a bad length, -3 block_tables too narrow, -4 a block id
 * outside [0, num_blocks), -5 out of memory.
 */
int pa_f32_attention(const float *q, int64_t q_tok, int64_t q_head, const float *k,
                     int64_t k_tok, int64_t k_head, const float *v, int64_t v_tok,
                     int64_t v_head, const float *k_cache, const float *v_cache,
                     int64_t num_blocks, const int32_t *block_tables, int64_t bt_row,
                     int64_t max_blocks, const int32_t *starts, const int32_t *lens,
                     int num_seqs, int64_t num_tokens, float *out, int64_t o_tok,
                     int64_t o_head, int num_heads, int num_kv_heads, int head_dim,
                     int block_size, float scale, int num_threads) {
    seq_info *seqs = malloc(sizeof(seq_info) * (size_t)(num_seqs > 0 ? num_seqs : 1));
    if (!seqs) return -5;
    const int group = num_heads / num_kv_heads;
    int64_t num_items = 0;
    int status = 0;
    for (int s = 0; s < num_seqs && !status; s++) {
        seq_info *si = &seqs[s];
        if (starts) {
            if (starts[s] < 0 || starts[s + 1] < starts[s] || starts[s + 1] > num_tokens)
                status = -1;
            si->qs = starts[s];
            si->nq = starts[s + 1] - starts[s];
            si->ncache = lens[s];
            si->lim0 = lens[s] + 1;
            if (lens[s] < 0) status = -2;
        } else { /* a sequence with nothing cached attends to nothing: its output is 0 */
            si->qs = s;
            si->nq = lens[s] > 0;
            si->ncache = si->lim0 = lens[s];
            if (lens[s] < 0 || s >= num_tokens) status = -2;
            for (int h = 0; h < num_heads && !status && !si->nq; h++)
                for (int d = 0; d < head_dim; d++) out[s * o_tok + h * o_head + d] = 0.0f;
        }
        if (status) break;
        const int64_t used = ((int64_t)si->ncache + block_size - 1) / block_size;
        if (used > max_blocks) status = -3;
        for (int64_t b = 0; b < used && !status; b++) {
            const int32_t id = block_tables[(int64_t)s * bt_row + b];
            if (id < 0 || id >= num_blocks) status = -4;
        }
        if (si->nq > 0) num_items += num_kv_heads * (((int64_t)si->nq * group + TILE - 1) / TILE);
    }
    tile_item *items = status ? NULL : malloc(sizeof(tile_item) * (size_t)(num_items + 1));
    if (!status && !items) status = -5;
    if (status) {
        free(seqs);
        free(items);
        return status;
    }
    int64_t next = 0;
    for (int s = 0; s < num_seqs; s++) {
        const int rows = seqs[s].nq * group;
        for (int kh = 0; kh < num_kv_heads; kh++)
            for (int r0 = 0; r0 < rows; r0 += TILE)
                items[next++] = (tile_item){s, kh, r0, r0 + TILE < rows ? r0 + TILE : rows};
    }
    const attention_args args = {
        q, k, v, k_cache, v_cache, q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head,
        block_tables, bt_row, out, seqs, num_kv_heads, group, head_dim, block_size,
        scale * LOG2E,
    };
    /* costliest first (the most keys), so the dynamic schedule ends evenly */
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t i = 0; i < num_items; i++) run_tile(&args, &items[num_items - 1 - i]);
    free(items);
    free(seqs);
    return 0;
}
