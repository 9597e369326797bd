"""decode_attention(): validate once, pick a backend, dispatch.

The "auto" rule (docs/design.md): on CPU tensors without TRITON_INTERPRET=1, or at a head dim above
TRITON_MAX_HEAD_DIM, ``torch_sdpa`` (``torch_naive`` for the model features and determinism). Otherwise the Triton
kernels: a forced ``num_splits`` picks single-pass (1) or fixed splits (> 1). Otherwise single-pass when the
sequences can hold at most SINGLE_PASS_MAX_TOKENS tokens. From 2 single-pass programs per SM (B * Hkv) on, with PDL,
a dual-path call: the single pass and the planned kernels are both launched and the lengths pick one on the device
(``triton_common.even_batch``). Below the planner's target (``triton_splitk.planner_target``) the single pass takes
even batches; in a full grid whose single pass would end on a nearly empty wave (``triton_splitk.single_pass_tail``),
only even batches of short sequences; in any other full grid with a table of at least FULL_GRID_DUAL_MIN_TOKENS
tokens, every batch whose longest sequence fits a wave's share of the work (``triton_splitk.full_grid_span``). Other
full grids (and any without PDL) run the single pass; everything else runs ``triton_splitk`` planned on the device
from the lengths. A single pass of more programs than SMs dispatches an uneven batch's sequences longest first
(``triton_common.longest_first``). The choice reads shapes only: no host sync. A ``plan`` from ``plan.plan_decode``
replaces it with the choice made from lengths read on the host (fixed splits, the single pass; plan.py).
"""

from __future__ import annotations

import functools
import math

import torch

from . import launcher, reference, torch_baselines, validation
from .plan import DecodePlan, call_shapes

__all__ = ["decode_attention", "BACKENDS"]

# sequences that can hold at most this many tokens (table width x page size) run single-pass: a split would add a
# combine launch to a call that takes a few microseconds (measured: docs/design.md)
SINGLE_PASS_MAX_TOKENS = 256
# batches that would plan in place (triton_splitk.plans_in_place: at most INLINE_PLAN_MAX_BATCH sequences, without the
# fused merge) in tables of at most this many tokens run the fixed splits a plan would give full-table lengths
# (``triton_splitk.capacity_splits``) instead of computing the cut in every program; a sequence shorter than the table
# gets shorter splits. H200 (scripts/variant_probe.py capacity / capacity4k, `auto` graph µs, in place -> capacity): 8
# x 256 28/4 8.7 -> 6.5, 8 x 2048 28/4 16.6 -> 15.1, 16 x 2048 12/2 16.6 -> 14.6, 8 x 256 28/4 in a 2048-token table
# 8.7 -> 7.2; 1.14x over 20 rows in tables of up to 2080 tokens. A batch of one long and short sequences loses, more
# in wider tables: 8 x 64..2048 28/4 9.4 -> 10.9, 8 x 100..4000 28/4 in 4096 tokens 11.0 -> 14.8 (so not 4096). Calls
# whose planned path merges in the last chunk program keep it (24 x 2048 32/8 57.8 -> 70.2 with the capacity's
# splits). 0: off (docs/design.md)
CAPACITY_SPLITS_MAX_TOKENS = 2560
BACKENDS = ("auto", "reference", "torch_naive", "torch_sdpa", "triton", "triton_splitk", "triton_tma")
# the backends that synchronise on the lengths for their own host loops: every call checks the values' bounds there
# too (``validation.check_bounds``, a copy of the lengths and the table), as on CPU tensors
HOST_READ_BACKENDS = ("reference", "torch_naive")
# a batch of more sequences runs as one call per slice of this many on the Triton backends: a CUDA grid's dims 1 and
# 2 stop at 65535, and the kernels put the sequences (the single pass, the combine) or the planned chunk slots (B plus
# up to TAIL_EXTRA_PROGRAMS_PER_SM * SMs / Hkv) on dim 1
MAX_LAUNCH_BATCH = 32768
# the largest head dim the Triton kernels' tiles are sized for (``triton_common.launch_config``) and tested at
TRITON_MAX_HEAD_DIM = 256
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# num_splits value that asks triton_splitk for the deterministic cut (a sentinel, never a user value)
DETERMINISTIC = object()
# ...and for a dual-path planned call: the single pass first, writing only if the lengths are even
DUAL_PATH = object()
# "auto" takes the dual path when B * Hkv gives every SM at least this many single-pass programs (and fewer than the
# planner's target, above which it runs the single pass outright): docs/design.md, "The `auto` rule"
DUAL_PATH_MIN_PROGRAMS_PER_SM = 2
# ...and a full grid (at least the target) too, with the test over a wave's sequences (triton_splitk.full_grid_span):
# the planned kernels take a batch whose longest sequence outlasts a wave slot's share of the work. H200
# (scripts/order_probe.py at 00e8721, graph µs, single pass longest first -> dual path): 120 x 256..2048 + 8 x
# 16k..32k 32/8 878.3 -> 394.2 (FlashInfer TC 544.7), 127 x 1024 + 131072 32/8 3396.0 -> 272.3 (1776.2), 120 x 2048
# + 8 x 12288 32/8 460.8 -> 353.5; batches that fit pay the idle planned launches (scripts/full_grid_probe.py:
# 256 x 256 12/12 94.1 -> 96.5, 0.7 of it the lost PDL chaining; 512 x 500..3000 32/8 809.9 -> 816.6). False: the
# single pass outright (docs/design.md, "The `auto` rule")
FULL_GRID_DUAL_PATH = True
# ...for tables of at least this many tokens: a straggler of T tokens costs a single pass at most about T / 40 µs
# (one program at ~20 GB/s: 131072 tokens took 3396 µs above), so shorter tables keep the plain single pass and its
# 1.7-2.4 µs (256 x 256 12/12)
FULL_GRID_DUAL_MIN_TOKENS = 1024
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# multi-token queries (speculative verification): at most this many new tokens per sequence
MAX_Q_LEN = 8
# the backends that implement the model features (softcap, ALiBi, sinks, window, q_len > 1, fp8 KV)
FEATURE_BACKENDS = ("auto", "reference", "torch_naive", "triton", "triton_splitk")


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
    kv_layout="NHD",
    deterministic=False,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
    window_left=None,
    k_scale=None,
    v_scale=None,
    validate=False,
    allow_shared_pages=False,
    plan=None,
):
    """Attention of one new query token (or q_len of them) per sequence over a paged KV cache.

    For each sequence b and query head h: out[b, h] = softmax(q[b, h] · K_bᵀ · scale) · V_b, where K_b, V_b are the
    first cache_seqlens[b] tokens of the sequence; token t lives in page block_table[b, t // page_size] at row
    t % page_size. Query head h reads KV head h // (Hq / Hkv) (MHA, GQA and MQA).

    Args:
        q: [B, Hq, D] or [B, q_len, Hq, D] (q_len 1..8), float16, bfloat16 or float32; any strides with a
            contiguous last dim. With q_len > 1 (speculative verification) the cache already holds the q_len new
            tokens as its last ones: token i sees cache positions < L - q_len + i + 1 (causal among the new
            tokens); a token that sees no position (L < q_len) gets out = 0, lse = -inf.
        k_cache, v_cache: [num_pages, page_size, Hkv, D] (kv_layout "NHD") or [num_pages, Hkv, page_size, D]
            ("HND"), q's dtype, or both float8_e4m3fn / float8_e5m2 with q in fp16 / bf16 (dequantised in the
            kernel with k_scale, v_scale); Hq must be a multiple of Hkv. Any strides with a contiguous last dim: k
            and v may be views of one buffer. With block_table=None, a dense cache [B, max_len, Hkv, D] ("HND":
            [B, Hkv, max_len, D]): sequence b's tokens are rows 0 .. cache_seqlens[b] - 1 of k_cache[b]. v_cache
            may instead have token-major pages, the view of a [num_pages, Hkv, D, page_size] tensor (faster for fp8
            caches with groups < 4; not triton_tma: docs/features.md, "Token-major V pages").
        cache_seqlens: [B] int32, valid tokens per sequence (0 allowed).
        block_table: [B, max_pages] int32 page ids, or None for a dense cache. Entries at index
            >= ceil(cache_seqlens[b] / page_size) are never read, so they may be -1 or garbage.
        softmax_scale: a finite float; defaults to 1 / sqrt(D).
        backend: one of ``flashdecode.BACKENDS``: "auto", "reference" (float64 on CPU), "torch_naive",
            "torch_sdpa", "triton" (single pass), "triton_splitk" (flash-decoding), "triton_tma" (flash-decoding with
            TMA page loads; compute capability >= 9.0, page_size a power of two in [16, 256]).
        num_splits: None picks automatically; an int >= 1 forces the number of splits per sequence (1 = none).
            Forcing more than 1 needs backend "auto", "triton_splitk" or "triton_tma"; the PyTorch backends ignore it.
        out: optional buffer with q's shape, dtype and device to write into. It may be q itself (same storage,
            shape and strides: every program reads its q rows before it writes the same out rows), but it must
            not otherwise share memory with an input.
        return_lse: bool, also return the natural-log LSE, float32 with q's shape without D ([B, Hq] or
            [B, q_len, Hq]); -inf for an empty sequence (FlashInfer's wrappers return base 2 by default).
        kv_layout: "NHD" (token-major pages, the default) or "HND" (head-major pages); read through strides, no copy.
        deterministic: each sequence's output is bit-identical whatever else is in the batch: split boundaries
            fall every ``triton_splitk.DETERMINISTIC_SPLIT_TOKENS`` tokens of the sequence's own length and the
            combine sums in a fixed order (docs/design.md). Not with ``num_splits`` or backend "torch_sdpa" or
            "triton_tma" (ValueError: their splits or fused kernels depend on the batch).
        softcap: float > 0, or None / 0 for off: logits (q · k · scale) become softcap · tanh(logits / softcap).
        alibi_slopes: [Hq] float32: logit += slope_h · (key position - query position), after the softcap.
        sinks: [Hq] float32 sink logits (natural scale) that join each softmax denominator once (not the
            numerator); the returned lse includes them, an empty row gives out = 0 and lse = sink_h.
        window_left: int W >= 0, or None / -1 for off: the query at position p sees positions p - W .. p (W + 1
            tokens, FlashAttention's / FlashInfer's window_left; a Hugging Face ``sliding_window`` of N tokens is
            W = N - 1); pages wholly before the window are not read.
        k_scale, v_scale: per-tensor dequantisation scales of an fp8 cache (k = k_scale · k_fp8): Python floats
            or 0-d / 1-element float32 tensors on q's device (so a CUDA graph replays with new values); default 1.
            The features need backend "auto", "reference", "torch_naive", "triton" or "triton_splitk"
            (docs/features.md).
        validate: also check the values of cache_seqlens and block_table (one host sync; ``validation.py``):
            lengths in [0, max_pages * page_size], the page ids they read in [0, num_pages), no page read twice.
            The environment variable FLASHDECODE_DEBUG=1 turns it on for every call. On CPU tensors, and with
            backend "reference" or "torch_naive" (whose loops run on the host), the first two checks run on every
            call (from the window's first page with window_left).
        allow_shared_pages: with validation on, accept pages read by several sequences (prefix caching).
        plan: a ``DecodePlan`` from ``flashdecode.plan_decode`` for these shapes (backend "auto", no num_splits,
            not deterministic): the kernels chosen from the lengths read once on the host, e.g. once per decode
            step for all layers. Correct for any lengths; fast for those it was made from. At most
            ``MAX_LAUNCH_BATCH`` sequences: past that (a CUDA grid's limit) the Triton backends run the batch in
            slices of that many, one call each, and refuse a plan.

    Returns:
        out with q's shape and dtype, or (out, lse) when return_lse. A sequence with 0 tokens gives out = 0 and
        lse = -inf (sink_h with sinks), never NaN.

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
    # Triton launches on the current device: a call on another GPU's tensors (a model split over GPUs in one process
    # keeps cuda:0 current) runs with q's current. The index is also the cached launcher's key (read once: 0.5 us)
    current = torch.cuda.current_device() if isinstance(q, torch.Tensor) and q.is_cuda else None
    if current is not None and q.get_device() != current:
        with torch.cuda.device(q.device):
            return decode_attention(
                q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale=softmax_scale, backend=backend,
                num_splits=num_splits, out=out, return_lse=return_lse, kv_layout=kv_layout,
                deterministic=deterministic, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                window_left=window_left, k_scale=k_scale, v_scale=v_scale, validate=validate,
                allow_shared_pages=allow_shared_pages, plan=plan,
            )  # fmt: skip
    _validate_options(backend, num_splits, softmax_scale, kv_layout, deterministic)
    if plan is not None:
        _validate_plan(plan, backend, num_splits, deterministic)
    dense = block_table is None
    k_cache, v_cache, block_table = _as_paged(q, k_cache, v_cache, block_table, kv_layout)
    meta = _validate(q, k_cache, v_cache, cache_seqlens, block_table, out, kv_layout, dense)
    features = _validate_features(
        q, k_cache, backend, softcap, alibi_slopes, sinks, window_left, k_scale, v_scale
    )  # fmt: skip
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool, got {_type_name(validate)}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {_type_name(return_lse)}")
    if backend.startswith("triton") and q.shape[-1] > TRITON_MAX_HEAD_DIM:
        raise ValueError(
            f"backend {backend!r} takes head_dim up to {TRITON_MAX_HEAD_DIM}, got {q.shape[-1]}; backend 'auto', "
            "'torch_sdpa' or 'torch_naive' takes any"
        )
    checked = validate or validation.debug_enabled()
    window = features.window_left
    if checked:
        validation.check_values(
            cache_seqlens, block_table, k_cache.shape[0], k_cache.shape[1], allow_shared_pages=allow_shared_pages,
            dense=dense, window_left=window, q_len=features.q_len,
        )  # fmt: skip
    elif q.is_cpu or backend in HOST_READ_BACKENDS:
        # the call synchronises on the lengths anyway (CPU tensors; these backends' host loops): keep every read
        # inside the table and the pool
        validation.check_bounds(
            cache_seqlens, block_table, k_cache.shape[0], k_cache.shape[1], dense=dense, window_left=window,
            q_len=features.q_len,
        )  # fmt: skip
    q_shape = q.shape
    batch, head_dim = q_shape[0], q_shape[-1]
    out_given = out is not None
    if not out_given:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (faster than torch.empty(shape, ...))
    lse = torch.empty(q_shape[:-1], dtype=torch.float32, device=q.device) if return_lse else None
    # the features' tensors are inputs like q (new addresses each call), their other fields part of the launch key;
    # a plan's merge counters and host table are inputs too: the replay finds them by address (the key holds the plan)
    feature_fields, feature_tensors = features.launch_key_parts
    counters, table = (plan.counters, plan.table) if plan is not None else (None, None)
    inputs = (q, k_cache, v_cache, cache_seqlens, block_table, out, lse) + feature_tensors + (counters, table)
    # every address read once, for the overlap check and the cached launcher's key (None: a tensor subclass)
    ptrs = launcher.addresses(inputs)
    if out_given:
        _check_out_overlap(inputs, ptrs, meta)
    if batch > MAX_LAUNCH_BATCH and backend.startswith(("auto", "triton")) and (
        q.is_cuda or _kernels()[0].interpreting()
    ):
        if plan is not None:
            raise ValueError(
                f"a plan takes at most {MAX_LAUNCH_BATCH} sequences (api.MAX_LAUNCH_BATCH), got {batch}; call "
                "without a plan, which runs the batch in slices"
            )
        options = dict(
            softmax_scale=softmax_scale, backend=backend, num_splits=num_splits, deterministic=deterministic,
            softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, window_left=window_left, k_scale=k_scale,
            v_scale=v_scale, allow_shared_pages=allow_shared_pages,  # FLASHDECODE_DEBUG checks each slice again
        )  # fmt: skip
        # after the whole batch's checks (out's overlap too: a slice sees only its own rows of q and the metadata)
        _decode_in_slices(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, options)
        return (out, lse) if return_lse else out
    if batch > 0:
        # the cached launcher (launcher.py) replays calls whose metadata passed the checks
        key = None
        if ptrs is not None and not checked and launcher.ENABLED:
            options = (
                backend, num_splits, softmax_scale, bool(return_lse), deterministic, current, feature_fields, plan
            )  # fmt: skip
            key = (meta, options, launcher.address_key(ptrs))
            if launcher.replay(key, inputs, current, ptrs):
                return (out, lse) if return_lse else out
        # [B, 1, Hq, D] -> [B, Hq, D] views: no copy, strides kept
        one = len(q_shape) == 4 and q_shape[1] == 1
        q_in, out_in = (q[:, 0], out[:, 0]) if one else (q, out)
        lse_in = lse[:, 0] if one and lse is not None else lse
        scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
        if plan is not None:
            plan.check(call_shapes(q_in, k_cache, block_table, features.window_left))
        # a plan picks among the Triton kernels (each implements every feature); PyTorch's pick needs the features
        plan_kwargs = {}
        if plan is None or not plan.backend.startswith("triton"):
            name, splits = _choose_backend(backend, num_splits, q_in, k_cache, block_table, features, deterministic)
        else:
            name, splits = plan.backend, (DUAL_PATH if plan.dual_path else plan.num_splits)
            if counters is not None:
                plan_kwargs["counters"] = counters
            if plan.long_tile:
                plan_kwargs["long_tile"] = True
            if table is not None:
                plan_kwargs["table"] = table
            if plan.in_order:
                plan_kwargs["in_order"] = True
            if plan.len_hint:
                plan_kwargs["len_hint"] = plan.len_hint
            if plan.gluon:
                plan_kwargs["gluon"] = True
        if name.startswith("triton") and not (q.is_cuda or _kernels()[0].interpreting()):
            raise ValueError(
                f"backend {name!r} needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors), got device {q.device}"
            )
        # only the backends whose every launch and workspace goes through launcher.launch / workspace are recorded
        with launcher.recording(key if name in _REPLAYABLE else None, inputs):
            _BACKEND_FNS[name](
                q_in, k_cache, v_cache, cache_seqlens, block_table, scale, out_in, lse_in, features, splits,
                **plan_kwargs,
            )  # fmt: skip
    return (out, lse) if return_lse else out


def _decode_in_slices(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, options):
    """A batch past MAX_LAUNCH_BATCH: one call per slice of the sequences, into slices of out (and lse, if not None).
    The caches are the NHD views and block table of ``_as_paged`` (a dense cache's table of its rows), whole in every
    call; the values were checked on the whole batch, if asked, so the slices skip that."""
    for start in range(0, q.shape[0], MAX_LAUNCH_BATCH):
        rows = slice(start, start + MAX_LAUNCH_BATCH)
        got = decode_attention(
            q[rows], k_cache, v_cache, cache_seqlens[rows], block_table[rows], out=out[rows],
            return_lse=lse is not None, kv_layout="NHD", **options,
        )  # fmt: skip
        if lse is not None:
            lse[rows] = got[1]


@functools.cache
def _kernels():
    """The Triton modules, imported on first use: decorating a kernel reads TRITON_INTERPRET, so importing
    flashdecode stays free of work and a caller may still set the variable after ``import flashdecode``. Cached:
    a ``from . import`` costs ~3 us a call and a decode call asks several times."""
    from . import triton_common, triton_single, triton_splitk

    return triton_common, triton_single, triton_splitk


def _choose_backend(
    backend, num_splits, q, k_cache, block_table, features=None, deterministic=False, capacity=True
):  # fmt: skip
    """(backend name, num_splits) for this call; "auto" resolved as the module docstring says (on CPU, a call with
    model features goes to torch_naive, which implements them). num_splits DETERMINISTIC asks triton_splitk for
    splits of a fixed number of tokens. capacity: small batches in small tables take the fixed splits of full-table
    lengths (CAPACITY_SPLITS_MAX_TOKENS); ``plan_decode``, which reads the lengths, asks without."""
    if backend == "auto" and q.shape[-1] > TRITON_MAX_HEAD_DIM:
        # past the Triton kernels' tiles: the PyTorch paths (torch_naive implements the features and determinism)
        plain = not deterministic and not (features is not None and _feature_names(features))
        return ("torch_sdpa" if plain else "torch_naive"), None
    if deterministic and backend in ("auto", "triton_splitk"):
        if backend == "auto" and not (q.is_cuda or _kernels()[0].interpreting()):
            # loops over sequences, the same ops for each whatever the batch
            return "torch_naive", None
        return "triton_splitk", DETERMINISTIC
    if backend != "auto":
        return backend, num_splits
    common, single, splitk = _kernels()
    if not (q.is_cuda or common.interpreting()):
        return ("torch_naive" if features is not None and _feature_names(features) else "torch_sdpa"), None
    if num_splits is not None:
        return ("triton" if num_splits == 1 else "triton_splitk"), num_splits
    max_tokens = block_table.shape[1] * k_cache.shape[1]
    batch, num_kv_heads = q.shape[0], k_cache.shape[2]
    q_len = q.shape[1] if q.dim() == 4 else 1
    target = splitk.planner_target(
        q.shape[-1], q.shape[-2] // num_kv_heads, q.dtype, q_len, k_cache.element_size(), num_kv_heads
    )  # fmt: skip
    sms = _num_sms(q.device)
    full = batch * num_kv_heads >= target * sms
    # both paths are launched and the lengths pick one; without PDL the planned kernels could not overlap the single
    # pass
    dual = bool(DUAL_PATH_MIN_PROGRAMS_PER_SM) and (common.use_pdl(q.device) or common.interpreting())
    # a grid whose single pass would end on a nearly empty wave: dual-path, long batches planned (every tile's single
    # pass fits at least 2 programs per SM, so smaller grids skip the cached lookup, ~0.6 us of an eager call)
    tail = dual and batch * num_kv_heads > 2 * sms and splitk.single_pass_tail(
        batch, q.shape[-1], q.shape[-2] // num_kv_heads, q.dtype, q_len, k_cache.element_size(), num_kv_heads, sms,
        max_tokens,
    ) is not None  # fmt: skip
    if max_tokens <= SINGLE_PASS_MAX_TOKENS or batch > splitk.MAX_PLANNED_BATCH:
        return "triton", 1
    if full and not tail:
        # a full grid: single pass, unless its longest sequence outlasts a wave (dual path, SPAN)
        straggler = FULL_GRID_DUAL_PATH and max_tokens >= FULL_GRID_DUAL_MIN_TOKENS and batch > 1
        return ("triton_splitk", DUAL_PATH) if dual and straggler else ("triton", 1)
    # enough programs for the single pass if the lengths are even, which only the device knows
    if dual and (tail or batch * num_kv_heads >= DUAL_PATH_MIN_PROGRAMS_PER_SM * sms):
        return "triton_splitk", DUAL_PATH
    small = capacity and max_tokens <= CAPACITY_SPLITS_MAX_TOKENS
    if small and splitk.plans_in_place(batch, q_len, q.shape[-2], num_kv_heads, sms):
        # a small table bounds every length: the splits of full-table lengths
        k = splitk.capacity_splits(
            batch, max_tokens, q.shape[-1], q.shape[-2] // num_kv_heads, q.dtype, q_len, k_cache.element_size(),
            num_kv_heads, sms,
        )  # fmt: skip
        return ("triton", 1) if k == 1 else ("triton_splitk", k)
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


def _from_torch(fn, with_features=True):
    """Adapt a function returning (out, lse) to the backend signature that writes into out / lse."""

    def run(q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse, features, num_splits):
        kwargs = {}
        if with_features:
            kwargs = dict(
                softcap=features.softcap, alibi_slopes=features.alibi_slopes, sinks=features.sinks,
                window_left=features.window_left, k_scale=features.k_scale, v_scale=features.v_scale,
            )  # fmt: skip
        o, lse_o = fn(q, k_cache, v_cache, cache_seqlens, block_table, scale, **kwargs)
        out.copy_(o)
        if lse is not None:
            lse.copy_(lse_o)

    return run


def _run_triton(
    q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse, features, num_splits, in_order=False
):  # fmt: skip
    # uneven batches go longest first (decode_single), unless a plan has read even lengths
    _kernels()[1].decode_single(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse, features=features, num_sms=_num_sms(q.device),
        longest_first=not in_order,
    )  # fmt: skip


def _run_triton_splitk(
    q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse, features, num_splits, counters=None,
    long_tile=False, table=None, len_hint=0, gluon=False,
):  # fmt: skip
    splitk = _kernels()[2]
    if gluon:
        # a plan's fixed splits on the Gluon pass (plan.GLUON_FP8_SPLITS), where it computes the call
        from . import gluon_single

        if gluon_single.supports(q, k_cache, v_cache, cache_seqlens, block_table, features):
            scales = dict(k_scale=features.k_scale, v_scale=features.v_scale) if features.kv_fp8 else {}
            gluon_single.decode_single_gluon(
                q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse, splits=num_splits, **scales
            )  # fmt: skip
            return
    split_tokens = None
    dual_path = num_splits is DUAL_PATH
    if num_splits is DETERMINISTIC:
        num_splits, split_tokens = None, splitk.DETERMINISTIC_SPLIT_TOKENS
    elif dual_path:
        num_splits = None
    elif num_splits is None and q.shape[0] > splitk.MAX_PLANNED_BATCH and table is None:
        num_splits = 1
    splitk.decode_splitk(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse,
        num_splits=num_splits, split_tokens=split_tokens, num_sms=_num_sms(q.device), features=features,
        dual_path=dual_path, counters=counters, long_tile=long_tile, table=table, len_hint=len_hint,
    )  # fmt: skip


def _run_triton_tma(q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse, features, num_splits):
    from . import triton_tma

    # TMA limits (compute capability, page size, alignment) as ValueErrors before any launch
    triton_tma.check_supported(q, k_cache, v_cache)
    if num_splits is None and q.shape[0] > triton_tma.MAX_PLANNED_BATCH:
        num_splits = 1
    triton_tma.decode_tma(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, out, lse,
        num_splits=num_splits, num_sms=_num_sms(q.device),
    )  # fmt: skip


# backends whose launches launcher.py may record and replay
_REPLAYABLE = ("triton", "triton_splitk")
_BACKEND_FNS = {
    "reference": _from_torch(reference.reference_dense),
    "torch_naive": _from_torch(torch_baselines.torch_naive),
    "torch_sdpa": _from_torch(torch_baselines.torch_sdpa, with_features=False),
    "triton": _run_triton,
    "triton_splitk": _run_triton_splitk,
    "triton_tma": _run_triton_tma,
}


def _validate_options(backend, num_splits, softmax_scale, kv_layout, deterministic):
    """The non-tensor arguments: TypeError / ValueError naming the argument and the value."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int):
            raise TypeError(f"num_splits must be None or an int, got {type(num_splits).__name__}")
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        if num_splits > 1 and backend == "triton":
            raise ValueError(
                f"num_splits={num_splits} needs backend 'triton_splitk', 'triton_tma' or 'auto', got 'triton'"
            )
    if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))):
        raise TypeError(f"softmax_scale must be None or a float, got {type(softmax_scale).__name__}")
    if softmax_scale is not None and not _finite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"kv_layout must be one of {tuple(_LAYOUTS)}, got {kv_layout!r}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if deterministic and num_splits is not None:
        raise ValueError(f"deterministic=True picks its own splits; num_splits must be None, got {num_splits}")
    if deterministic and backend in ("torch_sdpa", "triton_tma"):
        why = ("its fused kernels may change with the batch" if backend == "torch_sdpa"
               else "its splits are cut on the device for the whole batch")
        raise ValueError(f"deterministic=True is not offered by backend {backend!r} ({why}); use "
                         "'auto', 'triton', 'triton_splitk', 'torch_naive' or 'reference'")


def _finite(x) -> bool:
    """math.isfinite, with an int too large for a float counted as not finite."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _type_name(x) -> str:
    """x's type for a message: "str", or "numpy.bool" where the bare name would read like the expected type."""
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _validate_plan(plan, backend, num_splits, deterministic):
    """A plan replaces the "auto" choice: TypeError / ValueError when it is not a DecodePlan or other options
    choose too."""
    if not isinstance(plan, DecodePlan):
        raise TypeError(f"plan must be None or a DecodePlan from flashdecode.plan_decode, got {type(plan).__name__}")
    if backend != "auto" or num_splits is not None or deterministic:
        raise ValueError(
            "plan chooses the kernels, so it needs backend 'auto', num_splits None and deterministic False; got "
            f"backend {backend!r}, num_splits {num_splits}, deterministic {deterministic}"
        )


# k_cache dims per layout, for messages, and where the page-size and head dims sit
_LAYOUTS = {"NHD": ("[num_pages, page_size, Hkv, D]", 1, 2), "HND": ("[num_pages, Hkv, page_size, D]", 2, 1)}


def _as_paged(q, k_cache, v_cache, block_table, kv_layout):
    """Views of the caches as NHD pages and a block table, whatever layout the caller gave: no copies.

    HND pages are the NHD pages with dims 1 and 2 swapped (the kernels take every stride). A dense cache
    (block_table None) [B, max_len, Hkv, D] is B pages of max_len tokens, sequence b in page b.
    """
    if block_table is None and isinstance(q, torch.Tensor) and q.dim() > 0:
        block_table = torch.arange(q.shape[0], dtype=torch.int32, device=q.device)[:, None]
    if kv_layout == "HND" and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (k_cache, v_cache)):
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    return k_cache, v_cache, block_table


# argument metadata that passed ``_check_meta`` -> what the per-call overlap check needs of it (``_Checked``): a
# repeated call (same types, shapes, strides, dtypes, devices, layout) skips the checks that read only these, which
# were most of an eager call's host time (docs/design.md). Bounded: cleared when full
_CHECKED_META: dict = {}
_CHECKED_META_MAX = 256
_INPUT_NAMES = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table")
# the features' tensors in decode_attention's inputs tuple (after out and lse): (position, name)
_FEATURE_INPUTS = ((7, "alibi_slopes"), (8, "sinks"), (9, "k_scale"), (10, "v_scale"))


def _validate(q, k_cache, v_cache, cache_seqlens, block_table, out, kv_layout="NHD", dense=False):
    """Raise TypeError / ValueError naming the argument, the expected and the actual value.

    Takes the caches after ``_as_paged`` (NHD views), so shapes are read in one order; messages name the
    caller's layout (``dense``: block_table was None). The metadata checks run once per distinct metadata key.
    Whether out shares memory with an input depends on addresses: the caller checks it on every call
    (``_check_out_overlap``). Returns the metadata's ``_Checked`` entry, which the cached launcher's key holds."""
    inputs = (q, k_cache, v_cache, cache_seqlens, block_table)
    key = _meta_key(inputs, out, kv_layout, dense)
    checked = _CHECKED_META.get(key) if key is not None else None
    if checked is None:
        _check_meta(q, k_cache, v_cache, cache_seqlens, block_table, out, kv_layout, dense)
        checked = _Checked(q, inputs, out)
        if key is not None:
            if len(_CHECKED_META) >= _CHECKED_META_MAX:
                _CHECKED_META.clear()
            _CHECKED_META[key] = checked
    return checked


class _Checked:
    """What ``_validate`` keeps of an argument metadata that passed its checks: each input's byte extent from its
    first element (0: empty), and out's extent and whether it has q's strides. Compared and hashed by identity, so
    the cached launcher's key (launcher.py) holds one cheaply: one instance per metadata key."""

    __slots__ = ("extents", "out_span")

    def __init__(self, q, inputs, out):
        self.extents = tuple(_extent(t) for t in inputs)
        self.out_span = (_extent(out), out.stride() == q.stride()) if out is not None else None


def _meta_key(inputs, out, kv_layout, dense):
    """Everything ``_check_meta`` reads, as a hashable key; None when an argument is not a tensor (the checks then
    run and name it). The type is part of the key so that only objects that once passed as tensors hit."""
    for t in inputs:
        if not isinstance(t, torch.Tensor):
            return None
    if out is not None and not isinstance(out, torch.Tensor):
        return None
    q, k, v, lens, table = inputs
    return (
        kv_layout, dense,
        type(q), q.shape, q.stride(), q.dtype, q.device,
        type(k), k.shape, k.stride(), k.dtype, k.device,
        type(v), v.shape, v.stride(), v.dtype, v.device,
        type(lens), lens.shape, lens.stride(), lens.dtype, lens.device,
        type(table), table.shape, table.stride(), table.dtype, table.device,
        None if out is None else (type(out), out.shape, out.stride(), out.dtype, out.device),
    )  # fmt: skip


def _extent(t: torch.Tensor) -> int:
    """Bytes from t's first element to the end of its last one; 0 for an empty tensor."""
    if t.numel() == 0:
        return 0
    return (sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1) * t.element_size()


def _may_overlap_itself(t: torch.Tensor) -> bool:
    """Whether two elements of t may share an address: some dim's stride does not step past the span of the dims
    with smaller strides (a stride-0 dim, an interleaving view). Exact for the layouts that views and expand make."""
    if t.numel() == 0:
        return False
    span = 0
    for stride, size in sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1):
        if stride <= span:
            return True
        span += (size - 1) * stride
    return False


def _check_out_overlap(inputs, ptrs, checked):
    """out may be q itself (each program reads its q rows before writing the same out rows), nothing else that
    shares memory with an input: compared by address range, so a view interleaved with q is refused too.

    inputs: (q, k_cache, v_cache, cache_seqlens, block_table, out, lse, alibi_slopes, sinks, k_scale, v_scale, ...),
    None where absent; ptrs: their addresses (None: read here); checked: the metadata's ``_Checked``
    (``_validate``), with the byte extents of q .. block_table (the features' tensors are measured here)."""
    out_extent, same_strides = checked.out_span
    if out_extent == 0:
        return
    out = inputs[5]
    if ptrs is None:
        ptrs = [None if t is None else t.data_ptr() for t in inputs]
    out0 = ptrs[5]
    same_as_q = same_strides and out0 == ptrs[0]
    for i, extent in enumerate(checked.extents):
        start = ptrs[i]
        if extent and start < out0 + out_extent and out0 < start + extent and not (i == 0 and same_as_q):
            _refuse_shared(inputs[i], out, _INPUT_NAMES[i])
    for i, name in _FEATURE_INPUTS:
        t = inputs[i]
        if t is not None and ptrs[i] < out0 + out_extent and out0 < ptrs[i] + _extent(t):
            _refuse_shared(t, out, name)


def _refuse_shared(t, out, name):
    """ValueError if t, whose address range intersects out's, lies in out's allocation (a separate one is never an
    overlap)."""
    if t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
        raise ValueError(
            f"out must not share memory with {name} (only out=q, the same view, is allowed); pass a separate buffer"
        )


def _check_meta(q, k_cache, v_cache, cache_seqlens, block_table, out, kv_layout, dense):
    """``_validate``'s checks of types, ranks, dtypes, devices, shapes and strides (no addresses)."""
    named = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, block_table=block_table)
    if out is not None:
        named["out"] = out
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")

    # ranks
    if q.dim() not in (3, 4):
        raise ValueError(f"q must be [B, Hq, D] or [B, q_len, Hq, D], got {q.dim()} dims {tuple(q.shape)}")
    if q.dim() == 4 and not 1 <= q.shape[1] <= MAX_Q_LEN:
        raise ValueError(
            f"q as [B, q_len, Hq, D] must have q_len 1..{MAX_Q_LEN}, got q_len {q.shape[1]} (shape {tuple(q.shape)})"
        )
    dims = _LAYOUTS[kv_layout][0]
    if dense:
        dims = dims.replace("num_pages", "B").replace("page_size", "max_len")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be {dims} (kv_layout {kv_layout!r}), got {t.dim()} dims {tuple(t.shape)}")
    if cache_seqlens.dim() != 1:
        raise ValueError(f"cache_seqlens must be [B], got {cache_seqlens.dim()} dims {tuple(cache_seqlens.shape)}")
    if block_table.dim() != 2:
        raise ValueError(f"block_table must be [B, max_pages], got {block_table.dim()} dims {tuple(block_table.shape)}")

    # dtypes: metadata is never cast silently
    if q.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    if k_cache.dtype in _FP8_DTYPES:
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"q must be float16 or bfloat16 with an fp8 cache ({k_cache.dtype}), got {q.dtype}")
        if v_cache.dtype != k_cache.dtype:
            raise TypeError(f"v_cache must have k_cache's fp8 dtype {k_cache.dtype}, got {v_cache.dtype}")
    caches = (("k_cache", k_cache), ("v_cache", v_cache)) if k_cache.dtype not in _FP8_DTYPES else ()
    for name, t in caches + ((("out", out),) if out is not None else ()):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    for name, t in (("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype} (convert it with .to(torch.int32))")

    # devices
    for name, t in named.items():
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")

    # shapes (k_cache is an NHD view here; report the caller's dims)
    batch, num_q_heads, head_dim = q.shape[0], q.shape[-2], q.shape[-1]
    _, page_dim, head_dim_kv = _LAYOUTS[kv_layout]
    shown = tuple(k_cache.transpose(1, 2).shape) if kv_layout == "HND" else tuple(k_cache.shape)
    if k_cache.shape != v_cache.shape:
        shown_v = tuple(v_cache.transpose(1, 2).shape) if kv_layout == "HND" else tuple(v_cache.shape)
        raise ValueError(f"v_cache must have k_cache's shape {shown}, got {shown_v}")
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache head_dim must equal q's head_dim {head_dim}, got {k_cache.shape[3]}")
    if num_q_heads == 0:
        raise ValueError(f"q must have at least one head, got shape {tuple(q.shape)} (heads in dim -2)")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        raise ValueError(f"q's {num_q_heads} heads must be a multiple of k_cache's {num_kv_heads} KV heads "
                         f"(dim {head_dim_kv} of {shown}, kv_layout {kv_layout!r})")
    if head_dim == 0 or k_cache.shape[1] == 0:
        raise ValueError(f"head_dim and page_size must be > 0, got head_dim {head_dim}, page_size {k_cache.shape[1]} "
                         f"(dim {page_dim} of {shown}, kv_layout {kv_layout!r})")
    if dense and k_cache.shape[0] != batch:
        raise ValueError(f"a dense k_cache (block_table=None) must have q's batch size {batch} in dim 0, "
                         f"got {k_cache.shape[0]}")
    for name, t in (("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if t.shape[0] != batch:
            raise ValueError(f"{name} must have q's batch size {batch} in dim 0, got {t.shape[0]}")
    if out is not None and out.shape != q.shape:
        raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    if out is not None and _may_overlap_itself(out):
        raise ValueError(f"out's strides {out.stride()} for shape {tuple(out.shape)} may give two elements one address "
                         "(a stride-0 or interleaved dim; out=q then too): pass a dense buffer")  # fmt: skip

    # the kernels vectorise along the head dim, or along a token-major V page's tokens; any other stride is honoured
    for name, t in named.items():
        if name == "v_cache":
            check_v_pages(t, tuple(t.transpose(1, 2).stride()) if kv_layout == "HND" else tuple(t.stride()))
        elif t.dim() >= 3 and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got stride {t.stride(-1)}")


def check_v_pages(v_cache, shown_strides) -> None:
    """Raise ValueError unless a [num_pages, page_size, Hkv, D] V view has a contiguous head dim or token-major
    pages (``triton_common.v_token_major``) whose page and head strides are multiples of page_size (the kernels
    read a page's tokens as aligned vectors). shown_strides: the strides in the caller's layout, for the message."""
    page_size = v_cache.shape[1]
    if v_token_major(v_cache):
        if v_cache.stride(3) != page_size or v_cache.stride(0) % page_size or v_cache.stride(2) % page_size:
            raise ValueError(
                f"a token-major v_cache (stride 1 along the tokens) must be a view of a [num_pages, Hkv, D, page_size] "
                f"tensor: head-dim stride {page_size} and page / head strides that are multiples of it, got strides "
                f"{shown_strides}"
            )
    elif v_cache.shape[-1] > 1 and v_cache.stride(-1) != 1:
        raise ValueError(
            f"v_cache must have a contiguous last dimension (stride 1) or token-major pages (stride 1 along the "
            f"tokens), got strides {shown_strides}"
        )


def v_token_major(v_cache) -> bool:
    """Whether a [num_pages, page_size, Hkv, D] V view has token-major pages: the view of a [num_pages, Hkv, D,
    page_size] tensor (its ``transpose(-1, -2)`` in the HND layout), stride 1 along the tokens and page_size along
    the head dim (``check_v_pages``). An 8-bit V reaches the tensor cores from such pages without one-byte shared
    loads (docs/features.md, "Token-major V pages")."""
    return v_cache.shape[1] > 1 and v_cache.stride(1) == 1 and v_cache.shape[3] > 1 and v_cache.stride(3) != 1


def _feature_names(f) -> list[str]:
    """The model features a call uses, by argument name."""
    names = [n for n in ("softcap", "alibi_slopes", "sinks", "window_left") if getattr(f, n) is not None]
    return names + (["q_len > 1"] if f.q_len > 1 else []) + (["an fp8 cache"] if f.kv_fp8 else [])


def _validate_features(q, k_cache, backend, softcap, alibi_slopes, sinks, window_left, k_scale, v_scale):
    """Check the model-feature arguments (TypeError / ValueError naming them) and bundle them as
    ``triton_common.Features`` (imported lazily: it lives with the kernels, whose import reads TRITON_INTERPRET)."""
    q_len = q.shape[1] if q.dim() == 4 else 1
    if softcap is None and alibi_slopes is None and sinks is None and window_left is None and k_scale is None \
            and v_scale is None:
        # the common call: no feature argument to check, one shared (frozen) Features per (q_len, fp8)
        features, used = _plain_features(q_len, k_cache.dtype in _FP8_DTYPES)
    else:
        features = _checked_features(q, k_cache, q_len, softcap, alibi_slopes, sinks, window_left, k_scale, v_scale)
        used = _feature_names(features)
    if used and backend not in FEATURE_BACKENDS:
        raise ValueError(f"backend {backend!r} does not support {', '.join(used)}; use one of {FEATURE_BACKENDS}")
    return features


@functools.lru_cache(maxsize=None)
def _plain_features(q_len: int, kv_fp8: bool):
    """(Features, the features it uses) of a call that passes no feature argument."""
    features = _kernels()[0].Features(q_len=q_len, kv_fp8=kv_fp8)
    return features, _feature_names(features)


def _checked_features(q, k_cache, q_len, softcap, alibi_slopes, sinks, window_left, k_scale, v_scale):
    """``_validate_features`` for a call that passes feature arguments: check them, bundle them as Features."""
    num_q_heads = q.shape[-2]
    fp8 = k_cache.dtype in _FP8_DTYPES
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise TypeError(f"softcap must be None or a float, got {type(softcap).__name__}")
        if not softcap >= 0 or math.isinf(softcap):
            raise ValueError(f"softcap must be > 0 (or 0 / None for off), got {softcap}")
        softcap = float(softcap) if softcap > 0 else None
    if window_left is not None:
        if isinstance(window_left, bool) or not isinstance(window_left, int):
            raise TypeError(f"window_left must be None or an int, got {type(window_left).__name__}")
        if window_left < -1:
            raise ValueError(f"window_left must be >= 0 (or -1 / None for off), got {window_left}")
        window_left = None if window_left == -1 else window_left
    for name, t in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be None or a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        if tuple(t.shape) != (num_q_heads,) or t.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous [Hq] = [{num_q_heads}], got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    scales = {}
    for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
        if x is None:
            continue
        if not fp8:
            raise ValueError(
                f"{name} applies to an fp8 cache (float8_e4m3fn / float8_e5m2), got k_cache {k_cache.dtype}"
            )
        if isinstance(x, torch.Tensor):
            if x.dtype != torch.float32 or x.numel() != 1:
                raise ValueError(
                    f"{name} must be a 0-d / 1-element float32 tensor, got {x.dtype} shape {tuple(x.shape)}"
                )
            if x.device != q.device:
                raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
        elif isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{name} must be None, a float or a float32 tensor, got {type(x).__name__}")
        scales[name] = x
    # the kernels take both scales as floats or both as device tensors: a missing one becomes 1 of the other kind
    as_tensor = any(isinstance(x, torch.Tensor) for x in scales.values())
    for name in ("k_scale", "v_scale"):
        if name not in scales:
            scales[name] = torch.ones((), dtype=torch.float32, device=q.device) if as_tensor else 1.0
        elif as_tensor and not isinstance(scales[name], torch.Tensor):
            scales[name] = torch.full((), float(scales[name]), dtype=torch.float32, device=q.device)
    return _kernels()[0].Features(
        softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, window_left=window_left, q_len=q_len,
        kv_fp8=fp8, k_scale=scales["k_scale"], v_scale=scales["v_scale"],
    )  # fmt: skip
