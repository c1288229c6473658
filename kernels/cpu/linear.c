/*
 * y = x W^T (+ bias) for bf16 activations and weights (AVX512-BF16), the weight pre-packed once.
 *
 * Packed weight layout: [ceil(N / 64)][K / 2][64][2] bf16: for each strip of 64 output columns
 * and each pair of input dims (2p, 2p + 1), the 64 columns' pairs (W[n][2p], W[n][2p + 1]) are
 * 256 contiguous bytes, four zmm registers of 16 bf16 pairs. Columns past N are zero.
 * A register tile of R <= 6 rows x 16 NV columns accumulates in float32 with _mm512_dpbf16_ps,
 * an input pair of each row broadcast from memory; the output is rounded to bf16 once, after
 * the bias (float32) is added.
 *
 * Work items: with at most 6 rows (decode), whole strips, or 16-column slices of them when there
 * are few strips, so the threads stream disjoint parts of the weight once, at memory speed; with
 * more rows, whole strips times ranges of rows, each strip read from L2 for every 6-row tile,
 * each thread a contiguous run of them: while the later tiles of a strip run from L2, the
 * strip that comes next is prefetched, so only a thread's first strip waits for memory. A
 * thread done with its run takes items from the back of the others' (work_runs.h), so a
 * slower core does not hold the other one at the join.
 * pc_linear_prefetching's tiles, once nothing of their own is left to fetch, go on to bring
 * into L2 what the thread reads right after the GEMM: KV pool blocks (the attention's packing
 * of a cached prefix, which would otherwise wait for memory), then the strips it reads first in
 * the GEMM that follows (a gate strip and its up strip when that is pc_linear_swiglu).
 *
 * pc_linear_swiglu runs a gate_up projection ([gate; up] rows, `inter` each) with SiLU-and-mul
 * in the epilogue: its items are pairs of strips (gate strip s, up strip s + inter / 64), each
 * row tile computing the gate tile (stored, bf16) and then the up tile, whose epilogue reads
 * the gate back and writes act = bf16(bf16(silu(g)) * bf16(u)), as the separate ops round.
 */
#include <omp.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "simd_math.h"
#include "work_runs.h"

#define STRIP 64  /* output columns per packed strip */
#define TILE_M 6  /* rows per register tile */
#define SLICE 16  /* output columns per work item when rows <= TILE_M */
#define PREFETCH (64 * STRIP) /* prefetch distance into L2: 64 input pairs (16 KiB) ahead */
#define POOL_PREFETCH_MAX (768 * 1024) /* pool bytes a thread brings into L2 per GEMM, at most */

typedef struct {
    const bf16 *x;
    int64_t x_stride;
    const uint32_t *w; /* packed, as bf16 pairs */
    const bf16 *bias;
    bf16 *out;
    int64_t out_stride;
    int64_t n, k2;   /* output columns, input pairs */
    const bf16 *gate; /* gated epilogue: the gate rows (bf16, gate_stride), read back */
    int64_t gate_stride;
} linear_problem;

/* A thread's walk over the byte ranges it brings into L2 for what follows the GEMM: K then V
 * of pool entries [entry / 2, entry_end / 2), then the strips `then` (then_bytes each; a
 * gated GEMM's thread starts on a gate strip and its up strip, another's on one strip). */
typedef struct {
    const gemm_prefetch *ahead;
    int64_t entry, entry_end; /* entry 2 i: K of ahead->blocks[i], 2 i + 1: its V */
    const char *then[2];      /* NULL: none */
    int then_next;            /* the entry of `then` the walk takes next */
    int64_t then_bytes;
    const char *at; /* the current range, `left` bytes from at */
    int64_t left;
} prefetch_walk;

/* Moves `w` to its next range (left = 0: none left). */
static void walk_next_range(prefetch_walk *w) {
    if (w->entry < w->entry_end) {
        const gemm_prefetch *a = w->ahead;
        const int64_t e = w->entry++;
        w->at = (e % 2 ? a->v_pool : a->k_pool) + a->blocks[e / 2] * a->block_bytes;
        w->left = a->block_bytes;
    } else {
        w->at = w->then_next < 2 ? w->then[w->then_next++] : NULL;
        w->left = w->at ? w->then_bytes : 0;
    }
}

/* Rows [m0, m0 + R) x columns [c0, c0 + 16 NV) of the output; c0 is inside one strip.
 * Prefetching into L2 while it runs: PF_SELF, the weight PREFETCH bytes ahead of its loads
 * (its first pass, from memory); PF_NEXT, two lines per input pair from `next` on (half a
 * strip: two such tiles bring in the strip this thread reads next); PF_WALK, a line per input
 * pair along `walk`. */
enum { PF_NONE = 0, PF_SELF = 1, PF_NEXT = 2, PF_WALK = 3 };
/* Epilogues: EPI_STORE, out[r][c] = bf16(acc + bias); EPI_GATED (pc_linear_swiglu: no bias,
 * c0 in the up half [n, 2 n) of [gate; up]), out[r][c - n] = silu_and_mul(gate[r][c - n],
 * bf16(acc)). */
enum { EPI_STORE = 0, EPI_GATED = 1 };
INLINE void tile_epi(const int R, const int NV, const int PF, const int EPI,
                     const linear_problem *p, int64_t m0, int64_t c0, const char *next,
                     prefetch_walk *walk) {
    __m512 acc[TILE_M][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    const uint32_t *w = p->w + (c0 / STRIP) * p->k2 * STRIP + c0 % STRIP;
    const uint32_t *x[TILE_M];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) x[r] = (const uint32_t *)(p->x + (m0 + r) * p->x_stride);
    for (int64_t q = 0; q < p->k2; q++, w += STRIP) {
        if (PF == PF_SELF) {
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                _mm_prefetch((const char *)(w + PREFETCH + 16 * v), _MM_HINT_T1);
        } else if (PF == PF_NEXT) {
            _mm_prefetch(next + 128 * q, _MM_HINT_T1);
            _mm_prefetch(next + 128 * q + 64, _MM_HINT_T1);
        } else if (PF == PF_WALK && walk->left > 0) {
            _mm_prefetch(walk->at, _MM_HINT_T1);
            walk->at += 64;
            walk->left -= 64;
            if (walk->left <= 0) walk_next_range(walk);
        }
        __m512bh b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = (__m512bh)_mm512_loadu_si512(w + 16 * v);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)x[r][q]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
        }
    }
    if (EPI == EPI_GATED) { /* c0 is inside the up half: columns [n, 2 n) of [gate; up] */
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            const int64_t c = c0 - p->n + 16 * v;
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                const __m512 g = load_bf16(p->gate + (m0 + r) * p->gate_stride + c, 0xFFFF);
                store_bf16(p->out + (m0 + r) * p->out_stride + c,
                           silu_and_mul(g, round_bf16(acc[r][v])), 0xFFFF);
            }
        }
        return;
    }
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
        const int64_t c = c0 + 16 * v;
        if (c >= p->n) break;
        const __mmask16 m = lanes(p->n - c);
        const __m512 bias = p->bias ? load_bf16(p->bias + c, m) : _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            store_bf16(p->out + (m0 + r) * p->out_stride + c, _mm512_add_ps(acc[r][v], bias), m);
    }
}

#define DEFINE_TILE(R, NV, PF)                                                                \
    static void tile_##R##_##NV##_##PF(const linear_problem *p, int64_t m0, int64_t c0,       \
                                       const char *next, prefetch_walk *walk) {               \
        tile_epi(R, NV, PF, EPI_STORE, p, m0, c0, next, walk);                                \
    }
#define DEFINE_TILES(R)                                                                   \
    DEFINE_TILE(R, 1, 1) DEFINE_TILE(R, 4, 0) DEFINE_TILE(R, 4, 1) DEFINE_TILE(R, 4, 2) \
        DEFINE_TILE(R, 4, 3)
DEFINE_TILES(1)
DEFINE_TILES(2)
DEFINE_TILES(3)
DEFINE_TILES(4)
DEFINE_TILES(5)
DEFINE_TILES(6)

#define DEFINE_GATED_TILE(R, PF)                                                             \
    static void gated_##R##_##PF(const linear_problem *p, int64_t m0, int64_t c0,            \
                                 const char *next, prefetch_walk *walk) {                    \
        tile_epi(R, 4, PF, EPI_GATED, p, m0, c0, next, walk);                                \
    }
#define DEFINE_GATED_TILES(R) \
    DEFINE_GATED_TILE(R, 0) DEFINE_GATED_TILE(R, 1) DEFINE_GATED_TILE(R, 2) DEFINE_GATED_TILE(R, 3)
DEFINE_GATED_TILES(1)
DEFINE_GATED_TILES(2)
DEFINE_GATED_TILES(3)
DEFINE_GATED_TILES(4)
DEFINE_GATED_TILES(5)
DEFINE_GATED_TILES(6)

typedef void (*tile_fn)(const linear_problem *, int64_t, int64_t, const char *,
                        prefetch_walk *);
/* 16-column slices (decode), prefetching ahead */
static const tile_fn SLICE_TILES[TILE_M + 1] = {NULL,       tile_1_1_1, tile_2_1_1, tile_3_1_1,
                                                tile_4_1_1, tile_5_1_1, tile_6_1_1};
/* A [rows 0..TILE_M][PF_NONE, PF_SELF, PF_NEXT, PF_WALK] table of the tiles NAME(R, PF). */
#define TILE_ROW(NAME, R) {NAME(R, 0), NAME(R, 1), NAME(R, 2), NAME(R, 3)}
#define TILE_TABLE(NAME)                                                                      \
    {{NULL, NULL, NULL, NULL}, TILE_ROW(NAME, 1), TILE_ROW(NAME, 2), TILE_ROW(NAME, 3),       \
     TILE_ROW(NAME, 4),        TILE_ROW(NAME, 5), TILE_ROW(NAME, 6)}
#define STRIP_TILE(R, PF) tile_##R##_4_##PF
/* whole strips */
static const tile_fn STRIP_TILES[TILE_M + 1][4] = TILE_TABLE(STRIP_TILE);

/* How the many-rows path shares out a GEMM of `strips` strips over `rows` rows: items
 * (strip-major) of one strip times a range of tiles_per_chunk row tiles, `chunks` a strip. */
typedef struct {
    int64_t chunks, tiles_per_chunk, items;
} row_split;

/* What a tile of the many-rows path prefetches: its own weight on its item's first pass (from
 * memory), else the thread's next weight while some of it is still to fetch, else the walk. */
static inline int tile_prefetch(int first_pass, int next_to_fetch, const prefetch_walk *walk) {
    if (first_pass) return PF_SELF;
    if (next_to_fetch) return PF_NEXT;
    return walk->left > 0 ? PF_WALK : PF_NONE;
}

static row_split split_rows(int64_t rows, int64_t strips, int nt) {
    const int64_t tiles = (rows + TILE_M - 1) / TILE_M;
    int64_t chunks = (8 * (int64_t)nt + strips - 1) / strips; /* enough items for every thread */
    if (chunks > tiles) chunks = tiles;
    const int64_t tiles_per_chunk = (tiles + chunks - 1) / chunks;
    chunks = (tiles + tiles_per_chunk - 1) / tiles_per_chunk;
    return (row_split){chunks, tiles_per_chunk, strips * chunks};
}

/* Thread tid's (of team) walk for `ahead`: its share of the pool entries, at most
 * POOL_PREFETCH_MAX bytes, then the strip it reads first in the next GEMM (of `rows` rows). */
static prefetch_walk start_walk(const gemm_prefetch *ahead, int64_t rows, int64_t tid,
                                int64_t team) {
    prefetch_walk w = {ahead, 0, 0, {NULL, NULL}, 0, 0, NULL, 0};
    if (!ahead) return w;
    if (ahead->num_blocks > 0 && ahead->block_bytes > 0) {
        const int64_t n = ahead->num_blocks, lo = n * tid / team, hi = n * (tid + 1) / team;
        const int64_t most = POOL_PREFETCH_MAX / (2 * ahead->block_bytes);
        w.entry = 2 * lo;
        w.entry_end = 2 * (hi - lo < most ? hi : lo + most);
    }
    if (ahead->next_w && rows > TILE_M) {
        const int64_t strips = (ahead->next_n_out + STRIP - 1) / STRIP;
        /* pc_linear_swiglu's items are pairs (gate strip s, up strip s + strips / 2) */
        const int gated = ahead->next_gated && ahead->next_n_out % (2 * STRIP) == 0;
        const int64_t units = gated ? strips / 2 : strips;
        const row_split sp = split_rows(rows, units, (int)team);
        const int64_t first_item = sp.items * tid / team;
        w.then_bytes = ahead->next_k_pairs * STRIP * 4;
        if (first_item < sp.items) {
            const int64_t unit = first_item / sp.chunks;
            w.then[0] = (const char *)ahead->next_w + unit * w.then_bytes;
            if (gated) w.then[1] = (const char *)ahead->next_w + (units + unit) * w.then_bytes;
        }
    }
    walk_next_range(&w);
    return w;
}

/*
 * pc_linear's outputs of one strip, without bias, on the calling thread: out[m][c] =
 * bf16(sum_k x[m][k] w[64 strip + c][k]) for m < rows and the strip's columns c below n_out
 * (out_stride elements apart; columns past n_out are not written). The same sums, in the same
 * order, as pc_linear: the greedy screen (greedy_screen.c) recomputes a few strips exactly.
 */
void pc_linear_strip(const bf16 *x, int64_t x_stride, int64_t rows, int64_t k_pairs,
                     const bf16 *packed, int64_t n_out, int64_t strip, bf16 *out,
                     int64_t out_stride) {
    const linear_problem p = {x, x_stride,
                              (const uint32_t *)packed + strip * k_pairs * STRIP,
                              NULL, out, out_stride, n_out - strip * STRIP, k_pairs, NULL, 0};
    for (int64_t m0 = 0; m0 < rows; m0 += TILE_M) {
        const int R = rows - m0 < TILE_M ? (int)(rows - m0) : TILE_M;
        STRIP_TILES[R][PF_NONE](&p, m0, 0, NULL, NULL);
    }
}

/*
 * out[m][n] = bf16(sum_k x[m][k] w[n][k] + bias[n]) for m < rows, n < n_out, with w packed by
 * the layout above (k_pairs = K / 2; K even). bias may be NULL. Strides in elements.
 */
void pc_linear(const bf16 *x, int64_t x_stride, int64_t rows, int64_t k_pairs,
               const bf16 *packed, int64_t n_out, const bf16 *bias, bf16 *out,
               int64_t out_stride, int num_threads) {
    pc_linear_prefetching(x, x_stride, rows, k_pairs, packed, n_out, bias, out, out_stride,
                          num_threads, NULL);
}

/* pc_linear; with more than TILE_M rows its tiles also bring `ahead` into L2 (NULL: nothing),
 * each thread its share (see the top of this file). */
void pc_linear_prefetching(const bf16 *x, int64_t x_stride, int64_t rows, int64_t k_pairs,
                           const bf16 *packed, int64_t n_out, const bf16 *bias, bf16 *out,
                           int64_t out_stride, int num_threads, const gemm_prefetch *ahead) {
    if (rows <= 0 || n_out <= 0) return;
    const linear_problem p = {x, x_stride, (const uint32_t *)packed, bias, out, out_stride,
                              n_out, k_pairs, NULL, 0};
    const int64_t strips = (n_out + STRIP - 1) / STRIP;
    const int nt = num_threads > 0 ? num_threads : 1;
    if (rows <= TILE_M) {
        /* whole strips (one sequential stream each) when there are plenty, else slices */
        const int whole = strips >= 8 * (int64_t)nt;
        const int64_t width = whole ? STRIP : SLICE;
        const int64_t items = (n_out + width - 1) / width;
        const tile_fn fn = whole ? STRIP_TILES[rows][PF_SELF] : SLICE_TILES[rows];
        const int team = items >= 2 * nt ? nt : 1;
#pragma omp parallel for num_threads(team) schedule(static)
        for (int64_t s = 0; s < items; s++) fn(&p, 0, s * width, NULL, NULL);
        return;
    }
    const row_split sp = split_rows(rows, strips, nt);
    const int64_t chunks = sp.chunks, tiles_per_chunk = sp.tiles_per_chunk;
    /* each thread a contiguous run of items (strip-major), so it knows the strip it reads
     * next and brings it into L2 while its current strip's later tiles run from L2; a thread
     * done with its run takes items from the back of the others' (work_runs.h) */
    const int64_t strip_bytes = k_pairs * STRIP * 4;
    work_run runs[nt];
    work_runs_init(runs, nt, sp.items);
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num();
        int64_t fetched = -1; /* the strip the previous item prefetched whole */
        int64_t item, prev = -1, after;
        prefetch_walk walk = start_walk(ahead, rows, tid, nt);
        for (; (item = work_runs_next(runs, nt, tid, &after)) >= 0; prev = item) {
            const int64_t strip = item / chunks, chunk = item % chunks;
            const int64_t next_strip = after >= 0 ? after / chunks : strip;
            const char *next = (const char *)packed + next_strip * strip_bytes;
            const int64_t m_start = chunk * tiles_per_chunk * TILE_M;
            const int64_t m_end0 = (chunk + 1) * tiles_per_chunk * TILE_M;
            const int64_t m_end = m_end0 < rows ? m_end0 : rows;
            int halves = 0; /* of the next strip prefetched so far */
            for (int64_t m0 = m_start; m0 < m_end; m0 += TILE_M) {
                const int R = m_end - m0 < TILE_M ? (int)(m_end - m0) : TILE_M;
                const int mode = tile_prefetch(
                    m0 == m_start && (chunk == 0 || item != prev + 1) && strip != fetched,
                    next_strip != strip && halves < 2, &walk);
                STRIP_TILES[R][mode](&p, m0, strip * STRIP, next + halves * (strip_bytes / 2),
                                     &walk);
                halves += mode == PF_NEXT;
            }
            if (next_strip != strip) fetched = halves == 2 ? next_strip : -1;
        }
    }
}

#define GATED_TILE(R, PF) gated_##R##_##PF
static const tile_fn GATED_TILES[TILE_M + 1][4] = TILE_TABLE(GATED_TILE);

/*
 * act[m][i] = bf16(bf16(silu(g)) * u), g = bf16(x[m] . w[i]), u = bf16(x[m] . w[inter + i]), for
 * m < rows, i < inter: a gate_up projection (packed, 2 inter output columns, no bias) and
 * SiLU-and-mul at once, the same values as pc_linear then pc_silu_and_mul. `gate` (rows x inter,
 * gate_stride) receives the gate values on the way. With few rows (decode) or inter not a
 * multiple of 64 it runs as exactly those two calls, `gate` then holding the whole [gate; up]
 * (rows x 2 inter). `ahead` as for pc_linear_prefetching.
 */
void pc_linear_swiglu(const bf16 *x, int64_t x_stride, int64_t rows, int64_t k_pairs,
                      const bf16 *packed, int64_t inter, bf16 *gate, int64_t gate_stride,
                      bf16 *act, int64_t act_stride, int num_threads,
                      const gemm_prefetch *ahead) {
    if (rows <= 0 || inter <= 0) return;
    const int nt = num_threads > 0 ? num_threads : 1;
    if (rows <= TILE_M || inter % STRIP) {
        pc_linear_prefetching(x, x_stride, rows, k_pairs, packed, 2 * inter, NULL, gate,
                              gate_stride, nt, ahead);
        pc_silu_and_mul(gate, gate_stride, act, act_stride, rows, inter, nt);
        return;
    }
    const linear_problem gate_p = {x, x_stride, (const uint32_t *)packed, NULL, gate, gate_stride,
                                   inter, k_pairs, NULL, 0};
    const linear_problem up_p = {x, x_stride, (const uint32_t *)packed, NULL, act, act_stride,
                                 inter, k_pairs, gate, gate_stride};
    const int64_t pairs = inter / STRIP, strip_bytes = k_pairs * STRIP * 4;
    const row_split sp = split_rows(rows, pairs, nt);
    work_run runs[nt];
    work_runs_init(runs, nt, sp.items);
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num();
        int64_t fetched = -1; /* the pair the previous item prefetched whole */
        int64_t item, prev = -1, after;
        prefetch_walk walk = start_walk(ahead, rows, tid, nt);
        for (; (item = work_runs_next(runs, nt, tid, &after)) >= 0; prev = item) {
            const int64_t pair = item / sp.chunks, chunk = item % sp.chunks;
            const int64_t next_pair = after >= 0 ? after / sp.chunks : pair;
            /* the next pair's gate strip, then its up strip, a half per tile */
            const char *next_strips[2] = {(const char *)packed + next_pair * strip_bytes,
                                          (const char *)packed + (pairs + next_pair) * strip_bytes};
            const int64_t m_start = chunk * sp.tiles_per_chunk * TILE_M;
            const int64_t m_end0 = (chunk + 1) * sp.tiles_per_chunk * TILE_M;
            const int64_t m_end = m_end0 < rows ? m_end0 : rows;
            int quarters = 0; /* of the next pair prefetched so far: two halves of two strips */
            for (int64_t m0 = m_start; m0 < m_end; m0 += TILE_M) {
                const int R = m_end - m0 < TILE_M ? (int)(m_end - m0) : TILE_M;
                for (int half = 0; half < 2; half++) { /* the gate tile, then the up tile */
                    const int mode = tile_prefetch(
                        m0 == m_start && (chunk == 0 || item != prev + 1) && pair != fetched,
                        next_pair != pair && quarters < 4, &walk);
                    const char *next =
                        next_strips[quarters / 2] + (quarters % 2) * (strip_bytes / 2);
                    if (half == 0)
                        STRIP_TILES[R][mode](&gate_p, m0, pair * STRIP, next, &walk);
                    else
                        GATED_TILES[R][mode](&up_p, m0, (pairs + pair) * STRIP, next, &walk);
                    quarters += mode == PF_NEXT;
                }
            }
            if (next_pair != pair) fetched = quarters == 4 ? next_pair : -1;
        }
    }
}
