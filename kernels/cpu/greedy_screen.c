/*
 * Greedy decoding's argmax over an output head, reading an int8 copy of the head (half the
 * bytes of bf16) instead of the head itself: a few rows' logits are memory-bound, so this
 * halves their time. The screen does not pick the token; it rules out every output column
 * that provably cannot be the argmax of the exact bf16 logits (pc_linear's, rounded to bf16),
 * and the caller computes the exact logits of the few strips of 64 columns left, with the
 * same kernel, so the token is bitwise the one the full head gives, ties to the lowest index.
 *
 * Screening copy (pc_screen_pack): per output column i, s_i = max_j |w_ij| / 127 and
 * q_ij = round(w_ij / s_i) in int8, laid out [strips][k4][64][4]: for each strip of 64 columns
 * and each group of 4 input dims, the 64 columns' 4 bytes side by side (one zmm of
 * vpdpbusd's signed operand). Per column, meta[4][padded n] of 32-bit words: s_i; g_i, a
 * bound on max_j |w_ij - s_i q_ij| plus the exact kernel's own float32 rounding per unit of
 * |x|_1; a_i = sum_j |q_ij| (floats); o_i = 128 sum_j q_ij (an int32).
 *
 * Screening a row x: x = sx1 u1 + sx2 u2 + e with int8 u1, u2 (the second quantizes what the
 * first leaves), sx = max |.| / 127, |e_j| <= emax; vpdpbusd sums (u + 128) q exactly in int32,
 * so F = sum_j u_j q_ij = I - o_i exactly and the approximation is
 *     approx_i = s_i (sx1 F1_i + sx2 F2_i),
 * within B_i = |x|_1 g_i + s_i emax a_i (plus float32 slack) of the exact kernel's float32
 * value v_i. With L = max_i (approx_i - B_i) <= max_i v_i, a column whose approx_i + B_i is
 * below L - |L| 2^-6 - 2^-100 has v_i below the maximum by more than two bf16 steps, so its
 * bf16 logit is strictly below the largest one: it is neither the argmax nor tied with it.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "simd_math.h"
#include "work_runs.h"

#define STRIP 64        /* output columns per strip, as pc_linear's packing */
#define GROUP_ROWS 2    /* rows screened together: 8 accumulators each, 16 of 32 registers */
#define SCREEN_ROWS_MAX 4 /* beyond, the screen costs about what the full head does */
#define SLACK (1.0f + 0x1p-18f) /* float32 rounding of the bound's own terms, covered */

#define VNNI __attribute__((target("avx512vnni")))
/* acc += u8 u . s8 w in 4-byte groups (vpdpbusd): gcc 12's intrinsic copies the accumulator
 * through a low register on every use once many are live; the instruction itself does not */
#define DPBUSD(acc, u, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(w))

/* Row r of a screened batch: its two int8 levels as u8 (u + 128), [k4 * 4] bytes each. */
typedef struct {
    const uint8_t *u1, *u2;
    float sx1, sx2, l1, emax;
} screened_row;

static inline float bf16_value(bf16 x) {
    const uint32_t bits = (uint32_t)x << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* r (an integer in double) clamped to int8's [-127, 127]. */
static inline int clamp_int8(double r) {
    return (int)(r > 127.0 ? 127.0 : r < -127.0 ? -127.0 : r);
}

/* One column's quantization, in double (w and s q exactly representable). */
static void quantize_column(const bf16 *w, int64_t k, int64_t k4, int8_t *strip_base,
                            int64_t col, float *meta, int64_t npad) {
    float amax = 0.0f;
    for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(bf16_value(w[j])));
    const float s = amax > 0.0f ? amax / 127.0f : 0.0f;
    double err = 0.0;
    int64_t abs_sum = 0, sum = 0;
    for (int64_t j = 0; j < 4 * k4; j++) {
        int q = 0;
        if (j < k && s > 0.0f) {
            const float v = bf16_value(w[j]);
            q = clamp_int8(nearbyint((double)v / (double)s));
            err = fmax(err, fabs((double)v - (double)s * q));
        }
        strip_base[(j / 4) * STRIP * 4 + col * 4 + j % 4] = (int8_t)q;
        abs_sum += q < 0 ? -q : q;
        sum += q;
    }
    /* the exact kernel's float32 sums: at most k roundings of a partial sum bounded by
     * sum_j |x_j w_ij| <= |x|_1 amax, each within 2^-24 of it; doubled for safety */
    const double rounding = 2.0 * (double)k * 0x1p-24 * (double)amax;
    const int64_t i = col; /* column within the strip; the caller offsets meta */
    meta[i] = s;
    meta[npad + i] = (float)((err + rounding) * (1.0 + 0x1p-20));
    meta[2 * npad + i] = (float)abs_sum; /* exact: < 2^24 */
    const int32_t offset = (int32_t)(128 * sum);
    memcpy(meta + 3 * npad + i, &offset, sizeof offset);
}

/*
 * Packs the bf16 weight w [n][k] (row-major) into the screening copy: q, [ceil(n / 64)][k4]
 * [64][4] int8 with k4 = ceil(k / 4) (padding columns and dims zero), and meta, 32-bit words
 * [4][ceil(n / 64) * 64] (see the top of this file). Returns 0, or -1 when k > 65536 (the
 * int32 sums of the screen could overflow).
 */
int pc_screen_pack(const bf16 *w, int64_t n, int64_t k, int8_t *q, float *meta,
                   int num_threads) {
    if (k <= 0 || k > 65536 || n <= 0) return -1;
    const int64_t strips = (n + STRIP - 1) / STRIP, npad = strips * STRIP, k4 = (k + 3) / 4;
    memset(meta, 0, (size_t)(4 * npad) * sizeof(float));
#pragma omp parallel for num_threads(num_threads > 0 ? num_threads : 1) schedule(static)
    for (int64_t st = 0; st < strips; st++) {
        int8_t *base = q + st * k4 * STRIP * 4;
        memset(base, 0, (size_t)(k4 * STRIP * 4));
        for (int64_t c = 0; c < STRIP && st * STRIP + c < n; c++)
            quantize_column(w + (st * STRIP + c) * k, k, k4, base, c, meta + st * STRIP, npad);
    }
    return 0;
}

/* Quantizes row x (k bf16) into two int8 levels; 0, or -1 when it holds inf or NaN. */
static int quantize_row(const bf16 *x, int64_t k, int64_t k4, uint8_t *u1, uint8_t *u2,
                        screened_row *row) {
    double amax = 0.0, l1 = 0.0;
    for (int64_t j = 0; j < k; j++) {
        const float v = bf16_value(x[j]);
        if (!isfinite(v)) return -1;
        amax = fmax(amax, fabs(v));
        l1 += fabs(v);
    }
    const float sx1 = amax > 0.0 ? (float)(amax / 127.0) : 1.0f;
    double ramax = 0.0;
    for (int64_t j = 0; j < k; j++) { /* first level, and the largest remainder */
        const float v = bf16_value(x[j]);
        const int q = clamp_int8(nearbyint((double)v / sx1));
        u1[j] = (uint8_t)(q + 128);
        ramax = fmax(ramax, fabs((double)v - (double)sx1 * q));
    }
    const float sx2 = ramax > 0.0 ? (float)(ramax / 127.0) : 1.0f;
    double emax = 0.0;
    for (int64_t j = 0; j < k; j++) { /* second level, and what is left */
        const double rest = (double)bf16_value(x[j]) - (double)sx1 * (u1[j] - 128);
        const int q = clamp_int8(nearbyint(rest / sx2));
        u2[j] = (uint8_t)(q + 128);
        emax = fmax(emax, fabs(rest - (double)sx2 * q));
    }
    for (int64_t j = k; j < 4 * k4; j++) u1[j] = u2[j] = 128; /* zero */
    row->u1 = u1;
    row->u2 = u2;
    row->sx1 = sx1;
    row->sx2 = sx2;
    row->l1 = (float)(l1 * (1.0 + 0x1p-20));
    row->emax = (float)(emax * (1.0 + 0x1p-20));
    return 0;
}

/* Screens rows [0, R) of `rows` (R <= GROUP_ROWS) over one strip, of which the first `cols`
 * columns are the head's: writes each column's upper bound approx + B to up[r] (-inf past
 * cols) and raises lo[r] to the largest approx - B. */
VNNI INLINE void screen_strip(const int R, const screened_row *rows, const int8_t *w,
                              int64_t k4, const float *meta, int64_t npad, int64_t cols,
                              float *const *up, float *lo) {
    __m512i acc1[GROUP_ROWS][4], acc2[GROUP_ROWS][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            acc1[r][v] = _mm512_setzero_si512();
            acc2[r][v] = _mm512_setzero_si512();
        }
    for (int64_t g = 0; g < k4; g++, w += STRIP * 4) {
        _mm_prefetch((const char *)(w + 8 * STRIP * 4), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + 8 * STRIP * 4 + 128), _MM_HINT_T0);
        __m512i wv[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) wv[v] = _mm512_loadu_si512(w + 64 * v);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            int32_t a1, a2;
            memcpy(&a1, rows[r].u1 + 4 * g, 4);
            memcpy(&a2, rows[r].u2 + 4 * g, 4);
            const __m512i b1 = _mm512_set1_epi32(a1), b2 = _mm512_set1_epi32(a2);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                DPBUSD(acc1[r][v], b1, wv[v]);
                DPBUSD(acc2[r][v], b2, wv[v]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
        const __m512 sx1 = _mm512_set1_ps(rows[r].sx1), sx2 = _mm512_set1_ps(rows[r].sx2);
        const __m512 l1 = _mm512_set1_ps(rows[r].l1), emax = _mm512_set1_ps(rows[r].emax);
        const __m512 slack = _mm512_set1_ps(SLACK), rel = _mm512_set1_ps(0x1p-20f);
        __m512 lo_v = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const __m512 s = _mm512_loadu_ps(meta + 16 * v);
            const __m512 g = _mm512_loadu_ps(meta + npad + 16 * v);
            const __m512 a = _mm512_loadu_ps(meta + 2 * npad + 16 * v);
            const __m512i o = _mm512_loadu_si512(meta + 3 * npad + 16 * v);
            /* F = I - o exactly: |F| <= 127 * 127 * k < 2^31, and in float32 exact while
             * |F| < 2^24 (k <= 1040); beyond, its rounding is within the rel slack below */
            const __m512 f1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc1[r][v], o));
            const __m512 f2 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc2[r][v], o));
            const __m512 t1 = _mm512_mul_ps(s, _mm512_mul_ps(sx1, f1));
            const __m512 t2 = _mm512_mul_ps(s, _mm512_mul_ps(sx2, f2));
            const __m512 approx = _mm512_add_ps(t1, t2);
            __m512 bound = _mm512_fmadd_ps(l1, g, _mm512_mul_ps(_mm512_mul_ps(s, emax), a));
            const __m512 mag = _mm512_add_ps(_mm512_abs_ps(t1), _mm512_abs_ps(t2));
            bound = _mm512_mul_ps(_mm512_fmadd_ps(mag, rel, bound), slack);
            const __mmask16 head = cols >= 16 * (v + 1) ? 0xFFFF
                                   : cols > 16 * v  ? lanes(cols - 16 * v)
                                                    : 0;
            const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
            _mm512_storeu_ps(up[r] + 16 * v,
                             _mm512_mask_add_ps(minus_inf, head, approx, bound));
            lo_v = _mm512_mask_max_ps(lo_v, head, lo_v, _mm512_sub_ps(approx, bound));
        }
        lo[r] = fmaxf(lo[r], _mm512_reduce_max_ps(lo_v));
    }
}

typedef void (*strip_fn)(const screened_row *, const int8_t *, int64_t, const float *, int64_t,
                         int64_t, float *const *, float *);
#define DEFINE_STRIP(R)                                                                    \
    VNNI static void screen_strip_##R(const screened_row *rows, const int8_t *w, int64_t k4, \
                                      const float *meta, int64_t npad, int64_t cols,       \
                                      float *const *up, float *lo) {                       \
        screen_strip(R, rows, w, k4, meta, npad, cols, up, lo);                            \
    }
DEFINE_STRIP(1)
DEFINE_STRIP(2)
static const strip_fn STRIPS[GROUP_ROWS + 1] = {NULL, screen_strip_1, screen_strip_2};

static __thread void *tls_buf = NULL;
static __thread int64_t tls_buf_bytes = 0;

/* Rows [0, rows): marks[st] = 1 for each strip of 64 columns that may hold a row's argmax, 0
 * for the others. Returns the number marked, or -1 when a row holds inf or NaN, -3 out of
 * memory. */
static int64_t screen_rows(const bf16 *x, int64_t x_stride, int64_t rows, const int8_t *q,
                           const float *meta, int64_t n, int64_t k, uint8_t *marks, int nt) {
    const int64_t strips = (n + STRIP - 1) / STRIP, npad = strips * STRIP, k4 = (k + 3) / 4;
    const int64_t u_bytes = (4 * k4 + 63) / 64 * 64;
    char *buf = grow_buffer(&tls_buf, &tls_buf_bytes,
                            rows * (2 * u_bytes + npad * (int64_t)sizeof(float)));
    if (!buf) return -3;
    float *up[SCREEN_ROWS_MAX];
    screened_row srow[SCREEN_ROWS_MAX];
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *u = (uint8_t *)buf + 2 * u_bytes * r;
        if (quantize_row(x + r * x_stride, k, k4, u, u + u_bytes, &srow[r])) return -1;
        up[r] = (float *)(buf + 2 * u_bytes * rows) + npad * r;
    }
    float lo[nt][SCREEN_ROWS_MAX];
    work_run runs[nt];
    work_runs_init(runs, nt, strips);
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num();
        float *my_lo = lo[tid];
        for (int r = 0; r < SCREEN_ROWS_MAX; r++) my_lo[r] = -INFINITY;
        int64_t st, after;
        while ((st = work_runs_next(runs, nt, tid, &after)) >= 0) {
            for (int64_t r0 = 0; r0 < rows; r0 += GROUP_ROWS) {
                const int R = rows - r0 < GROUP_ROWS ? (int)(rows - r0) : GROUP_ROWS;
                float *ups[GROUP_ROWS];
                for (int r = 0; r < R; r++) ups[r] = up[r0 + r] + st * STRIP;
                const int64_t cols = n - st * STRIP < STRIP ? n - st * STRIP : STRIP;
                STRIPS[R](srow + r0, q + st * k4 * STRIP * 4, k4, meta + st * STRIP, npad, cols,
                          ups, my_lo + r0);
            }
        }
    }
    memset(marks, 0, (size_t)strips);
    for (int64_t r = 0; r < rows; r++) {
        double best = -INFINITY;
        for (int t = 0; t < nt; t++) best = fmax(best, (double)lo[t][r]);
        /* two bf16 steps below the largest lower bound (rounded down to a float) */
        const double cut = best - fabs(best) * 0x1p-6 - 0x1p-100;
        const __m512 thr = _mm512_set1_ps(nextafterf((float)cut, -INFINITY));
        for (int64_t st = 0; st < strips; st++) {
            __mmask16 hit = 0;
            for (int v = 0; v < 4; v++)
                hit |= _mm512_cmp_ps_mask(_mm512_loadu_ps(up[r] + st * STRIP + 16 * v), thr,
                                          _CMP_GE_OQ);
            if (hit) marks[st] = 1;
        }
    }
    int64_t marked = 0;
    for (int64_t st = 0; st < strips; st++) marked += marks[st];
    return marked;
}

static __thread void *tls_marks = NULL;
static __thread int64_t tls_marks_bytes = 0;

/*
 * tokens[r] = the argmax over columns of bf16(x[r] . w) (pc_linear's logits, no bias; the
 * lowest column among equal maxima) for rows x [rows][k] (bf16, x_stride elements apart) of an
 * n x k head held both packed (pc_linear's layout) and as its screening copy (q, meta). The
 * screen rules columns out; the strips of 64 columns it leaves are computed exactly by
 * pc_linear_strip. Returns the number of strips computed exactly (>= 1), or: -1, a row holds
 * inf or NaN (or a logit is NaN); -2, rows outside [1, SCREEN_ROWS_MAX] or k not even in
 * [2, 65536]; -3, out of memory; -4, the screen left more than max_exact_strips strips (tokens
 * not written).
 */
int pc_greedy_head(const bf16 *x, int64_t x_stride, int64_t rows, const int8_t *q,
                   const float *meta, const bf16 *packed, int64_t n, int64_t k,
                   int64_t max_exact_strips, int64_t *tokens, int num_threads) {
    if (rows < 1 || rows > SCREEN_ROWS_MAX || k < 2 || k > 65536 || k % 2 || n < 1) return -2;
    const int64_t strips = (n + STRIP - 1) / STRIP;
    uint8_t *marks = grow_buffer(&tls_marks, &tls_marks_bytes, strips);
    if (!marks) return -3;
    const int64_t marked =
        screen_rows(x, x_stride, rows, q, meta, n, k, marks, num_threads > 0 ? num_threads : 1);
    if (marked < 0) return (int)marked;
    if (marked > max_exact_strips) return -4;
    float best[SCREEN_ROWS_MAX];
    for (int64_t r = 0; r < rows; r++) {
        best[r] = -INFINITY;
        tokens[r] = -1;
    }
    bf16 exact[SCREEN_ROWS_MAX * STRIP];
    for (int64_t st = 0; st < strips; st++) { /* ascending: the first maximum stays */
        if (!marks[st]) continue;
        pc_linear_strip(x, x_stride, rows, k / 2, packed, n, st, exact, STRIP);
        const int64_t cols = n - st * STRIP < STRIP ? n - st * STRIP : STRIP;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                const float v = bf16_value(exact[r * STRIP + c]);
                if (isnan(v)) return -1;
                if (v > best[r] || tokens[r] < 0) {
                    best[r] = v;
                    tokens[r] = st * STRIP + c;
                }
            }
    }
    return (int)marked;
}
