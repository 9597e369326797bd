"""What a PyTorch user writes for paged decode attention: the baselines the kernels are measured against.

* ``torch_naive``: loop over sequences, gather pages, ``torch.cat``, ``repeat_interleave`` for GQA, einsum,
  softmax. Reads the lengths on the host (one sync), like the seed code it mirrors.
* ``torch_sdpa``: one padded gather of every sequence to the block table's width, then
  ``scaled_dot_product_attention`` with a length mask. No host sync, so it can be captured in a CUDA graph.
* ``torch_dense``: the same padded gather with plain einsum + masked softmax; the function that the benchmark
  hands to ``torch.compile``.

Each computes in the input dtype (as a user would) and returns (out [B, Hq, D] in q's dtype,
lse [B, Hq] float32). Bytes moved: the padded versions gather max_pages * page_size tokens for every sequence,
so they read and write far more than the valid K/V.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["torch_naive", "torch_sdpa", "torch_dense", "dense_gather"]


def torch_naive(
    q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, *,
    softcap=None, alibi_slopes=None, sinks=None, window_left=None, k_scale=None, v_scale=None,
):  # fmt: skip
    """Loop-over-sequences paged attention in q's dtype. q [B, Hq, D] or [B, q_len, Hq, D]; returns (out with q's
    shape, lse fp32 with q's shape without D). The model features (see ``reference.reference_dense`` for the math)
    are what a PyTorch user adds on top: fp8 pages dequantised to q's dtype, logits capped and biased, a causal /
    window mask, the sink as one more logit column."""
    q4 = q if q.dim() == 4 else q[:, None]
    batch, q_len, num_q_heads, head_dim = q4.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    plain = all(x is None for x in (softcap, alibi_slopes, sinks, window_left)) and q_len == 1
    out = torch.zeros_like(q4, memory_format=torch.contiguous_format)
    lse = torch.full((batch, q_len, num_q_heads), -math.inf, dtype=torch.float32, device=q.device)
    for b, seqlen in enumerate(cache_seqlens.tolist()):
        if seqlen == 0:
            if sinks is not None:
                lse[b] = sinks.float()[None, :]
            continue
        pages = block_table[b, : -(-seqlen // page_size)].long()
        # [L, Hkv, D] -> [L, Hq, D]
        k = torch.cat([k_cache[p] for p in pages])[:seqlen].repeat_interleave(group, dim=1)
        v = torch.cat([v_cache[p] for p in pages])[:seqlen].repeat_interleave(group, dim=1)
        if k.dtype != q.dtype:
            # fp8 pages: dequantise in q's dtype
            k = k.to(q.dtype) * _scale(k_scale)
            v = v.to(q.dtype) * _scale(v_scale)
        scores = torch.einsum("qhd,lhd->qhl", q4[b], k) * softmax_scale  # [q_len, Hq, L]
        if plain:
            p = torch.softmax(scores, dim=-1)
        else:
            scores = _feature_logits(scores, seqlen, softcap, alibi_slopes, sinks, window_left)
            # rows that see no token (all -inf) give NaN in softmax: they are 0; the sink column is not a value
            p = torch.softmax(scores, dim=-1)[..., :seqlen].nan_to_num(0.0)
        out[b] = torch.einsum("qhl,lhd->qhd", p, v)
        lse[b] = torch.logsumexp(scores.float(), dim=-1)
    return (out, lse) if q.dim() == 4 else (out[:, 0], lse[:, 0])


def _scale(x):
    return 1.0 if x is None else float(x.reshape(()) if isinstance(x, torch.Tensor) else x)


def _feature_logits(scores, seqlen, softcap, alibi_slopes, sinks, window_left):
    """[q_len, Hq, L] logits -> with softcap, ALiBi, the causal / window mask, and the sink as column L."""
    q_len, num_q_heads, _ = scores.shape
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    key_pos = torch.arange(seqlen, device=scores.device)
    query_pos = seqlen - q_len + torch.arange(q_len, device=scores.device)
    if alibi_slopes is not None:
        bias = alibi_slopes[None, :, None] * (key_pos[None, None, :] - query_pos[:, None, None])
        scores = scores + bias.to(scores.dtype)
    visible = key_pos[None, :] <= query_pos[:, None]
    if window_left is not None:
        visible &= key_pos[None, :] >= query_pos[:, None] - window_left
    scores = scores.masked_fill(~visible[:, None, :], -math.inf)
    if sinks is not None:
        scores = torch.cat([scores, sinks.to(scores.dtype)[None, :, None].expand(q_len, num_q_heads, 1)], dim=-1)
    return scores


def dense_gather(k_cache, v_cache, cache_seqlens, block_table):
    """Gather every sequence to the table's full width without reading the lengths on the host.

    Returns K, V [B, T, Hkv, D] with T = max_pages * page_size (positions past a sequence's length zeroed, so
    NaN in unused pages cannot leak through a 0 weight) and ``valid`` [B, T] bool.
    """
    batch, max_pages = block_table.shape
    page_size = k_cache.shape[1]
    if k_cache.shape[0] == 0:
        # an empty pool (a context-parallel rank without pages): the masked gather below reads page 0
        k_cache = v_cache = k_cache.new_zeros(1, *k_cache.shape[1:])
    pos = torch.arange(max_pages * page_size, device=block_table.device)
    valid = pos[None, :] < cache_seqlens[:, None]
    # table entries past the sequence may be -1 or garbage: replace them before indexing
    used = torch.arange(max_pages, device=block_table.device)[None, :] * page_size < cache_seqlens[:, None]
    pages = torch.where(used, block_table, 0).long()
    shape = (batch, max_pages * page_size, *k_cache.shape[2:])
    keep = valid[:, :, None, None]
    k = torch.where(keep, k_cache[pages].reshape(shape), 0)
    v = torch.where(keep, v_cache[pages].reshape(shape), 0)
    return k, v, valid


def torch_sdpa(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale):
    """Padded gather + ``F.scaled_dot_product_attention`` with a boolean length mask (GQA via enable_gqa)."""
    k, v, valid = dense_gather(k_cache, v_cache, cache_seqlens, block_table)
    # SDPA layout: [B, H, L, D]; one query token
    out = F.scaled_dot_product_attention(
        q[:, :, None, :],
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=valid[:, None, None, :],
        scale=softmax_scale,
        enable_gqa=True,
    )[:, :, 0, :]
    empty = (cache_seqlens == 0)[:, None, None]
    out = torch.where(empty, 0, out)
    return out, _masked_lse(q, k, valid, softmax_scale)


def _masked_lse(q, k, valid, softmax_scale):
    """LSE [B, Hq] fp32 of the scores over the valid positions (-inf for empty sequences)."""
    group = q.shape[1] // k.shape[2]
    scores = torch.einsum("bhd,bthd->bht", q.float(), k.float().repeat_interleave(group, dim=2))
    scores = torch.where(valid[:, None, :], scores * softmax_scale, -math.inf)
    return torch.logsumexp(scores, dim=-1)


def torch_dense(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale):
    """Padded gather + einsum + masked softmax in the input dtype; the version given to ``torch.compile``."""
    k, v, valid = dense_gather(k_cache, v_cache, cache_seqlens, block_table)
    group = q.shape[1] // k.shape[2]
    batch, num_q_heads, head_dim = q.shape
    # [B, Hkv, G, D] x [B, T, Hkv, D] -> [B, Hkv, G, T]: each KV head serves its group of query heads
    qg = q.view(batch, -1, group, head_dim)
    scores = torch.einsum("bkgd,btkd->bkgt", qg, k).float() * softmax_scale
    scores = torch.where(valid[:, None, None, :], scores, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - torch.where(torch.isneginf(lse), 0, lse)[..., None])
    out = torch.einsum("bkgt,btkd->bkgd", p.to(q.dtype), v)
    return out.reshape(batch, num_q_heads, head_dim), lse.reshape(batch, num_q_heads)
