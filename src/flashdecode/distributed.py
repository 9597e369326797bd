"""Context-parallel decode: the KV cache sharded across ranks by sequence position, merged by log-sum-exp.

Every rank holds the same query and its own shard of each sequence's tokens (its own page pool, block table and
lengths). ``decode_attention_cp`` runs the normal kernels on the local shard, giving a partial (out, lse) per
sequence and head, packs both into one fp32 buffer [B, Hq, D + 1], gathers it from every rank in ONE collective
(``all_gather`` on the process group: NCCL on GPUs, gloo on CPU) and merges the world's partials with the
log-sum-exp rule. Attention is invariant under any permutation of the keys, so any layout in which every token
lives on exactly one rank gives the same result: contiguous ranges, round-robin pages, anything else.

Bytes per step and rank: sends B * Hq * (D + 1) * 4, receives world * B * Hq * (D + 1) * 4 (B = 1, Hq = 64,
D = 128, 4 ranks: 132 KB), against the local K/V read of 2 * local_tokens * Hkv * D * itemsize.
Derivation and layouts: docs/distributed.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .api import decode_attention
from .merge import merge_states
from . import validation

__all__ = ["decode_attention_cp", "merge_gathered", "shard_paged_cache", "PagedShard", "LAYOUTS", "MERGES"]

LAYOUTS = ("contiguous", "round_robin")
MERGES = ("auto", "torch", "triton")


def decode_attention_cp(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    *,
    group=None,
    softmax_scale=None,
    backend="auto",
    num_splits=None,
    merge="auto",
    return_lse=False,
):
    """Decode attention over a KV cache sharded across the ranks of a torch.distributed process group.

    Each rank passes the same ``q`` and its own shard: the tokens it holds of every sequence, as a paged cache
    of its own (``shard_paged_cache`` builds shards from one cache). Every token of a sequence must live on
    exactly one rank; their order does not matter (attention is permutation-invariant over keys), so contiguous
    ranges and round-robin pages both work. A rank may hold no token of a sequence (length 0) or no page at all
    (num_pages 0): it contributes out = 0, lse = -inf, which the merge gives weight 0. Every rank gets the full
    result. Called collectively: every rank of ``group`` must call it with the same B, Hq, D, dtype, scale and
    ``merge``; the cache may differ in pages, page count and table width.

    Args:
        q: [B, Hq, D] or [B, 1, Hq, D], float16, bfloat16 or float32, identical on every rank.
        k_cache, v_cache: this rank's pages, [num_pages, page_size, Hkv, D] in q's dtype (num_pages may be 0).
        cache_seqlens: [B] int32, tokens of each sequence held by this rank (0 allowed).
        block_table: [B, max_pages] int32 page ids into this rank's pool; entries past each local sequence are
            never read.
        group: the process group (default: the world). Its backend must handle q's device (NCCL: CUDA, gloo: CPU).
        softmax_scale: defaults to 1 / sqrt(D) on every rank (D is the same everywhere).
        backend, num_splits: passed to ``flashdecode.decode_attention`` for the local partial.
        merge: "auto" (Triton kernel on CUDA tensors, else "torch"), "torch" (``flashdecode.merge_states``
            folded over the ranks) or "triton" (one kernel; CUDA tensors or TRITON_INTERPRET=1).
        return_lse: also return the LSE over the whole sequence.

    Returns:
        out with q's shape and dtype (and lse, float32 with q's shape without D, natural log, when return_lse),
        equal on every rank. A sequence with no token on any rank gives out = 0, lse = -inf.

    Raises:
        TypeError / ValueError naming the argument before any launch or collective (checks are local: a rank
        with bad arguments raises while the others wait in the collective).

    Communication: one all-gather per call of B * Hq * (D + 1) fp32 per rank (world * B * Hq * (D + 1) * 4 bytes
    received). No host synchronisation, so a step can be captured in a CUDA graph (NCCL).
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group: torch.distributed is not initialized (call torch.distributed.init_process_group)")
    if not isinstance(merge, str) or merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    # a q that is not a tensor is reported by decode_attention below
    on_cuda = getattr(q, "is_cuda", False)
    if merge == "auto":
        merge = "triton" if on_cuda else "torch"
    if merge == "triton" and not (on_cuda or _triton_merge().interpreting()):
        raise ValueError(f"merge 'triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors), got {q.device}")
    if getattr(q, "dim", lambda: 0)() == 4 and q.shape[1] != 1:
        raise ValueError(f"q: decode_attention_cp takes one query token per sequence, got q_len {q.shape[1]}")
    # validates every tensor argument, then computes this rank's partial
    local_out, local_lse = decode_attention(
        q, k_cache, v_cache, cache_seqlens, block_table,
        softmax_scale=softmax_scale, backend=backend, num_splits=num_splits, return_lse=True,
    )  # fmt: skip

    batch, num_q_heads, head_dim = q.shape[0], q.shape[-2], q.shape[-1]
    world = dist.get_world_size(group)
    # [B, Hq, D + 1] fp32: the partial output and its LSE side by side, so one collective carries both
    packed = torch.empty(batch, num_q_heads, head_dim + 1, dtype=torch.float32, device=q.device)
    packed[..., :head_dim] = local_out.reshape(batch, num_q_heads, head_dim)
    packed[..., head_dim] = local_lse.reshape(batch, num_q_heads)
    # [world * B, Hq, D + 1]: rank r's buffer at rows r * B .. r * B + B - 1
    gathered = torch.empty(world * batch, num_q_heads, head_dim + 1, dtype=torch.float32, device=q.device)
    _all_gather(gathered, packed, group)
    out, lse = merge_gathered(gathered.view(world, batch, num_q_heads, head_dim + 1), q.dtype, merge=merge)
    # out and lse in decode_attention's shapes: q's, and q's without D
    out = out.view(q.shape)
    return (out, lse.view(q.shape[:-1])) if return_lse else out


def merge_gathered(gathered, dtype, *, merge="torch"):
    """Merge the partial results of all ranks by log-sum-exp.

    Args:
        gathered: [world, B, Hq, D + 1] float32; [..., :D] is rank r's partial output, [..., D] its natural-log
            LSE (-inf for a rank without tokens; its output is then ignored, NaN included).
        dtype: dtype of the returned output.
        merge: "torch" (``merge_states`` folded pairwise, ceil(log2 world) calls) or "triton" (one kernel).

    Returns:
        (out [B, Hq, D] in ``dtype``, lse [B, Hq] float32). All ranks empty: out = 0, lse = -inf.
    """
    if merge not in ("torch", "triton"):
        raise ValueError(f"merge must be 'torch' or 'triton', got {merge!r}")
    if merge == "triton":
        return _triton_merge().merge_gathered_triton(gathered, dtype)
    head_dim = gathered.shape[-1] - 1
    outs, lses = gathered[..., :head_dim], gathered[..., head_dim]
    # pairwise tree: first half with second half until one remains; an odd last entry waits a level
    while outs.shape[0] > 1:
        half = outs.shape[0] // 2
        out, lse = merge_states(outs[:half], lses[:half], outs[half : 2 * half], lses[half : 2 * half])
        if outs.shape[0] % 2:
            out, lse = torch.cat([out, outs[-1:]]), torch.cat([lse, lses[-1:]])
        outs, lses = out, lse
    out, lse = outs[0], lses[0]
    if gathered.shape[0] == 1:
        # nothing was merged: drop an empty partial's output here (merge_states does it for the others)
        out = torch.where(torch.isneginf(lse)[..., None], 0.0, out)
    return out.to(dtype), lse.contiguous()


def _all_gather(output, input, group):
    """One all-gather into a [world * n, ...] tensor (``all_gather_single`` where torch has it, 2.13+)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, input, group=group)


def _triton_merge():
    """The Triton merge module, imported on first use (decorating a kernel reads TRITON_INTERPRET)."""
    from . import triton_merge

    return triton_merge


@dataclass
class PagedShard:
    """One rank's part of a paged cache, as ``decode_attention`` takes it (without q)."""

    k_cache: torch.Tensor  # [local_pages, page_size, Hkv, D]
    v_cache: torch.Tensor  # [local_pages, page_size, Hkv, D]
    cache_seqlens: torch.Tensor  # [B] int32, tokens held by this rank
    block_table: torch.Tensor  # [B, local_max_pages] int32, ids into this shard's pool, -1 past each sequence

    @property
    def args(self):
        return self.k_cache, self.v_cache, self.cache_seqlens, self.block_table


def shard_paged_cache(k_cache, v_cache, cache_seqlens, block_table, world_size, *, layout="contiguous", weights=None):
    """Split a paged cache into per-rank shards at page granularity, copying each rank's pages into its own pool.

    Layouts (page i of a sequence with P pages, ranks 0 .. world_size - 1):
    * "contiguous": rank r holds pages [bound_r, bound_{r+1}) with bound_r = round(P * sum(weights[:r]) /
      sum(weights)); equal weights by default. A weight of 0 gives an empty shard.
    * "round_robin": rank r holds pages i with i % world_size == r (``weights`` must be None).
    A sequence's last (partial) page is the last page its rank holds, so every shard is a valid paged cache.

    Args:
        k_cache, v_cache: [num_pages, page_size, Hkv, D], any dtype and device.
        cache_seqlens: [B] int32. block_table: [B, max_pages] int32 (entries past each sequence ignored).
        world_size: number of ranks, >= 1.
        layout: one of ``LAYOUTS``.
        weights: optional list of world_size non-negative numbers (contiguous only).

    Returns:
        list of world_size ``PagedShard``s on the cache's device; shard pools hold pages in sequence order.

    Example:
        >>> import torch
        >>> k = torch.randn(4, 2, 1, 8); table = torch.tensor([[2, 0, 3]], dtype=torch.int32)
        >>> lens = torch.tensor([5], dtype=torch.int32)
        >>> [s.cache_seqlens.tolist() for s in shard_paged_cache(k, k, lens, table, 2, layout="round_robin")]
        [[3], [2]]
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if weights is not None:
        if layout != "contiguous":
            raise ValueError(f"weights apply to layout 'contiguous' only, got layout {layout!r}")
        weights = [float(w) for w in weights]
        if len(weights) != world_size or not all(0 <= w < math.inf for w in weights) or sum(weights) <= 0:
            raise ValueError(
                f"weights must be {world_size} finite non-negative numbers with a positive sum, got {weights}"
            )
    for name, t in (("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
    for name, t, dims in (("k_cache", k_cache, 4), ("v_cache", v_cache, 4), ("cache_seqlens", cache_seqlens, 1),
                          ("block_table", block_table, 2)):  # fmt: skip
        if t.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    if v_cache.shape[:2] != k_cache.shape[:2]:
        raise ValueError(f"v_cache must have k_cache's pages {tuple(k_cache.shape[:2])}, got {tuple(v_cache.shape)}")
    if block_table.shape[0] != cache_seqlens.shape[0]:
        raise ValueError(f"block_table must have a row per sequence ({cache_seqlens.shape[0]}), got "
                         f"{tuple(block_table.shape)}")  # fmt: skip
    page_size = k_cache.shape[1]
    # one copy to the host; lengths >= 0, within the table, and every page read inside the pool
    lens, table = validation._on_host(cache_seqlens, block_table)
    validation._check_bounds(lens, table, k_cache.shape[0], page_size)
    seqlens = lens.tolist()
    # per rank and sequence: the global page ids it holds (in token order) and its token count
    pages = [[[] for _ in seqlens] for _ in range(world_size)]
    tokens = [[0] * len(seqlens) for _ in range(world_size)]
    for b, seqlen in enumerate(seqlens):
        num_pages = -(-seqlen // page_size)
        owners = _page_owners(num_pages, world_size, layout, weights)
        for i, rank in enumerate(owners):
            pages[rank][b].append(int(table[b, i]))
            tokens[rank][b] += min(page_size, seqlen - i * page_size)

    shards = []
    for rank in range(world_size):
        # local pool: this rank's pages, sequence after sequence; table entries are positions in that pool
        flat = [p for seq in pages[rank] for p in seq]
        width = max((len(seq) for seq in pages[rank]), default=0)
        local_table = torch.full((len(seqlens), width), -1, dtype=torch.int32)
        cursor = 0
        for b, seq in enumerate(pages[rank]):
            local_table[b, : len(seq)] = torch.arange(cursor, cursor + len(seq), dtype=torch.int32)
            cursor += len(seq)
        index = torch.tensor(flat, dtype=torch.long, device=k_cache.device)
        shards.append(
            PagedShard(
                k_cache=k_cache[index].contiguous(),
                v_cache=v_cache[index].contiguous(),
                cache_seqlens=torch.tensor(tokens[rank], dtype=torch.int32, device=cache_seqlens.device),
                block_table=local_table.to(block_table.device),
            )
        )
    return shards


def _page_owners(num_pages, world_size, layout, weights):
    """The rank of each of a sequence's num_pages pages."""
    if layout == "round_robin":
        return [i % world_size for i in range(num_pages)]
    weights = weights or [1.0] * world_size
    total, cumulative, bounds = sum(weights), 0.0, [0]
    for w in weights:
        cumulative += w
        bounds.append(math.floor(num_pages * cumulative / total + 0.5))
    return [r for r in range(world_size) for _ in range(bounds[r], bounds[r + 1])]
