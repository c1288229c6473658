/*
 * Llama-family decoder layers over a paged float32 KV pool, a run of them in one call: the
 * float32 kernels (model_ops_f32.c, linear_f32.c, paged_attention_f32.c) in sequence on
 * per-thread scratch buffers, with no return to Python between them or between layers. The
 * float32 counterpart of decoder_layer.c (the same layer_args, the same steps):
 *
 *   normed   = rms_norm(residual += delta)          (first layer: residual is delta itself)
 *   qkv      = normed Wqkv^T (+ bias); RoPE on q, k; k, v written to their pool slots
 *   attended = paged attention: decode rows [0, num_decode), then prefill rows (a sliding
 *              layer: every row over its last `window` keys, windowed_attention.c)
 *   normed   = rms_norm(residual += attended Wo^T)
 *   out      = (silu(normed Wgate^T) * normed Wup^T) Wdown^T
 *
 * and, after the last layer of the run, optionally the model's final norm on its output.
 * The same kernels and roundings as the separate ops, so the results are theirs exactly. (The
 * float32 GEMM prefetches its next strip by itself; nothing is prefetched across ops here.)
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels_f32.h"
#include "thread_scratch.h"

#define LAYER_ELEM float
#include "layer_args.h"

static __thread void *tls_buf = NULL;
static __thread int64_t tls_bytes = 0;

/* The calling thread's scratch of at least n floats (grown, never shrunk). */
static float *scratch_f32(int64_t n) {
    return grow_buffer(&tls_buf, &tls_bytes, n * (int64_t)sizeof(float));
}

/* Frees the calling thread's scratch. */
void pc_f32_release_layer_scratch(void) {
    free(tls_buf);
    tls_buf = NULL;
    tls_bytes = 0;
}

/* The layer after the attention, for `rows` rows: out = MLP(rms_norm(residual += attended
 * Wo^T)). The o projection lands in gate_up's space, free until the MLP. */
static void mlp_half(const layer_args *a, int64_t rows, const float *attended, float *gate_up,
                     float *normed, float *act, float *residual) {
    const int64_t H = a->hidden, attn_w = a->heads * a->head_dim, gu_w = 2 * a->inter;
    const int nt = (int)a->threads;
    float *projected = gate_up;
    pc_f32_linear(attended, attn_w, rows, attn_w, a->o_w, H, NULL, projected, H, nt);
    pc_f32_rms_norm(projected, H, residual, H, a->post_norm, normed, H, rows, H, (float)a->eps,
                    nt);
    pc_f32_linear(normed, H, rows, H, a->gate_up_w, gu_w, NULL, gate_up, gu_w, nt);
    pc_f32_silu_and_mul(gate_up, gu_w, act, a->inter, rows, a->inter, nt);
    pc_f32_linear(act, a->inter, rows, a->inter, a->down_w, H, NULL, a->out, H, nt);
}

/* The rest of the layer for rows out_rows only, after every row's KV write: their queries
 * gathered and attended to as decode rows, their residual rows moved to the front of the
 * stream (rows only move down: out_rows ascend), then the output projection and the MLP. */
static int selected_rows(const layer_args *a, const float *qkv, float *attended, float *gate_up,
                         float *normed, float *act, float *residual) {
    const int64_t R = a->num_out, H = a->hidden, D = a->head_dim;
    const int64_t qkv_w = (a->heads + 2 * a->kv_heads) * D, attn_w = a->heads * D;
    if (R == 0) return 0;
    float *queries = gate_up; /* [R][attn_w], free until the MLP */
    for (int64_t i = 0; i < R; i++)
        memcpy(queries + i * attn_w, qkv + a->out_rows[i] * qkv_w, (size_t)attn_w * sizeof(float));
    const window_args *w = a->window > 0 ? a->win : NULL;
    if (w)
        attend_windowed(a, queries, attn_w, w->out_tables, w->out_tables_stride, w->out_seq_of,
                        w->out_positions, R, attended);
    const int err = w ? 0 : pa_f32_attention(
        queries, attn_w, D, queries, attn_w, D, queries, attn_w, D, a->k_cache, a->v_cache,
        a->num_blocks, a->out_tables, a->out_tables_stride, a->out_max_blocks, NULL, a->out_lens,
        (int)R, R, attended, attn_w, D, (int)a->heads, (int)a->kv_heads, (int)D,
        (int)a->block_size, (float)a->scale, (int)a->threads);
    if (err) return err;
    for (int64_t i = 0; i < R; i++)
        if (a->out_rows[i] != i)
            memcpy(residual + i * H, residual + a->out_rows[i] * H, (size_t)H * sizeof(float));
    mlp_half(a, R, attended, gate_up, normed, act, residual);
    return 0;
}

/* Runs layer a; returns 0, -7 for a slot outside the pool (nothing written to the pool), -5
 * out of memory, or pa_f32_attention's error code (the pool already holds this layer's new
 * k/v then). */
static int decoder_layer(const layer_args *a) {
    const int64_t T = a->tokens, H = a->hidden, D = a->head_dim;
    const int nt = (int)a->threads;
    const int64_t qkv_w = (a->heads + 2 * a->kv_heads) * D, attn_w = a->heads * D;
    const int64_t gu_w = 2 * a->inter;
    /* scratch: normed [T][H], qkv [T][qkv_w], attended [T][attn_w], gate_up [T][gu_w], act */
    const int64_t n_normed = T * H, n_qkv = T * qkv_w, n_attn = T * attn_w, n_gu = T * gu_w;
    float *buf = scratch_f32(n_normed + n_qkv + n_attn + n_gu + T * a->inter);
    if (!buf) return -5;
    float *normed = buf, *qkv = normed + n_normed, *attended = qkv + n_qkv;
    float *gate_up = attended + n_attn, *act = gate_up + n_gu;

    float *residual = a->residual ? a->residual : a->delta;
    const window_args *w = a->window > 0 ? a->win : NULL; /* a sliding layer's inputs */
    pc_f32_rms_norm(a->delta, H, a->residual, H, a->input_norm, normed, H, T, H, (float)a->eps,
                    nt);
    pc_f32_linear(normed, H, T, H, a->qkv_w, qkv_w, a->qkv_bias, qkv, qkv_w, nt);
    pc_f32_rotary(qkv, qkv_w, D, a->cos_sin, 2 * D, T, a->heads + a->kv_heads, D, nt);
    const float *k = qkv + a->heads * D, *v = k + a->kv_heads * D;
    if (pc_f32_store_kv(k, qkv_w, D, v, qkv_w, D, a->k_cache, a->v_cache,
                        w ? w->slots : a->slots, T, a->kv_heads, D, a->num_blocks * a->block_size))
        return -7;
    if (a->num_out >= 0) return selected_rows(a, qkv, attended, gate_up, normed, act, residual);
    const int64_t nd = a->num_decode;
    int err = 0;
    if (w)
        attend_windowed(a, qkv, qkv_w, w->tables, w->tables_stride, w->seq_of, w->positions, T,
                        attended);
    else if (nd > 0)
        err = pa_f32_attention(qkv, qkv_w, D, qkv, qkv_w, D, qkv, qkv_w, D, a->k_cache,
                               a->v_cache, a->num_blocks, a->decode_tables,
                               a->decode_tables_stride, a->decode_max_blocks, NULL,
                               a->decode_lens, (int)nd, nd, attended, attn_w, D, (int)a->heads,
                               (int)a->kv_heads, (int)D, (int)a->block_size, (float)a->scale, nt);
    if (!w && !err && a->num_prefill > 0)
        err = pa_f32_attention(qkv + nd * qkv_w, qkv_w, D, k + nd * qkv_w, qkv_w, D,
                               v + nd * qkv_w, qkv_w, D, a->k_cache, a->v_cache, a->num_blocks,
                               a->prefill_tables, a->prefill_tables_stride,
                               a->prefill_max_blocks, a->prefill_starts, a->prefill_context,
                               (int)a->num_prefill, T - nd, attended + nd * attn_w, attn_w, D,
                               (int)a->heads, (int)a->kv_heads, (int)D, (int)a->block_size,
                               (float)a->scale, nt);
    if (err) return err;
    mlp_half(a, T, attended, gate_up, normed, act, residual);
    return 0;
}

/* Runs layers layers[0 .. n) of one step in order, each as run_layer (layer_args.h) makes it
 * from `step`, as pc_decoder_layers does; with step->final_norm, the last layer's out is then
 * added to the stream and normalized in place. Returns 0, or the first failing layer's code
 * (see decoder_layer) with *failed set to its index. */
int pc_f32_decoder_layers(const layer_args *layers, int64_t n, const layer_args *step,
                          int64_t *failed) {
    if (n <= 0) return 0;
    float *stream = step->residual ? step->residual : step->delta;
    int err = 0;
    for (int64_t i = 0; i < n && !err; i++) {
        const layer_args a = run_layer(layers, i, n, step, stream);
        err = decoder_layer(&a);
        if (err) *failed = i;
    }
    if (!err && step->final_norm) {
        const int64_t H = layers[0].hidden;
        const int64_t rows = step->num_out >= 0 ? step->num_out : step->tokens;
        pc_f32_rms_norm(step->out, H, stream, H, step->final_norm, step->out, H, rows, H,
                        (float)step->final_eps, (int)step->threads);
    }
    return err;
}
