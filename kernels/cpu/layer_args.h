/*
 * The arguments of a run of fused decoder layers, for decoder_layer.c (bf16 pools and weights)
 * and decoder_layer_f32.c (float32): define LAYER_ELEM, the element type, before including.
 * Every field 8 bytes (the Python side mirrors this layout with ctypes, once for both).
 */
#ifndef PREFIXCACHE_LAYER_ARGS_H
#define PREFIXCACHE_LAYER_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* wa_windowed_attention (windowed_attention.c, in the float32 library): the fused layers of
 * both libraries call it through this pointer, so a sliding layer's rows are the same bits
 * whichever library runs the layer, fused or op by op. */
typedef void (*windowed_attention_fn)(const void *q, int q_bf16, int64_t q_tok, int64_t q_head,
                                      const void *k_cache, const void *v_cache, int kv_bf16,
                                      const int32_t *block_tables, int64_t bt_row,
                                      const int32_t *seq_of, const int64_t *pos_of,
                                      int64_t num_tokens, int num_heads, int num_kv_heads, int D,
                                      int block_size, int window, float scale, void *out,
                                      int out_bf16, int num_threads);

/* A step's inputs for its sliding-window layers (every field 8 bytes): each row attends to
 * the last `window` keys of its sequence, read from the pool through the sequence's row of
 * `tables`; a hybrid cache's sliding layers write and read their slot pools with these. */
typedef struct {
    windowed_attention_fn attend;
    const int64_t *slots;    /* [tokens]: the pool rows the new k/v go to, -1 skips */
    const int32_t *tables;   /* [sequences][tables_stride]: every sequence of the step */
    int64_t tables_stride;
    const int32_t *seq_of;   /* [tokens]: each row's sequence (its row of tables) */
    const int64_t *positions; /* [tokens]: each row's position */
    const int32_t *out_tables; /* the same for the rows out_rows (num_out of them) */
    int64_t out_tables_stride;
    const int32_t *out_seq_of;
    const int64_t *out_positions;
} window_args;

typedef struct {
    int64_t tokens, hidden, heads, kv_heads, head_dim, inter, block_size, num_blocks, threads;
    LAYER_ELEM *delta;    /* [tokens][hidden]: the previous block's output (layer 0: embedding) */
    LAYER_ELEM *residual; /* [tokens][hidden], updated; NULL for the first layer */
    LAYER_ELEM *out;      /* [tokens][hidden]: this layer's MLP output (may be delta itself) */
    const LAYER_ELEM *input_norm, *post_norm; /* [hidden] */
    double eps, scale;
    /* packed for the library's GEMM (linear.c, linear_f32.c); the bias [qkv out] or NULL */
    const LAYER_ELEM *qkv_w, *qkv_bias, *o_w, *gate_up_w, *down_w;
    const LAYER_ELEM *cos_sin;     /* [tokens][2][head_dim] */
    LAYER_ELEM *k_cache, *v_cache; /* [num_blocks][block_size][kv_heads][head_dim] */
    int64_t window; /* > 0: a sliding layer, its rows over their last `window` keys (win) */
    const int64_t *slots;      /* [tokens], -1 skips */
    int64_t num_decode;        /* decode rows (one per sequence) come first */
    const int32_t *decode_tables;
    int64_t decode_tables_stride, decode_max_blocks;
    const int32_t *decode_lens; /* [num_decode] */
    int64_t num_prefill;        /* prefill sequences */
    const int32_t *prefill_tables;
    int64_t prefill_tables_stride, prefill_max_blocks;
    const int32_t *prefill_starts;  /* [num_prefill + 1], rows relative to num_decode */
    const int32_t *prefill_context; /* [num_prefill] */
    /* -1: every row goes through the whole layer; else only rows out_rows[0 .. num_out) go on
     * past the KV write (as decode rows over out_tables / out_lens), their outputs and residual
     * stream in rows [0, num_out) of out and of the stream, which are then the only valid ones */
    int64_t num_out;
    const int64_t *out_rows; /* [num_out], ascending */
    const int32_t *out_tables;
    int64_t out_tables_stride, out_max_blocks;
    const int32_t *out_lens; /* [num_out]: keys each row sees, itself included */
    /* the model's final norm (step only; NULL: none): after the last layer, out = rms_norm(
     * stream += out) over the rows that went through it, as the norms between layers do */
    const LAYER_ELEM *final_norm; /* [hidden] */
    double final_eps;
    const window_args *win; /* the sliding layers' inputs; NULL when no layer slides */
} layer_args;

/* Layer i of a run of n layers (pc_decoder_layers, pc_f32_decoder_layers): layers[i]'s own
 * fields (weights, shapes, pools) with those every layer shares from `step` (tokens, threads,
 * cos_sin, scale, out, and the tail from slots on). Layer 0 reads step->delta over
 * step->residual, every later one the previous out over `stream`; only the last one takes
 * step->num_out (the others -1). */
static inline layer_args run_layer(const layer_args *layers, int64_t i, int64_t n,
                                   const layer_args *step, LAYER_ELEM *stream) {
    const size_t tail = offsetof(layer_args, slots);
    layer_args a = layers[i];
    memcpy((char *)&a + tail, (const char *)step + tail, sizeof(layer_args) - tail);
    a.tokens = step->tokens;
    a.threads = step->threads;
    a.cos_sin = step->cos_sin;
    a.scale = step->scale;
    a.out = step->out;
    a.delta = i == 0 ? step->delta : step->out;
    a.residual = i == 0 ? step->residual : stream;
    a.num_out = i + 1 == n ? step->num_out : -1;
    return a;
}

/* The windowed attention of `rows` queries (q: [rows] of q_tok elements, head after head) of
 * sliding layer a into out [rows][heads][head_dim], through `tables`, `seq_of`, `positions`. */
static inline void attend_windowed(const layer_args *a, const LAYER_ELEM *q, int64_t q_tok,
                                   const int32_t *tables, int64_t tables_stride,
                                   const int32_t *seq_of, const int64_t *positions,
                                   int64_t rows, LAYER_ELEM *out) {
    const int half = sizeof(LAYER_ELEM) == 2; /* bf16 elements, else float32 */
    a->win->attend(q, half, q_tok, a->head_dim, a->k_cache, a->v_cache, half, tables,
                   tables_stride, seq_of, positions, rows, (int)a->heads, (int)a->kv_heads,
                   (int)a->head_dim, (int)a->block_size, (int)a->window, (float)a->scale, out,
                   half, (int)a->threads);
}

#endif
