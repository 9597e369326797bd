"""The truth: paged decode attention and the LSE merge in float64 on the CPU.

Two independent formulations of the same function, which tests hold to ~1e-12 of each other:

* ``reference_dense``: gather each sequence's pages into one [L, Hkv, D] tensor, softmax, weighted sum.
* ``reference_streaming``: walk the pages one at a time with the online-softmax recurrence
  (running max ``m``, running sum ``l``, rescaled accumulator ``acc``) that every kernel here uses.

Nothing in this file calls the code under test. Inputs may live on any device; they are copied to the CPU
and upcast to float64, so these functions are slow and meant for checking, not serving.
"""

from __future__ import annotations

import math

import torch

__all__ = ["reference_dense", "reference_streaming", "reference_merge_states", "gather_sequence", "reference_append_kv"]


def gather_sequence(cache: torch.Tensor, block_table_row: torch.Tensor, seqlen: int) -> torch.Tensor:
    """Return the first ``seqlen`` tokens of one sequence as [seqlen, Hkv, D].

    Token t lives in page ``block_table_row[t // page_size]`` at row ``t % page_size``; only the first
    ``ceil(seqlen / page_size)`` table entries are read.
    """
    page_size = cache.shape[1]
    num_pages = -(-seqlen // page_size)
    pages = block_table_row[:num_pages].long()
    return cache[pages].reshape(num_pages * page_size, *cache.shape[2:])[:seqlen]


def _to64(*tensors: torch.Tensor, device="cpu") -> list[torch.Tensor]:
    return [t.detach().to(device=device, dtype=torch.float64) for t in tensors]


def _scale_of(x) -> float:
    """A per-tensor fp8 scale given as a float or a 0-d / 1-element tensor, as a Python float."""
    return 1.0 if x is None else float(x.reshape(()) if isinstance(x, torch.Tensor) else x)


def reference_dense(
    q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale=None, device="cpu", *,
    softcap=None, alibi_slopes=None, sinks=None, window_left=None, k_scale=None, v_scale=None,
):  # fmt: skip
    """Dense float64 decode attention: gather, dequantise, logits with every feature, masked softmax, weighted sum.

    For query token i of sequence b (position p = L - q_len + i, the new tokens being the last q_len of the
    cache), head h and cached token j:
        logit = q · k_j · scale;  softcap: logit = softcap · tanh(logit / softcap);  ALiBi: logit += slope_h (j - p)
        visible iff j <= p and (window_left is None or j >= p - window_left)
        lse = log(Σ_visible exp(logit) + exp(sink_h)),  out = Σ_visible exp(logit - lse) v_j
    (the sink term only with sinks). fp8 caches are dequantised: k = k_scale · k_fp8, v = v_scale · v_fp8.

    Args:
        q: [B, Hq, D] or [B, q_len, Hq, D] query, any float dtype and device.
        k_cache, v_cache: [num_pages, page_size, Hkv, D] (any float dtype, float8 included).
        cache_seqlens: [B] integer lengths. block_table: [B, max_pages] integer page ids.
        softmax_scale: defaults to 1/sqrt(D).
        device: where the float64 math runs (the benchmark checks multi-GB rows on the GPU, still in float64).
        softcap: float > 0 or None. alibi_slopes, sinks: [Hq] or None. window_left: int >= 0 or None.
        k_scale, v_scale: float or 0-d tensor (default 1).

    Returns:
        (out, lse) float64 on ``device``: out with q's shape, lse with q's shape without D. A row that sees no
        token gives out = 0 and lse = -inf (lse = sink_h with sinks).
    """
    q = _to64(q, device=device)[0]
    q4 = q if q.dim() == 4 else q[:, None]
    batch, q_len, num_q_heads, head_dim = q4.shape
    group = num_q_heads // k_cache.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    ks, vs = _scale_of(k_scale), _scale_of(v_scale)
    slopes = None if alibi_slopes is None else _to64(alibi_slopes, device=device)[0]
    sink = None if sinks is None else _to64(sinks, device=device)[0]
    seqlens = cache_seqlens.cpu().tolist()
    table = block_table.cpu()
    out = torch.zeros(batch, q_len, num_q_heads, head_dim, dtype=torch.float64, device=device)
    lse = torch.full((batch, q_len, num_q_heads), -math.inf, dtype=torch.float64, device=device)
    for b, seqlen in enumerate(seqlens):
        # [L, Hq, D]: query head h reads KV head h // group; only this sequence's pages are upcast
        rows = table[b].to(k_cache.device)
        k = gather_sequence(k_cache, rows, seqlen).to(device, torch.float64).repeat_interleave(group, dim=1) * ks
        v = gather_sequence(v_cache, rows, seqlen).to(device, torch.float64).repeat_interleave(group, dim=1) * vs
        scores = torch.einsum("qhd,lhd->qhl", q4[b], k) * scale  # [q_len, Hq, L]
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        key_pos = torch.arange(seqlen, device=device, dtype=torch.float64)
        query_pos = seqlen - q_len + torch.arange(q_len, device=device, dtype=torch.float64)
        if slopes is not None:
            scores = scores + slopes[None, :, None] * (key_pos[None, None, :] - query_pos[:, None, None])
        visible = key_pos[None, :] <= query_pos[:, None]  # [q_len, L]
        if window_left is not None:
            visible &= key_pos[None, :] >= query_pos[:, None] - window_left
        scores = torch.where(visible[:, None, :], scores, -math.inf)
        denominator = torch.logsumexp(scores, dim=-1) if seqlen > 0 else lse[b]  # [q_len, Hq]
        if sink is not None:
            denominator = torch.logaddexp(denominator, sink[None, :].expand(q_len, -1))
        finite = torch.isfinite(denominator)[..., None]
        p = torch.where(finite, torch.exp(scores - torch.where(finite, denominator[..., None], 0.0)), 0.0)
        out[b] = torch.einsum("qhl,lhd->qhd", p, v)
        lse[b] = denominator
    if q.dim() == 3:
        return out[:, 0], lse[:, 0]
    return out, lse


def reference_streaming(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale=None):
    """Float64 decode attention by the online-softmax recurrence, one page at a time.

    For each page P of scores s (per query head):
        m_i' = max(m_i, max(s));  l_i' = l_i * exp(m_i - m_i') + sum(exp(s - m_i'));
        acc' = acc * exp(m_i - m_i') + exp(s - m_i') @ V_P
    and at the end out = acc / l_i, lse = m_i + log(l_i). Same arguments and results as ``reference_dense``.
    """
    q, k_cache, v_cache = _to64(q, k_cache, v_cache)
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    seqlens = cache_seqlens.cpu().tolist()
    table = block_table.cpu().long()
    out = torch.zeros(batch, num_q_heads, head_dim, dtype=torch.float64)
    lse = torch.full((batch, num_q_heads), -math.inf, dtype=torch.float64)
    for b, seqlen in enumerate(seqlens):
        m_i = torch.full((num_q_heads,), -math.inf, dtype=torch.float64)
        l_i = torch.zeros(num_q_heads, dtype=torch.float64)
        acc = torch.zeros(num_q_heads, head_dim, dtype=torch.float64)
        for start in range(0, seqlen, page_size):
            rows = min(page_size, seqlen - start)
            page = table[b, start // page_size]
            k = k_cache[page, :rows].repeat_interleave(group, dim=1)  # [rows, Hq, D]
            v = v_cache[page, :rows].repeat_interleave(group, dim=1)
            s = torch.einsum("hd,rhd->hr", q[b], k) * scale  # [Hq, rows]
            m_new = torch.maximum(m_i, s.max(dim=1).values)
            alpha = torch.exp(m_i - m_new)  # exp(-inf) = 0 on the first page
            p = torch.exp(s - m_new[:, None])
            l_i = l_i * alpha + p.sum(dim=1)
            acc = acc * alpha[:, None] + torch.einsum("hr,rhd->hd", p, v)
            m_i = m_new
        if seqlen > 0:
            out[b] = acc / l_i[:, None]
            lse[b] = m_i + torch.log(l_i)
    return out, lse


def reference_merge_states(out_a, lse_a, out_b, lse_b):
    """Float64 merge of two attention results over disjoint key sets.

    out = (exp(lse_a) * out_a + exp(lse_b) * out_b) / (exp(lse_a) + exp(lse_b)), lse = log(exp(lse_a) + exp(lse_b)),
    evaluated relative to max(lse_a, lse_b). An empty side (lse = -inf) contributes nothing; both empty give 0, -inf.
    """
    out_a, lse_a, out_b, lse_b = _to64(out_a, lse_a, out_b, lse_b)
    lse = torch.logaddexp(lse_a, lse_b)
    both_empty = torch.isneginf(lse)
    ref = torch.where(both_empty, 0.0, lse)
    w_a = torch.where(torch.isneginf(lse_a), 0.0, torch.exp(lse_a - ref))
    w_b = torch.where(torch.isneginf(lse_b), 0.0, torch.exp(lse_b - ref))
    # an empty side's output may hold anything (even NaN): it is dropped, not multiplied by 0
    out = torch.where(w_a[..., None] > 0, w_a[..., None] * out_a, 0.0) + torch.where(
        w_b[..., None] > 0, w_b[..., None] * out_b, 0.0
    )
    return out, lse


def reference_append_kv(k, v, k_cache, v_cache, slot_mapping):
    """What append_kv must produce, one token at a time in a Python loop: copies of the caches with k[i], v[i]
    at row s % page_size of page s // page_size for every slot s = slot_mapping[i] >= 0 (a negative slot skips
    the token, as in both backends; -1 is the one callers use). Inputs are not modified.

    Returns:
        (k_cache', v_cache') on the CPU, the caches' dtype.
    """
    k_out, v_out = k_cache.detach().cpu().clone(), v_cache.detach().cpu().clone()
    page_size = k_cache.shape[1]
    for i, slot in enumerate(slot_mapping.cpu().tolist()):
        if slot < 0:
            continue
        k_out[slot // page_size, slot % page_size] = k[i].cpu()
        v_out[slot // page_size, slot % page_size] = v[i].cpu()
    return k_out, v_out
