"""Hypothesis strategies for decode_attention: draw a case description, then build its tensors from a seed.

A ``Spec`` is plain data (shapes, dtype, layouts, features), so a failing example prints readably and shrinks
well; ``build`` turns it into the call's arguments with seeded torch RNG on top of ``cases.random_paged_case``
(shuffled pages, NaN/Inf-poisoned spare pages, -1 and garbage table entries past each sequence).

Adding a dimension is one line in ``DIMENSIONS`` (a strategy per field) plus its use in ``build``; rules between
fields (e.g. a forced split count needs a split-capable backend) live in ``_consistent``.

The hypothesis profiles are registered here: "ci" (the default, bounded and derandomised; tests/conftest.py
loads it) and "fuzz" (``make fuzz``: thousands of random examples). ``EXAMPLES`` counts the examples each test
ran; tests/conftest.py prints the total at the end of the session.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from flashdecode import plan_decode
from flashdecode.cases import random_paged_case, token_major_v

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# an fp8 cache holds k / K_SCALE and v / V_SCALE (the drawn values are ~N(0, 1)), dequantised in the kernels
# "plan": backend "auto" with a plan_decode(...) of the call's own tensors
FUZZ_BACKENDS = ("triton", "triton_splitk", "auto", "plan", "torch_sdpa", "torch_naive")
K_SCALE, V_SCALE = 0.05, 0.3
# the model-feature fields of a Spec (None / False: off)
FEATURES = ("softcap", "window_left", "sinks", "alibi")
# lengths around the kernels' tile edges (BLOCK_N is 64 or 128: triton_common.launch_config)
TILE_EDGES = (63, 64, 65, 127, 128, 129)
# the longest drawn sequence: a few tiles, so that one example costs about a second in the Triton interpreter
MAX_LEN = 300

_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
settings.register_profile("ci", max_examples=8, derandomize=True, deadline=None, suppress_health_check=_SLOW)
settings.register_profile(
    "fuzz", max_examples=int(os.environ.get("FLASHDECODE_FUZZ_EXAMPLES", "1000")), deadline=None,
    suppress_health_check=_SLOW, print_blob=True,
)  # fmt: skip
settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=_SLOW)

# examples run per test id, summed over xdist workers by tests/conftest.py
EXAMPLES: collections.Counter = collections.Counter()


@dataclasses.dataclass(frozen=True)
class Spec:
    """One decode_attention call, as data."""

    backend: str
    seqlens: tuple[int, ...]  # B lengths, 0 allowed
    num_kv_heads: int
    group: int  # Hq / Hkv
    head_dim: int
    page_size: int
    dtype: str  # key of DTYPES: q's dtype, and the cache's unless `cache` names an fp8 one
    cache: str  # "" (q's dtype) | a key of FP8: the cache quantised, with k_scale / v_scale
    v_layout: str  # "" | "token": V pages stored token-major (cases.token_major_v), after kv_layout's view of K
    hnd: bool  # the caches passed as kv_layout="HND", [num_pages, Hkv, page_size, D]
    q_len: int  # > 1: q [B, q_len, Hq, D], the last q_len cached tokens being the new ones
    softcap: float | None
    window_left: int | None
    sinks: bool  # a sink logit per query head
    alibi: bool  # ALiBi slopes 2^(-8 (h + 1) / Hq)
    num_splits: int | None  # None: the backend decides
    softmax_scale: float | None  # None: 1 / sqrt(D)
    q_layout: str  # "contiguous" | "4d" [B, 1, Hq, D] | "packed" (slice of a wider buffer) | "heads-major" strides
    kv_layout: str  # "contiguous" | "packed" (K and V views of one buffer) | "every-other-page" (page stride x2)
    table_layout: str  # "contiguous" | "transposed" | "every-other-column"
    out: str  # "new" | "nan" (NaN-filled buffer) | "view" (rows of a wider NaN buffer) | "q" (out=q)
    poison: float  # value of the unused pages and of the rows past each sequence's end in its last page
    share_prefix: bool  # every sequence reads sequence 0's first page (prefix caching)
    validate: bool
    return_lse: bool
    seed: int

    @property
    def id(self) -> str:
        return (
            f"{self.backend}-B{len(self.seqlens)}-H{self.group * self.num_kv_heads}/{self.num_kv_heads}"
            f"-D{self.head_dim}-P{self.page_size}-{self.dtype}{'-' + self.cache if self.cache else ''}"
            f"{'-Vtoken' if self.v_layout else ''}{'-HND' if self.hnd else ''}-S{self.num_splits}"
            + "".join(f"-{k}" for k in self.features)
            + (f"-q{self.q_len}" if self.q_len > 1 else "")
        )

    @property
    def features(self) -> list[str]:
        """The model features this call uses (FEATURES that are not None / False)."""
        return [k for k in FEATURES if getattr(self, k) not in (None, False)]


# one strategy per independent field of Spec
DIMENSIONS = dict(
    num_kv_heads=st.sampled_from([1, 2, 3]),
    group=st.sampled_from([1, 2, 3, 4, 5, 7, 8]),
    head_dim=st.sampled_from([16, 32, 64, 80, 96, 128]),
    page_size=st.sampled_from([1, 2, 3, 8, 12, 16, 17, 32, 33]) | st.integers(1, 33),
    dtype=st.sampled_from(list(DTYPES)),
    cache=st.sampled_from(["", "", *FP8]),
    v_layout=st.sampled_from(["", "token"]),
    hnd=st.booleans(),
    q_len=st.sampled_from([1, 1, 2, 3]),
    softcap=st.none() | st.floats(5.0, 50.0),
    window_left=st.none() | st.integers(0, 200),
    sinks=st.booleans(),
    alibi=st.booleans(),
    num_splits=st.none() | st.integers(1, 8) | st.just(24),
    softmax_scale=st.none() | st.floats(0.01, 1.0),
    q_layout=st.sampled_from(["contiguous", "4d", "packed", "heads-major"]),
    kv_layout=st.sampled_from(["contiguous", "packed", "every-other-page"]),
    table_layout=st.sampled_from(["contiguous", "transposed", "every-other-column"]),
    out=st.sampled_from(["new", "nan", "view", "q"]),
    poison=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    share_prefix=st.booleans(),
    validate=st.booleans(),
    return_lse=st.booleans(),
    seed=st.integers(0, 2**16),
)


def _lengths(page_size: int):
    """Ragged lengths: edges of the page (0, 1, page - 1, page, page + 1), of the tile, and anything up to MAX_LEN."""
    edges = sorted({n for n in (0, 1, page_size - 1, page_size, page_size + 1, *TILE_EDGES) if 0 <= n <= MAX_LEN})
    return st.lists(st.sampled_from(edges) | st.integers(0, MAX_LEN), min_size=1, max_size=4)


def _consistent(fields: dict) -> dict:
    """Rules between fields: a split count is a split-K argument (single pass takes 1 only, a plan none); an fp8
    cache, the model features and q_len > 1 need a backend that implements them (not torch_sdpa), an fp8 cache a
    16-bit q; q_len > 1 takes q contiguous (its own [B, q_len, Hq, D])."""
    if fields["backend"] == "triton" and fields["num_splits"] not in (None, 1):
        fields["num_splits"] = 1
    if fields["backend"] == "plan":
        fields["num_splits"] = None
    if fields["backend"] == "torch_sdpa":
        fields.update(cache="", q_len=1, softcap=None, window_left=None, sinks=False, alibi=False)
    if fields["q_len"] > 1:
        fields["q_layout"] = "contiguous"
    if fields["cache"] and fields["dtype"] == "fp32":
        fields["dtype"] = "bf16"
    return fields


@st.composite
def specs(draw, backend: str) -> Spec:
    fields = draw(st.fixed_dictionaries(DIMENSIONS))
    fields["seqlens"] = tuple(draw(_lengths(fields["page_size"])))
    return Spec(**_consistent(dict(fields, backend=backend)))


@dataclasses.dataclass
class Call:
    """A built example: the call's arguments, the same inputs in plain layouts for the reference, and where the
    output buffer lives (to check that nothing outside it was written)."""

    args: tuple
    kwargs: dict
    plain: tuple  # (q [B, Hq, D] or [B, q_len, Hq, D], k_cache, v_cache, cache_seqlens, block_table), NHD, contiguous
    features: dict  # the model features and an fp8 cache's scales, passed to the reference too
    out_base: torch.Tensor | None  # the buffer that holds `out`, when there is one
    out_mask: torch.Tensor | None  # True where `out` lives in out_base


def build(spec: Spec, device: str = DEVICE) -> Call:
    """The tensors of a Spec, from its seed."""
    dtype = DTYPES[spec.dtype]
    num_q_heads = spec.group * spec.num_kv_heads
    c = random_paged_case(
        spec.seqlens, num_q_heads, spec.num_kv_heads, spec.head_dim, spec.page_size, dtype, device,
        poison=spec.poison, seed=spec.seed,
    )  # fmt: skip
    q, k, v, lens, table = c.args
    page = spec.page_size
    gen = torch.Generator().manual_seed(spec.seed + 1)
    if spec.q_len > 1:
        q = torch.randn(len(spec.seqlens), spec.q_len, num_q_heads, spec.head_dim, generator=gen).to(device, dtype)
    if spec.share_prefix and spec.seqlens and spec.seqlens[0] > 0:
        for b, n in enumerate(spec.seqlens):
            if n > 0:
                table[b, 0] = table[0, 0]
    # stale rows past each sequence's end in its last page (unless another sequence reads that page): never read
    readers = collections.Counter(int(p) for b, n in enumerate(spec.seqlens) for p in table[b, : -(-n // page)])
    for b, n in enumerate(spec.seqlens):
        last = int(table[b, n // page]) if n % page else None
        if last is not None and readers[last] == 1:
            k[last, n % page :] = spec.poison
            v[last, n % page :] = spec.poison
    features = dict(softcap=spec.softcap, window_left=spec.window_left)
    if spec.sinks:
        features["sinks"] = torch.randn(num_q_heads, generator=gen).to(device)
    if spec.alibi:
        features["alibi_slopes"] = torch.tensor([2.0 ** (-8 * (h + 1) / num_q_heads) for h in range(num_q_heads)],
                                                device=device)  # fmt: skip
    if spec.cache:
        # NaN stays NaN; e4m3 saturates ±Inf to ±448, far from any valid value (|k / K_SCALE| < ~100)
        k, v = (k.float() / K_SCALE).to(FP8[spec.cache]), (v.float() / V_SCALE).to(FP8[spec.cache])
        features.update(k_scale=K_SCALE, v_scale=V_SCALE)
    plain = (q, k, v, lens, table)

    if spec.q_layout == "4d":
        q = q[:, None]
    elif spec.q_layout == "packed":
        wide = torch.randn(q.shape[0], num_q_heads + 3, spec.head_dim + 8, device=device).to(dtype)
        wide[:, 1 : num_q_heads + 1, : spec.head_dim] = q
        q = wide[:, 1 : num_q_heads + 1, : spec.head_dim]
    elif spec.q_layout == "heads-major":
        q = q.transpose(0, 1).contiguous().transpose(0, 1)

    if spec.kv_layout == "packed":
        kv = torch.stack([k, v], dim=2)  # [pages, page, 2, Hkv, D]
        k, v = kv[:, :, 0], kv[:, :, 1]
    elif spec.kv_layout == "every-other-page":
        k = torch.stack([k, _filled(k, spec.poison)], dim=1).flatten(0, 1)[::2]
        v = torch.stack([v, _filled(v, spec.poison)], dim=1).flatten(0, 1)[::2]
    if spec.v_layout == "token":
        v = token_major_v(v)
    if spec.hnd:
        # [num_pages, Hkv, page_size, D]: K copied so, token-major V as the transpose of its [.., Hkv, D, page] pages
        k = k.transpose(1, 2).contiguous()
        v = v.transpose(1, 2) if spec.v_layout == "token" else v.transpose(1, 2).contiguous()

    if spec.table_layout == "transposed":
        table = table.t().contiguous().t()
    elif spec.table_layout == "every-other-column":
        wide = torch.full((table.shape[0], 2 * table.shape[1]), -1, dtype=torch.int32, device=device)
        wide[:, ::2] = table
        table = wide[:, ::2]

    out_base = out_mask = None
    if spec.out == "q":
        q = q.clone() if spec.q_layout != "packed" else q
        out = q
    elif spec.out == "nan":
        out = out_base = torch.full(q.shape, float("nan"), dtype=dtype, device=device)
        out_mask = torch.ones(q.shape, dtype=torch.bool, device=device)
    elif spec.out == "view":
        out_base = torch.full((*q.shape[:-1], spec.head_dim + 8), float("nan"), dtype=dtype, device=device)
        out = out_base[..., : spec.head_dim]
        out_mask = torch.zeros(out_base.shape, dtype=torch.bool, device=device)
        out_mask[..., : spec.head_dim] = True
    else:
        out = None

    kwargs = dict(
        backend=spec.backend, num_splits=spec.num_splits, softmax_scale=spec.softmax_scale, out=out,
        return_lse=spec.return_lse, validate=spec.validate, allow_shared_pages=spec.share_prefix, **features,
    )  # fmt: skip
    layout = "HND" if spec.hnd else "NHD"
    if spec.hnd:
        kwargs["kv_layout"] = layout
    if spec.backend == "plan":
        kwargs.update(backend="auto", plan=plan_decode(q, k, lens, table, kv_layout=layout,
                                                       window_left=spec.window_left))  # fmt: skip
    return Call((q, k, v, lens, table), kwargs, plain, features, out_base, out_mask)


def _filled(t: torch.Tensor, value: float) -> torch.Tensor:
    """t's shape and dtype filled with value, converted as a cast converts it (e4m3 has no Inf: ±448)."""
    return torch.full(t.shape, value, device=t.device).to(t.dtype)


def count_example(test_id: str) -> None:
    EXAMPLES[test_id] += 1


def profile_name() -> str:
    """The profile tests/conftest.py loads unless pytest gets --hypothesis-profile."""
    return os.environ.get("FLASHDECODE_HYPOTHESIS_PROFILE", "ci")
