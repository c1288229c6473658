/*
 * The compiled CPU kernels each source exports, declared once: decoder_layer.c chains them, and
 * every source includes this header so the compiler checks its definitions against it. The
 * contracts are at the definitions (model_ops.c, linear.c, paged_attention.c).
 */
#ifndef PREFIXCACHE_CPU_KERNELS_H
#define PREFIXCACHE_CPU_KERNELS_H

#include <stdint.h>

typedef uint16_t bf16;

/* model_ops.c */
void pc_rms_norm(const bf16 *x, int64_t x_stride, bf16 *residual, int64_t residual_stride,
                 const bf16 *weight, bf16 *out, int64_t out_stride, int64_t rows,
                 int64_t hidden, float eps, int num_threads);
void pc_rotary(bf16 *x, int64_t token_stride, int64_t head_stride, const bf16 *cos_sin,
               int64_t cs_stride, int64_t tokens, int64_t num_heads, int64_t head_dim,
               int num_threads);
void pc_silu_and_mul(const bf16 *gate_up, int64_t gate_up_stride, bf16 *out,
                     int64_t out_stride, int64_t rows, int64_t inter, int num_threads);
int pc_store_kv(const bf16 *k, int64_t k_token_stride, int64_t k_head_stride, const bf16 *v,
                int64_t v_token_stride, int64_t v_head_stride, bf16 *k_cache, bf16 *v_cache,
                const int64_t *slots, int64_t tokens, int64_t num_kv_heads, int64_t head_dim,
                int64_t num_slots);
int pc_copy_blocks(char *const *pools, int64_t num_pools, int64_t block_bytes,
                   int64_t num_blocks, const int64_t *pairs, int64_t num_pairs,
                   const int64_t *bytes);
/* linear.c */
void pc_linear(const bf16 *x, int64_t x_stride, int64_t rows, int64_t k_pairs,
               const bf16 *packed, int64_t n_out, const bf16 *bias, bf16 *out,
               int64_t out_stride, int num_threads);
void pc_linear_strip(const bf16 *x, int64_t x_stride, int64_t rows, int64_t k_pairs,
                     const bf16 *packed, int64_t n_out, int64_t strip, bf16 *out,
                     int64_t out_stride);
/* What a GEMM of many rows brings into L2 for what runs after it (pc_linear_prefetching). */
typedef struct {
    const char *k_pool, *v_pool;     /* a KV pool's bases */
    const int32_t *blocks;           /* ids of its blocks read next, in reading order */
    int64_t num_blocks, block_bytes; /* entries of blocks; bytes of a block of K (= of V) */
    const bf16 *next_w;              /* the packed weight of the GEMM that follows, or NULL */
    int64_t next_k_pairs, next_n_out; /* its input pairs and output columns (same rows) */
    int next_gated; /* it is pc_linear_swiglu's [gate; up]: a thread starts on two strips */
} gemm_prefetch;
void pc_linear_prefetching(const bf16 *x, int64_t x_stride, int64_t rows, int64_t k_pairs,
                           const bf16 *packed, int64_t n_out, const bf16 *bias, bf16 *out,
                           int64_t out_stride, int num_threads, const gemm_prefetch *ahead);
void pc_linear_swiglu(const bf16 *x, int64_t x_stride, int64_t rows, int64_t k_pairs,
                      const bf16 *packed, int64_t inter, bf16 *gate, int64_t gate_stride,
                      bf16 *act, int64_t act_stride, int num_threads,
                      const gemm_prefetch *ahead);
/* greedy_screen.c (avx512vnni, checked by the caller) */
int pc_screen_pack(const bf16 *w, int64_t n, int64_t k, int8_t *q, float *meta,
                   int num_threads);
int pc_greedy_head(const bf16 *x, int64_t x_stride, int64_t rows, const int8_t *q,
                   const float *meta, const bf16 *packed, int64_t n, int64_t k,
                   int64_t max_exact_strips, int64_t *tokens, int num_threads);
/* phase_profile.c: the fused layers' phases (phase_profile.py mirrors this list) */
enum {
    PC_PHASE_NORMS,            /* both RMSNorms with their residual adds */
    PC_PHASE_QKV,              /* the QKV projection */
    PC_PHASE_ROPE_KV_WRITE,    /* RoPE, then the new k/v into the pool */
    PC_PHASE_ATTENTION,        /* paged attention, its K/V packing included */
    PC_PHASE_O,                /* the output projection */
    PC_PHASE_GATE_UP_SILU,     /* the gate and up projections with SiLU-and-mul */
    PC_PHASE_DOWN,             /* the down projection */
    PC_NUM_PHASES
};
void pc_profile_enable(int on);
void pc_profile_read(double *out, int reset); /* out[PC_NUM_PHASES] seconds; reset: zero them */
double pc_phase_start(void);                  /* a clock reading, or 0 while profiling is off */
void pc_phase_end(int phase, double *since);  /* adds now - *since to phase, *since = now */
double pc_bf16_dot_gflops(int threads, int64_t rounds); /* the bf16 dot-product peak */
/* work_runs.c (checks of work_runs.h) */
int64_t pc_work_runs_drain(int64_t n, int runs, int tid, int64_t *out);
void pc_work_runs_stress(int64_t n, int runs, int repeats, int32_t *taken);
/* paged_attention.c */
int pa_paged_attention(const bf16 *q, int64_t q_st, int64_t q_sh, const bf16 *k, int64_t k_st,
                       int64_t k_sh, const bf16 *v, int64_t v_st, int64_t v_sh,
                       const void *k_cache, const void *v_cache, int kv_type,
                       const float *k_scale, const float *v_scale, int64_t num_blocks,
                       const int32_t *bt, int64_t bt_stride, int64_t max_blocks,
                       const int32_t *starts, const int32_t *lens, int num_seqs,
                       int64_t num_tokens, bf16 *out, int num_heads, int num_kv_heads,
                       int head_dim, int block_size, float scale, _Bool decode, int num_threads);

#endif
