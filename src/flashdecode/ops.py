"""torch.library custom ops: ``torch.ops.flashdecode.decode_attention`` and ``torch.ops.flashdecode.append_kv``.

Registered when this module is imported (``import flashdecode.ops``; the transformers integration does it). As
custom ops they are opaque to torch.compile: Dynamo records one call each instead of tracing into Python that reads
environment variables and launches Triton kernels, so a model calling them compiles with ``fullgraph=True``. Their
fake implementations give output shapes without running anything.

* decode_attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale=None, backend="auto",
  num_splits=None) -> out: ``flashdecode.decode_attention`` without ``out=`` / ``return_lse`` (a custom op returns
  fresh tensors). Its workspaces are sized from the batch and the SM count, never from the lengths, so one CUDA
  graph captured at short lengths replays correctly at long ones.
* append_kv(k, v, k_cache, v_cache, slot_mapping, backend="auto") -> None: mutates k_cache and v_cache
  (declared with ``mutates_args``, so functionalisation orders it before the attention that reads them).
"""

from __future__ import annotations

import torch

from .api import decode_attention as _decode_attention
from .append import append_kv as _append_kv

__all__ = ["decode_attention_op", "append_kv_op"]


@torch.library.custom_op("flashdecode::decode_attention", mutates_args=())
def decode_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    softmax_scale: float | None = None,
    backend: str = "auto",
    num_splits: int | None = None,
) -> torch.Tensor:
    """Paged decode attention as a custom op: out with q's shape ([B, Hq, D] or [B, 1, Hq, D]) and dtype."""
    return _decode_attention(
        q, k_cache, v_cache, cache_seqlens, block_table,
        softmax_scale=softmax_scale, backend=backend, num_splits=num_splits,
    )  # fmt: skip


@decode_attention_op.register_fake
def _decode_attention_fake(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale=None, backend="auto",
                           num_splits=None):  # fmt: skip
    return q.new_empty(q.shape)


@torch.library.custom_op("flashdecode::append_kv", mutates_args=("k_cache", "v_cache"))
def append_kv_op(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: str = "auto",
) -> None:
    """Write k[i], v[i] ([N, Hkv, D]) into slot slot_mapping[i] of the caches (-1 skips), in place."""
    _append_kv(k, v, k_cache, v_cache, slot_mapping, backend=backend)


@append_kv_op.register_fake
def _append_kv_fake(k, v, k_cache, v_cache, slot_mapping, backend="auto"):
    return None
