/*
 * y = x W^T + b in float32 for x86-64 CPUs with AVX2 and FMA, over a weight packed once:
 * strips of 16 output columns, each strip [K][16] contiguous (the last strip zero-padded), so
 * a strip streams from memory in order and a row tile reads 64 bytes of it per input dim.
 *
 * Register tile: up to 6 rows x 16 columns (12 accumulators); per input dim, two loads of the
 * strip, one broadcast per row, 12 FMAs. Rows are taken in blocks of ROW_BLOCK (their inputs
 * stay in L2 while every strip passes over them); within a block the threads split the
 * strips, each strip read once per block and reused by the block's row tiles from L1/L2.
 * Every output element is one FMA chain over k in order, so a row's result does not depend
 * on which other rows are in the call.
 */
#include <immintrin.h>
#include <stdint.h>

#define STRIP 16     /* output columns per strip */
#define TILE_ROWS 6  /* rows per register tile */
#define ROW_BLOCK 96 /* rows whose inputs a pass of the strips reuses */

#define INLINE static inline __attribute__((always_inline))

/* Rows [r0, r0 + R) of x times strip s: out[r][s*16 .. s*16 + 16) (the columns < n_out). */
INLINE void tile(const float *x, int64_t x_stride, int64_t k, const float *strip,
                 const float *bias, float *out, int64_t out_stride, int64_t col0,
                 int64_t n_out, const int R) {
    __m256 acc[TILE_ROWS][2];
    for (int r = 0; r < R; r++) {
        acc[r][0] = _mm256_setzero_ps();
        acc[r][1] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < k; i++) {
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

static void strip_rows(const float *x, int64_t x_stride, int64_t rows, int64_t k,
                       const float *strip, const float *bias, float *out, int64_t out_stride,
                       int64_t col0, int64_t n_out) {
    int64_t r = 0;
    for (; r + TILE_ROWS <= rows; r += TILE_ROWS)
        tile(x + r * x_stride, x_stride, k, strip, bias, out + r * out_stride, out_stride, col0,
             n_out, TILE_ROWS);
    const float *xr = x + r * x_stride;
    float *o = out + r * out_stride;
    switch (rows - r) {
        case 5: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, 5); break;
        case 4: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, 4); break;
        case 3: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, 3); break;
        case 2: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, 2); break;
        case 1: tile(xr, x_stride, k, strip, bias, o, out_stride, col0, n_out, 1); break;
        default: break;
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
            strip_rows(x + r0 * x_stride, x_stride, block, k, packed + s * k * STRIP, bias,
                       out + r0 * out_stride, out_stride, s * STRIP, n_out);
    }
}
