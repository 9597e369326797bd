"""Random paged KV caches shaped like production: the inputs for tests, ``flashdecode run`` and the benchmark.

Pages are placed at random in the pool, the pool has spare pages that no sequence uses (poisoned with NaN by
default, so a read of one shows up in the output), and block-table entries past each sequence hold -1 or
out-of-range garbage (they must never be read).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PagedCase", "poison_page_tails", "random_paged_case", "token_major_v"]


@dataclass
class PagedCase:
    """One decode-attention input. Tensors as ``decode_attention`` takes them."""

    q: torch.Tensor  # [B, Hq, D]
    k_cache: torch.Tensor  # [num_pages, page_size, Hkv, D]
    v_cache: torch.Tensor  # [num_pages, page_size, Hkv, D]
    cache_seqlens: torch.Tensor  # [B] int32
    block_table: torch.Tensor  # [B, max_pages] int32

    @property
    def args(self):
        return self.q, self.k_cache, self.v_cache, self.cache_seqlens, self.block_table


def random_paged_case(
    seqlens,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype=torch.bfloat16,
    device="cpu",
    *,
    spare_pages: int = 3,
    extra_table_columns: int = 2,
    poison: float = float("nan"),
    seed: int = 0,
) -> PagedCase:
    """Build a random paged cache for the given per-sequence lengths.

    Args:
        seqlens: list of ints, one per sequence (0 allowed).
        spare_pages: pages in the pool that no sequence uses, filled with ``poison``.
        extra_table_columns: block-table columns beyond the longest sequence, filled with -1 / garbage.
        poison: value of the unused pages (NaN by default; pass 0.0 for benchmarks if you like).
        seed: seeds the page placement (CPU) and the data, which is drawn on ``device`` (a multi-GB benchmark
            cache is drawn on the GPU, not copied from the host).
    """
    gen = torch.Generator().manual_seed(seed)
    data_gen = torch.Generator(device=device).manual_seed(seed)
    seqlens = [int(n) for n in seqlens]
    pages_per_seq = [-(-n // page_size) for n in seqlens]
    used = sum(pages_per_seq)
    num_pages = used + spare_pages
    max_pages = max(pages_per_seq, default=0) + extra_table_columns
    batch = len(seqlens)

    # physical placement: a random permutation of the pool; the last `spare_pages` ids are never referenced
    perm = torch.randperm(num_pages, generator=gen)
    table = torch.full((batch, max_pages), -1, dtype=torch.int32)
    # past each sequence: -1, or ids far outside the pool
    garbage = torch.randint(num_pages + 1000, 2**30, (batch, max_pages), generator=gen, dtype=torch.int32)
    table = torch.where(torch.rand(batch, max_pages, generator=gen) < 0.5, table, garbage)
    cursor = 0
    for b, n in enumerate(pages_per_seq):
        table[b, :n] = perm[cursor : cursor + n].to(torch.int32)
        cursor += n

    def draw(*shape):
        return torch.randn(shape, generator=data_gen, device=device, dtype=torch.float32).to(dtype)

    k_cache = draw(num_pages, page_size, num_kv_heads, head_dim)
    v_cache = draw(num_pages, page_size, num_kv_heads, head_dim)
    unused = perm[used:].to(device)
    k_cache[unused] = poison
    v_cache[unused] = poison
    return PagedCase(
        q=draw(batch, num_q_heads, head_dim),
        k_cache=k_cache,
        v_cache=v_cache,
        cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device=device),
        block_table=table.to(device),
    )


def poison_page_tails(case: PagedCase, value: float = float("nan")) -> PagedCase:
    """Fill every K and V slot past each sequence's length in its last page with ``value`` (NaN), in place, and
    return the case: the slots a masked step reads if its mask is wrong (random_paged_case fills them with data)."""
    page_size = case.k_cache.shape[1]
    for b, n in enumerate(case.cache_seqlens.tolist()):
        if n % page_size:
            page = int(case.block_table[b, n // page_size])
            case.k_cache[page, n % page_size :] = value
            case.v_cache[page, n % page_size :] = value
    return case


def token_major_v(v_cache):
    """The same V pages stored token-major, [num_pages, Hkv, D, page_size] in memory, returned as the
    [num_pages, page_size, Hkv, D] view that ``decode_attention`` and ``append_kv`` take (``api.v_token_major``)."""
    return v_cache.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
