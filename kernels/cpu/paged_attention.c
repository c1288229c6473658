/*
 * Paged attention over a bf16, int8 or fp8-e4m3 KV pool for x86-64 CPUs with AVX-512 and
 * AVX512-BF16.
 *
 * Flash-attention style: online softmax in float32, the score matrix is never materialized.
 * The query rows of a kv head are (query token, query head of the group) pairs, so a GQA
 * group's heads share one read of K/V. Work items are (sequence, kv head, range of query rows),
 * or, for short queries over many sequences (decode), (sequence, all kv heads). When short
 * queries over few sequences leave threads idle (decode of one sequence: one item per kv head),
 * their keys are split into chunks (split-K): each chunk item leaves its unnormalized partial
 * output, running max and sum, and a merge pass combines the chunks of each row.
 * A row tile of up to RB rows is scored against KB keys at a time (in a block some rows see
 * only part of, the groups of 16 keys past the last one any row sees are not scored):
 *
 *   S = Q K^T   _mm512_dpbf16_ps, keys packed as [head_dim/2][KB][2] (16 keys x 2 dims a zmm,
 *               a query dim pair broadcast from memory)
 *   online softmax on S (exp2 polynomial), P rounded to bf16
 *   O += P V    _mm512_dpbf16_ps, values as [KB/2][head_dim][2] (16 dims x 2 keys a zmm, a P
 *               key pair broadcast from memory): from a bf16 pool read in place, two keys'
 *               rows interleaved by vpunpck{l,h}wd (which leaves O's dims permuted within each
 *               32, put back in order once a row tile is done), from a quantized one packed
 *
 * Keys (and a quantized pool's values) are packed per key block, a bf16 pool's value rows
 * listed instead, by the row tile about to use the block, while the pool rows of the block two
 * ahead come into L2 along the step's loops: a sequence with more than one row tile per kv
 * head (prefill) keeps them, in an area of the thread's own that holds one (sequence, kv
 * head) at a time, so the first row tile a thread runs on it packs each block as it goes and
 * the thread's next ones read the packed copy (a later tile's further key blocks are packed
 * by it); otherwise (decode) every item packs its own. So each key is read from the pool once
 * per thread that uses it, and the reads of a cached prefix overlap the attention's products
 * instead of waiting in a pass of their own.
 * Threads take the work items as contiguous runs, stealing from the back of the others' runs
 * once their own is done (work_runs.h): a prefill's items in (sequence, kv head, rows) order,
 * so a thread packs a kv head's keys once and reads them from its L2 for several items in a
 * row, the others costliest first.
 *
 * Key j of a sequence is cache token j for j < ncache (found through the block table), else
 * new token (qs + j - ncache) of k/v. Query token t sees keys [0, lim0 + t).
 *
 * Quantized pools (int8, fp8 e4m3fn) are dequantized while packing: stored * scale in float32
 * (scale [num_kv_heads][head_dim]), rounded to bf16 to nearest even, as torch's
 * dequantize(stored, scale, bfloat16) does. The conversion instruction flushes subnormal
 * products to zero, which _mm512_dpbf16_ps would do to them anyway, so the results are those
 * of the exact bf16 values. The new tokens' k/v (prefill) are bf16 whatever the pool holds.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "simd_math.h"
#include "work_runs.h"

#define KB 64        /* keys per online-softmax step */
#define RB 6         /* query rows per register tile */
#define ROWS_ITEM 48 /* query rows per work item */
#define MAX_D 256    /* largest head_dim (a multiple of 32) */
#define SPLIT_ITEMS_PER_THREAD 8 /* split-K aims at this many items per thread */
#define SPLIT_MIN_BLOCKS 4       /* key blocks (of KB) per split-K chunk, at least */

enum { KV_BF16 = 0, KV_INT8 = 1, KV_FP8 = 2 }; /* pool element types (pa_paged_attention) */

typedef struct {
    int64_t qs;     /* row of the sequence's first query token in q / out / k / v */
    int nq;         /* query tokens */
    int ncache;     /* keys read from the cache */
    int lim0;       /* keys visible to query token 0 */
    int keep;       /* its packed K/V are kept in a thread's area for its next tiles, else
                     * every tile packs its own */
    int chunks;     /* split-K chunks of its keys per (kv head, query rows): 1 = unsplit */
} seq_info;

typedef struct {
    int seq, h0, h1, r0, r1; /* kv heads [h0, h1), query rows [r0, r1) of each */
    int kb0, kb1;            /* key blocks [kb0, kb1) (split-K chunk), or 0, INT32_MAX */
    int64_t part;            /* split-K: float offset of this chunk's partials, else -1 */
    int64_t cost;
    int keep;   /* the sequence keeps its packed K/V (a thread packs them once) */
} work_item;

/* Split-K bookkeeping of one (sequence, kv head, query rows) whose keys were chunked: the
 * chunks' partials lie at part + c * stride floats, rows (r1 - r0) x (D + 2) each: the
 * unnormalized output row, then the row's reference max m and lane-summed l. */
typedef struct {
    int seq, h, r0, r1, chunks;
    int64_t part, stride;
} split_merge;

/* What a thread's area holds: the packed keys (then the packed values or, bf16 pool, the
 * values' row list) of key blocks [0, blocks) of (seq, kv head h); seq < 0: nothing. */
typedef struct {
    int seq, h, blocks;
} packed_area;

typedef struct {
    const bf16 *q, *k, *v;
    const char *k_cache, *v_cache; /* pool elements of esize bytes, of type kind */
    const float *k_scale, *v_scale; /* [KVH][D] (quantized pools only) */
    int kind, esize;
    int64_t q_st, q_sh, k_st, k_sh, v_st, v_sh;
    const int32_t *bt;
    int64_t bt_stride;
    bf16 *out;
    int H, KVH, G, D, bs;
    float c; /* scale * log2(e): scores are exponentiated in base 2 */
    const seq_info *seqs;
} problem;

/* Per-thread scratch, 64-byte aligned members. */
typedef struct {
    bf16 qt[RB * MAX_D];              /* query tile, row stride MAX_D */
    bf16 pt[RB * KB];                 /* probabilities of the current key block, bf16 */
    float o[RB * MAX_D];              /* output accumulator, row stride MAX_D */
    uint32_t kp[(MAX_D / 2) * KB];    /* keys packed per item (decode) */
    uint32_t vp[(KB / 2) * MAX_D];    /* values packed per item (decode) */
    const void *kr[3][KB], *vr[3][KB]; /* source rows of this and the next two key blocks */
    const void *pk[KB], *pv[KB];       /* rows of the next tile's first blocks, prefetched */
} __attribute__((aligned(64))) scratch;

/* acc += (pair at ptr, broadcast) . x, pairwise over 16 lanes of bf16 pairs. */
#define DPBF16_BCAST(acc, x, ptr) \
    (acc) = _mm512_dpbf16_ps((acc), (__m512bh)_mm512_set1_epi32((int)*(ptr)), (x))

static inline int64_t packed_bytes(int nkeys, int D) { /* one of K or V of one kv head */
    return (int64_t)((nkeys + KB - 1) / KB) * KB * D * 2;
}

/* ------------------------------------------------------------------ math helpers */

/* Max of all lanes, broadcast to every lane. */
static inline __m512 hmax_bcast(__m512 x) {
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
    x = _mm512_max_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_max_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));
}

/* 16x16 transpose of 32-bit elements, in place. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* u[4g + j], lane L: column 4L + j of rows 4g .. 4g+3 */
        u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int j = 0; j < 4; j++) {
        const __m512i a = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
        const __m512i b = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);
        const __m512i c = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
        const __m512i d = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
        r[j] = _mm512_shuffle_i32x4(a, c, 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(a, c, 0xDD);
        r[4 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(b, d, 0xDD);
    }
}

/* ------------------------------------------------------------------ packing */

/* Source rows of keys [j0, j0 + KB) of (seq, kv head); NULL past the sequence's keys. Returns
 * how many leading rows are pool rows (elements of p->kind); the others are bf16 rows of k/v. */
static int key_rows(const problem *p, int s, int h, int j0, const void **kr, const void **vr) {
    const seq_info *si = &p->seqs[s];
    const int total = si->lim0 + si->nq - 1;
    const int end = j0 + KB < total ? j0 + KB : total;
    const int cend = end < si->ncache ? end : si->ncache;
    const int64_t tok = (int64_t)p->KVH * p->D * p->esize; /* bytes per cache token */
    const int64_t head = (int64_t)h * p->D * p->esize;
    const int32_t *bt = p->bt + (int64_t)s * p->bt_stride;
    int j = j0;
    if (j < cend) {
        int blk = j / p->bs, off = j % p->bs;
        int64_t base = ((int64_t)bt[blk] * p->bs + off) * tok + head;
        for (; j < cend; j++) {
            kr[j - j0] = p->k_cache + base;
            vr[j - j0] = p->v_cache + base;
            if (++off == p->bs) {
                off = 0;
                if (j + 1 < cend) base = (int64_t)bt[++blk] * p->bs * tok + head;
            } else {
                base += tok;
            }
        }
    }
    const int npool = j > j0 ? j - j0 : 0;
    for (; j < end; j++) {
        const int64_t t = si->qs + (j - si->ncache);
        kr[j - j0] = p->k + t * p->k_st + h * p->k_sh;
        vr[j - j0] = p->v + t * p->v_st + h * p->v_sh;
    }
    for (; j < j0 + KB; j++) kr[j - j0] = vr[j - j0] = NULL;
    return npool;
}

/* Prefetch a key block's K and V rows into L1 (they are read right after the current block):
 * the first npool rows are pool rows of esize-byte elements, the others bf16 rows of k/v.
 * Always inlined: gcc may find an out-of-line function of only prefetches side-effect free
 * and drop its calls. */
INLINE void prefetch_rows(const void *const *kr, const void *const *vr, int npool, int esize,
                          int D) {
    int i = 0;
    if (esize != 2) { /* quantized pool rows: D bytes each */
        for (; i < npool; i++) {
            for (int off = 0; off < esize * D; off += 64) {
                _mm_prefetch((const char *)kr[i] + off, _MM_HINT_T0);
                _mm_prefetch((const char *)vr[i] + off, _MM_HINT_T0);
            }
        }
    }
    for (; i < KB && kr[i]; i++) {
        for (int off = 0; off < 2 * D; off += 64) {
            _mm_prefetch((const char *)kr[i] + off, _MM_HINT_T0);
            _mm_prefetch((const char *)vr[i] + off, _MM_HINT_T0);
        }
    }
}

/* 32 int8 pool elements at src as float32 (exact), times the 32 scales at scale: lo, hi. */
INLINE void dequant32_int8(const int8_t *src, const float *scale, __m512 *lo, __m512 *hi) {
    const __m512i a = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)src));
    const __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 16)));
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_loadu_ps(scale));
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(b), _mm512_loadu_ps(scale + 16));
}

/* 32 fp8 e4m3fn pool elements at src as float32 (exact), times the 32 scales at scale: lo, hi.
 * A byte (sign s, exponent e, mantissa m) with its bits placed as the fp16 (s, e, m << 7) is
 * exactly 2^-8 times its e4m3fn value, subnormals included (the exponent biases differ by 8),
 * and vcvtph2ps converts fp16 exactly (ignoring MXCSR.DAZ). The NaN bytes 0x7F / 0xFF (e and
 * m all ones) also get the top fp16 exponent bit, from the carry of adding 1 below them, so
 * they read as NaN. */
INLINE void dequant32_fp8(const uint8_t *src, const float *scale, __m512 *lo, __m512 *hi) {
    const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)src));
    const __m512i h = _mm512_and_si512(_mm512_slli_epi16(x, 7), _mm512_set1_epi16(-0x4080));
    const __m512i carry = _mm512_add_epi16(h, _mm512_set1_epi16(0x0080));
    const __m512i f16 = _mm512_ternarylogic_epi32(h, carry, _mm512_set1_epi16(0x4000),
                                                  0xF8); /* h | (carry & 0x4000) */
    const __m512 two8 = _mm512_set1_ps(256.0f);
    const __m512 a = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(f16)), two8);
    const __m512 b = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(f16, 1)), two8);
    *lo = _mm512_mul_ps(a, _mm512_loadu_ps(scale));
    *hi = _mm512_mul_ps(b, _mm512_loadu_ps(scale + 16));
}

/* Dims [32 dc, 32 dc + 32) of a row as 32 bf16: a bf16 row (the pool's when kind is KV_BF16,
 * else a new token's k/v, pooled == 0) as is; a quantized pool row dequantized with the
 * head's scales scale [D] and rounded to nearest even; zeros for a NULL row. */
INLINE __m512i row_chunk(const int kind, const void *src, int pooled, int dc,
                         const float *scale) {
    if (!src) return _mm512_setzero_si512();
    if (kind == KV_BF16 || !pooled) return _mm512_loadu_si512((const bf16 *)src + 32 * dc);
    __m512 lo, hi;
    if (kind == KV_INT8) dequant32_int8((const int8_t *)src + 32 * dc, scale + 32 * dc, &lo, &hi);
    else dequant32_fp8((const uint8_t *)src + 32 * dc, scale + 32 * dc, &lo, &hi);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* kp[d2][key] = (k[key][2 d2], k[key][2 d2 + 1]) as one 32-bit bf16 pair; missing keys are 0.
 * Rows [0, npool) are pool rows of type kind (scale [D]: the kv head's scales). */
INLINE void pack_k(const int kind, const void *const *kr, int npool, int D, const float *scale,
                   uint32_t *kp) {
    for (int g = 0; g < KB / 16; g++) {
        for (int dc = 0; dc < D / 32; dc++) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                r[i] = row_chunk(kind, kr[16 * g + i], 16 * g + i < npool, dc, scale);
            }
            transpose16(r);
            for (int i = 0; i < 16; i++) {
                _mm512_store_si512(kp + (16 * dc + i) * KB + 16 * g, r[i]);
            }
        }
    }
}

/* vp[k2][d] = (v[2 k2][d], v[2 k2 + 1][d]) as one 32-bit bf16 pair; missing keys are 0.
 * Rows [0, npool) are pool rows of type kind (scale [D]: the kv head's scales). */
INLINE void pack_v(const int kind, const void *const *vr, int npool, int D, const float *scale,
                   uint32_t *vp) {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int k2 = 0; k2 < KB / 2; k2++) {
        const void *a = vr[2 * k2], *b = vr[2 * k2 + 1];
        for (int dc = 0; dc < D / 32; dc++) {
            const __m512i va = row_chunk(kind, a, 2 * k2 < npool, dc, scale);
            const __m512i vb = row_chunk(kind, b, 2 * k2 + 1 < npool, dc, scale);
            uint32_t *dst = vp + (int64_t)k2 * D + 32 * dc;
            _mm512_store_si512(dst, _mm512_permutex2var_epi16(va, lo, vb));
            _mm512_store_si512(dst + 16, _mm512_permutex2var_epi16(va, hi, vb));
        }
    }
}

#define DEFINE_PACK(name, kind)                                                               \
    static void pack_kv_##name(const void *const *kr, const void *const *vr, int npool,      \
                               int D, const float *ks, const float *vs, uint32_t *kp,         \
                               uint32_t *vp) {                                                \
        pack_k(kind, kr, npool, D, ks, kp);                                                   \
        pack_v(kind, vr, npool, D, vs, vp);                                                   \
    }
DEFINE_PACK(int8, KV_INT8)
DEFINE_PACK(fp8, KV_FP8)

static const bf16 ZERO_ROW[MAX_D] __attribute__((aligned(64))); /* a missing key's values */

/* Whether the PV loop reads the values from their rows (a bf16 pool) rather than packed. */
static inline int values_in_place(const problem *p) { return p->kind == KV_BF16; }

/* Packs one key block of kv head h (rows from key_rows) into kp [D/2][KB], and its values as
 * the PV loop reads them: a bf16 pool's rows listed in vrows [KB] (vr itself may be vrows),
 * ZERO_ROW for missing keys; a quantized pool's values dequantized into vp [KB/2][D]. */
static void pack_kv(const problem *p, int h, const void *const *kr, const void *const *vr,
                    int npool, uint32_t *kp, uint32_t *vp, const void **vrows) {
    const int D = p->D;
    if (values_in_place(p)) {
        pack_k(KV_BF16, kr, npool, D, NULL, kp);
        for (int i = 0; i < KB; i++) vrows[i] = vr[i] ? vr[i] : ZERO_ROW;
        return;
    }
    const float *ks = p->k_scale + (int64_t)h * D, *vs = p->v_scale + (int64_t)h * D;
    if (p->kind == KV_INT8) pack_kv_int8(kr, vr, npool, D, ks, vs, kp, vp);
    else pack_kv_fp8(kr, vr, npool, D, ks, vs, kp, vp);
}

/* ----------------------------------------------------------- one row tile x one key block */

typedef struct {
    const uint32_t *kp, *vp; /* packed keys [D/2][KB], values [KB/2][D] (quantized pool) */
    const void *const *vrows; /* the keys' bf16 value rows (bf16 pool), else NULL: vp */
    int masked;              /* some row sees only part of the block */
    int nk2;                 /* key pairs of the block that any row sees */
    int lim[RB];             /* keys of this block each row sees (may be <= 0 or > KB) */
    const void *const *pfk, *const *pfv; /* rows to prefetch during the step (pf_lines > 0) */
    int pf_lines;                        /* cache lines of each of them */
} block_args;

/* Prefetches into L2 rows [it KB / n, (it + 1) KB / n) of `rows`, `lines` lines each: the
 * it-th of n even shares of a key block, spread over a loop of n iterations. Where a whole
 * block's rows were prefetched at once (256 lines, one block ahead, into L1), the packing
 * still waited for memory; spread over the step's loops, two blocks ahead, into L2, a decode
 * over 1,701 keys of a pool not in cache takes 0.8x the time. */
INLINE void prefetch_share(const void *const *rows, int it, int n, int lines) {
    for (int r = it * KB / n; r < (it + 1) * KB / n; r++) {
        if (!rows[r]) return;
        for (int l = 0; l < lines; l++) _mm_prefetch((const char *)rows[r] + 64 * l, _MM_HINT_T1);
    }
}

/* O columns [d0, d0 + 16 NV) of R rows: O = O * alpha + P V (no rescale when alpha is NULL).
 * From value rows (a->vrows), the key pairs' interleave leaves the columns of each 32 in the
 * order of unpermute_rows' input. */
INLINE void pv_chunk(const int R, const int NV, const int PF, int D, int d0,
                     const block_args *a, scratch *sc, const __m512 *alpha) {
    __m512 o[RB][4];
    const uint32_t *pt = (const uint32_t *)sc->pt;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            o[r][v] = _mm512_load_ps(sc->o + r * MAX_D + d0 + 16 * v);
            if (alpha) o[r][v] = _mm512_mul_ps(o[r][v], alpha[r]);
        }
    const uint32_t *vp = a->vp + d0;
    for (int k2 = 0; k2 < a->nk2; k2++, vp += D) {
        if (PF && a->pf_lines && d0 == 0) prefetch_share(a->pfv, k2, KB / 2, a->pf_lines);
        __m512bh vv[4];
        if (a->vrows) {
            const bf16 *ra = (const bf16 *)a->vrows[2 * k2] + d0;
            const bf16 *rb = (const bf16 *)a->vrows[2 * k2 + 1] + d0;
#pragma GCC unroll 2
            for (int c = 0; c < NV / 2; c++) {
                const __m512i x = _mm512_loadu_si512(ra + 32 * c);
                const __m512i y = _mm512_loadu_si512(rb + 32 * c);
                vv[2 * c] = (__m512bh)_mm512_unpacklo_epi16(x, y);
                vv[2 * c + 1] = (__m512bh)_mm512_unpackhi_epi16(x, y);
            }
        } else {
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) vv[v] = (__m512bh)_mm512_load_si512(vp + 16 * v);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) DPBF16_BCAST(o[r][v], vv[v], pt + r * (KB / 2) + k2);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm512_store_ps(sc->o + r * MAX_D + d0 + 16 * v, o[r][v]);
}

/* 2^x for the probabilities, x <= LAZY_MAX: a degree-3 polynomial for 2^f (relative error
 * 7.5e-5, far below the bf16 rounding of P, 3.9e-3) scaled by vscalefps; the sum l adds the
 * same values, so the weights stay consistent. Very negative x gives 0. */
static inline __m512 exp2_probability(__m512 x) {
    const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(7.802402973175049e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.2606706619262695e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.958339810371399e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999251365661621e-1f));
    return _mm512_scalef_ps(p, x);
}

/* Online-softmax state of one row, all vectors broadcast. The reference max m is only raised
 * when a score exceeds it by more than LAZY_MAX (in units of log2 of the probability), so most
 * key blocks need no rescaling of O and l; probabilities stay below 2^LAZY_MAX. */
#define LAZY_MAX 8.0f
#define MASKED (-1e30f) /* score of a key a row must not see: exp2 of it is 0 */
typedef struct {
    __m512 m;    /* reference max of the raw scores */
    __m512 mc;   /* m * c */
    __m512 mthr; /* m + LAZY_MAX / c: scores above it trigger a rescale */
    __m512 l;    /* lane-wise partial sums of the probabilities */
} row_state;

/* S = Q K^T for R rows and the first NJ groups of 16 keys of the block (the others stay 0). */
INLINE void qk_loop(const int R, const int PF, const int NJ, int D, const block_args *a,
                    const scratch *sc, __m512 acc[RB][4]) {
    const uint32_t *q32 = (const uint32_t *)sc->qt;
    const uint32_t *kp = a->kp;
    for (int d = 0; d < D / 2; d++, kp += KB) {
        if (PF && a->pf_lines) prefetch_share(a->pfk, d, D / 2, a->pf_lines);
        __m512bh kv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NJ; j++) kv[j] = (__m512bh)_mm512_load_si512(kp + 16 * j);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const uint32_t *qp = q32 + r * (MAX_D / 2) + d;
#pragma GCC unroll 4
            for (int j = 0; j < NJ; j++) DPBF16_BCAST(acc[r][j], kv[j], qp);
        }
    }
}

/* Scores, online softmax update, P into sc->pt, then O update, for R rows. */
INLINE void block_step(const int R, const int PF, int D, float c, const block_args *a,
                       scratch *sc, row_state *st) {
    __m512 acc[RB][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    const int groups = (2 * a->nk2 + 15) / 16; /* of 16 keys, with a key some row sees */
    if (groups == 4) qk_loop(R, PF, 4, D, a, sc, acc);
    else if (groups == 3) qk_loop(R, PF, 3, D, a, sc, acc);
    else if (groups == 2) qk_loop(R, PF, 2, D, a, sc, acc);
    else qk_loop(R, PF, 1, D, a, sc, acc);
    __m512 vmax[RB];
    __mmask16 over = 0;  /* any row's */
    int row_over[RB];    /* each row's own: whether its scores passed its threshold */
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (a->masked) {
            const __m512 masked = _mm512_set1_ps(MASKED);
            const __m512i lim = _mm512_set1_epi32(a->lim[r]);
            const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,
                                                  1, 0);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m512i key = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * j));
                const __mmask16 visible = _mm512_cmplt_epi32_mask(key, lim);
                acc[r][j] = _mm512_mask_mov_ps(masked, visible, acc[r][j]);
            }
        }
        vmax[r] = _mm512_max_ps(_mm512_max_ps(acc[r][0], acc[r][1]),
                                _mm512_max_ps(acc[r][2], acc[r][3]));
        const __mmask16 mine = _mm512_cmp_ps_mask(vmax[r], st[r].mthr, _CMP_GT_OQ);
        row_over[r] = mine != 0;
        over |= mine;
    }
    const __m512 cv = _mm512_set1_ps(c);
    __m512 alpha[RB];
    if (over) {
        /* raise the reference max of each row whose scores passed its threshold to its true
         * running max; the others keep theirs (alpha exactly 1). A row's max, so the bf16
         * rounding of its probabilities, depends on its own scores alone, never on which rows
         * share its tile: a token's result is the same however its prompt was chunked. */
        const __m512 thr = _mm512_set1_ps(LAZY_MAX / c);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            if (!row_over[r]) {
                alpha[r] = _mm512_set1_ps(1.0f);
                continue;
            }
            const __m512 mnew = _mm512_max_ps(st[r].m, hmax_bcast(vmax[r]));
            alpha[r] = exp2_ps(_mm512_mul_ps(_mm512_sub_ps(st[r].m, mnew), cv));
            st[r].l = _mm512_mul_ps(st[r].l, alpha[r]);
            st[r].m = mnew;
            st[r].mc = _mm512_mul_ps(mnew, cv);
            st[r].mthr = _mm512_add_ps(mnew, thr);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        const __m512 mc = st[r].mc;
        const __m512 p0 = exp2_probability(_mm512_fmsub_ps(acc[r][0], cv, mc));
        const __m512 p1 = exp2_probability(_mm512_fmsub_ps(acc[r][1], cv, mc));
        const __m512 p2 = exp2_probability(_mm512_fmsub_ps(acc[r][2], cv, mc));
        const __m512 p3 = exp2_probability(_mm512_fmsub_ps(acc[r][3], cv, mc));
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(p0, p1), _mm512_add_ps(p2, p3));
        st[r].l = _mm512_add_ps(st[r].l, sum);
        _mm512_store_si512(sc->pt + r * KB, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
        _mm512_store_si512(sc->pt + r * KB + 32, (__m512i)_mm512_cvtne2ps_pbh(p3, p2));
    }
    const __m512 *scale_o = over ? alpha : NULL;
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) pv_chunk(R, 4, PF, D, d0, a, sc, scale_o);
    if (d0 < D) pv_chunk(R, 2, PF, D, d0, a, sc, scale_o);
}

#define DEFINE_STEP(R)                                                                      \
    static void block_step_##R(int D, float c, const block_args *a, scratch *sc,            \
                               row_state *st) {                                             \
        block_step(R, 0, D, c, a, sc, st);                                                  \
    }                                                                                       \
    static void block_step_pf_##R(int D, float c, const block_args *a, scratch *sc,         \
                                  row_state *st) {                                          \
        block_step(R, 1, D, c, a, sc, st);                                                  \
    }
DEFINE_STEP(1)
DEFINE_STEP(2)
DEFINE_STEP(3)
DEFINE_STEP(4)
DEFINE_STEP(5)
DEFINE_STEP(6)

typedef void (*step_fn)(int, float, const block_args *, scratch *, row_state *);
static const step_fn STEPS[RB + 1] = {NULL,         block_step_1, block_step_2, block_step_3,
                                      block_step_4, block_step_5, block_step_6};
/* the same, prefetching a later key block's pool rows (a->pfk, a->pfv) along their loops */
static const step_fn PF_STEPS[RB + 1] = {NULL,            block_step_pf_1, block_step_pf_2,
                                         block_step_pf_3, block_step_pf_4, block_step_pf_5,
                                         block_step_pf_6};

/* ------------------------------------------------------------------ work items */

/* Puts the D columns of R output rows (row stride MAX_D) back in order after pv_chunk from
 * value rows: vpunpck{l,h}wd pair dims 8j..8j+3 (low) and 8j+4..8j+7 (high) of each 128-bit
 * lane j, so each 32 columns arrive as [lanes' low quads][lanes' high quads]. */
static void unpermute_rows(float *o, int R, int D) {
    const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i second =
        _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    for (int i = 0; i < R; i++) {
        for (int d = 0; d < D; d += 32) {
            float *row = o + i * MAX_D + d;
            const __m512 low = _mm512_load_ps(row), high = _mm512_load_ps(row + 16);
            _mm512_store_ps(row, _mm512_permutex2var_ps(low, first, high));
            _mm512_store_ps(row + 16, _mm512_permutex2var_ps(low, second, high));
        }
    }
}

/* The keys a thread reads after a row tile: key blocks [kb0, kb1) of (seq, kv head h), whose
 * first blocks the tile's last steps prefetch; seq < 0 when unknown. */
typedef struct {
    int seq, h, kb0, kb1;
} next_keys;

/* Rows [rb, rb + R) of (seq s, kv head h): attention over their visible keys in key blocks
 * [kb0, kb1). Writes the normalized bf16 output rows, or, when part is not NULL (a split-K
 * chunk), each row's unnormalized output, reference max and sum there: R x (D + 2) floats.
 * A sequence that keeps its packed K/V uses the thread's `area` (described by *held, taken
 * over from another (seq, kv head) if it held one): the tile reads the blocks packed there
 * and packs its further ones into it. Otherwise it packs every block for itself, and its last
 * steps prefetch the first blocks of `then`. */
static void row_tile(const problem *p, int s, int h, int rb, int R, int kb0, int kb1,
                     float *part, scratch *sc, next_keys then, char *area, packed_area *held) {
    const seq_info *si = &p->seqs[s];
    const int D = p->D, G = p->G;
    int lim[RB];
    for (int i = 0; i < R; i++) {
        const int t = (rb + i) / G, g = (rb + i) % G;
        const bf16 *src = p->q + (si->qs + t) * p->q_st + (int64_t)(h * G + g) * p->q_sh;
        memcpy(sc->qt + i * MAX_D, src, (size_t)D * sizeof(bf16));
        memset(sc->o + i * MAX_D, 0, (size_t)D * sizeof(float));
        lim[i] = si->lim0 + t;
    }
    const int lim_lo = lim[0];
    const int64_t chunk_end = (int64_t)kb1 * KB;
    const int lim_hi = lim[R - 1] < chunk_end ? lim[R - 1] : (int)chunk_end; /* keys read */
    row_state st[RB];
    for (int i = 0; i < R; i++) {
        st[i].m = _mm512_set1_ps(MASKED);
        st[i].mc = _mm512_set1_ps(MASKED * p->c);
        st[i].mthr = _mm512_set1_ps(-__builtin_inff()); /* the first block sets m */
        st[i].l = _mm512_setzero_ps();
    }
    uint32_t *kpre = NULL, *vpre = NULL;
    const void **vrows_pre = NULL;
    int packed = kb0; /* blocks [kb0, packed) are in kpre / vpre already (a kept sequence's
                       * tiles start at block 0), the later ones are packed here */
    if (si->keep) {
        if (held->seq != s || held->h != h) *held = (packed_area){s, h, 0};
        kpre = (uint32_t *)area;
        vpre = (uint32_t *)(area + packed_bytes(si->lim0 + si->nq - 1, D));
        if (values_in_place(p)) vrows_pre = (const void **)vpre;
        packed = held->blocks;
    }
    block_args a;
    a.pf_lines = 0;
    /* packing here, from block `packed` on: the rows of block kb in slot (kb - packed) % 3;
     * those of kb + 1 came in before, those of kb + 2 are prefetched during the step of kb,
     * spread over its loops (`lines` a pool row's; the few bf16 rows of new tokens past a
     * quantized pool's are hot) */
    int npool[3] = {0, 0, 0}; /* leading rows of kr[i] / vr[i] that are pool rows */
    const int lines = (D * p->esize + 63) / 64;
    for (int f = 0; f < 2 && (packed + f) * KB < lim_hi; f++) {
        npool[f] = key_rows(p, s, h, (packed + f) * KB, sc->kr[f], sc->vr[f]);
        prefetch_rows(sc->kr[f], sc->vr[f], npool[f], p->esize, D);
    }
    for (int kb = kb0; kb * KB < lim_hi; kb++) {
        step_fn step = STEPS[R];
        if (kb < packed) {
            a.kp = kpre + (int64_t)kb * KB * D / 2;
            a.vp = vpre + (int64_t)kb * KB * D / 2;
            a.vrows = vrows_pre ? vrows_pre + (int64_t)kb * KB : NULL;
        } else {
            step = PF_STEPS[R];
            const int cur = (kb - packed) % 3, far = (kb - packed + 2) % 3;
            a.pf_lines = 0;
            if ((kb + 2) * KB < lim_hi) {
                npool[far] = key_rows(p, s, h, (kb + 2) * KB, sc->kr[far], sc->vr[far]);
                a.pfk = sc->kr[far];
                a.pfv = sc->vr[far];
                a.pf_lines = lines;
            } else if (then.seq >= 0) { /* no block of its own left: the next tile's first */
                const int last = (lim_hi + KB - 1) / KB; /* first block not read here */
                const int t = then.kb0 + (kb + 2 - last);
                if (t < then.kb1 && (int64_t)t * KB < p->seqs[then.seq].ncache) {
                    key_rows(p, then.seq, then.h, t * KB, sc->pk, sc->pv);
                    a.pfk = sc->pk;
                    a.pfv = sc->pv;
                    a.pf_lines = lines;
                }
            }
            uint32_t *kdst = kpre ? kpre + (int64_t)kb * KB * D / 2 : sc->kp;
            uint32_t *vdst = kpre ? vpre + (int64_t)kb * KB * D / 2 : sc->vp;
            const void **vrows = vrows_pre ? vrows_pre + (int64_t)kb * KB : sc->vr[cur];
            pack_kv(p, h, sc->kr[cur], sc->vr[cur], npool[cur], kdst, vdst, vrows);
            a.kp = kdst;
            a.vp = vdst;
            a.vrows = values_in_place(p) ? vrows : NULL;
            if (kpre) held->blocks = kb + 1;
        }
        a.masked = (kb + 1) * KB > lim_lo;
        const int seen = lim_hi - kb * KB < KB ? lim_hi - kb * KB : KB;
        a.nk2 = (seen + 1) / 2;
        for (int i = 0; i < R; i++) a.lim[i] = lim[i] - kb * KB;
        step(D, p->c, &a, sc, st);
    }
    if (values_in_place(p)) unpermute_rows(sc->o, R, D);
    for (int i = 0; part && i < R; i++) {
        float *row = part + (int64_t)i * (D + 2);
        memcpy(row, sc->o + i * MAX_D, (size_t)D * sizeof(float));
        row[D] = _mm512_cvtss_f32(st[i].m);
        row[D + 1] = _mm512_reduce_add_ps(st[i].l);
    }
    for (int i = 0; !part && i < R; i++) {
        const int t = (rb + i) / G, g = (rb + i) % G;
        bf16 *dst = p->out + ((si->qs + t) * p->H + h * G + g) * (int64_t)D;
        const float sum = _mm512_reduce_add_ps(st[i].l);
        const __m512 inv = _mm512_set1_ps(lim[i] > 0 ? 1.0f / sum : 0.0f);
        for (int d = 0; d < D; d += 16) {
            const __m512 o = _mm512_mul_ps(_mm512_load_ps(sc->o + i * MAX_D + d), inv);
            _mm256_storeu_si256((__m256i *)(dst + d), (__m256i)_mm512_cvtneps_pbh(o));
        }
    }
}

/* Combines the split-K chunks of each row of m: out = sum_c w_c O_c / sum_c w_c l_c with
 * w_c = 2^((m_c - max_c m_c) c), written as bf16. A row no key reaches gets zeros. */
static void merge_split(const problem *p, const split_merge *m, float *parts) {
    const seq_info *si = &p->seqs[m->seq];
    const int D = p->D, G = p->G;
    for (int r = m->r0; r < m->r1; r++) {
        const int64_t row = (int64_t)(r - m->r0) * (D + 2);
        float mmax = MASKED;
        for (int c = 0; c < m->chunks; c++) {
            const float mc = parts[m->part + c * m->stride + row + D];
            mmax = mc > mmax ? mc : mmax;
        }
        __m512 acc[MAX_D / 16];
        for (int d = 0; d < D / 16; d++) acc[d] = _mm512_setzero_ps();
        float sum = 0.0f;
        for (int c = 0; c < m->chunks; c++) {
            const float *src = parts + m->part + c * m->stride + row;
            const __m512 w = exp2_ps(_mm512_set1_ps((src[D] - mmax) * p->c));
            sum += _mm512_cvtss_f32(w) * src[D + 1];
            for (int d = 0; d < D / 16; d++)
                acc[d] = _mm512_fmadd_ps(w, _mm512_loadu_ps(src + 16 * d), acc[d]);
        }
        const int t = r / G, g = r % G;
        bf16 *dst = p->out + ((si->qs + t) * p->H + m->h * G + g) * (int64_t)D;
        const __m512 inv = _mm512_set1_ps(sum > 0.0f ? 1.0f / sum : 0.0f);
        for (int d = 0; d < D / 16; d++)
            store_bf16(dst + 16 * d, _mm512_mul_ps(acc[d], inv), 0xFFFF);
    }
}

/* Item order: the items of sequences that keep their packed K/V first, by (sequence, kv head,
 * rows), so that a thread's run packs one kv head's keys once and keeps them in its L2 for
 * several items; then the others, costliest first (stealing from the back of the runs then
 * balances the tail). */
static int by_order(const void *x, const void *y) {
    const work_item *a = x, *b = y;
    if (a->keep != b->keep) return b->keep - a->keep;
    if (!a->keep && a->cost != b->cost) return (a->cost < b->cost) - (a->cost > b->cost);
    if (a->seq != b->seq) return (a->seq > b->seq) - (a->seq < b->seq);
    if (a->h0 != b->h0) return (a->h0 > b->h0) - (a->h0 < b->h0);
    return (a->r0 > b->r0) - (a->r0 < b->r0);
}

/* ------------------------------------------------------------------ workspace */

static __thread void *tls_ws = NULL;
static __thread int64_t tls_ws_bytes = 0;

static char *workspace(int64_t bytes) { return grow_buffer(&tls_ws, &tls_ws_bytes, bytes); }

/* Frees the calling thread's cached workspace. */
void pa_release_workspace(void) {
    free(tls_ws);
    tls_ws = NULL;
    tls_ws_bytes = 0;
}

/* ------------------------------------------------------------------ entry point */

/*
 * Prefill (decode == 0): starts [num_seqs + 1] are query_start_loc, lens [num_seqs] the cached
 * context lengths; new token i of a sequence sees the context and new tokens 0..i (k/v).
 * Decode (decode != 0): starts is unused, query i belongs to sequence i, lens are seq_lens and
 * all keys are in the cache; k/v are unused.
 * The pool (k_cache, v_cache: [num_blocks][block_size][num_kv_heads][head_dim]) holds
 * elements of kv_type: KV_BF16, KV_INT8 or KV_FP8 (e4m3fn); quantized pools read as
 * stored * scale with k_scale, v_scale float32 [num_kv_heads][head_dim] (unused for bf16).
 * Strides are in elements. Returns 0, or a negative code on invalid input (nothing written):
 * -1 query_start_loc not monotone within [0, num_tokens], -2 negative length, -3 block table
 * too narrow, -4 block id out of range, -5 out of memory, -6 unknown kv_type or a quantized
 * pool without scales.
 */
int pa_paged_attention(const bf16 *q, int64_t q_st, int64_t q_sh, const bf16 *k, int64_t k_st,
                       int64_t k_sh, const bf16 *v, int64_t v_st, int64_t v_sh,
                       const void *k_cache, const void *v_cache, int kv_type,
                       const float *k_scale, const float *v_scale, int64_t num_blocks,
                       const int32_t *bt, int64_t bt_stride, int64_t max_blocks,
                       const int32_t *starts, const int32_t *lens, int num_seqs,
                       int64_t num_tokens, bf16 *out, int num_heads, int num_kv_heads,
                       int head_dim, int block_size, float scale, _Bool decode, int num_threads) {
    if (kv_type != KV_BF16 && kv_type != KV_INT8 && kv_type != KV_FP8) return -6;
    if (kv_type != KV_BF16 && (!k_scale || !v_scale)) return -6;
    if (num_seqs <= 0 || num_tokens <= 0) return 0;
    const int G = num_heads / num_kv_heads, D = head_dim;
    seq_info *seqs = malloc(sizeof(seq_info) * (size_t)num_seqs);
    if (!seqs) return -5;
    int64_t area_bytes = 0, n_items = 0; /* a thread's area: the largest kept K/V of a head */
    int err = 0;
    for (int s = 0; s < num_seqs; s++) {
        seq_info *si = &seqs[s];
        if (decode) {
            si->qs = s;
            si->nq = 1;
            si->ncache = lens[s];
            si->lim0 = lens[s];
        } else {
            if (starts[s] < 0 || starts[s + 1] < starts[s] || starts[s + 1] > num_tokens) err = -1;
            si->qs = starts[s];
            si->nq = starts[s + 1] - starts[s];
            si->ncache = lens[s];
            si->lim0 = lens[s] + 1;
        }
        if (lens[s] < 0) err = -2;
        if (err) break;
        si->keep = 0;
        si->chunks = 1;
        if (si->nq == 0) continue; /* nothing read for it */
        const int64_t nblk = ((int64_t)si->ncache + block_size - 1) / block_size;
        if (nblk > max_blocks) err = -3;
        for (int64_t b = 0; b < nblk && !err; b++) {
            const int32_t id = bt[s * bt_stride + b];
            if (id < 0 || id >= num_blocks) err = -4;
        }
        if (err) break;
        const int rows = si->nq * G;
        n_items += (int64_t)num_kv_heads * ((rows + ROWS_ITEM - 1) / ROWS_ITEM);
        if (!decode && rows > RB) {
            const int64_t bytes = 2 * packed_bytes(si->lim0 + si->nq - 1, D);
            si->keep = 1;
            area_bytes = bytes > area_bytes ? bytes : area_bytes;
        }
    }
    if (err) {
        free(seqs);
        return err;
    }
    const int nt = num_threads > 0 ? num_threads : 1;
    /* Split-K when short queries over few sequences would leave threads idle: each sequence
     * read per block inside its items gets its keys cut into chunks of SPLIT_MIN_BLOCKS key
     * blocks or more, so that there are about SPLIT_ITEMS_PER_THREAD items per thread. */
    const int64_t split_target = (int64_t)SPLIT_ITEMS_PER_THREAD * nt;
    int64_t n_merges = 0, part_floats = 0;
    for (int s = 0; s < num_seqs && nt > 1 && num_seqs < 4 * nt && n_items < split_target; s++) {
        seq_info *si = &seqs[s];
        const int total = si->lim0 + si->nq - 1;
        if (si->keep || si->nq == 0 || total <= 0) continue;
        const int64_t want = (split_target + n_items - 1) / n_items;
        const int64_t most = ((int64_t)total + KB - 1) / KB / SPLIT_MIN_BLOCKS;
        si->chunks = (int)(want < most ? want : most);
        if (si->chunks < 2) {
            si->chunks = 1;
            continue;
        }
        const int rows = si->nq * G;
        const int64_t pieces = (int64_t)num_kv_heads * ((rows + ROWS_ITEM - 1) / ROWS_ITEM);
        n_merges += pieces;
        part_floats += (int64_t)si->chunks * num_kv_heads * rows * (D + 2);
    }
    const int64_t items_cap = n_items * (n_merges ? split_target : 1);
    area_bytes = (area_bytes + 63) / 64 * 64;
    const int64_t scratch_off = area_bytes * nt;
    const int64_t parts_off = scratch_off + (int64_t)sizeof(scratch) * nt;
    char *ws = workspace(parts_off + part_floats * (int64_t)sizeof(float));
    work_item *items = malloc(sizeof(work_item) * (size_t)(items_cap + 1));
    split_merge *merges = malloc(sizeof(split_merge) * (size_t)(n_merges + 1));
    if (!ws || !items || !merges) {
        free(seqs);
        free(items);
        free(merges);
        return -5;
    }
    float *parts = (float *)(ws + parts_off);
    int64_t ni = 0, nm = 0, part = 0;
    for (int s = 0; s < num_seqs; s++) {
        const seq_info *si = &seqs[s];
        const int rows = si->nq * G;
        const int total = si->lim0 + si->nq - 1;
        if (!si->keep && rows <= ROWS_ITEM && num_seqs >= 4 * nt && rows > 0) {
            /* decode-like and enough sequences to share out: one item reads each cache block of
             * the sequence for all kv heads in turn (page and cache-line locality) */
            const int64_t keys = si->lim0 + si->nq / 2 + KB;
            items[ni++] = (work_item){s, 0, num_kv_heads, 0, rows, 0, INT32_MAX, -1,
                                      keys * (rows + RB) * num_kv_heads};
            continue;
        }
        const int nkb = (total + KB - 1) / KB;
        for (int h = 0; h < num_kv_heads; h++) {
            for (int r0 = 0; r0 < rows; r0 += ROWS_ITEM) {
                const int r1 = r0 + ROWS_ITEM < rows ? r0 + ROWS_ITEM : rows;
                const int64_t keys = si->lim0 + (r0 + r1) / (2 * G) + KB;
                if (si->chunks == 1) {
                    items[ni++] = (work_item){s, h, h + 1, r0, r1, 0, INT32_MAX, -1,
                                              keys * (r1 - r0 + RB), si->keep};
                    continue;
                }
                const int64_t stride = (int64_t)(r1 - r0) * (D + 2);
                merges[nm++] = (split_merge){s, h, r0, r1, si->chunks, part, stride};
                for (int c = 0; c < si->chunks; c++) {
                    const int kb0 = (int)((int64_t)nkb * c / si->chunks);
                    const int kb1 = (int)((int64_t)nkb * (c + 1) / si->chunks);
                    items[ni++] = (work_item){s, h, h + 1, r0, r1, kb0, kb1, part + c * stride,
                                              (int64_t)(kb1 - kb0) * KB * (r1 - r0 + RB)};
                }
                part += si->chunks * stride;
            }
        }
    }
    qsort(items, (size_t)ni, sizeof(work_item), by_order);
    const problem p = {.q = q, .k = k, .v = v, .k_cache = k_cache, .v_cache = v_cache,
                       .k_scale = k_scale, .v_scale = v_scale, .kind = kv_type,
                       .esize = kv_type == KV_BF16 ? 2 : 1, .q_st = q_st, .q_sh = q_sh,
                       .k_st = k_st, .k_sh = k_sh, .v_st = v_st, .v_sh = v_sh, .bt = bt,
                       .bt_stride = bt_stride, .out = out, .H = num_heads, .KVH = num_kv_heads,
                       .G = G, .D = D, .bs = block_size, .c = scale * 1.4426950408889634f,
                       .seqs = seqs};
    work_run item_runs[nt];
    work_runs_init(item_runs, nt, ni);
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num();
        scratch *sc = (scratch *)(ws + scratch_off + (int64_t)sizeof(scratch) * tid);
        char *area = ws + area_bytes * tid;
        packed_area held = {-1, 0, 0};
        for (int64_t i, after; (i = work_runs_next(item_runs, nt, tid, &after)) >= 0;) {
            const work_item *it = &items[i];
            next_keys then = {-1, 0, 0, 0};
            if (after >= 0 && !items[after].keep && it->h1 - it->h0 == 1 &&
                it->r1 - it->r0 <= RB) { /* one tile here (decode): the next item's keys */
                const work_item *nx = &items[after];
                then = (next_keys){nx->seq, nx->h0, nx->kb0, nx->kb1};
            }
            for (int h = it->h0; h < it->h1; h++) {
                for (int rb = it->r0; rb < it->r1; rb += RB) {
                    const int R = it->r1 - rb < RB ? it->r1 - rb : RB;
                    float *tile_part = it->part < 0
                                           ? NULL
                                           : parts + it->part + (int64_t)(rb - it->r0) * (D + 2);
                    row_tile(&p, it->seq, h, rb, R, it->kb0, it->kb1, tile_part, sc, then, area,
                             &held);
                }
            }
        }
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < nm; i++) merge_split(&p, &merges[i], parts);
    }
    free(seqs);
    free(items);
    free(merges);
    return 0;
}
