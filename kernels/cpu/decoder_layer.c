/*
 * Llama-family decoder layers over a paged bf16 KV pool, a run of them in one call: the
 * kernels of model_ops.c, linear.c and paged_attention.c run in sequence on per-thread scratch
 * buffers, with no return to Python between them or between layers.
 *
 *   normed   = rms_norm(residual += delta)          (first layer: residual is delta itself)
 *   qkv      = normed Wqkv^T (+ bias); RoPE on q, k; k, v written to their pool slots
 *   attended = paged attention: decode rows [0, num_decode), then prefill rows (a sliding
 *              layer: every row over its last `window` keys, windowed_attention.c)
 *   normed   = rms_norm(residual += attended Wo^T)
 *   out      = (silu(normed Wgate^T) * normed Wup^T) Wdown^T   (SiLU-and-mul in the GEMM)
 *
 * and, after the last layer of the run, optionally the model's final norm on its output.
 * The same roundings as the separate ops, so the results are theirs exactly. Each GEMM's tiles
 * also bring into L2 what comes right after it (pc_linear_prefetching): the QKV projection the
 * pool blocks of the prefills' cached prefixes (which the attention then reads), every GEMM
 * the first strip of the next one, the down projection the next layer's QKV.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "simd_math.h"

#define LAYER_ELEM bf16
#include "layer_args.h"

static __thread void *tls_buf = NULL;
static __thread int64_t tls_bytes = 0;

/* The calling thread's scratch of at least n bf16 elements (grown, never shrunk). */
static bf16 *scratch_bf16(int64_t n) { return grow_buffer(&tls_buf, &tls_bytes, n * 2); }

/* Frees the calling thread's scratch. */
void pc_release_layer_scratch(void) {
    free(tls_buf);
    tls_buf = NULL;
    tls_bytes = 0;
}

/* Blocks of prefill sequence s's cached keys inside its block table row (bad lengths read as
 * 0 or the row's width here; the attention rejects them). */
static int64_t cached_blocks(const layer_args *a, int64_t s) {
    const int64_t blocks = (a->prefill_context[s] + a->block_size - 1) / a->block_size;
    if (blocks < 0) return 0;
    return blocks < a->prefill_max_blocks ? blocks : a->prefill_max_blocks;
}

/* The ids of the pool blocks holding the prefill sequences' cached keys (the blocks the
 * attention reads from memory), in reading order: *n of them, in *owned (to free) unless they
 * are a prefix of the block table's one row. */
static const int32_t *context_blocks(const layer_args *a, int64_t *n, int32_t **owned) {
    const int64_t seqs = a->num_prefill;
    *n = 0;
    *owned = NULL;
    if (seqs == 1) *n = cached_blocks(a, 0);
    if (seqs <= 1) return a->prefill_tables;
    for (int64_t s = 0; s < seqs; s++) *n += cached_blocks(a, s);
    *owned = malloc(sizeof(int32_t) * (size_t)(*n + 1));
    if (!*owned) {
        *n = 0; /* only a prefetch is lost */
        return NULL;
    }
    int64_t at = 0;
    for (int64_t s = 0; s < seqs; s++)
        for (int64_t b = 0; b < cached_blocks(a, s); b++)
            (*owned)[at++] = a->prefill_tables[s * a->prefill_tables_stride + b];
    return *owned;
}

/* A prefetch of only the strips that `w` (k_pairs x n_out, packed) first hands this thread:
 * one, or a gate strip and its up strip when `w` is pc_linear_swiglu's [gate; up] (gated). */
static gemm_prefetch then_gemm(const bf16 *w, int64_t k_pairs, int64_t n_out, int gated) {
    return (gemm_prefetch){
        .next_w = w, .next_k_pairs = k_pairs, .next_n_out = n_out, .next_gated = gated};
}

/* The layer after the attention, for `rows` rows: out = MLP(rms_norm(residual += attended
 * Wo^T)). The o projection lands in gate_up's space, free until the MLP. The down projection
 * prefetches `next`'s QKV weight (NULL: none). */
static void mlp_half(const layer_args *a, const layer_args *next, int64_t rows,
                     const bf16 *attended, bf16 *gate_up, bf16 *normed, bf16 *act,
                     bf16 *residual) {
    const int64_t H = a->hidden, attn_w = a->heads * a->head_dim, gu_w = 2 * a->inter;
    const int nt = (int)a->threads;
    bf16 *projected = gate_up;
    const gemm_prefetch to_gate_up = then_gemm(a->gate_up_w, H / 2, gu_w, 1);
    const gemm_prefetch to_down = then_gemm(a->down_w, a->inter / 2, H, 0);
    const gemm_prefetch to_next = next ? then_gemm(next->qkv_w, next->hidden / 2,
                                                   (next->heads + 2 * next->kv_heads) *
                                                       next->head_dim, 0)
                                       : then_gemm(NULL, 0, 0, 0);
    double clock = pc_phase_start();
    pc_linear_prefetching(attended, attn_w, rows, attn_w / 2, a->o_w, H, NULL, projected, H, nt,
                          &to_gate_up);
    pc_phase_end(PC_PHASE_O, &clock);
    pc_rms_norm(projected, H, residual, H, a->post_norm, normed, H, rows, H, (float)a->eps, nt);
    pc_phase_end(PC_PHASE_NORMS, &clock);
    pc_linear_swiglu(normed, H, rows, H / 2, a->gate_up_w, a->inter, gate_up, gu_w, act,
                     a->inter, nt, &to_down);
    pc_phase_end(PC_PHASE_GATE_UP_SILU, &clock);
    pc_linear_prefetching(act, a->inter, rows, a->inter / 2, a->down_w, H, NULL, a->out, H, nt,
                          &to_next);
    pc_phase_end(PC_PHASE_DOWN, &clock);
}

/* The rest of the layer for rows out_rows only, after every row's KV write: their queries
 * gathered and attended to as decode rows, their residual rows moved to the front of the
 * stream (rows only move down: out_rows ascend), then the output projection and the MLP. */
static int selected_rows(const layer_args *a, const bf16 *qkv, bf16 *attended, bf16 *gate_up,
                         bf16 *normed, bf16 *act, bf16 *residual) {
    const int64_t R = a->num_out, H = a->hidden, D = a->head_dim, nt = a->threads;
    const int64_t qkv_w = (a->heads + 2 * a->kv_heads) * D, attn_w = a->heads * D;
    if (R == 0) return 0;
    bf16 *queries = gate_up; /* [R][attn_w], free until the MLP */
    for (int64_t i = 0; i < R; i++)
        memcpy(queries + i * attn_w, qkv + a->out_rows[i] * qkv_w, (size_t)attn_w * 2);
    double clock = pc_phase_start();
    const window_args *w = a->window > 0 ? a->win : NULL;
    if (w)
        attend_windowed(a, queries, attn_w, w->out_tables, w->out_tables_stride, w->out_seq_of,
                        w->out_positions, R, attended);
    const int err = w ? 0 : pa_paged_attention(
        queries, attn_w, D, queries, attn_w, D, queries, attn_w, D, a->k_cache, a->v_cache, 0,
        NULL, NULL, a->num_blocks, a->out_tables, a->out_tables_stride, a->out_max_blocks, NULL,
        a->out_lens, (int)R, R, attended, (int)a->heads, (int)a->kv_heads, (int)D,
        (int)a->block_size, (float)a->scale, 1, (int)nt);
    pc_phase_end(PC_PHASE_ATTENTION, &clock);
    if (err) return err;
    for (int64_t i = 0; i < R; i++)
        if (a->out_rows[i] != i)
            memcpy(residual + i * H, residual + a->out_rows[i] * H, (size_t)H * 2);
    mlp_half(a, NULL, R, attended, gate_up, normed, act, residual);
    return 0;
}

/* Runs layer a, `next` the one after it (NULL: none), `blocks` (n) its context_blocks (only
 * prefetched); returns 0, -7 for a slot outside the pool (nothing written to the pool), -5 out
 * of memory, or pa_paged_attention's error code (the pool already holds this layer's new k/v
 * then). */
static int decoder_layer(const layer_args *a, const layer_args *next, const int32_t *blocks,
                         int64_t n) {
    const int64_t T = a->tokens, H = a->hidden, D = a->head_dim, nt = a->threads;
    const int64_t qkv_w = (a->heads + 2 * a->kv_heads) * D, attn_w = a->heads * D;
    const int64_t gu_w = 2 * a->inter;
    /* scratch: normed [T][H], qkv [T][qkv_w], attended [T][attn_w], gate_up [T][gu_w], act */
    const int64_t n_normed = T * H, n_qkv = T * qkv_w, n_attn = T * attn_w, n_gu = T * gu_w;
    bf16 *buf = scratch_bf16(n_normed + n_qkv + n_attn + n_gu + T * a->inter);
    if (!buf) return -5;
    bf16 *normed = buf, *qkv = normed + n_normed, *attended = qkv + n_qkv;
    bf16 *gate_up = attended + n_attn, *act = gate_up + n_gu;
    const float eps = (float)a->eps;

    bf16 *residual = a->residual ? a->residual : a->delta;
    const window_args *w = a->window > 0 ? a->win : NULL; /* a sliding layer's inputs */
    double clock = pc_phase_start();
    pc_rms_norm(a->delta, H, a->residual, H, a->input_norm, normed, H, T, H, eps, (int)nt);
    pc_phase_end(PC_PHASE_NORMS, &clock);
    gemm_prefetch to_attention = then_gemm(a->num_out < 0 ? a->o_w : NULL, attn_w / 2, H, 0);
    to_attention.k_pool = (const char *)a->k_cache;
    to_attention.v_pool = (const char *)a->v_cache;
    to_attention.blocks = blocks;
    to_attention.num_blocks = blocks && !w ? n : 0; /* a sliding layer reads its window */
    to_attention.block_bytes = a->block_size * a->kv_heads * D * (int64_t)sizeof(bf16);
    pc_linear_prefetching(normed, H, T, H / 2, a->qkv_w, qkv_w, a->qkv_bias, qkv, qkv_w, (int)nt,
                          &to_attention);
    pc_phase_end(PC_PHASE_QKV, &clock);
    pc_rotary(qkv, qkv_w, D, a->cos_sin, 2 * D, T, a->heads + a->kv_heads, D, (int)nt);
    const bf16 *k = qkv + a->heads * D, *v = k + a->kv_heads * D;
    if (pc_store_kv(k, qkv_w, D, v, qkv_w, D, a->k_cache, a->v_cache, w ? w->slots : a->slots,
                    T, a->kv_heads, D, a->num_blocks * a->block_size))
        return -7;
    pc_phase_end(PC_PHASE_ROPE_KV_WRITE, &clock);
    if (a->num_out >= 0) return selected_rows(a, qkv, attended, gate_up, normed, act, residual);
    const int64_t nd = a->num_decode;
    int err = 0;
    if (w)
        attend_windowed(a, qkv, qkv_w, w->tables, w->tables_stride, w->seq_of, w->positions, T,
                        attended);
    else if (nd > 0)
        err = pa_paged_attention(qkv, qkv_w, D, qkv, qkv_w, D, qkv, qkv_w, D, a->k_cache,
                                 a->v_cache, 0, NULL, NULL, a->num_blocks, a->decode_tables,
                                 a->decode_tables_stride, a->decode_max_blocks, NULL,
                                 a->decode_lens, (int)nd, nd, attended, (int)a->heads,
                                 (int)a->kv_heads, (int)D, (int)a->block_size, (float)a->scale,
                                 1, (int)nt);
    if (!w && !err && a->num_prefill > 0)
        err = pa_paged_attention(qkv + nd * qkv_w, qkv_w, D, k + nd * qkv_w, qkv_w, D,
                                 v + nd * qkv_w, qkv_w, D, a->k_cache, a->v_cache, 0, NULL, NULL,
                                 a->num_blocks, a->prefill_tables, a->prefill_tables_stride,
                                 a->prefill_max_blocks, a->prefill_starts, a->prefill_context,
                                 (int)a->num_prefill, T - nd, attended + nd * attn_w,
                                 (int)a->heads, (int)a->kv_heads, (int)D, (int)a->block_size,
                                 (float)a->scale, 0, (int)nt);
    pc_phase_end(PC_PHASE_ATTENTION, &clock);
    if (err) return err;
    mlp_half(a, next, T, attended, gate_up, normed, act, residual);
    return 0;
}

/* Runs layers layers[0 .. n) of one step in order: layers[i] holds layer i's weights, shapes
 * and pools; `step` the fields every layer shares (tokens, threads, delta, residual, out,
 * cos_sin, scale, num_out, and the tail from slots on). Layer 0 reads step->delta over
 * step->residual (NULL: delta becomes the stream); every later one reads the previous out,
 * over the stream; only the last one takes step->num_out (the others -1). With
 * step->final_norm, the last layer's out is then added to the stream and normalized in place.
 * Returns 0, or the first failing layer's code (see decoder_layer) with *failed set to its
 * index. */
int pc_decoder_layers(const layer_args *layers, int64_t n, const layer_args *step,
                      int64_t *failed) {
    if (n <= 0) return 0;
    bf16 *stream = step->residual ? step->residual : step->delta;
    int64_t count = 0;
    int32_t *owned = NULL;
    const int32_t *blocks = NULL; /* the step, so the blocks, are the same for every layer */
    int err = 0;
    for (int64_t i = 0; i < n && !err; i++) {
        const layer_args a = run_layer(layers, i, n, step, stream);
        if (i == 0) blocks = context_blocks(&a, &count, &owned);
        err = decoder_layer(&a, i + 1 < n ? &layers[i + 1] : NULL, blocks, count);
        if (err) *failed = i;
    }
    free(owned);
    if (!err && step->final_norm) {
        const int64_t H = layers[0].hidden;
        const int64_t rows = step->num_out >= 0 ? step->num_out : step->tokens;
        double clock = pc_phase_start();
        pc_rms_norm(step->out, H, stream, H, step->final_norm, step->out, H, rows, H,
                    (float)step->final_eps, (int)step->threads);
        pc_phase_end(PC_PHASE_NORMS, &clock);
    }
    return err;
}
