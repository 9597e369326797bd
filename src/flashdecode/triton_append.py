"""The append_kv kernel: scatter N tokens' K/V rows into their cache slots.

Bytes: reads and writes 2 * N * Hkv * D elements once. Grid: (N, cdiv(Hkv, BLOCK_H)); each program copies one
token's [BLOCK_H, BLOCK_D] tile of K and of V. Imported on first use (decorating reads TRITON_INTERPRET).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launcher import launch
from .triton_common import cdiv, next_power_of_2

from .append import _TILE_ELEMENTS

__all__ = ["append_kv_triton", "append_launch_config"]


@triton.jit
def _append_kv_kernel(
    K, V, K_CACHE, V_CACHE, SLOTS, num_slots, stride_s,
    stride_kn, stride_kh, stride_vn, stride_vh,
    stride_kcp, stride_kct, stride_kch, stride_vcp, stride_vct, stride_vch, stride_vcd,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    slot = tl.load(SLOTS + token * stride_s).to(tl.int64)
    # -1 (skip) and anything outside the pool is never written
    valid = (slot >= 0) & (slot < num_slots)
    page = slot // PAGE_SIZE
    row = slot % PAGE_SIZE
    heads = offs_h.to(tl.int64)
    # [BLOCK_H, BLOCK_D]
    mask = valid & (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + token * stride_kn + heads[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(V + token * stride_vn + heads[:, None] * stride_vh + offs_d[None, :], mask=mask)
    k_ptrs = K_CACHE + page * stride_kcp + row * stride_kct + heads[:, None] * stride_kch + offs_d[None, :]
    # stride_vcd: 1, or page_size for token-major V pages (api.v_token_major)
    v_ptrs = V_CACHE + page * stride_vcp + row * stride_vct + heads[:, None] * stride_vch + offs_d[None, :] * stride_vcd
    # the conversion to the cache's dtype is where an fp8 cache would quantise (k * (1 / k_scale))
    tl.store(k_ptrs, k.to(K_CACHE.dtype.element_ty), mask=mask)
    tl.store(v_ptrs, v.to(V_CACHE.dtype.element_ty), mask=mask)


def append_launch_config(num_kv_heads: int, head_dim: int) -> dict:
    """BLOCK_D: head_dim padded to a power of two; BLOCK_H: as many KV heads as fit a tile of _TILE_ELEMENTS."""
    block_d = next_power_of_2(head_dim)
    block_h = min(next_power_of_2(num_kv_heads), max(1, _TILE_ELEMENTS // block_d))
    return dict(BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4 if block_h * block_d >= 1024 else 1)


def append_kv_triton(k, v, k_cache, v_cache, slot_mapping):
    """Launch the kernel. k, v: [N, Hkv, D]; caches [num_pages, page_size, Hkv, D]; slot_mapping [N] int32/int64."""
    num_tokens, num_kv_heads, head_dim = k.shape
    num_pages, page_size = k_cache.shape[:2]
    cfg = append_launch_config(num_kv_heads, head_dim)
    grid = (num_tokens, cdiv(num_kv_heads, cfg["BLOCK_H"]))
    launch(
        _append_kv_kernel, grid,
        k, v, k_cache, v_cache, slot_mapping, num_pages * page_size, slot_mapping.stride(0),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        **cfg,
    )  # fmt: skip
