"""append_kv(): write new tokens' K/V into their pages of a paged cache.

Addressing is vLLM's slot mapping: token i goes to slot ``s = slot_mapping[i]``, i.e. row ``s % page_size`` of page
``s // page_size``; a slot of -1 skips the token (a padding or inactive batch row). With a block table, the slot of
token position t of sequence b is ``block_table[b, t // page_size] * page_size + t % page_size``
(``PagedKVCache`` computes it on the device).

The Triton kernel moves 2 * N * Hkv * D elements in and out (nothing else is read). Grid: (N, cdiv(Hkv, BLOCK_H)),
one program per token and block of KV heads, a [BLOCK_H, BLOCK_D] tile each for K and V. The store converts to the
cache's dtype, which is where quantisation to an fp8 cache (with a scale) will go; fp8 caches are refused for now.
"""

from __future__ import annotations

import torch

from . import launcher
from .api import check_v_pages

__all__ = ["append_kv", "APPEND_BACKENDS"]

APPEND_BACKENDS = ("auto", "triton", "torch")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# elements of one [BLOCK_H, BLOCK_D] tile: 4096 keeps a program's registers small for any head count
_TILE_ELEMENTS = 4096


def append_kv(k, v, k_cache, v_cache, slot_mapping, *, backend="auto"):
    """Write k[i], v[i] into slot slot_mapping[i] of k_cache / v_cache, in place.

    Args:
        k, v: [N, Hkv, D] new keys and values, the caches' dtype; any strides with a contiguous last dim
            (e.g. a [B, Hkv, 1, D] projection indexed at [:, :, 0]).
        k_cache, v_cache: [num_pages, page_size, Hkv, D] float16 / bfloat16 / float32, written in place.
        slot_mapping: [N] int32 or int64. Slot s is row s % page_size of page s // page_size; -1 (any negative
            slot) skips the token. Slots at or past num_pages * page_size are skipped by the Triton kernel (never
            written out of bounds) and raise IndexError in the torch backend; checking them up front would need a
            host sync.
            Two tokens with the same slot: one of them wins, which one is unspecified.
        backend: "auto" (Triton on CUDA tensors or under TRITON_INTERPRET=1, else "torch"), "triton", or "torch"
            (plain indexing; reads which slots are -1 on the host, so it synchronises: meant for CPU).

    Returns:
        None; k_cache and v_cache are updated. Pages and rows not addressed by a valid slot are untouched.

    Raises:
        TypeError / ValueError naming the argument, the expected and the actual value, before any launch.

    Example:
        >>> import torch, flashdecode
        >>> k_cache = torch.zeros(4, 2, 1, 3); v_cache = torch.zeros(4, 2, 1, 3)
        >>> k = torch.ones(2, 1, 3); v = 2 * torch.ones(2, 1, 3)
        >>> flashdecode.append_kv(k, v, k_cache, v_cache, torch.tensor([5, -1], dtype=torch.int32), backend="torch")
        >>> k_cache[2, 1].tolist(), float(v_cache.sum())
        ([[1.0, 1.0, 1.0]], 6.0)
    """
    # Triton launches on the current device: a call on another GPU's tensors runs with k's current
    current = torch.cuda.current_device() if isinstance(k, torch.Tensor) and k.is_cuda else None
    if current is not None and k.get_device() != current:
        with torch.cuda.device(k.device):
            return append_kv(k, v, k_cache, v_cache, slot_mapping, backend=backend)
    inputs = (k, v, k_cache, v_cache, slot_mapping)
    key = _replay_key(inputs, backend, current)
    if key is not None and launcher.replay(key, inputs):
        return None
    _validate(k, v, k_cache, v_cache, slot_mapping, backend)
    if k.shape[0] == 0:
        return None
    if backend == "auto":
        backend = "triton" if (k.is_cuda or _interpreting()) else "torch"
    if backend == "triton":
        if not (k.is_cuda or _interpreting()):
            raise ValueError(f"backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1), got device {k.device}")
        from .triton_append import append_kv_triton

        with launcher.recording(key, inputs):
            append_kv_triton(k, v, k_cache, v_cache, slot_mapping)
    else:
        _append_kv_torch(k, v, k_cache, v_cache, slot_mapping)
    return None


def _replay_key(inputs, backend, device):
    """The cached launcher's key (launcher.py): the backend asked for, every input's metadata (all that _validate
    reads), the current device (its index, None off CUDA) and how the addresses relate. A call is only recorded
    after its metadata passed _validate, so a key that replays was checked. None (run the host code) for a
    non-tensor input or when off."""
    # a backend that is not one of ours goes to _validate's error (and may not even hash)
    valid_backend = isinstance(backend, str) and backend in APPEND_BACKENDS
    ptrs = launcher.addresses(inputs) if launcher.ENABLED and valid_backend else None
    if ptrs is None or None in ptrs:
        return None
    meta = tuple((t.shape, t.stride(), t.dtype, t.device) for t in inputs)
    return ("append_kv", backend, device, meta, launcher.address_key(ptrs))


def _interpreting() -> bool:
    from .triton_common import interpreting

    return interpreting()


def _append_kv_torch(k, v, k_cache, v_cache, slot_mapping):
    """Plain indexing: k_cache[page, row] = k for the tokens whose slot is not -1 (host sync on the mask)."""
    page_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    page, row = slots // page_size, slots % page_size
    k_cache[page, row] = k[keep]
    v_cache[page, row] = v[keep]


def _validate(k, v, k_cache, v_cache, slot_mapping, backend):
    """Raise TypeError / ValueError naming the argument, the expected and the actual value."""
    named = dict(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not isinstance(backend, str) or backend not in APPEND_BACKENDS:
        raise ValueError(f"backend must be one of {APPEND_BACKENDS}, got {backend!r}")

    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype.is_floating_point and t.element_size() == 1:
            raise TypeError(
                f"{name} has dtype {t.dtype}: fp8 KV caches are not supported by append_kv yet (quantising needs "
                "the cache's scale); use a float16, bfloat16 or float32 cache"
            )
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if v_cache.dtype != k_cache.dtype:
        raise TypeError(f"v_cache must have k_cache's dtype {k_cache.dtype}, got {v_cache.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != k_cache.dtype:
            raise TypeError(f"{name} must have the cache's dtype {k_cache.dtype}, got {t.dtype}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")

    for name, t in named.items():
        if t.device != k_cache.device:
            raise ValueError(f"{name} must be on k_cache's device {k_cache.device}, got {t.device}")

    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be [num_pages, page_size, Hkv, D], got {t.dim()} dims {tuple(t.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 3 or tuple(t.shape[1:]) != tuple(k_cache.shape[2:]):
            want = f"[N, {k_cache.shape[2]}, {k_cache.shape[3]}]"
            raise ValueError(f"{name} must be [N, Hkv, D] = {want}, got {tuple(t.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(
            f"slot_mapping must be [N] with N = {k.shape[0]} (k's tokens), got {tuple(slot_mapping.shape)}"
        )
    for name, t in named.items():
        if name == "v_cache":
            check_v_pages(t, tuple(t.stride()))
        elif t.dim() >= 3 and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got stride {t.stride(-1)}")
