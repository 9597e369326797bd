"""decode_attention(): validate once, pick a backend, dispatch.

The "auto" rule (docs/design.md): on CPU tensors without TRITON_INTERPRET=1, ``torch_sdpa``. Otherwise the Triton
kernels: a forced ``num_splits`` picks single-pass (1) or fixed splits (> 1). Otherwise single-pass when the
sequences can hold at most SINGLE_PASS_MAX_TOKENS tokens, or when B * Hkv alone gives every SM
``triton_splitk.SATURATION_PER_SM`` programs (splitting then only adds the planner and combine launches, unless the
lengths are very uneven: a known trade-off, docs/design.md); everything else runs ``triton_splitk`` planned on the
device from the lengths. The choice reads shapes only: no host sync.
"""

from __future__ import annotations

import functools
import math

import torch

from . import reference, torch_baselines, validation

__all__ = ["decode_attention", "BACKENDS"]

# sequences that can hold at most this many tokens (table width x page size) run single-pass: a split would add a
# combine launch to a call that takes a few microseconds (measured: docs/design.md)
SINGLE_PASS_MAX_TOKENS = 256
BACKENDS = ("auto", "reference", "torch_naive", "torch_sdpa", "triton", "triton_splitk")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def decode_attention(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    *,
    softmax_scale=None,
    backend="auto",
    num_splits=None,
    out=None,
    return_lse=False,
    validate=False,
    allow_shared_pages=False,
):
    """Attention of one new query token per sequence over a paged KV cache.

    For each sequence b and query head h: out[b, h] = softmax(q[b, h] · K_bᵀ · scale) · V_b, where K_b, V_b are the
    first cache_seqlens[b] tokens of the sequence; token t lives in page block_table[b, t // page_size] at row
    t % page_size. Query head h reads KV head h // (Hq / Hkv) (MHA, GQA and MQA).

    Args:
        q: [B, Hq, D] or [B, 1, Hq, D], float16, bfloat16 or float32; any strides with a contiguous last dim.
        k_cache, v_cache: [num_pages, page_size, Hkv, D], q's dtype; Hq must be a multiple of Hkv.
        cache_seqlens: [B] int32, valid tokens per sequence (0 allowed).
        block_table: [B, max_pages] int32 page ids. Entries at index >= ceil(cache_seqlens[b] / page_size) are
            never read, so they may be -1 or garbage.
        softmax_scale: defaults to 1 / sqrt(D).
        backend: one of ``flashdecode.BACKENDS``: "auto", "reference" (float64 on CPU), "torch_naive",
            "torch_sdpa", "triton" (single pass), "triton_splitk" (flash-decoding).
        num_splits: None picks automatically; an int >= 1 forces the number of splits per sequence (1 = none).
            Forcing more than 1 needs backend "auto" or "triton_splitk"; the PyTorch backends ignore it.
        out: optional buffer with q's shape, dtype and device to write into. It may be q itself (same storage,
            shape and strides: every program reads its q rows before it writes the same out rows), but it must
            not otherwise share memory with an input.
        return_lse: also return the natural-log LSE [B, Hq] float32.
        validate: also check the values of cache_seqlens and block_table (one host sync; ``validation.py``):
            lengths in [0, max_pages * page_size], the page ids they read in [0, num_pages), no page read twice.
            The environment variable FLASHDECODE_DEBUG=1 turns it on for every call.
        allow_shared_pages: with validation on, accept pages read by several sequences (prefix caching).

    Returns:
        out with q's shape and dtype, or (out, lse) when return_lse. A sequence with 0 tokens gives out = 0 and
        lse = -inf, never NaN.

    Raises:
        TypeError / ValueError naming the argument, the expected and the actual value, before any launch.

    Example:
        >>> import torch, flashdecode
        >>> q = torch.randn(2, 8, 64)
        >>> k = torch.randn(10, 16, 2, 64); v = torch.randn(10, 16, 2, 64)
        >>> lens = torch.tensor([20, 0], dtype=torch.int32)
        >>> table = torch.tensor([[3, 7], [-1, -1]], dtype=torch.int32)
        >>> out, lse = flashdecode.decode_attention(q, k, v, lens, table, backend="reference", return_lse=True)
        >>> out.shape, lse[1].tolist()[:2]
        (torch.Size([2, 8, 64]), [-inf, -inf])
    """
    _validate(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, backend, num_splits, out)
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool, got {type(validate).__name__}")
    if validate or validation.debug_enabled():
        validation.check_values(
            cache_seqlens, block_table, k_cache.shape[0], k_cache.shape[1], allow_shared_pages=allow_shared_pages
        )
    batch, num_q_heads, head_dim = q.shape[0], q.shape[-2], q.shape[-1]
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, num_q_heads, dtype=torch.float32, device=q.device) if return_lse else None
    if batch > 0:
        # [B, 1, Hq, D] -> [B, Hq, D] views: no copy, strides kept
        q3 = q[:, 0] if q.dim() == 4 else q
        out3 = out[:, 0] if out.dim() == 4 else out
        scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
        name, splits = _choose_backend(backend, num_splits, q3, k_cache, block_table)
        if name.startswith("triton") and not (q.is_cuda or _kernels()[0].interpreting()):
            raise ValueError(
                f"backend {name!r} needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors), got device {q.device}"
            )
        _BACKEND_FNS[name](q3, k_cache, v_cache, cache_seqlens, block_table, scale, out3, lse, splits)
    return (out, lse) if return_lse else out


def _kernels():
    """The Triton modules, imported on first use: decorating a kernel reads TRITON_INTERPRET, so importing
    flashdecode stays free of work and a caller may still set the variable after ``import flashdecode``."""
    from . import triton_common, triton_single, triton_splitk

    return triton_common, triton_single, triton_splitk


def _choose_backend(backend, num_splits, q, k_cache, block_table):
    """(backend name, num_splits) for this call; "auto" resolved as the module docstring says."""
    if backend != "auto":
        return backend, num_splits
    common, single, splitk = _kernels()
    if not (q.is_cuda or common.interpreting()):
        return "torch_sdpa", None
    if num_splits is not None:
        return ("triton" if num_splits == 1 else "triton_splitk"), num_splits
    max_tokens = block_table.shape[1] * k_cache.shape[1]
    programs = q.shape[0] * k_cache.shape[2]
    full = programs >= splitk.SATURATION_PER_SM * _num_sms(q.device)
    if max_tokens <= SINGLE_PASS_MAX_TOKENS or full or q.shape[0] > splitk.MAX_PLANNED_BATCH:
        return "triton", 1
    return "triton_splitk", None


@functools.lru_cache(maxsize=None)
def _num_sms_cached(device_type: str, index: int) -> int:
    if device_type == "cuda":
        return torch.cuda.get_device_properties(index).multi_processor_count
    # the interpreter has no SMs; pretend to be a mid-size GPU so "auto" exercises both paths
    return 16


def _num_sms(device: torch.device) -> int:
    index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)
    return _num_sms_cached(device.type, index)


def _from_torch(fn):
    """Adapt a function returning (out, lse) to the backend signature that writes into out / lse."""

    def run(q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse, num_splits):
        o, l = fn(q, k_cache, v_cache, cache_seqlens, block_table, scale)
        out.copy_(o)
        if lse is not None:
            lse.copy_(l)

    return run


def _run_triton(q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse, num_splits):
    _kernels()[1].decode_single(q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse)


def _run_triton_splitk(q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse, num_splits):
    splitk = _kernels()[2]
    if num_splits is None and q.shape[0] > splitk.MAX_PLANNED_BATCH:
        num_splits = 1
    splitk.decode_splitk(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse,
        num_splits=num_splits, num_sms=_num_sms(q.device),
    )  # fmt: skip


_BACKEND_FNS = {
    "reference": _from_torch(reference.reference_dense),
    "torch_naive": _from_torch(torch_baselines.torch_naive),
    "torch_sdpa": _from_torch(torch_baselines.torch_sdpa),
    "triton": _run_triton,
    "triton_splitk": _run_triton_splitk,
}


def _validate(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, backend, num_splits, out):
    """Raise TypeError / ValueError naming the argument, the expected and the actual value."""
    named = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, block_table=block_table)
    if out is not None:
        named["out"] = out
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")

    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int):
            raise TypeError(f"num_splits must be None or an int, got {type(num_splits).__name__}")
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        if num_splits > 1 and backend == "triton":
            raise ValueError(f"num_splits={num_splits} needs backend 'triton_splitk' or 'auto', got 'triton'")
    if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))):
        raise TypeError(f"softmax_scale must be None or a float, got {type(softmax_scale).__name__}")

    # ranks
    if q.dim() not in (3, 4):
        raise ValueError(f"q must be [B, Hq, D] or [B, 1, Hq, D], got {q.dim()} dims {tuple(q.shape)}")
    if q.dim() == 4 and q.shape[1] != 1:
        raise ValueError(f"q as [B, q_len, Hq, D] must have q_len 1, got q_len {q.shape[1]} (shape {tuple(q.shape)})")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be [num_pages, page_size, Hkv, D], got {t.dim()} dims {tuple(t.shape)}")
    if cache_seqlens.dim() != 1:
        raise ValueError(f"cache_seqlens must be [B], got {cache_seqlens.dim()} dims {tuple(cache_seqlens.shape)}")
    if block_table.dim() != 2:
        raise ValueError(f"block_table must be [B, max_pages], got {block_table.dim()} dims {tuple(block_table.shape)}")

    # dtypes: metadata is never cast silently
    if q.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)) + ((("out", out),) if out is not None else ()):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    for name, t in (("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype} (convert it with .to(torch.int32))")

    # devices
    for name, t in named.items():
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")

    # shapes
    batch, num_q_heads, head_dim = q.shape[0], q.shape[-2], q.shape[-1]
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache head_dim must equal q's head_dim {head_dim}, got {k_cache.shape[3]}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        raise ValueError(f"q's {num_q_heads} heads must be a multiple of k_cache's {num_kv_heads} KV heads")
    if head_dim == 0 or k_cache.shape[1] == 0:
        raise ValueError(f"head_dim and page_size must be > 0, got head_dim {head_dim}, page_size {k_cache.shape[1]}")
    for name, t in (("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if t.shape[0] != batch:
            raise ValueError(f"{name} must have q's batch size {batch} in dim 0, got {t.shape[0]}")
    if out is not None and out.shape != q.shape:
        raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")

    # the kernels vectorise along the head dim; any other stride is honoured
    for name, t in named.items():
        if t.dim() >= 3 and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got stride {t.stride(-1)}")

    # out may be q itself (each program reads its q rows before writing the same out rows), nothing else that
    # shares memory with an input: compared by address range, so a view interleaved with q is refused too
    if out is not None:
        same_as_q = out.data_ptr() == q.data_ptr() and out.stride() == q.stride()
        for name, t in named.items():
            if name != "out" and not (name == "q" and same_as_q) and _byte_ranges_overlap(out, t):
                raise ValueError(
                    f"out must not share memory with {name} (only out=q, the same view, is allowed); "
                    "pass a separate buffer"
                )


def _byte_ranges_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the address ranges [first byte, last byte] of two tensors on one device intersect."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False

    def span(t):
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) * t.element_size()
        return t.data_ptr(), t.data_ptr() + last + t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1
