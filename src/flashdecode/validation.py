"""Value checks of the paged-cache metadata: what ``decode_attention(..., validate=True)`` adds.

On CUDA tensors the default path checks shapes, dtypes, devices and strides only (``api._validate``): reading the
values of ``cache_seqlens`` and ``block_table`` means copying them to the host, a synchronisation that a decode step
(and a captured CUDA graph) cannot afford. Where the call synchronises on them anyway (CPU tensors, and the
"reference" and "torch_naive" backends, whose loops run on the host) every call runs ``check_bounds``: the first
three checks below, which keep every read inside the table and the pool. With ``validate=True`` or the environment
variable ``FLASHDECODE_DEBUG=1``, ``check_values`` copies them once and raises ValueError naming the argument, the
sequence and the value for:

* a negative length;
* a length the block table's row cannot hold (more than ``block_table.shape[1] * page_size`` tokens); without the
  check the kernels would read past the row;
* a page id that a sequence reads (the first ``ceil(len / page_size)`` entries of its row) outside
  ``[0, num_pages)``; entries past that point are never read and may hold anything;
* a page read twice (by two sequences, or twice by one), unless ``allow_shared_pages=True``: prefix caching shares
  the pages of a common prompt prefix between sequences legitimately, an allocator bug does so by accident.

docs/contracts.md lists every contract and the test that holds it.
"""

from __future__ import annotations

import torch

from .env import env_flag

__all__ = ["check_bounds", "check_values", "debug_enabled"]


def debug_enabled() -> bool:
    """True when FLASHDECODE_DEBUG is on (``env.env_flag``: set, and not "0", "false", "no" or "off"): every call
    validates values."""
    return env_flag("FLASHDECODE_DEBUG", False)


def check_values(
    cache_seqlens, block_table, num_pages: int, page_size: int, *, allow_shared_pages: bool = False,
    dense: bool = False, window_left: int | None = None, q_len: int = 1,
):  # fmt: skip
    """Raise ValueError if the lengths or the pages they read are invalid (one host sync).

    Args:
        cache_seqlens: [B] int32 tokens per sequence, any device.
        block_table: [B, max_pages] int32 page ids, any device.
        num_pages: pages in the cache pool (``k_cache.shape[0]``).
        page_size: tokens per page (``k_cache.shape[1]``).
        allow_shared_pages: accept a page read by more than one (sequence, table column).
        dense: the call's cache is dense (``block_table=None``, the table made by ``decode_attention``): a length is
            checked against the cache's max_len, named as such.
        window_left, q_len: the call's window and new tokens: the pages wholly before a sequence's window are not
            read, so their entries are not checked.
    """
    lens, table = _on_host(cache_seqlens, block_table)
    read = _check_bounds(lens, table, num_pages, page_size, dense, window_left, q_len)

    if not allow_shared_pages:
        where = read.nonzero()  # [N, 2] (sequence, column), row-major
        ids = table[read]
        order = torch.argsort(ids, stable=True)
        repeated = (ids[order][1:] == ids[order][:-1]).nonzero()
        if len(repeated):
            i = int(repeated[0])
            (b0, j0), (b1, j1) = where[order[i]].tolist(), where[order[i + 1]].tolist()
            raise ValueError(
                f"page {int(ids[order[i]])} is read by block_table[{b0}, {j0}] and block_table[{b1}, {j1}]; "
                "pass allow_shared_pages=True if sharing is intended (prefix caching)"
            )


def check_bounds(
    cache_seqlens, block_table, num_pages: int, page_size: int, *, dense: bool = False,
    window_left: int | None = None, q_len: int = 1,
):  # fmt: skip
    """``check_values`` without the shared-page test: the checks that keep every read inside the table and the pool.
    What ``decode_attention`` runs on every call that synchronises on the lengths anyway (CPU tensors, and the
    "reference" and "torch_naive" backends, whose loops run on the host)."""
    _check_bounds(*_on_host(cache_seqlens, block_table), num_pages, page_size, dense, window_left, q_len)


def _on_host(cache_seqlens, block_table):
    """The one host sync: both tensors to the CPU, widened to int64 so that sums cannot overflow."""
    return cache_seqlens.detach().to("cpu", torch.int64), block_table.detach().to("cpu", torch.int64)


def _check_bounds(lens, table, num_pages, page_size, dense=False, window_left=None, q_len=1):
    """The int64 CPU lengths' and table's bounds checks; returns the [B, max_pages] mask of the entries read."""
    width = table.shape[1]
    negative = (lens < 0).nonzero()
    if len(negative):
        b = int(negative[0])
        raise ValueError(f"cache_seqlens[{b}] must be >= 0, got {int(lens[b])}")
    too_long = (lens > width * page_size).nonzero()
    if len(too_long) and dense:
        b = int(too_long[0])
        raise ValueError(f"cache_seqlens[{b}] = {int(lens[b])} is more than the dense k_cache holds per sequence "
                         f"(max_len {page_size}, its dim 1)")
    if len(too_long):
        b = int(too_long[0])
        raise ValueError(
            f"cache_seqlens[{b}] = {int(lens[b])} needs {-(-int(lens[b]) // page_size)} pages of {page_size} tokens, "
            f"but block_table has {width} columns (at most {width * page_size} tokens)"
        )

    # [B, max_pages]: the entries the kernels read, from the page of the window's first token (splitk.visible_start)
    pages_read = -(-lens // page_size)
    first = torch.zeros_like(lens) if window_left is None else (lens - q_len - window_left).clamp(min=0) // page_size
    columns = torch.arange(width)[None, :]
    read = (columns >= first[:, None]) & (columns < pages_read[:, None])
    bad = read & ((table < 0) | (table >= num_pages))
    if bad.any():
        b, j = (int(i) for i in bad.nonzero()[0])
        n, f = int(pages_read[b]), int(first[b])
        span = f"its first {n} entries are" if f == 0 else f"its entries {f} to {n - 1} (the window's) are"
        raise ValueError(
            f"block_table[{b}, {j}] = {int(table[b, j])} is not a page id in [0, {num_pages}); sequence {b} has "
            f"{int(lens[b])} tokens, so {span} read"
        )
    return read
