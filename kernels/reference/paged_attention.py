"""Attention over a paged KV pool in plain torch: gather by block table, then SDPA.

Quantized (fp8/int8) pools are read back as ``stored * scale`` in the query dtype before SDPA.
Grouped-query attention is handled by SDPA's ``enable_gqa`` (query heads are grouped over
``num_heads // num_kv_heads`` KV heads, head h reading KV head ``h // group``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prefixcache.kernels.quantization import dequantize

WINDOW_RUN = 64  # fewest new tokens a windowed prefill attends at once (else a quarter window)


def gather_context(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks] int
    length: int,
    first_block: int = 0,
) -> torch.Tensor:  # [length - first_block * block_size, num_kv_heads, head_dim]
    """The cached tokens of one sequence from block ``first_block`` up to ``length``, in
    order."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    # index_select is several times faster than advanced indexing for this gather on CPU
    table = block_table[first_block:num_blocks].long()
    blocks = cache.index_select(0, table)  # [blocks, bs, kv, dim]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[: length - first_block * block_size]


def paged_prefill_attention_reference(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim] new tokens of all sequences
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32: cached tokens before the new ones
    scale: float,
    k_scale: torch.Tensor | None = None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    v_scale: torch.Tensor | None = None,
    widen: bool = True,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Each new token attends to its sequence's whole cached context and, causally, to the new
    tokens up to itself. The new tokens' k/v come from ``k``/``v``, not from the cache.
    ``widen`` runs 16-bit inputs in float32 (see ``_widened``); without it SDPA runs in the
    query dtype (``paged_prefill_attention_sdpa``). With ``sliding_window`` W the token at
    position i sees only keys j with i - W < j <= i: the cached blocks wholly before the first
    new token's window are not read, and the new tokens go in runs of ``max(W // 4, 64)``,
    each over its own keys (a run of R tokens scores R x (W + R) pairs for the R x W it
    needs). With ``softcap`` c the scores become ``c * tanh(scores / c)`` before
    the softmax (Gemma 2).

    Windowed and soft-capped attention (widened) run in float64, rounded once at the output:
    the key range and the chunk a token comes in change the order of the sums, and float64's
    error is so far below float32's that the rounded result does not move with them (a
    cached answer equals an uncached one, bit for bit in every test; the full layers'
    compiled kernels give that by construction)."""
    widened = _widened if widen else _unchanged
    if widen and (sliding_window is not None or softcap is not None):
        widened = _double
    run = max(sliding_window // 4, WINDOW_RUN) if sliding_window is not None else None
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    contexts = context_lens.tolist()
    for seq, context in enumerate(contexts):
        begin, end = starts[seq], starts[seq + 1]
        if begin == end:
            continue
        keys, values = k[begin:end], v[begin:end]  # [new, kv_heads, dim]
        first_block = 0  # the first cached block any new token sees
        if sliding_window is not None:
            first_block = max(0, context - sliding_window + 1) // k_cache.shape[1]
        skipped = first_block * k_cache.shape[1]  # cached keys no new token sees
        if context > skipped:
            cached_k = gather_context(k_cache, block_tables[seq], context, first_block)
            cached_v = gather_context(v_cache, block_tables[seq], context, first_block)
            keys = torch.cat([dequantize(cached_k, k_scale, q.dtype), keys])
            values = torch.cat([dequantize(cached_v, v_scale, q.dtype), values])
        keys, values = widened(keys), widened(values)  # positions skipped .. context + new
        step = run or end - begin
        for first in range(0, end - begin, step):  # runs of new tokens, each over its keys
            last = min(end - begin, first + step)
            lowest = skipped  # the first key position any token of the run sees
            if sliding_window is not None:
                lowest = max(skipped, context + first - sliding_window + 1)
            seen = slice(lowest - skipped, context + last - skipped)
            attended = _attend(widened(q[begin + first:begin + last]), keys[seen], values[seen],
                               context + first - lowest, scale, sliding_window, softcap)
            out[begin + first:begin + last] = attended  # rounded to the query dtype once
    return out


def paged_prefill_attention_sdpa(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """``paged_prefill_attention_reference`` with SDPA in the query dtype: torch's CPU flash
    kernel in bf16 (oneDNN's brgemm, AMX tiles where the CPU has them). Its softmax weights are
    rounded to 16 bits with its own blocking, so a token's result depends on the chunk it came
    in (see ``_widened``): the kernel choice uses it only where it is measured faster."""
    return paged_prefill_attention_reference(
        q, k, v, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale,
        k_scale, v_scale, widen=False, sliding_window=sliding_window,
    )  # fmt: skip


def _double(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float64 (windowed and soft-capped attention: see the prefill's docstring)."""
    return x.double()


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


def _widened(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 when it is a 16-bit float: SDPA's CPU kernels round a 16-bit input's
    softmax weights to 16 bits before the value product, with their own blocking, so the same
    token attended as a new token, over a cached prefix, or in another chunk would round
    differently (and a cached answer differ from an uncached one). In float32 only the output's
    final rounding is 16-bit."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _attend(
    q: torch.Tensor,  # [new, num_heads, head_dim]
    keys: torch.Tensor,  # [context + new, num_kv_heads, head_dim]
    values: torch.Tensor,  # [context + new, num_kv_heads, head_dim]
    context: int,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [new, num_heads, head_dim]
    new, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    windowed = sliding_window is not None and context + new > sliding_window
    if context == 0 and not windowed and softcap is None:
        # Square causal attention: SDPA's fused causal path (4-D inputs select the CPU flash
        # kernel; 3-D ones fall back to the math path), KV heads expanded to query heads
        # (SDPA's own enable_gqa is several times slower on CPU).
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            _expand_heads(keys, group).transpose(0, 1)[None],
            _expand_heads(values, group).transpose(0, 1)[None],
            is_causal=True,
            scale=scale,
        )  # [1, heads, new, dim]
        return out[0].transpose(0, 1)
    # Over a cached context (or a window): fold each KV head's query group into the query axis,
    # so K/V are never copied per query head; new token i sees keys 0 .. context + i (the last
    # ``sliding_window`` of them).
    folded = q.reshape(new, num_kv_heads, group, head_dim).permute(1, 0, 2, 3)
    folded = folded.reshape(num_kv_heads, new * group, head_dim)  # [kv_heads, new*group, dim]
    rows = torch.arange(new, device=q.device).repeat_interleave(group).unsqueeze(1) + context
    keys_at = torch.arange(context + new, device=q.device).unsqueeze(0)  # [1, total]
    visible = keys_at <= rows
    if windowed:
        visible &= keys_at > rows - sliding_window
    if softcap is not None:
        out = _softcapped(folded, keys.transpose(0, 1), values.transpose(0, 1), visible, scale,
                          softcap)  # fmt: skip
        out = out.reshape(num_kv_heads, new, group, head_dim).permute(1, 0, 2, 3)
        return out.reshape(new, num_heads, head_dim)
    mask = additive_mask(visible, q.dtype)  # [new*group, total]
    out = F.scaled_dot_product_attention(
        folded[None],
        keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None],
        attn_mask=mask[None, None],
        scale=scale,
    )[0]  # [kv_heads, new*group, dim]
    out = out.reshape(num_kv_heads, new, group, head_dim).permute(1, 0, 2, 3)
    return out.reshape(new, num_heads, head_dim)


def _softcapped(
    q: torch.Tensor,  # [kv_heads, rows, head_dim]
    keys: torch.Tensor,  # [kv_heads, total, head_dim]
    values: torch.Tensor,  # [kv_heads, total, head_dim]
    visible: torch.Tensor,  # [rows, total] bool
    scale: float,
    softcap: float,
) -> torch.Tensor:  # [kv_heads, rows, head_dim]
    """Attention with soft-capped scores, op by op as transformers' eager Gemma 2 does
    (SDPA has no soft-cap): ``softmax(c * tanh(q.k * scale / c) + mask) @ v``, the softmax in
    float32 or in the inputs' dtype if wider."""
    scores = torch.matmul(q, keys.transpose(1, 2)) * scale  # [kv, rows, total]
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    scores = scores + additive_mask(visible, scores.dtype)
    weights = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(weights, values)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``visible``, -inf elsewhere: SDPA's CPU flash kernel takes an additive mask in
    the query dtype about 1.8x faster than a boolean one."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(
        ~visible, float("-inf")
    )


def _expand_heads(
    kv: torch.Tensor,  # [tokens, num_kv_heads, head_dim]
    group: int,
) -> torch.Tensor:  # [tokens, num_kv_heads * group, head_dim]; head h reads KV head h // group
    if group == 1:
        return kv
    tokens, num_kv_heads, head_dim = kv.shape
    expanded = kv[:, :, None, :].expand(tokens, num_kv_heads, group, head_dim)
    return expanded.reshape(tokens, num_kv_heads * group, head_dim)


def paged_decode_attention_reference(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim] one new token per sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32: tokens in cache, including the current one
    scale: float,
    k_scale: torch.Tensor | None = None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Each sequence's single query attends to all of its ``seq_lens`` cached tokens (the last
    ``sliding_window`` of them; scores soft-capped by ``softcap``)."""
    num_seqs = q.shape[0]
    block_size = k_cache.shape[1]
    lengths = seq_lens.to(q.device).unsqueeze(1).long()  # [num_seqs, 1]
    table, first = _visible_blocks(block_tables, lengths, block_size, sliding_window)
    max_len = table.shape[1] * block_size
    kv_shape = (num_seqs, max_len, k_cache.shape[2], k_cache.shape[3])
    flat = table.reshape(-1)  # index_select: several times faster than cache[table] on CPU
    keys = dequantize(k_cache.index_select(0, flat).reshape(kv_shape), k_scale, q.dtype)
    values = dequantize(v_cache.index_select(0, flat).reshape(kv_shape), v_scale, q.dtype)
    # keys, values: [num_seqs, max_len, kv_heads, head_dim], sequence s from position first[s]
    positions = first + torch.arange(max_len, device=q.device).unsqueeze(0)  # [seqs, max_len]
    visible = positions < lengths  # [num_seqs, max_len]
    if sliding_window is not None:
        visible &= positions >= lengths - sliding_window
    mask = additive_mask(visible, q.dtype)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    # One query token per sequence: the query heads of a KV group act as `group` query rows
    # over that KV head, so no K/V copy per query head is needed. With so few query rows,
    # two batched matmuls beat SDPA's CPU flash kernel (about 2x in bf16); the softmax runs in
    # float32. Windowed and soft-capped layers run in float64 as their prefill does, so a token
    # computed here (a one-token chunk) equals the same token computed in a longer chunk.
    widened = _double if sliding_window is not None or softcap is not None else _widened
    grouped = widened(q).reshape(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.matmul(grouped, widened(keys).permute(0, 2, 3, 1))  # [seqs, kv, group, len]
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)).mul_(scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap).mul_(softcap)
    scores = scores.add_(mask[:, None, None, :])
    weights = torch.softmax(scores, dim=-1).to(grouped.dtype)
    out = torch.matmul(weights, widened(values).transpose(1, 2))  # [seqs, kv, group, dim]
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)


def _visible_blocks(
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    lengths: torch.Tensor,  # [num_seqs, 1] int64: tokens each sequence's query sees up to
    block_size: int,
    sliding_window: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # [num_seqs, blocks] int64, [num_seqs, 1] int64
    """The blocks holding each sequence's visible keys, and the position of each row's first
    key. Without a window, blocks 0 on; with one, from the block of the window's first key, so
    a sliding layer reads about ``sliding_window`` keys whatever the context. Columns past a
    sequence's last block repeat it (their keys are masked)."""
    num_blocks = -(-lengths // block_size)  # [num_seqs, 1]
    start = torch.zeros_like(lengths)
    if sliding_window is not None:
        start = (lengths - sliding_window).clamp_(min=0) // block_size
    width = int((num_blocks - start).max())
    columns = start + torch.arange(width, device=lengths.device).unsqueeze(0)  # [seqs, width]
    columns = torch.minimum(columns, (num_blocks - 1).clamp_(min=0))
    table = block_tables.to(lengths.device).long().gather(1, columns)
    return table, start * block_size

