"""PagedKVCache: page bookkeeping on the host, tables on the device, and decode steps through it."""

import pytest
import torch
from helpers import max_err

from flashdecode import CacheFullError, PagedKVCache, append_kv, decode_attention
from flashdecode.check import output_tolerance
from flashdecode.reference import reference_dense


def _cache(device, num_pages=6, page_size=4, max_batch=3, max_seq_len=16, **kw):
    return PagedKVCache(2, 1, 8, num_pages=num_pages, page_size=page_size, max_batch=max_batch,
                        max_seq_len=max_seq_len, device=device, **kw)  # fmt: skip


def _assert_tables_match_host(cache):
    """The device tables are what the host bookkeeping says, row by row; no page is owned twice."""
    table, seqlens, active = cache.block_table.cpu(), cache.seqlens.cpu(), cache.active.cpu()
    owned = []
    for row in range(cache.max_batch):
        pages = cache.pages_of(row)
        owned += pages
        assert table[row, : len(pages)].tolist() == pages
        assert (table[row, len(pages) :] == -1).all()
        assert seqlens[row] == cache.lengths[row]
        assert bool(active[row]) == (row in cache.active_rows)
        assert len(pages) == cache.pages_needed(cache.lengths[row])
    assert len(owned) == len(set(owned))
    assert len(owned) + cache.num_free_pages == cache.num_pages


def test_allocate_grow_free_reuse(device):
    cache = _cache(device)
    a = cache.add_sequence(4)  # exactly one page
    b = cache.add_sequence(5)  # one page + 1 token
    assert (a, b, cache.num_free_pages) == (0, 1, 3)
    _assert_tables_match_host(cache)
    cache.grow()  # a starts its second page, b does not
    cache.update_step_tensors()
    assert cache.lengths[:2] == [5, 6] and cache.num_free_pages == 2
    _assert_tables_match_host(cache)
    pages_of_a = cache.pages_of(a)
    cache.free(a)
    assert cache.num_free_pages == 4 and cache.active_rows == [b]
    _assert_tables_match_host(cache)
    c = cache.add_sequence(8)  # takes a's row and a's pages back
    assert c == a and sorted(cache.pages_of(c)) == sorted(pages_of_a)
    _assert_tables_match_host(cache)


def test_exhaustion_errors_name_what_is_missing(device):
    cache = _cache(device, num_pages=3, max_batch=2)
    row = cache.add_sequence(8)
    with pytest.raises(CacheFullError, match="needs 2 more pages for 6 tokens, only 1 of 3 are free"):
        cache.add_sequence(6)
    _assert_tables_match_host(cache)  # the failed add allocated nothing
    cache.add_sequence(4)
    # both rows start a page at the next step: 2 pages needed, 0 free
    with pytest.raises(CacheFullError, match=r"needs 2 new pages \(rows \[0, 1\] start a page\), only 0 of 3"):
        cache.grow()
    assert cache.lengths[:2] == [8, 4]
    _assert_tables_match_host(cache)  # the failed step changed nothing
    with pytest.raises(CacheFullError, match="all 2 batch rows hold sequences"):
        cache.add_sequence(1)
    cache.free(row)
    with pytest.raises(CacheFullError, match="more than max_seq_len 16"):
        cache.add_sequence(17)
    with pytest.raises(ValueError, match="row 0 holds no sequence"):
        cache.free(row)


def test_step_tensors_match_host_positions(device):
    """positions / slot_mapping / seqlens after update_step_tensors, computed independently from the host pages."""
    cache = _cache(device, num_pages=8, max_batch=4)
    rows = [cache.add_sequence(n) for n in (3, 4, 1)]
    cache.free(rows[1])  # a hole in the batch: row 1 inactive
    for _ in range(6):
        before = list(cache.lengths)
        cache.grow()
        positions = cache.update_step_tensors()
        want_slots = [
            cache.pages_of(r)[before[r] // 4] * 4 + before[r] % 4 if r in cache.active_rows else -1
            for r in range(cache.max_batch)
        ]
        assert cache.slot_mapping.tolist() == want_slots
        assert positions.tolist() == before
        _assert_tables_match_host(cache)


def test_rows_added_or_freed_mid_step_are_left_alone(device):
    """A sequence added between grow() and update_step_tensors() joins at the next step, and one freed there is not
    written: the device step agrees with the host's lengths and pages (the step used to advance the new row too,
    one token past its pages). update_step_tensors() without grow() changes nothing."""
    cache = _cache(device, num_pages=8, max_batch=3)
    a = cache.add_sequence(3)
    b = cache.add_sequence(4)
    cache.grow()
    c = cache.add_sequence(4)  # a whole page: a step would need a page grow() did not allocate
    cache.free(b)
    cache.update_step_tensors()
    assert (a, b, c) == (0, 1, 2) and cache.slot_mapping.tolist() == [cache.pages_of(a)[0] * 4 + 3, -1, -1]
    _assert_tables_match_host(cache)
    seqlens = cache.seqlens.tolist()
    cache.update_step_tensors()  # no grow(): no row steps
    assert cache.seqlens.tolist() == seqlens and cache.slot_mapping.tolist() == [-1, -1, -1]
    cache.grow()
    cache.update_step_tensors()
    want = [-1] * 3
    want[a], want[c] = cache.pages_of(a)[1] * 4, cache.pages_of(c)[1] * 4
    assert cache.slot_mapping.tolist() == want
    _assert_tables_match_host(cache)


def test_add_sequence_checks_num_tokens(device):
    cache = _cache(device)
    for bad in (2.0, True, torch.tensor(3)):
        with pytest.raises(TypeError, match="num_tokens must be an int, got"):
            cache.add_sequence(bad)
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got -3"):
        cache.add_sequence(-3)
    assert cache.num_free_rows == 3 and cache.num_free_pages == 6
    row = cache.add_sequence(0)  # an empty prompt: no page until its first token
    assert cache.pages_of(row) == []
    cache.grow()
    cache.update_step_tensors()
    assert cache.lengths[row] == 1 and cache.slot_mapping.tolist()[row] == cache.pages_of(row)[0] * 4
    _assert_tables_match_host(cache)


def test_decode_through_cache_matches_reference(device):
    """Prefill two sequences and decode three steps through the cache (append_kv + decode_attention with the Triton
    kernel): every step equals float64 attention over the tokens written so far, kept independently."""
    hq, hkv, d, page_size = 4, 2, 16, 4
    cache = PagedKVCache(1, hkv, d, num_pages=6, page_size=page_size, max_batch=3, max_seq_len=12, device=device)
    gen = torch.Generator().manual_seed(0)
    history = {}  # row -> (K [L, Hkv, D], V [L, Hkv, D]) appended so far, on the CPU
    for length in (5, 3):
        row = cache.add_sequence(length)
        k, v = torch.randn(2, length, hkv, d, generator=gen)
        append_kv(k.to(device), v.to(device), cache.k_pools[0], cache.v_pools[0], cache.slots(row, 0, length))
        history[row] = (k, v)
    for _ in range(3):
        cache.grow()
        cache.update_step_tensors()
        k, v = torch.randn(2, cache.max_batch, hkv, d, generator=gen)
        append_kv(k.to(device), v.to(device), cache.k_pools[0], cache.v_pools[0], cache.slot_mapping)
        for row in history:
            history[row] = (torch.cat([history[row][0], k[row : row + 1]]), torch.cat([history[row][1], v[row : row + 1]]))
        q = torch.randn(cache.max_batch, hq, d, generator=gen)
        args = (cache.k_pools[0], cache.v_pools[0], cache.seqlens, cache.block_table)
        out = decode_attention(q.to(device), *args, backend="triton")
        # 2 x torch_naive's error over the whole batch + 1 ulp (flashdecode.check)
        ref_all = torch.cat([_reference_row(q, history, row) for row in range(cache.max_batch)])
        tolerance = output_tolerance((q.to(device),) + args, ref_all)
        for row in range(cache.max_batch):
            if row not in history:
                assert (out[row] == 0).all()  # inactive row: length 0
                continue
            ref = ref_all[row : row + 1]
            assert max_err(out[row : row + 1], ref) <= tolerance


def _reference_row(q, history, row):
    """float64 attention of q[row] over the row's history as one page: independent of the pool's layout."""
    if row not in history:
        return torch.zeros(1, *q.shape[1:], dtype=torch.float64)
    hk, hv = history[row]
    lens, table = torch.tensor([len(hk)], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32)
    return reference_dense(q[row : row + 1], hk[None], hv[None], lens, table)[0]
