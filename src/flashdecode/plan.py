"""plan_decode(): read a decode step's lengths once on the host, so that each layer's call skips the device's plan.

``decode_attention``'s "auto" rule reads shapes only: no host sync, and one CUDA graph serves every length. Where
the lengths decide the fast path, it pays for deciding on the device: the planner's cut (in every partial program
for small batches, or a planner launch), or a dual-path call that launches both the single pass and the planned
kernels (docs/design.md, "The `auto` rule"). A serving engine knows the lengths on the host at each step (it wrote
them) and calls attention once per layer with the same lengths, as FlashInfer's ``plan`` / ``run`` split assumes.
``plan_decode`` reads them once (one host sync) and makes the choice the device would have made:

* shapes that ``auto`` sends to one backend outright (the single pass, PyTorch on CPU) keep it;
* a dual-path call whose lengths are even and short: the single pass alone (the planned kernels would only test the
  lengths and return);
* a planned call of even lengths of at most ``SINGLE_FULL_MAX_TOKENS`` whose single pass gives the SMs one or two
  programs each, all but a few (``SINGLE_FULL_FILL``): the single pass, which has no merge to pay for;
* a planned call (or the planned side of a dual-path call without a tail gate) of even lengths, or whose cut gives
  every non-empty sequence the same number of chunks: fixed splits, ``num_splits=k`` with k the most chunks the cut
  gives a sequence (for a uniform batch the same cut; each sequence's tiles dealt evenly to its k splits, without
  the cut computed in place or a planner launch), halved while PREFETCH_TILE's chunks are shorter than
  ``triton_splitk.FIXED_MIN_SPLIT_TILES`` tiles and every SM keeps a program; k = 1: the single pass. With few
  splits and many (sequence, row) pairs, or few splits of the MHA tile (``triton_splitk.merge_fixed_in_partial``),
  the plan also holds zeroed counters, and the last split program of each sequence and head merges the splits (no
  combine launch). An fp8 cache's splits take the single pass's 128-token tile (``FP8_LONG_MIN_TOKENS``), and long
  MHA rows' fixed splits a deeper MHA tile (``MHA_LONG_MIN_TOKENS``; at head dim 128 the 32-token prefetching tile,
  ``MHA_PREFETCH_MIN_TOKENS``): ``DecodePlan.long_tile``;
* an uneven batch without a window (HOST_TABLE): the split-K kernels with a cut made here (``host_cut``): each
  sequence in chunks of equal length, the chunk length chosen for the fewest estimated µs, chunks dispatched longest
  first; the table rides in the plan (no planner launch), and with few chunks a sequence the last chunk program merges
  (plan-owned counters);
* anything else (the tail split, windows): ``auto``'s own device-planned call.

Every choice is correct for any lengths (the single pass and fixed splits read the lengths on the device too), so
a plan used after the lengths changed, or replayed in a CUDA graph captured with it, still gives the right output,
only perhaps more slowly. Make a new plan when the lengths change much (each step, or every few steps). A plan with
counters is device state, like FlashInfer's workspace: its calls must run one after another (one stream, as the
layers of a step do), and a CUDA graph captured with it needs the plan kept alive while it replays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DecodePlan", "plan_decode"]

# an even planned batch runs the single pass when that gives the SMs 1 or 2 programs each, on at least this share of
# them, and its mean visible length is at most this many tokens: the split's merge then costs more than the idle SMs
# save. Measured for the grouped prefetching tile only (groups 4-16, head dim 128, 16-bit cache, one query token).
# H200 (docs/benchmarks/h200-2026-11-24/sweeps/single-full-bd06e2a, the plan's fixed splits -> the single pass, graph
# µs): 128 programs (0.97 a SM) 64 x 512 12/2 13.9 -> 12.5, 64 x 1024 12/2 22.5 -> 21.9, 32 x 1024 28/4 23.0 -> 21.8,
# 16 x 1024 32/8 22.0 -> 21.4; 256 programs 128 x 512 12/2 22.2 -> 20.9, 64 x 1024 28/4 37.7 -> 37.2, 32 x 1024 32/8
# 36.9 -> 36.7. The splits win at 2048 tokens (64 x 2048 12/2 38.2 against 39.7, 32 x 2048 32/8 66.9 against 68.4) and
# at 0.73 programs a SM (96 x 1024 12/2 29.3 against 34.3)
SINGLE_FULL_FILL = 0.95
SINGLE_FULL_MAX_TOKENS = 1024
# an fp8 cache's split-K calls take the single pass's 128-token tile (triton_common.FP8_LONG_TILE, 2 programs per
# SM, planner target 2) instead of FP8_SPLIT_TILE (64 tokens under a 128-register cap, 4 per SM) when that tile's cut
# gives chunks of at least this many tokens. H200, scripts/fp8_plan_probe.py (e4m3, graph µs, the plan without it ->
# with it): at 26cef0b, 1 x 131072 32/8 98.9 -> 82.8 (4096-token chunks), 8 x 8192 32/8 55.7 -> 44.8, 4 x 16384
# 12/2 20.6 -> 17.0, 16 x 4096 12/2 22.8 -> 18.9 (512), 64 x 1024 12/2 17.1 -> 15.5; at e088ba3 (`short`) the
# 128-token chunks too: 8 x 2048 28/4 16.1 -> 13.2, 32 x 1024 12/2 16.4 -> 10.7, 8 x 1024 28/4 13.4 -> 10.3,
# 1 x 2048 28/4 5.7 -> 5.6; no row slower. So every fp8 plan takes it (0). `auto`'s planned calls keep
# FP8_SPLIT_TILE: there the tile lost on short rows (docs/design.md). None: never
FP8_LONG_MIN_TOKENS = 0
# fixed splits of the "mha" tile class (groups < 4 whose token row is not a power of two, 16-bit cache, head dim <=
# 128) take triton_splitk.MHA_LONG_TILE (one more stage) when their chunks have at least this many tokens and the grid
# fills its last wave of 3 programs per SM to at least MHA_LONG_MIN_FILL. H200 (graph µs, docs/benchmarks/
# h200-2026-11-24/sweeps/mha-long-tile-21ed679): scripts/fused_fixed_probe.py --tile 128,3 at b3326e4, 384 programs
# (0.97 a wave) of 4096-token chunks and longer: 1 x 131072 12/12 186.0 -> 183.9, 4 x 65536 12/12 366.6 -> 360.0,
# 1 x 262144 6/6 187.3 -> 186.4, 16 x 8192 12/12 185.4 -> 183.0; 2048-token chunks tie (1 x 65536 12/12 95.9,
# 1 x 131072 6/6 97.7 -> 97.8); 320 programs (0.81) lose, 1 x 131072 20/20 311.6 -> 318.1, and 288 (0.73),
# 3 x 65536 12/12 283.9 -> 290.7. The rule through the plan (scripts/mha_plan_probe.py at 21ed679, another machine):
# the 10 rows it takes 0.3-1.1% faster (2 x 131072 12/12 372.6 -> 368.4), the 10 it leaves alone within 0.2%.
# None: never
MHA_LONG_MIN_TOKENS = 4096
MHA_LONG_MIN_FILL = 0.9
# ...and where that class's long tile is triton_splitk.MHA_PREFETCH_TILE (one query row a KV head, head dim 128) from
# chunks of this many tokens, on the same grids. H200 (scripts/mha_plan_probe.py --tile 32,3,p --min-tokens 1024 at
# ecf4311): 1024-token chunks 1 x 32768 12/12 50.9 -> 49.6 µs, 2 x 16384 12/12 51.8 -> 49.9; 2048: 16 x 4096 12/12
# 95.2 -> 92.6, 8 x 8192 12/12 95.2 -> 92.9, 1 x 131072 6/6 96.9 -> 94.3; shorter chunks were not measured. None: never
MHA_PREFETCH_MIN_TOKENS = 1024
# fixed splits of the grouped prefetching tile (groups of 4-16, head dim 128, 16-bit cache, one query token) instead
# take triton_splitk.GROUPED_LONG_TILE (128 tokens, 3 stages, one program per SM), in S = #SMs // (B * Hkv * head
# blocks) splits, when S is 2..FIXED_MERGE_MAX_SPLITS with the merge in the last split program
# (merge_fixed_in_partial), the grid fills at least GROUPED_LONG_MIN_FILL of the SMs and each split has at least this
# many tokens. H200 (scripts/fused_fixed_probe.py --tile 128,3 at 3d020a5, graph µs, the plan's fixed splits of the
# 32-token tile -> 4 of these, 128 programs): 16 x 4096 12/2 22.4 (S 8, combine launch) -> 21.5, 8 x 2048 28/4 13.6
# (S 8) -> 12.8. With more splits and the combine launch it did not pay: 4 x 16384 12/2 21.8 (S 32) against 22.1 (S 16),
# 1 x 65536 12/2 22.4 against 23.0, 1 x 2048 28/4 5.6 against 5.9 (1 x 131072 12/2 39.1 against 37.8). None: never
GROUPED_LONG_MIN_TOKENS = 512
GROUPED_LONG_MIN_FILL = 0.9
# ...and fixed splits of that tile merged by the combine launch: half as many splits (about 2 programs per SM instead of
# the cut's 4) of triton_splitk.GROUPED_MID_TILE (64 tokens, 3 stages, two programs per SM), where the halved grid
# still fills at least this share of the SMs and its splits hold GROUPED_MID_MIN_TILES of its tiles. H200
# (scripts/fused_fixed_probe.py --tile 64,3 at 7c4a88f, graph µs, the plan's S of the 32-token tile -> S / 2 of these):
# 4 x 16384 12/2 23.2 -> 21.8, 1 x 65536 12/2 22.9 -> 22.3, 1 x 131072 12/2 38.6 -> 38.2, 2 x 4096 12/2 8.1 -> 7.2,
# 8 x 4096 12/2 13.7 -> 13.6, 2 x 2048 28/4 7.2 -> 7.3. Splits of one tile went both ways (1 x 2048 28/4 6.3 -> 5.8,
# 1 x 4096 12/2 6.1 -> 6.7: 128 programs each), hence two. None: never
GROUPED_MID_MIN_FILL = 0.9
GROUPED_MID_MIN_TILES = 2
# an uneven batch (no window) is cut on the host (triton_splitk.host_cut: equal chunks a sequence, any multiple of a
# tile, dispatched longest first) and its table uploaded with the plan, instead of the device planner's cut (chunks
# of a power of two tiles, made equal a sequence and ordered longest first on the device since ef2f631, with a
# planner launch) or, where the shapes pick the single pass, a single pass in sequence order. False: off
HOST_TABLE = True
# an fp8 cache's even batch that the plan splits takes fixed splits of the Gluon pass (gluon_single, splits > 1:
# 64-token steps, V by v_perm, partials merged by triton_splitk's combine), S the power of two at or below
# GLUON_SPLIT_PROGRAMS_PER_SM programs a SM, each split at least GLUON_SPLIT_MIN_TOKENS tokens, for batches of at most
# GLUON_SPLIT_MAX_PAIRS (sequence, KV head) pairs whose grid still has 2 programs a SM (the measured grids had
# 3.9-7.8). H200, e4m3, graph µs, the plan (tl fp8 tile's splits) -> Gluon splits (h200-2026-11-30/gsplit-6b09e9b,
# the kernel called directly; the plan's routing not yet run on a GPU): 1 x 131072 32/8 81.39 -> 67.67 (S 64; bf16
# 124.49, so 1.84x), 1 x 65536 12/2 17.66 -> 14.59 (S 256, 256-token splits), 4 x 16384 12/2 16.62 -> 14.06 (S 64),
# 8 x 8192 32/8 43.88 -> 41.34 (S 16; the rule gives 8, not measured). Fewer programs lose: S 16 on 1 x 131072
# 109.63, on 1 x 65536 54.01. False: off
GLUON_FP8_SPLITS = True
# ...and an fp8 cache's even batch that the shapes would split but whose single pass the Gluon kernel takes (from
# gluon_single.GLUON_FP8_MIN_PER_SM programs a SM) runs that single pass. H200, e4m3, graph µs, 1.45 programs a SM,
# the plan (tl splits) / the tl single pass / the Gluon single pass (h200-2026-11-30/gate-62026a7, the kernels called
# directly; this rule not yet run through the plan on a GPU): 96 x 1024 12/2 29.22 / 23.40 / 20.43, 16 x 4096 12/12
# 96.99 / 98.75 / 70.87. False: off
GLUON_FP8_SINGLE = True
GLUON_SPLIT_PROGRAMS_PER_SM = 4
GLUON_SPLIT_MIN_TOKENS = 256
GLUON_SPLIT_MAX_PAIRS = 64


@dataclass(frozen=True, eq=False)
class DecodePlan:
    """What ``plan_decode`` chose for one batch's shapes and lengths; pass it as ``decode_attention(plan=...)``.

    Attributes:
        backend: the backend the calls run ("triton", "triton_splitk", or a PyTorch one on CPU).
        num_splits: 1 (single pass), S > 1 (fixed splits), or None (planned on the device from the lengths).
        dual_path: a dual-path call (the device still decides between the single pass and the planned kernels).
        reason: why, in words.
        shapes: the call shapes the plan is for (checked by ``decode_attention``).
        counters: None, or for fixed splits merged in the last split program a zeroed int32 tensor of B * q_len * Hq
            elements on the call's device, which the calls leave at zero.
        long_tile: the split-K calls take the long-chunk tile of their tile class
            (``triton_splitk.decode_splitk(long_tile=True)``): an fp8 cache's 128-token tile (``FP8_LONG_MIN_TOKENS``),
            for long MHA rows' fixed splits the 3-stage MHA tile (``MHA_LONG_MIN_TOKENS``), for grouped ones the
            128-token tile at one program per SM (merged in the last split, ``GROUPED_LONG_MIN_TOKENS``) or the 64-token
            one at two (``GROUPED_MID_MIN_FILL``).
        table: None, or the host-made cut of an uneven batch (HOST_TABLE): int32 [4, chunks + B] on the call's
            device (``triton_splitk.host_table``'s layout), for planned-mode calls of triton_splitk.
        in_order: the single pass keeps the batch order (the plan read even lengths), instead of dispatching the
            sequences longest first after testing them on the device (``triton_single.decode_single``).
        len_hint: fixed splits without a window: the length every sequence had when planned (0: they differed), from
            which each split program finds its first page ids before it has read its sequence's length
            (``triton_splitk.decode_splitk(len_hint=...)``).
        gluon: the fixed splits run on the Gluon pass (``gluon_single.decode_single_gluon(splits=...)``: an fp8
            cache's even batches, ``GLUON_FP8_SPLITS``) where the call's tensors are ones it supports, else on
            ``triton_splitk``'s kernels.
    """

    backend: str
    num_splits: int | None
    dual_path: bool
    reason: str
    shapes: tuple
    counters: torch.Tensor | None = None
    long_tile: bool = False
    table: torch.Tensor | None = None
    in_order: bool = False
    len_hint: int = 0
    gluon: bool = False

    def __repr__(self):
        # the choice and why; the shapes tuple and the tensors (counters, table) by their size only
        extras = [f"{name}=True" for name in ("dual_path", "long_tile", "in_order", "gluon") if getattr(self, name)]
        extras += [f"len_hint={self.len_hint}"] if self.len_hint else []
        extras += [f"{name}=<{t.numel()} {str(t.dtype).replace('torch.', '')}>"
                   for name, t in (("counters", self.counters), ("table", self.table)) if isinstance(t, torch.Tensor)]
        shapes = _describe(self.shapes) if isinstance(self.shapes, tuple) else {}
        if {"batch", "num_q_heads", "num_kv_heads", "head_dim"} <= shapes.keys():
            extras.append(f"B={shapes['batch']}, heads={shapes['num_q_heads']}/{shapes['num_kv_heads']}, "
                          f"D={shapes['head_dim']}")
        return (f"DecodePlan(backend={self.backend!r}, num_splits={self.num_splits}, {', '.join(extras)}"
                f"{', ' if extras else ''}reason={self.reason!r})")

    def __post_init__(self):
        if self.long_tile and self.backend != "triton_splitk":
            raise ValueError(f"DecodePlan: long_tile is for triton_splitk calls (got {self.backend!r})")
        if self.table is not None and (self.backend, self.num_splits, self.dual_path) != ("triton_splitk", None, False):
            raise ValueError(
                "DecodePlan: a table is for planned triton_splitk calls (num_splits None, no dual path), got "
                f"{self.backend!r}, num_splits {self.num_splits}, dual_path {self.dual_path}"
            )
        ok = self.num_splits is None or (type(self.num_splits) is int and self.num_splits >= 1)
        if not ok or (self.dual_path and (self.backend, self.num_splits) != ("triton_splitk", None)):
            raise ValueError(
                f"DecodePlan: num_splits must be None or an int >= 1 (got {self.num_splits!r}), and a dual-path plan "
                f"must be triton_splitk without num_splits (got {self.backend!r}, dual_path {self.dual_path})"
            )
        if self.counters is not None:
            shapes = _describe(self.shapes)
            rows = shapes["batch"] * shapes["q_len"] * shapes["num_q_heads"]
            fits = isinstance(self.counters, torch.Tensor) and self.counters.dtype == torch.int32
            fits = fits and self.counters.numel() >= rows and self.counters.device == shapes["device"]
            merged = (self.num_splits or 0) > 1 or self.table is not None
            if not fits or self.backend != "triton_splitk" or not merged:
                raise ValueError(
                    "DecodePlan: counters must be an int32 tensor of at least B * q_len * Hq elements on the call's "
                    f"device, for fixed splits or a table of triton_splitk (got {self.backend!r}, num_splits "
                    f"{self.num_splits})"
                )
        hint_ok = type(self.len_hint) is int and self.len_hint >= 0
        if not hint_ok or (self.len_hint and (self.backend != "triton_splitk" or (self.num_splits or 0) < 2)):
            raise ValueError(
                f"DecodePlan: len_hint must be an int >= 0, and nonzero only for fixed splits of triton_splitk (got "
                f"{self.len_hint!r}, {self.backend!r}, num_splits {self.num_splits})"
            )
        if self.in_order and (self.backend, self.num_splits) != ("triton", 1):
            raise ValueError(f"DecodePlan: in_order is for the single pass (got {self.backend!r}, {self.num_splits})")
        if self.gluon and (self.backend != "triton_splitk" or (self.num_splits or 0) < 2 or self.dual_path):
            raise ValueError(f"DecodePlan: gluon is for fixed splits of triton_splitk (got {self.backend!r}, "
                             f"num_splits {self.num_splits})")  # fmt: skip

    def check(self, shapes: tuple) -> None:
        """Raise ValueError when a call's shapes differ from those the plan was made for."""
        if shapes != self.shapes:
            made, got = _describe(self.shapes), _describe(shapes)
            diff = ", ".join(f"{k} {made[k]} (call: {got[k]})" for k in made if made[k] != got[k])
            raise ValueError(f"plan was made for other shapes: {diff}; make one with plan_decode for this call")


_SHAPE_NAMES = ("batch", "q_len", "num_q_heads", "num_kv_heads", "head_dim", "dtype", "kv_dtype", "page_size",
                "max_pages", "device", "window_left")  # fmt: skip


def _describe(shapes: tuple) -> dict:
    return dict(zip(_SHAPE_NAMES, shapes))


def call_shapes(q, k_cache, block_table, window_left) -> tuple:
    """The shapes a plan is bound to, from ``decode_attention``'s views (q [B, (q_len,) Hq, D], NHD k_cache)."""
    q_len = q.shape[1] if q.dim() == 4 else 1
    return (
        q.shape[0], q_len, q.shape[-2], k_cache.shape[2], q.shape[-1], q.dtype, k_cache.dtype, k_cache.shape[1],
        block_table.shape[1], q.device, window_left,
    )  # fmt: skip


def plan_decode(q, k_cache, cache_seqlens, block_table, *, kv_layout="NHD", window_left=None) -> DecodePlan:
    """Choose the kernels for a batch from its lengths, read once on the host (one device sync).

    Args:
        q: [B, Hq, D] or [B, q_len, Hq, D], as the calls will pass it (only shapes, dtype and device are read).
        k_cache: [num_pages, page_size, Hkv, D] ("NHD") or [num_pages, Hkv, page_size, D] ("HND"), or a dense cache
            with block_table None, as ``decode_attention`` takes it.
        cache_seqlens: [B] int32, the lengths the calls will see (read here, on the host).
        block_table: [B, max_pages] int32, or None for a dense cache.
        kv_layout: "NHD" or "HND".
        window_left: the calls' sliding window (None / -1: off); the cut covers only the visible tokens.

    Returns:
        A ``DecodePlan`` for ``decode_attention(..., plan=plan)`` with these shapes (backend "auto", no
        num_splits). Any lengths give the right output with it; the lengths read here make it fast.

    Raises:
        ValueError / TypeError as ``decode_attention`` for the arguments; ValueError for a length read here that
        is negative or past the table's capacity.

    Example:
        >>> import torch, flashdecode
        >>> q = torch.randn(2, 8, 64)
        >>> k = torch.randn(10, 16, 2, 64); v = torch.randn(10, 16, 2, 64)
        >>> lens = torch.tensor([20, 7], dtype=torch.int32)
        >>> table = torch.tensor([[3, 7], [1, -1]], dtype=torch.int32)
        >>> plan = flashdecode.plan_decode(q, k, lens, table)
        >>> out = flashdecode.decode_attention(q, k, v, lens, table, plan=plan)
        >>> out.shape
        torch.Size([2, 8, 64])
    """
    from . import api

    api._validate_options("auto", None, None, kv_layout, False)
    dense = block_table is None
    k_view, _, block_table = api._as_paged(q, k_cache, k_cache, block_table, kv_layout)
    api._validate(q, k_view, k_view, cache_seqlens, block_table, None, kv_layout, dense)
    features = api._validate_features(q, k_view, "auto", None, None, None, window_left, None, None)
    if q.shape[0] > api.MAX_LAUNCH_BATCH:
        raise ValueError(
            f"plan_decode takes at most {api.MAX_LAUNCH_BATCH} sequences (api.MAX_LAUNCH_BATCH), got {q.shape[0]}; "
            "decode_attention without a plan runs the batch in slices"
        )
    window = features.window_left
    q_in = q[:, 0] if q.dim() == 4 and q.shape[1] == 1 else q
    shapes = call_shapes(q_in, k_view, block_table, window)
    # the lengths make the choice that the table's capacity stands in for in auto's
    name, splits = api._choose_backend("auto", None, q_in, k_view, block_table, features, capacity=False)
    # the single pass by the shapes alone: unless the lengths are uneven, which a host table balances
    table_ok = HOST_TABLE and window is None
    if name != "triton_splitk" and not (name == "triton" and table_ok):
        return DecodePlan(name, splits, False, "the shapes alone pick it", shapes)
    if q_in.shape[0] == 0:
        return DecodePlan("triton", 1, False, "an empty batch launches nothing", shapes)
    common, _, splitk = api._kernels()
    lens = [int(n) for n in cache_seqlens.tolist()]
    page_size = k_view.shape[1]
    max_tokens = block_table.shape[1] * page_size
    bad = next((b for b, n in enumerate(lens) if not 0 <= n <= max_tokens), None)
    if bad is not None:
        # a length past the table would size the plan's grid from it (2^31 - 1: 16385 chunks a sequence)
        raise ValueError(f"cache_seqlens[{bad}] = {lens[bad]} must lie in [0, {max_tokens}], the tokens "
                         f"block_table's {block_table.shape[1]} columns of {page_size} hold")  # fmt: skip
    # each sequence's visible tokens (after the window): what the device's test and cut read
    visible = [n - splitk.visible_start(n, window, features.q_len) for n in lens]
    batch, num_kv_heads = q_in.shape[0], k_view.shape[2]
    q_len, num_q_heads, head_dim = features.q_len, q_in.shape[-2], q_in.shape[-1]
    group, sms, kv_itemsize = num_q_heads // num_kv_heads, api._num_sms(q.device), k_view.element_size()
    even = common.even_lengths(visible, None, q_len)

    def single(reason):
        # an even batch's single pass skips the device's longest-first test
        return DecodePlan("triton", 1, False, reason, shapes, in_order=even)

    if splits is api.DUAL_PATH:
        tail, span = splitk.dual_path_gates(
            batch, head_dim, group, q.dtype, q_len, kv_itemsize, num_kv_heads, sms, max_tokens
        )  # fmt: skip
        if span:
            # a full grid's dual path: the host has the lengths, so the single pass, or a host table if uneven
            if not (table_ok or even):
                return DecodePlan(name, None, True, "an uneven full grid: the dual path decides on the device", shapes)
            name, splits = "triton", 1
        elif common.even_lengths(visible, None, q_len, tail[1] if tail else 0):
            # the device's test, on the host: the single pass takes an even batch (of short ones under the tail gate)
            return single("even lengths: the single pass, as the dual path would")
        elif tail is not None:
            return DecodePlan(name, None, True, "a single-pass tail: the dual path decides on the device", shapes)
    if name == "triton" and even:
        return single("the shapes alone pick it")
    if splits is None and _single_pass_fills(head_dim, group, q.dtype, q_len, kv_itemsize, batch, num_kv_heads, sms,
                                             visible):  # fmt: skip
        return single("even short lengths, a single pass that fills the SMs alike")
    if even and kv_itemsize == 1 and _gluon_fp8_single(q_in, k_view, features, batch * num_kv_heads, group, sms):
        return single("even lengths of an fp8 cache on a grid the Gluon single pass takes")
    # the cut, as decode_splitk would plan it, for fixed splits (decode_splitk(counters=...) merges them its own way)
    def cut(long_tile):
        return splitk.fixed_cut(
            visible, max_tokens, head_dim, group, q.dtype, q_len, kv_itemsize, num_kv_heads, sms, long_tile
        )  # fmt: skip

    # an fp8 cache takes its 128-token tile (2 programs per SM) and that tile's cut where the chunks are long enough
    long_cut = cut(True) if kv_itemsize == 1 and FP8_LONG_MIN_TOKENS is not None else None
    long = long_cut is not None and long_cut[2] == "fp8_long" and long_cut[1] >= FP8_LONG_MIN_TOKENS
    cfg, chunk, tile, saturation = long_cut if long else cut(False)
    counts = [-(-n // chunk) for n in visible]
    head_blocks = -(-q_len * group // cfg["BLOCK_H"])
    # an uneven batch (the longest above 1.5 times the mean) keeps its cut: fixed splits would give its long
    # sequences as many chunks as its short ones
    if name == "triton" or (len({c for c in counts if c}) > 1 and not even):
        if table_ok:
            return _table_plan(splitk, cfg, saturation, long, visible, q_in, num_kv_heads, head_blocks, sms, shapes)
        return DecodePlan(name, None, False, "uneven lengths: planned on the device", shapes, long_tile=long)
    # ...in at most as many fixed splits, fewer where its chunks are short (FIXED_MIN_SPLIT_TILES)
    k = splitk.fixed_split_count(max(counts), chunk, cfg, batch * num_kv_heads * head_blocks, sms)
    if k <= 1:
        return single("one chunk a sequence: the single pass")
    gluon_k = _gluon_splits(q_in, k_view, features, visible, num_kv_heads, sms) if kv_itemsize == 1 else 0
    if gluon_k:
        reason = f"{gluon_k} fixed splits of the Gluon fp8 pass, merged by the combine"
        return DecodePlan("triton_splitk", gluon_k, False, reason, shapes, gluon=True)
    reason = f"up to {k} chunks a sequence: {k} fixed splits" + (" of the long fp8 tile" if long else "")
    programs = batch * num_kv_heads * head_blocks * k
    mha_tile = splitk.mha_long_tile(cfg["BLOCK_D"], q_len * group) if tile == "mha" and kv_itemsize == 2 else None
    prefetch = mha_tile is splitk.MHA_PREFETCH_TILE
    if mha_tile and _mha_long(chunk, programs, saturation * sms, prefetch):
        # the same cut and grid, one more stage of loads in flight (or short tiles whose page ids load a tile ahead)
        long = True
        reason += " of the 32-token prefetching MHA tile" if prefetch else " of the 3-stage MHA tile"
    fat = _grouped_long_splits(splitk, cfg, tile, batch, q_len, num_q_heads, num_kv_heads * head_blocks, sms, visible)
    if fat:
        # fewer, longer splits, one program per SM with three 128-token tiles of loads in flight
        k, long = fat, True
        reason = f"{k} fixed splits of the 128-token tile, one program per SM"
    elif _grouped_mid(splitk, cfg, tile, k, batch, q_len, num_q_heads, num_kv_heads * head_blocks, sms, visible):
        # half as many splits, two programs per SM with 64-token tiles
        k, long = k // 2, True
        reason = f"{k} fixed splits of the 64-token tile, about two programs per SM"
    # one length for all: where each split starts is known before the kernels read it (a window's start is not)
    hint = visible[0] if window is None and len(set(visible)) == 1 else 0
    counters = None
    if splitk.merge_fixed_in_partial(batch, q_len, num_q_heads, k, sms, tile):
        # the last split program of each (sequence, KV head, head block) merges them and zeroes its counter again
        counters = torch.zeros(batch * q_len * num_q_heads, dtype=torch.int32, device=q.device)
        reason += ", merged in the last split program"
    return DecodePlan(name, k, False, reason, shapes, counters, long, len_hint=hint)


def _gluon_fp8_single(q, k_cache, features, programs, group, num_sms) -> bool:
    """Whether an fp8 cache's even batch the shapes would split runs the single pass instead, on a grid where
    ``decode_single`` takes the Gluon kernel (``gluon_single.pays``; ``GLUON_FP8_SINGLE``). K's layout stands in for V's
    (a call whose V the kernel does not take runs the tl single pass)."""
    from . import gluon_single

    if not GLUON_FP8_SINGLE or not gluon_single.pays(programs, num_sms, group, kv_fp8=True):
        return False
    return gluon_single.supports(q, k_cache, k_cache, None, None, features)


def _gluon_splits(q, k_cache, features, visible, num_kv_heads, num_sms) -> int:
    """The Gluon pass's fixed splits for an fp8 cache's batch of equal visible lengths (``GLUON_FP8_SPLITS``), or 0:
    the power of two at or below GLUON_SPLIT_PROGRAMS_PER_SM programs a SM and one split a GLUON_SPLIT_MIN_TOKENS
    tokens, for at most GLUON_SPLIT_MAX_PAIRS (sequence, KV head) pairs, and only if that is 2 programs a SM or more;
    0 too where gluon_single's switches (GLUON_MIN_PER_SM, GLUON_FP8_MIN_PER_SM) turn the kernel off for fp8.
    K's layout stands in for V's, which the plan does not see (the call checks V, ``api._run_triton_splitk``)."""
    from . import gluon_single

    pairs = len(visible) * num_kv_heads
    if not GLUON_FP8_SPLITS or len(set(visible)) != 1 or not 0 < pairs <= GLUON_SPLIT_MAX_PAIRS:
        return 0
    if not (gluon_single.GLUON_MIN_PER_SM and gluon_single.GLUON_FP8_MIN_PER_SM):
        return 0  # the Gluon kernel turned off (for every cache, or for fp8 ones)
    if not gluon_single.supports(q, k_cache, k_cache, None, None, features):
        return 0
    target = min(GLUON_SPLIT_PROGRAMS_PER_SM * num_sms // pairs, visible[0] // GLUON_SPLIT_MIN_TOKENS)
    splits = 1 << (target.bit_length() - 1) if target > 0 else 0
    return splits if splits >= 2 and splits * pairs >= 2 * num_sms else 0


def _table_plan(splitk, cfg, saturation, long, visible, q, num_kv_heads, head_blocks, num_sms, shapes) -> DecodePlan:
    """An uneven batch's plan with a host table (HOST_TABLE): ``host_cut``'s chunks for the call's tile, and
    counters for the merge in the last chunk program where (sequence, row) pairs fill the SMs and no sequence has
    more than HOST_FUSED_MAX_CHUNKS chunks."""
    batch, num_q_heads = q.shape[0], q.shape[-2]
    q_len = q.shape[1] if q.dim() == 4 else 1
    counts = splitk.host_cut(visible, num_kv_heads * head_blocks, num_sms, saturation, cfg["BLOCK_N"])
    table = torch.tensor(splitk.host_table(visible, counts, cfg["BLOCK_N"]), dtype=torch.int32).to(q.device)
    reason = f"uneven lengths: cut on the host, {len(visible)} sequences in {sum(counts)} chunks, longest first"
    counters = None
    merge = splitk.FUSED_COMBINE and 1 < max(counts) <= splitk.HOST_FUSED_MAX_CHUNKS
    if merge and batch * q_len * num_q_heads >= num_sms:
        counters = torch.zeros(batch * q_len * num_q_heads, dtype=torch.int32, device=q.device)
        reason += ", merged in the last chunk program"
    return DecodePlan("triton_splitk", None, False, reason, shapes, counters, long, table)


def _grouped_prefetch(splitk, cfg, tile) -> bool:
    """Whether a fixed-split cut is of the grouped prefetching tile (PREFETCH_TILE), which GROUPED_LONG_TILE and
    GROUPED_MID_TILE replace (off with triton_splitk.GROUPED_LONG_TILE None)."""
    from .triton_common import uses_prefetch_tile

    return bool(splitk.GROUPED_LONG_TILE) and tile == "grouped" and uses_prefetch_tile(cfg)


def _grouped_long_splits(splitk, cfg, tile, batch, q_len, num_q_heads, per_sequence, num_sms, visible) -> int:
    """The split count of fixed splits of GROUPED_LONG_TILE (one program per SM) for an even batch of the grouped
    prefetching tile, or 0 where they do not apply (GROUPED_LONG_MIN_TOKENS). per_sequence: Hkv * head blocks."""
    if GROUPED_LONG_MIN_TOKENS is None or not _grouped_prefetch(splitk, cfg, tile):
        return 0
    splits = num_sms // (batch * per_sequence)
    if splits < 2 or splits * batch * per_sequence < GROUPED_LONG_MIN_FILL * num_sms:
        return 0
    if min(visible) < GROUPED_LONG_MIN_TOKENS * splits:
        return 0
    return splits if splitk.merge_fixed_in_partial(batch, q_len, num_q_heads, splits, num_sms) else 0


def _grouped_mid(splitk, cfg, tile, splits, batch, q_len, num_q_heads, per_sequence, num_sms, visible) -> bool:
    """Whether fixed splits of the grouped prefetching tile take half as many splits of GROUPED_MID_TILE: a grid that
    still fills GROUPED_MID_MIN_FILL of the SMs, splits of at least GROUPED_MID_MIN_TILES of its tiles, and a combine
    launch to merge them (no merge in the last split program)."""
    if GROUPED_MID_MIN_FILL is None or not _grouped_prefetch(splitk, cfg, tile):
        return False
    half = splits // 2
    if half < 2 or half * batch * per_sequence < GROUPED_MID_MIN_FILL * num_sms:
        return False
    if min(visible) < GROUPED_MID_MIN_TILES * splitk.GROUPED_MID_TILE["BLOCK_N"] * half:
        return False
    return not splitk.merge_fixed_in_partial(batch, q_len, num_q_heads, half, num_sms)


def _mha_long(chunk: int, programs: int, wave: int, prefetch: bool = False) -> bool:
    """Whether fixed splits of the MHA tile take its long tile (``triton_splitk.mha_long_tile``): chunks of at least
    MHA_LONG_MIN_TOKENS tokens (MHA_PREFETCH_MIN_TOKENS where that tile is MHA_PREFETCH_TILE: prefetch) and a grid
    of `programs` whose last wave (of `wave` resident programs) is at least MHA_LONG_MIN_FILL full."""
    min_tokens = MHA_PREFETCH_MIN_TOKENS if prefetch else MHA_LONG_MIN_TOKENS
    if min_tokens is None or chunk < min_tokens:
        return False
    waves = -(-programs // wave)
    return programs >= MHA_LONG_MIN_FILL * waves * wave


def _single_pass_fills(head_dim, group, dtype, q_len, kv_itemsize, batch, num_kv_heads, num_sms, visible) -> bool:
    """Whether an even batch of these visible lengths runs the single pass rather than splits (SINGLE_FULL_*): the
    single pass's tile is the grouped prefetching one, its P programs give every SM at most 2, P / (ceil(P / #SMs)
    * #SMs) >= SINGLE_FULL_FILL, and the mean visible length is at most SINGLE_FULL_MAX_TOKENS."""
    from .triton_common import even_lengths, launch_config, uses_prefetch_tile

    cfg = launch_config(head_dim, group, dtype, q_len, kv_itemsize, single=True)
    if not uses_prefetch_tile(cfg) or not visible:
        return False
    programs = batch * num_kv_heads * -(-q_len * group // cfg["BLOCK_H"])
    per_sm = -(-programs // num_sms)
    if per_sm > 2 or programs < SINGLE_FULL_FILL * per_sm * num_sms:
        return False
    return sum(visible) <= SINGLE_FULL_MAX_TOKENS * len(visible) and even_lengths(visible, None, q_len)
