"""The softmax's row sums kept per token and reduced once after the walk (``triton_common.DEFER_ROW_SUM``,
``defer_row_sum``): the 16-bit page-prefetch tiles of 32 and 128 tokens take it, the others keep a row sum per
tile. Both must give the reference's output and LSE on ragged lengths (0, 1, page - 1, page, page + 1, several
tiles), shuffled pages and NaN spare pages; under the interpreter the two forms are also compared with each other.
"""

import pytest
import torch
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, reference_of

from flashdecode import triton_common
from flashdecode.triton_common import (
    FP8_LONG_TILE,
    PREFETCH_ONE_WAVE_TILE,
    PREFETCH_ONE_WAVE_TILE_64,
    PREFETCH_TILE,
    defer_row_sum,
    interpreting,
    launch_config,
)
from flashdecode.triton_single import decode_single
from flashdecode.triton_splitk import decode_splitk

LENS = [0, 1, 15, 16, 17, 300]


def _deferred(cfg, kv_fp8=0):
    return defer_row_sum(True, cfg["BLOCK_N"], cfg["PREFETCH_PAGES"], kv_fp8)


def test_which_tiles_defer():
    grouped = launch_config(128, 4, torch.bfloat16)
    assert _deferred(PREFETCH_TILE) and _deferred(PREFETCH_ONE_WAVE_TILE)
    # 64 tokens (more registers than a program per SM allows there), no page prefetch (the MHA tile), fp8 tiles
    assert not _deferred(PREFETCH_ONE_WAVE_TILE_64)
    assert not _deferred(launch_config(128, 1, torch.bfloat16))
    assert not _deferred(FP8_LONG_TILE, kv_fp8=2)
    assert not defer_row_sum(False, 32, True, 0)
    assert grouped["BLOCK_N"] == 32 and _deferred(grouped)


def _run(c, tile, splits):
    cfg = dict(launch_config(128, 4, c.q.dtype), **tile)
    out = torch.full_like(c.q, float("nan"))
    lse = torch.full(c.q.shape[:-1], float("nan"), device=c.q.device)
    scale = c.q.shape[-1] ** -0.5
    if splits == 1:
        decode_single(*c.args, scale, out, lse, config=cfg)
    else:
        decode_splitk(*c.args, scale, out, lse, num_splits=splits, config=cfg)
    return out, lse


@pytest.mark.parametrize("splits", [1, 3], ids=["single", "S3"])
@pytest.mark.parametrize("tile", ["t32", "t128"])
def test_deferred_row_sums_match_reference(tile, splits, device, monkeypatch):
    c = case(LENS, 8, 2, 128, 16, torch.bfloat16, device, seed=3)
    tile = PREFETCH_TILE if tile == "t32" else PREFETCH_ONE_WAVE_TILE
    ref_out, ref_lse = reference_of(c)
    out, lse = _run(c, tile, splits)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, c.q.dtype)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)
    if interpreting():
        # the interpreter reads the switch at run time: the per-tile sums give the same result to fp32 rounding
        monkeypatch.setattr(triton_common, "DEFER_ROW_SUM", triton_common.tl.constexpr(False))
        out0, lse0 = _run(c, tile, splits)
        assert max_err(out, out0) <= 1e-2 and lse_err(lse, lse0) <= 1e-5
