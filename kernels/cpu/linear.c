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
 * strip that comes next is prefetched, so only a thread's first strip waits for memory.
 */
#include <omp.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "simd_math.h"

#define STRIP 64  /* output columns per packed strip */
#define TILE_M 6  /* rows per register tile */
#define SLICE 16  /* output columns per work item when rows <= TILE_M */
#define PREFETCH (64 * STRIP) /* prefetch distance into L2: 64 input pairs (16 KiB) ahead */

typedef struct {
    const bf16 *x;
    int64_t x_stride;
    const uint32_t *w; /* packed, as bf16 pairs */
    const bf16 *bias;
    bf16 *out;
    int64_t out_stride;
    int64_t n, k2; /* output columns, input pairs */
} linear_problem;

/* Rows [m0, m0 + R) x columns [c0, c0 + 16 NV) of the output; c0 is inside one strip.
 * Prefetching into L2 while it runs: PF_SELF, the weight PREFETCH bytes ahead of its loads
 * (its first pass, from memory); PF_NEXT, two lines per input pair from `next` on (half a
 * strip: two such tiles bring in the strip this thread reads next). */
enum { PF_NONE = 0, PF_SELF = 1, PF_NEXT = 2 };
INLINE void tile(const int R, const int NV, const int PF, const linear_problem *p, int64_t m0,
                 int64_t c0, const char *next) {
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
                                       const char *next) {                                    \
        tile(R, NV, PF, p, m0, c0, next);                                                     \
    }
#define DEFINE_TILES(R) \
    DEFINE_TILE(R, 1, 1) DEFINE_TILE(R, 4, 0) DEFINE_TILE(R, 4, 1) DEFINE_TILE(R, 4, 2)
DEFINE_TILES(1)
DEFINE_TILES(2)
DEFINE_TILES(3)
DEFINE_TILES(4)
DEFINE_TILES(5)
DEFINE_TILES(6)

typedef void (*tile_fn)(const linear_problem *, int64_t, int64_t, const char *);
/* 16-column slices (decode), prefetching ahead */
static const tile_fn SLICE_TILES[TILE_M + 1] = {NULL,       tile_1_1_1, tile_2_1_1, tile_3_1_1,
                                                tile_4_1_1, tile_5_1_1, tile_6_1_1};
/* whole strips, [rows][PF_NONE, PF_SELF, PF_NEXT] */
static const tile_fn STRIP_TILES[TILE_M + 1][3] = {
    {NULL, NULL, NULL},
    {tile_1_4_0, tile_1_4_1, tile_1_4_2},
    {tile_2_4_0, tile_2_4_1, tile_2_4_2},
    {tile_3_4_0, tile_3_4_1, tile_3_4_2},
    {tile_4_4_0, tile_4_4_1, tile_4_4_2},
    {tile_5_4_0, tile_5_4_1, tile_5_4_2},
    {tile_6_4_0, tile_6_4_1, tile_6_4_2},
};

/*
 * out[m][n] = bf16(sum_k x[m][k] w[n][k] + bias[n]) for m < rows, n < n_out, with w packed by
 * the layout above (k_pairs = K / 2; K even). bias may be NULL. Strides in elements.
 */
void pc_linear(const bf16 *x, int64_t x_stride, int64_t rows, int64_t k_pairs,
               const bf16 *packed, int64_t n_out, const bf16 *bias, bf16 *out,
               int64_t out_stride, int num_threads) {
    if (rows <= 0 || n_out <= 0) return;
    const linear_problem p = {x, x_stride, (const uint32_t *)packed, bias, out, out_stride,
                              n_out, k_pairs};
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
        for (int64_t s = 0; s < items; s++) fn(&p, 0, s * width, NULL);
        return;
    }
    /* row ranges per strip: enough items for every thread, each a multiple of TILE_M rows */
    const int64_t tiles = (rows + TILE_M - 1) / TILE_M;
    int64_t chunks = (8 * (int64_t)nt + strips - 1) / strips;
    if (chunks > tiles) chunks = tiles;
    const int64_t tiles_per_chunk = (tiles + chunks - 1) / chunks;
    chunks = (tiles + tiles_per_chunk - 1) / tiles_per_chunk;
    /* each thread a contiguous run of items (strip-major), so it knows the strip it reads
     * next and brings it into L2 while its current strip's later tiles run from L2 */
    const int64_t n_items = strips * chunks, strip_bytes = k_pairs * STRIP * 4;
#pragma omp parallel num_threads(nt)
    {
        const int64_t team = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t lo = n_items * tid / team, hi = n_items * (tid + 1) / team;
        int64_t fetched = -1; /* the strip the previous item prefetched whole */
        for (int64_t item = lo; item < hi; item++) {
            const int64_t strip = item / chunks, chunk = item % chunks;
            const int64_t next_strip = item + 1 < hi ? (item + 1) / chunks : strip;
            const char *next = (const char *)packed + next_strip * strip_bytes;
            const int64_t m_start = chunk * tiles_per_chunk * TILE_M;
            const int64_t m_end0 = (chunk + 1) * tiles_per_chunk * TILE_M;
            const int64_t m_end = m_end0 < rows ? m_end0 : rows;
            int halves = 0; /* of the next strip prefetched so far */
            for (int64_t m0 = m_start; m0 < m_end; m0 += TILE_M) {
                const int R = m_end - m0 < TILE_M ? (int)(m_end - m0) : TILE_M;
                int mode = PF_NONE;
                if (m0 == m_start && (chunk == 0 || item == lo) && strip != fetched)
                    mode = PF_SELF; /* its first pass, from memory */
                else if (next_strip != strip && halves < 2)
                    mode = PF_NEXT;
                STRIP_TILES[R][mode](&p, m0, strip * STRIP, next + halves * (strip_bytes / 2));
                halves += mode == PF_NEXT;
            }
            if (next_strip != strip) fetched = halves == 2 ? next_strip : -1;
        }
    }
}
