"""Peer kernels for the benchmark, used when importable: FlashInfer and flash-attn.

Each factory takes a ``PagedCase`` and returns ``fn(case) -> out [B, Hq, D]``; planning happens once, in the
factory, so that the timed call is the kernel launch alone (what an engine replays every step). A missing
package or an unsupported shape raises ``bench.Skip`` with the reason.
"""

from __future__ import annotations

import math

import torch

from .bench import Skip

# FlashInfer's recommended workspace for its split-K scratch
_FLASHINFER_WORKSPACE_BYTES = 128 << 20


def _import(name: str):
    try:
        return __import__(name)
    except Exception as e:  # ImportError, or a broken install that fails while importing
        raise Skip(f"{name} not importable ({type(e).__name__})") from None


def flashinfer_decode(case, use_tensor_cores: bool):
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper (NHD layout), planned once for this case's lengths."""
    flashinfer = _import("flashinfer")
    q, k_cache, v_cache, seqlens, table = case.args
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if not use_tensor_cores and (num_q_heads // num_kv_heads) not in (1, 2, 3, 4, 8):
        raise Skip(f"FlashInfer without tensor cores rejects GQA group {num_q_heads // num_kv_heads}")
    # CSR page lists: indptr [B + 1], indices [total pages], last_page_len [B] (tokens in each last page)
    pages = (seqlens + page_size - 1) // page_size
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = torch.cumsum(pages, 0)
    used = torch.arange(table.shape[1], device=q.device)[None, :] < pages[:, None]
    indices = table[used].to(torch.int32)
    last_page_len = torch.where(seqlens > 0, (seqlens - 1) % page_size + 1, 0).to(torch.int32)
    workspace = torch.empty(_FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=use_tensor_cores)
    wrapper.plan(
        indptr, indices, last_page_len, num_q_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode="NONE", q_data_type=q.dtype, kv_data_type=k_cache.dtype,
        sm_scale=1.0 / math.sqrt(head_dim),
    )  # fmt: skip

    def run(c):
        return wrapper.run(c.q, (c.k_cache, c.v_cache))

    run.keepalive = (workspace, indptr, indices, last_page_len)
    return run


def flash_attn_decode(case):
    """flash_attn_with_kvcache with a paged cache. It needs page sizes that are multiples of 256, so a cache with
    smaller pages is re-paged once (outside the timed call) into 256-token pages; the row's timing then reflects
    flash-attn on its own layout."""
    fa = _import("flash_attn")
    q, k_cache, v_cache, seqlens, table = case.args
    page_size = k_cache.shape[1]
    big = 256
    if page_size % big != 0:
        from .reference import gather_sequence

        lens = seqlens.tolist()
        per_seq = [-(-n // big) for n in lens]
        new_table = torch.zeros(len(lens), max(max(per_seq, default=0), 1), dtype=torch.int32, device=q.device)
        shape = (max(sum(per_seq), 1), big, *k_cache.shape[2:])
        new_k, new_v = k_cache.new_zeros(shape), v_cache.new_zeros(shape)
        cursor = 0
        for b, n in enumerate(lens):
            if n == 0:
                continue
            ids = torch.arange(cursor, cursor + per_seq[b], device=q.device)
            new_table[b, : per_seq[b]] = ids.to(torch.int32)
            new_k.view(-1, *shape[2:])[cursor * big : cursor * big + n] = gather_sequence(k_cache, table[b], n)
            new_v.view(-1, *shape[2:])[cursor * big : cursor * big + n] = gather_sequence(v_cache, table[b], n)
            cursor += per_seq[b]
        k_cache, v_cache, table = new_k, new_v, new_table

    def run(c):
        return fa.flash_attn_with_kvcache(
            c.q[:, None], k_cache, v_cache, cache_seqlens=c.cache_seqlens, block_table=table, causal=False
        )[:, 0]

    return run


def flex_attention_decode(case):
    """PyTorch flex_attention (compiled on a GPU) on a dense copy of each sequence's K/V, with a block mask of the
    lengths. The paged gather and the block mask are built once per cache copy, outside the timed call: the row
    then times flex's decode kernel reading the valid K/V, not a paged kernel."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:
        raise Skip(f"flex_attention not importable ({type(e).__name__})") from None
    from .torch_baselines import dense_gather

    q, k_cache, v_cache, seqlens, table = case.args
    batch, num_q_heads, head_dim = q.shape
    lens = seqlens.clone()
    seq_tokens = table.shape[1] * k_cache.shape[1]

    def keep(b, h, q_idx, kv_idx):
        return kv_idx < lens[b]

    mask = create_block_mask(keep, batch, None, 1, seq_tokens, device=q.device)
    attend = torch.compile(flex_attention, dynamic=False) if q.is_cuda else flex_attention
    dense = {}

    def run(c):
        key = c.k_cache.data_ptr()
        if key not in dense:
            k, v, _ = dense_gather(c.k_cache, c.v_cache, c.cache_seqlens, c.block_table)
            # [B, Hkv, T, D]
            dense[key] = (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
        k, v = dense[key]
        out = attend(c.q[:, :, None, :], k, v, block_mask=mask, scale=head_dim**-0.5, enable_gqa=True)
        # an empty sequence has no unmasked key: flex returns 0 there, as flashdecode does
        return out[:, :, 0, :]

    return run
