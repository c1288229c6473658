/*
 * y = x W^T + b in float32 for x86-64 CPUs with AVX2 and FMA, over a weight packed once:
 * strips of 16 output columns, each strip [K][16] contiguous (the last strip zero-padded), so
 * a strip streams from memory in order and a row tile reads 64 bytes of it per input dim.
 *
 * Register tile: up to 6 rows x 16 columns (12 accumulators); per input dim, two loads of the
 * strip, one broadcast per row, 12 FMAs. Rows are taken in blocks of ROW_BLOCK (their inputs
 * stay in L2 while every strip passes over them); within a block the threads split the
 * strips, each strip read once per block and reused by the block's row tiles from L1/L2,
 * which meanwhile ask for the next strip's lines, so few rows (a decode batch, a short suffix)
 * do not wait on memory at each strip's first tile.
 * Every output element is one FMA chain over k in order, so a row's result does not depend
 * on which other rows are in the call.
 */
#include <immintrin.h>
#include <stdint.h>

#include "cpu_kernels_f32.h"

#define STRIP 16     /* output columns per strip */
#define TILE_ROWS 6  /* rows per register tile */
#define ROW_BLOCK 96 /* rows whose inputs a pass of the strips reuses */

#define INLINE static inline __attribute__((always_inline))

/* The lines of the next strip a row tile asks the memory for while it computes: from `next`,
 * one line every `tiles` input dims (`tiles` = the row tiles of the strip, which split the
 * next strip between them). Each input dim issues one prefetch, with no branch: a line asked
 * for twice costs a load slot, while a counter and a branch in this loop made the GEMM
 * markedly slower on many rows. Prefetches past the weight's end are harmless (they never
 * fault). */
typedef struct {
    const char *next;  /* first line to ask for */
    uint64_t step;     /* bytes advanced per input dim, 16.16 fixed point (64 / tiles) */
} strip_prefetch;

/* Rows [r0, r0 + R) of x times strip s: out[r][s*16 .. s*16 + 16) (the columns < n_out). */
INLINE void tile(const float *x, int64_t x_stride, int64_t k, const float *strip,
                 const float *bias, float *out, int64_t out_stride, int64_t col0,
                 int64_t n_out, strip_prefetch pf, const int R) {
    __m256 acc[TILE_ROWS][2];
    for (int r = 0; r < R; r++) {
        acc[r][0] = _mm256_setzero_ps();
        acc[r][1] = _mm256_setzero_ps();
    }
    uint64_t ahead = 0;
    for (int64_t i = 0; i < k; i++, ahead += pf.step) {
        _mm_prefetch(pf.next + ((ahead >> 16) & ~(uint64_t)63), _MM_HINT_T0);
        const __m256 w0 = _mm256_load_ps(strip + i * STRIP);
        const __m256 w1 = _mm256_load_ps(strip + i * STRIP + 8);
        for (int r = 0; r < R; r++) {
            const __m256 xr = _mm256_broadcast_ss(x + r * x_stride + i);
            acc[r][0] = _mm256_fmadd_ps(xr, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(xr, w1, acc[r][1]);
        }
    }
    float sums[TILE_ROWS][STRIP] __attribute__((aligned(32)));
    for (int r = 0; r < R; r++) {
        _mm256_store_ps(sums[r], acc[r][0]);
        _mm256_store_ps(sums[r] + 8, acc[r][1]);
    }
    const int64_t cols = n_out - col0 < STRIP ? n_out - col0 : STRIP;
    for (int r = 0; r < R; r++) {
        float *dst = out + r * out_stride + col0;
        for (int64_t c = 0; c < cols; c++) dst[c] = sums[r][c] + (bias ? bias[col0 + c] : 0.0f);
    }
}

/* The strip's row tiles; while they compute, they ask for the next strip (`next`, NULL for
 * none), each tile for its share of its lines, so that strip is in cache when its turn comes
 * instead of the first tile waiting on memory. */
static void strip_rows(const float *x, int64_t x_stride, int64_t rows, int64_t k,
                       const float *strip, const float *next, const float *bias, float *out,
                       int64_t out_stride, int64_t col0, int64_t n_out) {
    const int64_t tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
    const int64_t share = (k + tiles - 1) / tiles; /* lines of the next strip a tile asks for */
    for (int64_t t = 0, r = 0; t < tiles; t++, r += TILE_ROWS) {
        const int64_t first = t * share < k ? t * share : k - 1;
        const strip_prefetch pf = next ? (strip_prefetch){(const char *)(next + first * STRIP),
                                                          (uint64_t)(64 << 16) / tiles}
                                       : (strip_prefetch){(const char *)strip, 0};
        const float *xr = x + r * x_stride;
        float *o = out + r * out_stride;
        switch (rows - r < TILE_ROWS ? rows - r : TILE_ROWS) {
            case 6: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, pf, 6); break;
            case 5: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, pf, 5); break;
            case 4: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, pf, 4); break;
            case 3: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, pf, 3); break;
            case 2: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, pf, 2); break;
            default: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, pf, 1); break;
        }
    }
}

/*
 * out [rows, n_out] (row stride out_stride) = x [rows, k] (row stride x_stride) times the
 * weight packed as ceil(n_out / 16) strips of [k][16] (zero-padded columns, 32-byte aligned), plus
 * bias [n_out] when not NULL. Float32 throughout.
 */
void pc_f32_linear(const float *x, int64_t x_stride, int64_t rows, int64_t k,
                   const float *packed, int64_t n_out, const float *bias, float *out,
                   int64_t out_stride, int num_threads) {
    const int64_t strips = (n_out + STRIP - 1) / STRIP;
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
        const int64_t block = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
#pragma omp parallel for schedule(static) num_threads(num_threads)
        for (int64_t s = 0; s < strips; s++)
            strip_rows(x + r0 * x_stride, x_stride, block, k, packed + s * k * STRIP,
                       s + 1 < strips ? packed + (s + 1) * k * STRIP : NULL, bias,
                       out + r0 * out_stride, out_stride, s * STRIP, n_out);
    }
}
