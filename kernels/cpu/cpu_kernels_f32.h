/*
 * The float32 (AVX2/FMA) kernels one library's files call of each other: the projections, the
 * elementwise ops and the paged attention, which decoder_layer_f32.c chains. Contracts at
 * their definitions (linear_f32.c, model_ops_f32.c, paged_attention_f32.c).
 */
#ifndef PREFIXCACHE_CPU_KERNELS_F32_H
#define PREFIXCACHE_CPU_KERNELS_F32_H

#include <stdint.h>

void pc_f32_linear(const float *x, int64_t x_stride, int64_t rows, int64_t k,
                   const float *packed, int64_t n_out, const float *bias, float *out,
                   int64_t out_stride, int num_threads);
void pc_f32_rms_norm(const float *x, int64_t x_stride, float *residual, int64_t res_stride,
                     const float *weight, float *out, int64_t out_stride, int64_t rows,
                     int64_t hidden, float eps, int num_threads);
void pc_f32_silu_and_mul(const float *gate_up, int64_t gu_stride, float *out,
                         int64_t out_stride, int64_t rows, int64_t inter, int num_threads);
void pc_f32_rotary(float *x, int64_t token_stride, int64_t head_stride, const float *cos_sin,
                   int64_t cs_stride, int64_t tokens, int64_t num_heads, int64_t head_dim,
                   int num_threads);
int pc_f32_store_kv(const float *k, int64_t k_token_stride, int64_t k_head_stride,
                    const float *v, int64_t v_token_stride, int64_t v_head_stride,
                    float *k_cache, float *v_cache, const int64_t *slots, int64_t tokens,
                    int64_t num_kv_heads, int64_t head_dim, int64_t num_slots);
int pa_f32_attention(const float *q, int64_t q_tok, int64_t q_head, const float *k,
                     int64_t k_tok, int64_t k_head, const float *v, int64_t v_tok,
                     int64_t v_head, const float *k_cache, const float *v_cache,
                     int64_t num_blocks, const int32_t *block_tables, int64_t bt_row,
                     int64_t max_blocks, const int32_t *starts, const int32_t *lens,
                     int num_seqs, int64_t num_tokens, float *out, int64_t o_tok,
                     int64_t o_head, int num_heads, int num_kv_heads, int head_dim,
                     int block_size, float scale, int num_threads);
double pc_f32_fma_gflops(int threads, int64_t rounds);

#endif
