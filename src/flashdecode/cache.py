"""PagedKVCache: the page pools of every layer, and which pages each sequence owns.

Ownership is split the way a generation loop needs it:

* host (Python ints and lists): the free-page stack, each batch row's pages and length. The loop knows on the host
  how many tokens each sequence has (it decides when to prefill, step and stop), so allocating a page never reads
  the GPU;
* device (int32 tensors that the kernels read): ``block_table`` [max_batch, max_pages_per_seq] and ``seqlens``
  [max_batch], plus the per-step buffers ``positions`` and ``slot_mapping`` [max_batch]. The host never reads them
  and changes them only by writes that do not wait for the GPU: ``fill_`` with a Python number (a kernel argument,
  no copy), and the new pages of a call as one (flat index, page) list copied from *pinned* host memory with
  ``non_blocking=True`` and scattered into the table. (``table[row, i] = page`` would not do: it copies a pageable
  CPU scalar and synchronises.) Each upload uses a fresh pinned tensor; PyTorch's caching host allocator records
  the copy's stream event and does not hand that memory out again before the copy has run, so the host may go on
  allocating while earlier copies are in flight. The step's device work (``update_step_tensors``) has fixed
  addresses that a CUDA graph can capture.

A batch *row* is a slot for one sequence. Rows that hold no sequence are inactive: their length is 0, their slot is
-1 (append_kv skips them) and decode_attention returns 0 for them, so a fixed-size batch serves a varying number of
sequences (continuous batching).
"""

from __future__ import annotations

import torch

__all__ = ["PagedKVCache", "CacheFullError"]


class CacheFullError(RuntimeError):
    """The page pool (or the batch rows) cannot hold what was asked; the message says how much is missing."""


class PagedKVCache:
    """K/V page pools for ``num_layers`` layers and the block tables of up to ``max_batch`` sequences.

    Args:
        num_layers: layers of the model; each has its own K and V pool.
        num_kv_heads, head_dim: the attention's KV heads and head dimension.
        num_pages: pages in each pool (shared by all sequences).
        page_size: tokens per page.
        max_batch: batch rows (sequences that can be resident at once).
        max_seq_len: longest sequence a row can hold; sets the block table's width ceil(max_seq_len / page_size).
            Rounded up to whole pages: the ``max_seq_len`` attribute is that width times ``page_size``.
        dtype: the pools' dtype (float16, bfloat16 or float32).
        device: where the pools and tables live.

    Attributes:
        k_pools, v_pools: per layer, [num_pages, page_size, num_kv_heads, head_dim] in ``dtype``.
        block_table: [max_batch, max_pages_per_seq] int32; -1 past each row's pages.
        seqlens: [max_batch] int32, tokens in each row's cache (0 for an inactive row).
        active: [max_batch] bool, rows that hold a sequence.
        stepping: [max_batch] bool, rows the pending decode step advances: ``grow`` copies ``active`` into it and
            ``update_step_tensors`` clears it, so a row added or freed between the two is left alone by the step.
        positions: [max_batch] int64, the position written by the current decode step (see update_step_tensors).
        slot_mapping: [max_batch] int32, the slot written by the current decode step, -1 for inactive rows.

    Example:
        >>> import torch
        >>> from flashdecode import PagedKVCache
        >>> cache = PagedKVCache(2, 1, 4, num_pages=8, page_size=4, max_batch=2, max_seq_len=16, device="cpu")
        >>> row = cache.add_sequence(6)  # a prompt of 6 tokens: 2 pages
        >>> cache.slots(row, 0, 6).tolist(), cache.num_free_pages
        ([0, 1, 2, 3, 4, 5], 6)
        >>> cache.grow(); _ = cache.update_step_tensors()  # one decode step: token 7 goes to position 6
        >>> cache.lengths[row], cache.slot_mapping.tolist(), cache.seqlens.tolist()
        (7, [6, -1], [7, 0])
        >>> cache.free(row); cache.num_free_pages
        8
    """

    def __init__(
        self,
        num_layers,
        num_kv_heads,
        head_dim,
        *,
        num_pages,
        page_size=16,
        max_batch,
        max_seq_len,
        dtype=torch.float32,
        device="cuda",
    ):
        for name, value in dict(
            num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, num_pages=num_pages,
            page_size=page_size, max_batch=max_batch, max_seq_len=max_seq_len,
        ).items():  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
        self.num_pages, self.page_size, self.max_batch = num_pages, page_size, max_batch
        self.max_pages_per_seq = -(-max_seq_len // page_size)
        self.max_seq_len = self.max_pages_per_seq * page_size
        device = torch.device(device)
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        self.k_pools = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_pools = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.block_table = torch.full((max_batch, self.max_pages_per_seq), -1, dtype=torch.int32, device=device)
        self.seqlens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.active = torch.zeros(max_batch, dtype=torch.bool, device=device)
        self.stepping = torch.zeros(max_batch, dtype=torch.bool, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.int32, device=device)
        # host state; pages are handed out lowest id first (a stack, reversed)
        self._free_pages = list(range(num_pages - 1, -1, -1))
        self._pages = [[] for _ in range(max_batch)]
        self.lengths = [0] * max_batch
        self._free_rows = list(range(max_batch - 1, -1, -1))
        self._host_active = [False] * max_batch

    @property
    def num_free_pages(self) -> int:
        """Pages of the pool no row holds (host state)."""
        return len(self._free_pages)

    @property
    def num_free_rows(self) -> int:
        """Batch rows free for a new sequence (host state)."""
        return len(self._free_rows)

    @property
    def active_rows(self) -> list[int]:
        """Rows that hold a sequence, ascending (host state)."""
        return [r for r in range(self.max_batch) if self._host_active[r]]

    def pages_of(self, row: int) -> list[int]:
        """The page ids that row owns, in token order (host copy)."""
        return list(self._pages[row])

    def pages_needed(self, num_tokens: int) -> int:
        """Pages that ``num_tokens`` tokens fill: ceil(num_tokens / page_size)."""
        return -(-num_tokens // self.page_size)

    def add_sequence(self, num_tokens: int) -> int:
        """Take a free row for a new sequence of ``num_tokens`` tokens (the prompt), allocate its pages and mark it
        active with that length. Returns the row. Write the tokens' K/V at ``slots(row, 0, num_tokens)``.

        Raises CacheFullError when no row or too few pages are free (nothing is allocated then)."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
            raise TypeError(f"num_tokens must be an int, got {type(num_tokens).__name__}")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if not self._free_rows:
            raise CacheFullError(f"all {self.max_batch} batch rows hold sequences; free one before adding another")
        row = self._free_rows[-1]
        self._write_pages(self._reserve(row, num_tokens))
        self._free_rows.pop()
        self._host_active[row] = True
        self.lengths[row] = num_tokens
        # fill_ with a Python number: a kernel argument, no host-to-device copy, no sync
        self.seqlens[row].fill_(num_tokens)
        self.active[row].fill_(True)
        return row

    def free(self, row: int) -> None:
        """Return a finished sequence's pages to the pool and its row to the free rows."""
        self._check_row(row)
        self._free_pages.extend(reversed(self._pages[row]))
        self._pages[row] = []
        self.lengths[row] = 0
        self._free_rows.append(row)
        self._host_active[row] = False
        self.block_table[row].fill_(-1)
        self.seqlens[row].fill_(0)
        self.active[row].fill_(False)
        self.stepping[row].fill_(False)

    def slots(self, row: int, start: int, end: int) -> torch.Tensor:
        """[end - start] int32 slots of positions [start, end) of ``row`` (already allocated), computed on the
        device from the block table: slot = block_table[row, t // page_size] * page_size + t % page_size."""
        self._check_row(row)
        if not 0 <= start <= end <= self.lengths[row]:
            raise ValueError(f"positions [{start}, {end}) must lie in row {row}'s {self.lengths[row]} tokens")
        pos = torch.arange(start, end, dtype=torch.int32, device=self.block_table.device)
        return self.block_table[row, pos // self.page_size] * self.page_size + pos % self.page_size

    def grow(self) -> None:
        """Host half of a decode step: every active row gets one more token, allocating a page when the token
        starts a new one. Call it before ``update_step_tensors`` (or before replaying a graph that contains it);
        a sequence added between the two joins at the next step.

        Raises CacheFullError naming the pages needed and free (the lengths are left unchanged then)."""
        rows = self.active_rows
        too_long = [r for r in rows if self.lengths[r] + 1 > self.max_seq_len]
        if too_long:
            raise CacheFullError(f"rows {too_long} already hold max_seq_len {self.max_seq_len} tokens")
        starting = [r for r in rows if self.lengths[r] % self.page_size == 0]
        if len(starting) > len(self._free_pages):
            raise CacheFullError(
                f"a decode step needs {len(starting)} new pages (rows {starting} start a page), only "
                f"{len(self._free_pages)} of {self.num_pages} are free; finish or free sequences first"
            )
        new_pages = []
        for r in rows:
            new_pages += self._reserve(r, self.lengths[r] + 1)
            self.lengths[r] += 1
        self._write_pages(new_pages)
        # the rows this step advances, in stream order after every add / free before it (device copy, no sync)
        self.stepping.copy_(self.active)

    def update_step_tensors(self) -> torch.Tensor:
        """Device half of a decode step (no host sync, fixed addresses: CUDA-graph capturable).

        positions = seqlens (where the new token goes); slot_mapping = that position's slot, -1 for the rows that
        ``grow`` did not advance (inactive, or added since); then seqlens += stepping, so decode_attention sees the
        new token, and stepping is cleared (a second call without ``grow`` changes nothing). Returns ``positions``
        [max_batch] int64.
        """
        page_size = self.page_size
        # [max_batch, 1] page index of each row's new token; a row not stepping may read any column: masked below
        col = (self.seqlens // page_size).clamp_max(self.max_pages_per_seq - 1).long()[:, None]
        page = self.block_table.gather(1, col)[:, 0]
        slot = torch.where(self.stepping, page * page_size + self.seqlens % page_size, -1)
        self.positions.copy_(self.seqlens)
        self.slot_mapping.copy_(slot)
        self.seqlens.add_(self.stepping.to(torch.int32))
        self.stepping.zero_()
        return self.positions

    def _reserve(self, row: int, num_tokens: int) -> list[tuple[int, int]]:
        """Give row enough pages for num_tokens tokens; all or nothing (host only). Returns the new table entries
        as (flat index into block_table, page) for ``_write_pages``."""
        if num_tokens > self.max_seq_len:
            raise CacheFullError(
                f"row {row} would hold {num_tokens} tokens, more than max_seq_len {self.max_seq_len} "
                f"({self.max_pages_per_seq} pages of {self.page_size})"
            )
        have = len(self._pages[row])
        need = self.pages_needed(num_tokens) - have
        if need > len(self._free_pages):
            raise CacheFullError(
                f"row {row} needs {need} more pages for {num_tokens} tokens, only {len(self._free_pages)} of "
                f"{self.num_pages} are free; finish or free sequences first, or build the cache with more num_pages"
            )
        entries = []
        for i in range(have, have + need):
            page = self._free_pages.pop()
            self._pages[row].append(page)
            entries.append((row * self.max_pages_per_seq + i, page))
        return entries

    def _write_pages(self, entries: list[tuple[int, int]]) -> None:
        """block_table.flatten()[index] = page for each entry, without waiting for the GPU: one [2, n] int64 tensor
        (indices, pages) from fresh pinned memory, a non_blocking copy and a scatter on the current stream."""
        if not entries:
            return
        device = self.block_table.device
        # [2, n]: row 0 flat indices, row 1 page ids
        upload = torch.tensor(entries, dtype=torch.int64).T.contiguous()
        if device.type == "cuda":
            # pageable memory would make the copy synchronous; the caching host allocator keeps this buffer until
            # the copy has run (it records an event on the stream), so dropping our reference here is safe
            upload = upload.pin_memory()
        upload = upload.to(device, non_blocking=True)
        self.block_table.view(-1).scatter_(0, upload[0], upload[1].to(torch.int32))

    def _check_row(self, row: int) -> None:
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < self.max_batch:
            raise ValueError(f"row must be an int in [0, {self.max_batch}), got {row!r}")
        if not self._host_active[row]:
            raise ValueError(f"row {row} holds no sequence (it is free)")
