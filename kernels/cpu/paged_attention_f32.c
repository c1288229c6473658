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
 * of 16 rows 6 keys (12) and 4 dims (8); a tile of 8 rows 12 keys and 8 dims. A sequence
 * with one query token (a decode step) turns this around, keys in the lanes, with the same
 * arithmetic (attend_token_heads); its work item takes up to TOKEN_HEADS kv heads together
 * when the batch has sequences enough, so each pool slot's heads are read as one run.
 *
 * Key j of a sequence is cache token j for j < ncache (found through the block table), else
 * new token (qs + j - ncache) of k/v. Query token t sees keys [0, lim0 + t): prefill
 * lim0 = ncache + 1 (the cached keys and itself), decode lim0 = the sequence's cached length.
 * Work items are up to TILES_PER_ITEM row tiles of one (sequence, kv head), which take each
 * step of keys in turn (its rows found and read once for them all), or a token's rows over
 * some kv heads; the threads take them dynamically.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_kernels_f32.h"
#include "simd_math_avx2.h"
#include "thread_scratch.h"

#define KB 48      /* keys per online-softmax step: a multiple of 6 and of 12 */
#define MAX_D 256  /* largest head_dim (a multiple of 8) */
#define TILE 24    /* rows of the widest tile (RV = 3 ymm) */
#define TILES_PER_ITEM 4 /* row tiles a work item takes together, at most */
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

#define TOKEN_HEADS 4 /* kv heads a token item takes together, at most */

typedef struct {
    int seq, kh, r0, r1; /* rows [r0, r1) of kv head kh of sequence seq */
    int nkh;             /* kv heads [kh, kh + nkh) (a token item; 1 for a row tile) */
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

INLINE int min_int(int x, int y) { return x < y ? x : y; }

/* Reads the first n key rows of a step and then their value rows, a load per cache line,
 * before the tile computes on them. These are cached keys: pool slots scattered block by
 * block, one kv head's part of each slot, an order the hardware prefetchers follow
 * slowly, so the tile's loads, mixed with its FMAs, waited on memory one line at a time when
 * a layer's pool comes from memory (a warm prefill reads each layer's once); loads issued
 * together overlap their waits. */
INLINE void read_pool_rows(const float *const *krow, const float *const *vrow, int n, int D) {
    for (int j = 0; j < n; j++)
        for (int d = 0; d < D; d += 16) (void)*(const volatile float *)(krow[j] + d);
    for (int j = 0; j < n; j++)
        for (int d = 0; d < D; d += 16) (void)*(const volatile float *)(vrow[j] + d);
}

/* A row tile's state across the steps of its item: RV ymm of rows (8 * RV lanes), its
 * queries and output transposed, its rows' key limits, online-softmax maxima and sums. */
typedef struct {
    int32_t lim[TILE] __attribute__((aligned(32)));
    __m256 m[3], l[3];
    float *qt, *ot; /* [D][lanes] each */
    int r0, n, rv, lim_min, lim_max;
} row_tile;

/* Rows [r0, r0 + n) of the item's kv head as a tile, qt and ot its [D][TILE] scratch. */
static void tile_begin(const attention_args *a, const tile_item *it, int r0, int n, float *qt,
                       float *ot, row_tile *tl) {
    const int D = a->head_dim, group = a->group;
    const seq_info *si = &a->seqs[it->seq];
    const int rv = n > 16 ? 3 : n > 8 ? 2 : 1, lanes = 8 * rv;
    for (int i = 0; i < lanes; i++) { /* lanes past the tile repeat its last row */
        const int row = r0 + (i < n ? i : n - 1), t = row / group;
        const int head = it->kh * group + row % group;
        const float *src = a->q + (si->qs + t) * a->q_tok + head * a->q_head;
        for (int d = 0; d < D; d++) qt[d * lanes + i] = src[d] * a->qscale;
        tl->lim[i] = si->lim0 + t;
    }
    for (int i = 0; i < D * lanes; i++) ot[i] = 0.0f;
    for (int r = 0; r < rv; r++) {
        tl->m[r] = _mm256_set1_ps(-INFINITY);
        tl->l[r] = _mm256_setzero_ps();
    }
    tl->qt = qt, tl->ot = ot, tl->r0 = r0, tl->n = n, tl->rv = rv;
    tl->lim_min = tl->lim[0], tl->lim_max = tl->lim[lanes - 1];
}

/* One KB-key step of a tile, keys [kb0, kb0 + KB) (rows step_k / step_v of them, as many
 * as the item's step holds): the tile takes those below its own last limit, padded with
 * zero rows to a multiple of NKQ, so its arithmetic does not depend on the other tiles of
 * its item. NKQ keys are scored at a time, NDV output dims updated at a time (RV * NKQ and
 * RV * NDV accumulators); sp is [KB][lanes] scratch. */
INLINE void tile_step(row_tile *tl, const float *const *step_k, const float *const *step_v,
                      int kb0, int D, float *sp, const int RV, const int NKQ, const int NDV) {
    const int lanes = 8 * RV;
    const int nk = tl->lim_max - kb0 < KB ? tl->lim_max - kb0 : KB;
    const int nkp = (nk + NKQ - 1) / NKQ * NKQ; /* keys scored, padded with zero rows */
    const float *krow[KB], *vrow[KB];
    for (int j = 0; j < nk; j++) krow[j] = step_k[j], vrow[j] = step_v[j];
    for (int j = nk; j < nkp; j++) krow[j] = vrow[j] = zero_row;
    const float *qt = tl->qt;
    float *ot = tl->ot;
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
    if (kb0 + nkp > tl->lim_min) {
        for (int j = 0; j < nkp; j++) {
            const __m256i key = _mm256_set1_epi32(kb0 + j);
            for (int rv = 0; rv < RV; rv++) {
                const __m256i limv = _mm256_load_si256((const __m256i *)(tl->lim + 8 * rv));
                const __m256 seen = _mm256_castsi256_ps(_mm256_cmpgt_epi32(limv, key));
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
        const __m256 m_new = _mm256_max_ps(tl->m[rv], bm);
        alpha[rv] = exp2_avx2(_mm256_sub_ps(tl->m[rv], m_new));
        __m256 sum = _mm256_setzero_ps();
        for (int j = 0; j < nkp; j++) {
            float *s = sp + j * lanes + 8 * rv;
            const __m256 p = exp2_avx2(_mm256_sub_ps(_mm256_load_ps(s), m_new));
            _mm256_store_ps(s, p);
            sum = _mm256_add_ps(sum, p);
        }
        tl->l[rv] = _mm256_fmadd_ps(tl->l[rv], alpha[rv], sum);
        tl->m[rv] = m_new;
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

/* The tile's output rows: Ot / l, transposed back. */
static void tile_end(const attention_args *a, const tile_item *it, const row_tile *tl) {
    const int D = a->head_dim, group = a->group, lanes = 8 * tl->rv;
    const seq_info *si = &a->seqs[it->seq];
    float inv[TILE] __attribute__((aligned(32)));
    for (int rv = 0; rv < tl->rv; rv++)
        _mm256_store_ps(inv + 8 * rv, _mm256_div_ps(_mm256_set1_ps(1.0f), tl->l[rv]));
    for (int i = 0; i < tl->n; i++) {
        const int row = tl->r0 + i, t = row / group, head = it->kh * group + row % group;
        float *dst = a->out + (si->qs + t) * a->o_tok + head * a->o_head;
        for (int d = 0; d < D; d++) dst[d] = tl->ot[d * lanes + i] * inv[i];
    }
}

static __thread void *tls_tiles = NULL; /* the row tiles' qt / ot, kept by each thread */
static __thread int64_t tls_tiles_bytes = 0;

/* A row item: rows [r0, r1) of one (sequence, kv head), up to TILES_PER_ITEM row tiles of
 * TILE rows. The tiles take each KB-key step in turn, so the step's key and value rows are
 * found and read from the pool once for all of them, where a tile alone read every cached
 * row again, from L3 or memory, for each 24 rows. Returns -5 when out of memory. */
static int attend_rows(const attention_args *a, const tile_item *it) {
    const int D = a->head_dim, rows = it->r1 - it->r0, ntiles = (rows + TILE - 1) / TILE;
    const seq_info *si = &a->seqs[it->seq];
    if (ntiles < 1) return 0;
    float *scratch = grow_buffer(&tls_tiles, &tls_tiles_bytes,
                                 (int64_t)ntiles * 2 * D * TILE * (int64_t)sizeof(float));
    if (!scratch) return -5;
    row_tile tiles[TILES_PER_ITEM];
    for (int t = 0; t < ntiles; t++) {
        const int r0 = it->r0 + t * TILE;
        tile_begin(a, it, r0, it->r1 - r0 < TILE ? it->r1 - r0 : TILE,
                   scratch + (int64_t)2 * t * D * TILE, scratch + (int64_t)(2 * t + 1) * D * TILE,
                   &tiles[t]);
    }
    float sp[KB * TILE] __attribute__((aligned(32))); /* [KB][lanes]: scores, then P */
    const float *krow[KB], *vrow[KB];
    const int lim_max = tiles[ntiles - 1].lim_max; /* later rows are later tokens */
    for (int kb0 = 0; kb0 < lim_max; kb0 += KB) {
        const int nk = lim_max - kb0 < KB ? lim_max - kb0 : KB;
        key_rows(a, it->seq, it->kh, kb0, nk, krow, vrow);
        read_pool_rows(krow, vrow, kb0 < si->ncache ? min_int(nk, si->ncache - kb0) : 0, D);
        for (int t = 0; t < ntiles; t++) {
            row_tile *tl = &tiles[t];
            if (kb0 >= tl->lim_max) continue;
            if (tl->rv == 3)
                tile_step(tl, krow, vrow, kb0, D, sp, 3, 4, 4);
            else if (tl->rv == 2)
                tile_step(tl, krow, vrow, kb0, D, sp, 2, 6, 4);
            else
                tile_step(tl, krow, vrow, kb0, D, sp, 1, 12, 8);
        }
    }
    for (int t = 0; t < ntiles; t++) tile_end(a, it, &tiles[t]);
    return 0;
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

/* Scores of rows [i0, i0 + R) of a token's scaled queries q against key vectors [v0, v0 + V)
 * (8 keys each) of kt, a block of keys transposed ([D][KB]: kt[d * KB + j] = k_j[d]):
 * sp[i][8 v0 ...]. Each score is one FMA chain over d in order, as in attend_tile; the R * V
 * chains run side by side (R * V + R + 1 ymm registers). */
INLINE void token_scores(const float (*q)[MAX_D], const float *kt, int D, int i0, int v0,
                         float (*sp)[KB], const int R, const int V) {
    __m256 acc[3][6];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) acc[r][v] = _mm256_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m256 qd[3];
        for (int r = 0; r < R; r++) qd[r] = _mm256_broadcast_ss(&q[i0 + r][d]);
        for (int v = 0; v < V; v++) {
            const __m256 kd = _mm256_load_ps(kt + d * KB + 8 * (v0 + v));
            for (int r = 0; r < R; r++) acc[r][v] = _mm256_fmadd_ps(qd[r], kd, acc[r][v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) _mm256_store_ps(&sp[i0 + r][8 * (v0 + v)], acc[r][v]);
}

/* O = alpha O + P V for rows [i0, i0 + R) and dims [d0, d0 + 32) of a token's output o, over
 * the step's nkp keys in order (each element one FMA chain, as in attend_tile). */
INLINE void token_values(const float *const *vrow, const float (*sp)[KB], const float *alpha,
                         float (*o)[MAX_D], int i0, int d0, int nkp, const int R) {
    __m256 acc[3][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            acc[r][c] = _mm256_mul_ps(_mm256_load_ps(&o[i0 + r][d0 + 8 * c]),
                                      _mm256_set1_ps(alpha[i0 + r]));
    for (int j = 0; j < nkp; j++) {
        __m256 p[3];
        for (int r = 0; r < R; r++) p[r] = _mm256_broadcast_ss(&sp[i0 + r][j]);
        for (int c = 0; c < 4; c++) {
            const __m256 vd = _mm256_loadu_ps(vrow[j] + d0 + 8 * c);
            for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(p[r], vd, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) _mm256_store_ps(&o[i0 + r][d0 + 8 * c], acc[r][c]);
}

/* One kv head's part of a token item: its rows' scaled queries, output and softmax state, and
 * the key and value rows of the current KB-key step. */
typedef struct {
    float q[8][MAX_D] __attribute__((aligned(32)));
    float o[8][MAX_D] __attribute__((aligned(32)));
    float m[8] __attribute__((aligned(32))), alpha[8] __attribute__((aligned(32)));
    __m256 l; /* the rows' softmax denominators, a row a lane */
    const float *krow[KB], *vrow[KB];
} token_head;

/* Reads a step's key and value rows once, a load per cache line, in address order: key by key,
 * its keys of every head of the item (one pool slot's run), then its values. Pool blocks lie
 * scattered, and the kernel's own reads (8 keys of one head at a time) leave the hardware
 * prefetchers idle: a step then waited on memory line by line, and software prefetches did
 * not help. Read this way first, the step's rows stream in (with the grouping of kv heads,
 * cpu_attention_f32.py's decode of 32 sequences over 30 layers' pools: 3.23 -> 2.00 ms a
 * layer). */
static void read_step_rows(const token_head *heads, int nkh, int nk, int D) {
    for (int j = 0; j < nk; j++) {
        for (int h = 0; h < nkh; h++)
            for (int d = 0; d < D; d += 16) (void)*(const volatile float *)(heads[h].krow[j] + d);
        for (int h = 0; h < nkh; h++)
            for (int d = 0; d < D; d += 16) (void)*(const volatile float *)(heads[h].vrow[j] + d);
    }
}

/* One KB-key step of kv head h's rows (n of them): kt/sp are scratch. */
static void token_head_step(const attention_args *a, token_head *h, int n, int nk, float *kt,
                            float (*sp)[KB]) {
    const int D = a->head_dim;
    /* keys the step transposes: its scoring passes read 24 (3 rows) or 48 (1-2 rows) at a time */
    const int pass_keys = n % 3 ? KB : 24;
    const int nkp = (nk + 7) / 8 * 8, nkt = (nkp + pass_keys - 1) / pass_keys * pass_keys;
    const float **krow = h->krow, **vrow = h->vrow;
    for (int j = nk; j < nkt; j++) krow[j] = vrow[j] = zero_row;
    for (int j0 = 0; j0 < nkt; j0 += 8) {
        for (int d0 = 0; d0 < D; d0 += 8) {
            __m256 kd[8];
            for (int j = 0; j < 8; j++) kd[j] = _mm256_loadu_ps(krow[j0 + j] + d0);
            transpose8(kd);
            for (int d = 0; d < 8; d++) _mm256_store_ps(kt + (d0 + d) * KB + j0, kd[d]);
        }
    }
    /* S = q . K: up to 3 rows against 24 keys, or 1-2 rows against 48, per pass */
    for (int i0 = 0; i0 < n; i0 += 3) {
        const int rows_left = n - i0;
        for (int v0 = 0; 8 * v0 < nkp; v0 += rows_left >= 3 ? 3 : 6) {
            if (rows_left >= 3)
                token_scores(h->q, kt, D, i0, v0, sp, 3, 3);
            else if (rows_left == 2)
                token_scores(h->q, kt, D, i0, v0, sp, 2, 6);
            else
                token_scores(h->q, kt, D, i0, v0, sp, 1, 6);
        }
    }
    /* keys past the last one (the padding up to 8) score -inf */
    for (int i = 0; i < n; i++)
        for (int j = nk; j < nkp; j++) sp[i][j] = -INFINITY;
    for (int i = 0; i < n; i++) {
        __m256 bm = _mm256_set1_ps(-INFINITY);
        for (int j0 = 0; j0 < nkp; j0 += 8) bm = _mm256_max_ps(bm, _mm256_load_ps(&sp[i][j0]));
        float lane[8] __attribute__((aligned(32)));
        _mm256_store_ps(lane, bm);
        float m_new = h->m[i];
        for (int j = 0; j < 8; j++) m_new = lane[j] > m_new ? lane[j] : m_new;
        h->alpha[i] = h->m[i] - m_new;
        h->m[i] = m_new;
        for (int j0 = 0; j0 < nkp; j0 += 8)
            _mm256_store_ps(&sp[i][j0], exp2_avx2(_mm256_sub_ps(_mm256_load_ps(&sp[i][j0]),
                                                                _mm256_set1_ps(m_new))));
    }
    for (int i = n; i < 8; i++) h->alpha[i] = 0.0f;
    const __m256 alphav = exp2_avx2(_mm256_load_ps(h->alpha)); /* a row a lane */
    _mm256_store_ps(h->alpha, alphav);
    /* the rows' sums of P over the keys in order, a row a lane (P's 8x8 blocks transposed) */
    __m256 sum = _mm256_setzero_ps();
    for (int j0 = 0; j0 < nkp; j0 += 8) {
        __m256 pt[8];
        for (int i = 0; i < 8; i++) pt[i] = _mm256_load_ps(&sp[i][j0]);
        transpose8(pt);
        for (int j = 0; j < 8; j++) sum = _mm256_add_ps(sum, pt[j]);
    }
    h->l = _mm256_fmadd_ps(h->l, alphav, sum);
    /* O = alpha O + P V: up to 3 rows x 32 dims at a time (12 chains), keys in order */
    for (int i0 = 0; i0 < n; i0 += 3) {
        const int rows_left = n - i0;
        for (int d0 = 0; d0 < D; d0 += 32) {
            if (rows_left >= 3)
                token_values(vrow, sp, h->alpha, h->o, i0, d0, nkp, 3);
            else if (rows_left == 2)
                token_values(vrow, sp, h->alpha, h->o, i0, d0, nkp, 2);
            else
                token_values(vrow, sp, h->alpha, h->o, i0, d0, nkp, 1);
        }
    }
}

/* A token item: the rows of one query token's heads over kv heads [kh, kh + nkh), at most 8
 * rows (one GQA group) a kv head, head_dim a multiple of 64. A decode step's 1-8 rows a kv
 * head are too few to fill attend_tile's lanes, so the keys go in the lanes instead: each
 * KB-key step transposes a head's keys into kt (8x8 blocks in registers) and scores up to 3
 * rows against 24-48 keys at a time (9-12 independent FMA chains); the softmax sums run with
 * the rows in the lanes (P transposed back), the values are read row by row. The kv heads of
 * an item take each step in turn, so a pool slot's heads (contiguous) are read together:
 * streaming one kv head's part of each slot alone reached half the memory bandwidth.
 * The arithmetic is attend_tile's, operation for operation (the same dot products summed over
 * d in order, the same KB-key softmax steps, the same sums over keys in order), so its
 * outputs are bitwise attend_tile's. Returns -5 when out of memory. */
static int attend_token_heads(const attention_args *a, const tile_item *it) {
    const int D = a->head_dim, group = a->group, n = it->r1 - it->r0;
    const seq_info *si = &a->seqs[it->seq];
    const int t = it->r0 / group, lim = si->lim0 + t;
    token_head *heads = aligned_alloc(32, sizeof(token_head) * (size_t)it->nkh);
    if (!heads) return -5;
    float kt[MAX_D * KB] __attribute__((aligned(32))); /* [D][KB]: a step's keys transposed */
    float sp[8][KB] __attribute__((aligned(32)));      /* [rows][keys]: scores, then P */
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < KB; j++) sp[i][j] = 0.0f; /* rows past n stay 0: they sum to 0 */
    for (int hi = 0; hi < it->nkh; hi++) {
        token_head *h = &heads[hi];
        for (int i = 0; i < 8; i++) {
            if (i < n) {
                const int head = (it->kh + hi) * group + (it->r0 + i) % group;
                const float *src = a->q + (si->qs + t) * a->q_tok + head * a->q_head;
                for (int d = 0; d < D; d++) {
                    h->q[i][d] = src[d] * a->qscale;
                    h->o[i][d] = 0.0f;
                }
            }
            h->m[i] = i < n ? -INFINITY : 0.0f; /* lanes past n stay finite */
        }
        h->l = _mm256_setzero_ps();
    }
    for (int kb0 = 0; kb0 < lim; kb0 += KB) {
        const int nk = lim - kb0 < KB ? lim - kb0 : KB;
        for (int hi = 0; hi < it->nkh; hi++)
            key_rows(a, it->seq, it->kh + hi, kb0, nk, heads[hi].krow, heads[hi].vrow);
        read_step_rows(heads, it->nkh, nk, D);
        for (int hi = 0; hi < it->nkh; hi++) token_head_step(a, &heads[hi], n, nk, kt, sp);
    }
    for (int hi = 0; hi < it->nkh; hi++) {
        const token_head *h = &heads[hi];
        float inv[8] __attribute__((aligned(32)));
        _mm256_store_ps(inv, _mm256_div_ps(_mm256_set1_ps(1.0f), h->l)); /* as attend_tile */
        for (int i = 0; i < n; i++) {
            const int head = (it->kh + hi) * group + (it->r0 + i) % group;
            float *dst = a->out + (si->qs + t) * a->o_tok + head * a->o_head;
            for (int d = 0; d < D; d++) dst[d] = h->o[i][d] * inv[i];
        }
    }
    free(heads);
    return 0;
}

/* Whether sequence s's rows run as token items: one query token (a decode step), a GQA group
 * of at most 8 heads, head_dim a multiple of 64. */
static int token_items(const seq_info *si, int group, int head_dim) {
    return si->nq == 1 && group <= 8 && head_dim % 64 == 0;
}

/* The row items of the sequences that do not run as token items, at `tiles` row tiles an
 * item. */
static int64_t row_item_count(const seq_info *seqs, int num_seqs, int group, int head_dim,
                              int num_kv_heads, int tiles) {
    int64_t count = 0;
    for (int s = 0; s < num_seqs; s++)
        if (seqs[s].nq > 0 && !token_items(&seqs[s], group, head_dim))
            count += num_kv_heads * (((int64_t)seqs[s].nq * group + tiles * TILE - 1) /
                                     (tiles * TILE));
    return count;
}

/* Returns 0, or -5 when out of memory. */
static int run_item(const attention_args *a, const tile_item *it) {
    if (token_items(&a->seqs[it->seq], a->group, a->head_dim))
        return attend_token_heads(a, it);
    return attend_rows(a, it);
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
    int64_t num_items = 0, token_seqs = 0;
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
        token_seqs += token_items(si, group, head_dim);
    }
    /* A token item takes several kv heads when there are sequences enough to keep the threads
     * busy; one sequence alone keeps a kv head an item, for the parallelism. */
    const int heads_per_token_item =
        token_seqs >= 4 * (int64_t)num_threads ? (num_kv_heads < TOKEN_HEADS ? num_kv_heads
                                                                            : TOKEN_HEADS)
                                               : 1;
    tile_item *items = status ? NULL : malloc(sizeof(tile_item) * (size_t)(num_items + 1));
    if (!status && !items) status = -5;
    if (status) {
        free(seqs);
        free(items);
        return status;
    }
    /* Row tiles a row item takes together: up to TILES_PER_ITEM while the items stay at least
     * 3 a thread, for the dynamic schedule to end evenly. */
    const int64_t token_item_count =
        token_seqs * ((num_kv_heads + heads_per_token_item - 1) / heads_per_token_item);
    int tiles_per_item = TILES_PER_ITEM;
    while (tiles_per_item > 1 && token_item_count + row_item_count(seqs, num_seqs, group,
                                                                   head_dim, num_kv_heads,
                                                                   tiles_per_item) <
                                     3 * (int64_t)num_threads)
        tiles_per_item /= 2;
    const int item_rows = tiles_per_item * TILE;
    int64_t next = 0;
    for (int s = 0; s < num_seqs; s++) {
        const int rows = seqs[s].nq * group;
        if (token_items(&seqs[s], group, head_dim)) {
            for (int kh = 0; kh < num_kv_heads; kh += heads_per_token_item) {
                const int nkh = num_kv_heads - kh < heads_per_token_item ? num_kv_heads - kh
                                                                          : heads_per_token_item;
                items[next++] = (tile_item){s, kh, 0, rows, nkh};
            }
            continue;
        }
        for (int kh = 0; kh < num_kv_heads; kh++)
            for (int r0 = 0; r0 < rows; r0 += item_rows)
                items[next++] =
                    (tile_item){s, kh, r0, r0 + item_rows < rows ? r0 + item_rows : rows, 1};
    }
    const attention_args args = {
        q, k, v, k_cache, v_cache, q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head,
        block_tables, bt_row, out, seqs, num_kv_heads, group, head_dim, block_size,
        scale * LOG2E,
    };
    /* costliest first (the most keys), so the dynamic schedule ends evenly */
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t i = 0; i < next; i++) {
        if (run_item(&args, &items[next - 1 - i])) {
#pragma omp atomic write
            status = -5;
        }
    }
    free(items);
    free(seqs);
    return status;
}
