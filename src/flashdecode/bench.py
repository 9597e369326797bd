"""Benchmark harness: flashdecode's backends side by side with peers, checked, timed, with a roofline.

For each row (a batch of lengths and a head geometry) the harness builds one random paged cache, checks every
backend against the float64 reference (a wrong backend is marked and not timed), then times it:

* ``graph_us``: median of CUDA-graph replays (``triton.testing.do_bench_cudagraph``), the headline number;
* ``eager_us``: median of eager calls (``triton.testing.do_bench``), which adds Python and launch overhead;
* ``host_pace``: the host's pace right after the eager timing (``measure_host_pace``), which the eager column
  moves with.

Rows whose K/V fit a few times in L2 rotate through copies of the cache, as many as make the calls cycle through
>= 3x L2 of the K/V they read, so that calls do not find their data in L2; ``l2`` in the results says "rotated",
"cold" (one call reads >= 3x L2) or "warm", from the copies the CUDA graph actually read (``l2_state``). The eager
column finds L2 flushed before each call (``do_bench``). Bytes are counted from the actual lengths:
K + V of the valid tokens + q + out. % of peak is against the read bandwidth measured in the same process over a
4 GiB tensor by ``triton_read`` (the plainest fast read; ``torch.sum``'s slower read is recorded beside it).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import random
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["Row", "PRESETS", "run_rows", "add_bench_arguments", "cmd_bench", "cmd_plot"]


@dataclass
class Row:
    """One benchmark configuration."""

    seqlens: list[int]
    num_q_heads: int
    num_kv_heads: int
    head_dim: int = 128
    page_size: int = 16
    dtype: str = "bf16"
    label: str = ""
    # model features (docs/features.md): an fp8 cache ("e4m3" / "e5m2", q stays in dtype) and a sliding window
    kv_dtype: str = ""
    window_left: int | None = None
    # "token": V pages stored token-major (cases.token_major_v; docs/features.md), else head-dim-major
    v_layout: str = ""
    # tokens the block table can hold (a serving engine's table is sized for its longest allowed sequence); 0: the
    # longest sequence's pages and 2 more. "auto" reads this capacity, never the lengths
    table_tokens: int = 0

    def __post_init__(self):
        if self.v_layout not in ("", "token"):
            raise ValueError(f"v_layout must be '' or 'token', got {self.v_layout!r}")
        if self.table_tokens and self.table_tokens < max(self.seqlens, default=0):
            longest = max(self.seqlens)
            raise ValueError(f"table_tokens {self.table_tokens} is shorter than the longest sequence {longest}")

    def extra_table_columns(self) -> int:
        """Block-table columns past the longest sequence's pages (random_paged_case's extra_table_columns)."""
        if not self.table_tokens:
            return 2
        return -(-self.table_tokens // self.page_size) - -(-max(self.seqlens, default=0) // self.page_size)

    def feature_kwargs(self) -> dict:
        """decode_attention keyword arguments of the row's features (fp8 scales: k 0.05, v 0.3)."""
        kw = {} if self.window_left is None else {"window_left": self.window_left}
        return {**kw, **({"k_scale": FP8_K_SCALE, "v_scale": FP8_V_SCALE} if self.kv_dtype else {})}

    @property
    def batch(self) -> int:
        return len(self.seqlens)

    def name(self) -> str:
        if self.label:
            return self.label
        lens = set(self.seqlens)
        s = str(self.seqlens[0]) if len(lens) == 1 else f"{min(lens)}..{max(lens)}"
        extra = "" if (self.head_dim, self.page_size, self.dtype) == (128, 16, "bf16") else (
            f" D{self.head_dim} P{self.page_size} {self.dtype}"
        )
        extra += (f" kv {self.kv_dtype}" if self.kv_dtype else "") + (
            f" W{self.window_left}" if self.window_left is not None else ""
        ) + (" V token-major" if self.v_layout == "token" else "")
        extra += f" T{self.table_tokens}" if self.table_tokens else ""
        return f"{self.batch}x{s} {self.num_q_heads}/{self.num_kv_heads}{extra}"

    def kv_bytes(self) -> int:
        """Bytes of the K/V a kernel must read: with a window only the last window_left + 1 tokens."""
        itemsize = 1 if self.kv_dtype else (4 if self.dtype == "fp32" else 2)
        tokens = sum(n if self.window_left is None else min(n, self.window_left + 1) for n in self.seqlens)
        return 2 * tokens * self.num_kv_heads * self.head_dim * itemsize

    def io_bytes(self) -> int:
        itemsize = 4 if self.dtype == "fp32" else 2
        return self.kv_bytes() + 2 * self.batch * self.num_q_heads * self.head_dim * itemsize

    def flops(self) -> int:
        # q·k and p·v: 2 multiply-adds per (query head, token, dim) each
        return 4 * sum(self.seqlens) * self.num_q_heads * self.head_dim


# the fp8 rows' per-tensor scales (the cache is quantised as k / FP8_K_SCALE)
FP8_K_SCALE, FP8_V_SCALE = 0.05, 0.3


def quantize_kv(case, kv_dtype: str):
    """Quantise a case's K and V caches in place to fp8 ("e4m3" / "e5m2") with the fp8 rows' scales: k / FP8_K_SCALE,
    v / FP8_V_SCALE (unused pages stay NaN). Returns the case."""
    import torch

    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[kv_dtype]
    case.k_cache = (case.k_cache.float() / FP8_K_SCALE).to(fp8)
    case.v_cache = (case.v_cache.float() / FP8_V_SCALE).to(fp8)
    return case


# the "tables" preset's block-table capacity
SERVING_TABLE_TOKENS = 131072


def _uniform(batch, seqlen, hq, hkv, **kw):
    return Row([seqlen] * batch, hq, hkv, **kw)


def _anchor():
    # ../shared/PERF.md's grid: bf16, head_dim 128, page 16 (shapes only; the peers' times are in docs)
    rows = []
    for hq, hkv in ((12, 12), (12, 2)):
        for b, s in ((256, 256), (64, 1024), (16, 4096), (4, 16384), (1, 65536), (1, 131072)):
            rows.append(_uniform(b, s, hq, hkv))
    rows += [_uniform(1, s, 32, 32) for s in (8192, 32768, 131072)]
    rows += [_uniform(b, s, 28, 4) for b, s in ((1, 128), (1, 2048), (8, 128), (8, 2048))]
    rows += [_uniform(b, s, 32, 8) for b, s in ((64, 4096), (256, 2048), (128, 8192))]
    return rows


def _uneven(batch, hq, hkv, seed, low=1024, high=8192, **kw):
    # a serving step's mix: lengths drawn uniformly from [low, high], seeded so every run and every peer gets the
    # same batch
    g = random.Random(seed)
    return Row([g.randint(low, high) for _ in range(batch)], hq, hkv, **kw)


def _long_tail(short, long, hq, hkv, seed):
    # many short sequences and a few long ones (lengths 256..2048 and 16384..32768)
    g = random.Random(seed)
    lens = [g.randint(256, 2048) for _ in range(short)] + [g.randint(16384, 32768) for _ in range(long)]
    return Row(lens, hq, hkv, label=f"long tail {short}x256..2048+{long}x16k..32k {hq}/{hkv}")


def _constant_tokens(hq, hkv):
    pairs = [(256, 256), (128, 512), (64, 1024), (32, 2048), (16, 4096), (8, 8192), (4, 16384), (2, 32768),
             (1, 65536), (1, 131072)]  # fmt: skip
    return [_uniform(b, s, hq, hkv) for b, s in pairs]


PRESETS = {
    "anchor": _anchor,
    "mha": lambda: _constant_tokens(12, 12),
    "gqa": lambda: _constant_tokens(12, 2),
    "long": lambda: [_uniform(1, s, 32, 32) for s in (8192, 16384, 32768, 65536, 131072)],
    "qwen": lambda: [_uniform(b, s, 28, 4) for b in (1, 8) for s in (128, 256, 512, 1024, 2048)],
    "serving": lambda: [
        _uniform(b, s, 32, 8) for b, s in ((64, 2048), (64, 8192), (128, 4096), (256, 2048), (256, 4096))
    ],
    "ragged": lambda: [
        Row([131072] + [1024] * 63, 32, 8, label="ragged 1x131072+63x1024 32/8"),
        _uniform(64, 3064, 32, 8, label="uniform 64x3064 32/8 (same bytes)"),
    ],
    # uneven batches, as a serving step has them (plan_decode leaves most to the device's planner)
    "uneven": lambda: [
        _uneven(b, hq, hkv, seed) for seed, (b, hq, hkv) in enumerate(
            ((8, 32, 8), (16, 32, 8), (34, 32, 8), (64, 32, 8), (128, 32, 8), (8, 12, 2), (32, 12, 2), (8, 28, 4),
             (24, 28, 4))
        )
    ] + [_long_tail(60, 4, 32, 8, 100)],  # fmt: skip
    "dims": lambda: [_uniform(64, 4096, 32, 8, head_dim=d) for d in (64, 128, 256)],
    # anchor-like batches in a block table sized for a 131072-token sequence, as a serving engine captures its graphs:
    # "auto" reads the table's capacity (its planner's candidates, whether a combine launch may be needed), the plan
    # reads the lengths
    "tables": lambda: [
        _uniform(b, s, hq, hkv, table_tokens=SERVING_TABLE_TOKENS) for b, s, hq, hkv in (
            (1, 512, 12, 12), (4, 1024, 12, 12), (16, 1024, 12, 12), (16, 4096, 12, 12), (1, 65536, 12, 12),
            (64, 1024, 12, 2), (16, 4096, 12, 2), (1, 2048, 28, 4), (8, 2048, 28, 4), (64, 4096, 32, 8),
        )
    ],  # fmt: skip
    # model features: fp8 cache vs bf16 (same shapes; PERF.md's fp8 rows are 64 x 4096 and 1 x 131072 at 32/8), and
    # with 64-token pages, bf16 against an e4m3 cache whose V pages are token-major (the fastest fp8 layout:
    # docs/features.md); a 4096 window at 32k context vs full attention
    "fp8": lambda: [
        _uniform(b, s, hq, hkv, kv_dtype=kv) for b, s, hq, hkv in ((64, 4096, 32, 8), (1, 131072, 32, 8),
                                                                   (1, 65536, 12, 2))
        for kv in ("", "e4m3", "e5m2")
    ] + [
        _uniform(b, s, 32, 8, page_size=64, **kw) for b, s in ((64, 4096), (1, 131072))
        for kw in ({}, dict(kv_dtype="e4m3", v_layout="token"))
    ],  # fmt: skip
    "window": lambda: [_uniform(b, 32768, 32, 8, window_left=w) for b in (1, 16) for w in (None, 4096)],
    "tiny": lambda: [
        Row([40, 100, 7], 8, 2, head_dim=64),
        Row([0, 33, 64, 129], 4, 4, head_dim=64, page_size=12),
    ],
}

FLASHDECODE_BACKENDS = ("auto", "triton", "triton_splitk", "triton_tma", "torch_sdpa", "torch_naive")
# "auto" with a plan made once per case from the lengths on the host (plan_decode), as FlashInfer's wrapper is planned
# once per case: the call a serving engine makes for each layer of a decode step
PLANNED = "auto_plan"
PEERS = (
    "torch_compile", "flashinfer", "flashinfer_tc", "flash_attn", "flex_attention", "sglang_triton", "vllm_triton",
)  # fmt: skip
GPU_DEFAULT = (
    "auto", PLANNED, "triton", "triton_splitk", "torch_sdpa", "torch_compile", "flashinfer", "flashinfer_tc",
    "flash_attn", "flex_attention", "sglang_triton", "vllm_triton",
)  # fmt: skip
CPU_DEFAULT = ("auto", PLANNED, "triton", "triton_splitk", "torch_sdpa", "torch_naive")


class Skip(Exception):
    """A backend that cannot run this row (missing package, unsupported shape): reported, never an error."""


def _torch_dtype(name):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def make_backend(name: str, case, row: Row):
    """A zero-argument callable computing the row's output [B, Hq, D] with backend ``name`` (or raise Skip).

    The callable takes the tensors it reads from ``case`` at call time, so the harness can swap in a copy of the
    cache (L2 rotation) without re-planning.
    """
    from .api import FEATURE_BACKENDS, decode_attention

    kw = row.feature_kwargs()
    if kw and name not in FEATURE_BACKENDS + (PLANNED,):
        raise Skip(f"{name} has no {', '.join(kw)} here")
    if row.v_layout and (name not in FLASHDECODE_BACKENDS + (PLANNED,) or name == "triton_tma"):
        raise Skip(f"{name} reads head-dim-major V pages only")
    if name in FLASHDECODE_BACKENDS:
        return lambda c=case: decode_attention(*c.args, backend=name, **kw)
    if name == PLANNED:
        from .plan import plan_decode

        q, k, _, lens, table = case.args
        plan = plan_decode(q, k, lens, table, window_left=row.window_left)
        return lambda c=case: decode_attention(*c.args, plan=plan, **kw)
    if name == "torch_compile":
        compiled = _compiled_dense()
        scale = 1.0 / math.sqrt(row.head_dim)
        return lambda c=case: compiled(*c.args, scale)[0]
    if name in ("flashinfer", "flashinfer_tc"):
        from .peers import flashinfer_decode

        return flashinfer_decode(case, use_tensor_cores=name == "flashinfer_tc")
    if name == "flash_attn":
        from .peers import flash_attn_decode

        return flash_attn_decode(case)
    if name == "flex_attention":
        from .peers import flex_attention_decode

        return flex_attention_decode(case)
    if name == "sglang_triton":
        from .peers import sglang_triton_decode

        return sglang_triton_decode(case)
    if name == "vllm_triton":
        from .peers import vllm_triton_decode

        return vllm_triton_decode(case)
    raise ValueError(f"unknown backend {name!r}; known: {FLASHDECODE_BACKENDS + (PLANNED,) + PEERS}")


_COMPILED = {}


def _compiled_dense():
    """torch.compile of the plain PyTorch dense version, compiled once per process (dynamic shapes)."""
    if "dense" not in _COMPILED:
        import torch

        from .torch_baselines import torch_dense

        _COMPILED["dense"] = torch.compile(torch_dense, dynamic=True)
    return _COMPILED["dense"]


# ---------------------------------------------------------------------------------------------- measuring


def measure_read_bandwidth(device, how: str = "torch.sum") -> float:
    """Bytes/s of one read of a 4 GiB bf16 tensor in this process, median of eager calls.

    how: "stream", ``triton_read``'s one-load-a-program kernel, the benchmark's read ceiling (its % peak and bound
    µs); or "torch.sum", the yardstick the notes compare machines by (4.08-4.22 TB/s on the H200s of this project,
    slower than the decode's best rows: docs/benchmarks/h200-2026-11-30)."""
    import torch
    from triton.testing import do_bench

    if how not in ("stream", "torch.sum"):
        raise ValueError(f"how must be 'stream' or 'torch.sum', got {how!r}")
    x = torch.empty(2 << 30, dtype=torch.bfloat16, device=device).uniform_()
    partial = None
    if how == "stream":
        from .triton_read import read_partials

        partial = read_partials(x)
        ms = do_bench(lambda: read_partials(x, partial), warmup=50, rep=300, return_mode="median")
    else:
        ms = do_bench(x.sum, warmup=50, rep=300, return_mode="median")
    nbytes = x.numel() * x.element_size()
    x = partial = None  # the 4 GiB go back to the allocator, then to the device
    torch.cuda.empty_cache()
    return nbytes / (ms * 1e-3)


def _python_piece() -> None:
    """A fixed piece of plain Python (dict and list work), the yardstick of ``measure_host_pace``."""
    d = {"a": 1, "b": (1, 2)}
    d["c"] = [d["a"], *d["b"]]


def measure_host_pace(device) -> dict:
    """This process's CPU pace on work that runs none of flashdecode's code, best of 3 rounds each: µs per call of a
    fixed piece of plain Python (``python_us``) and host µs per queued in-place add on a 1-element tensor of the
    device (``torch_op_us``: a kernel launch on a GPU). The eager column moves with it: on the H200's host whole
    processes ran at two paces, and the pace of one process can change within seconds: 25-28 against 34-58 µs of host
    time per queued `auto` call of 8 x 2048 28/4, with 6.3-7.3 against 7.7-9.8 µs per torch op
    (docs/benchmarks/h200-2026-11-29/affinity-25c3857). About 30 ms a call."""
    import torch

    x = torch.zeros(1, device=device)
    return {
        "python_us": round(min(host_us_per_call(_python_piece, 10000) for _ in range(3)), 3),
        "torch_op_us": round(min(host_us_per_call(lambda: x.add_(1), 1000) for _ in range(3)), 2),
    }


def pace_range(results) -> str:
    """The records' host paces (``measure_host_pace``, taken after each eager timing) as text: min-max of each;
    "" where no record has one."""
    paces = [r["host_pace"] for r in results if "host_pace" in r]
    if not paces:
        return ""
    python = [p["python_us"] for p in paces]
    torch_op = [p["torch_op_us"] for p in paces]
    return (f"Python {min(python):.3f}-{max(python):.3f} µs, torch op {min(torch_op):.2f}-{max(torch_op):.2f} µs "
            f"({len(paces)} records)")


def _l2_bytes(device) -> int:
    import torch

    return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)


def rotation_copies(case, l2_bytes: int, read_bytes: int | None = None, max_bytes: int = 8 << 30,
                    max_copies: int = 1024):  # fmt: skip
    """Copies of the cache, enough that consecutive calls do not find K/V in L2: the calls cycle through >= 3x L2
    of the K/V they read (``read_bytes`` a call; default the whole pool). Sized from the bytes read, not the pool,
    so a window row reading a slice of a large pool gets enough copies. Capped at ``max_bytes`` of copies in all and
    at ``max_copies`` (``time_gpu`` lengthens its graph to read them all; the smallest anchor row, 1 x 128 28/4,
    needs 720): past a cap the calls find some K/V in L2 and ``l2_state`` says "warm"."""
    pool = case.k_cache.numel() * case.k_cache.element_size() + case.v_cache.numel() * case.v_cache.element_size()
    read = read_bytes or pool
    n = max(1, min(math.ceil(3 * l2_bytes / max(read, 1)), max_bytes // max(pool, 1), max_copies))
    copies = [case] + [
        dataclasses.replace(case, k_cache=case.k_cache.clone(), v_cache=case.v_cache.clone()) for _ in range(n - 1)
    ]
    return copies


def l2_state(read_bytes: int, copies: int, l2_bytes: int) -> str:
    """What the timed calls found in L2: "rotated" when they cycled through >= 3x L2 of distinct K/V over several
    copies, "cold" when one call alone reads that much, else "warm" (some of it can sit in L2 between calls)."""
    if copies * read_bytes >= 3 * l2_bytes:
        return "rotated" if copies > 1 else "cold"
    return "warm"


def probe_case(seqlens, num_q_heads: int, num_kv_heads: int, head_dim: int = 128):
    """The GPU probe scripts' row: (a bf16 case with 16-token pages, no spare pages and seed 0; its float64
    reference output; ``rotation_copies`` of it for this GPU's L2)."""
    import torch

    from .cases import random_paged_case
    from .reference import reference_dense

    case = random_paged_case(seqlens, num_q_heads, num_kv_heads, head_dim, 16, torch.bfloat16, "cuda", spare_pages=0,
                             seed=0)  # fmt: skip
    ref, _ = reference_dense(*case.args, device="cuda")
    return case, ref, rotation_copies(case, _l2_bytes("cuda"))


def probe_rows(text: str, default: list) -> list:
    """The GPU probe scripts' ``--rows``: 'B,L,Hq,Hkv;...' (each row's integers as ``parse_ints`` reads them) as
    tuples, or ``default`` when empty."""
    return [tuple(parse_ints(row)) for row in text.split(";")] if text else default


def probe_graph_us(fn) -> float:
    """The GPU probe scripts' timer: µs per call of fn, median of CUDA-graph replays (rep 30 ms)."""
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3


def probe_variants(variants: dict, case, ref, copies, out, tol: float = 2e-2, rounds: int = 2):
    """The GPU probe scripts' comparison of kernels on one row: each variant ``fn(case)`` (writing ``out``) run once
    into a NaN-filled ``out`` and its max error against ``ref`` kept; then ``rounds`` rounds in which each variant
    in turn is timed over the rotated ``copies`` (only same-process pairs compare: the H200's host runs a process at
    one of two paces). A variant whose error is ``tol`` or more is not timed (NaN). Returns (errs, times: {name: [µs
    a round]})."""
    import itertools

    errs = {}
    for key, fn in variants.items():
        out.fill_(float("nan"))
        fn(case)
        errs[key] = (out.double() - ref).abs().max().item()
    times = {key: [] for key in variants}
    for _ in range(rounds):
        for key, fn in variants.items():
            it = itertools.cycle(copies)
            times[key].append(probe_graph_us(lambda fn=fn, it=it: fn(next(it))) if errs[key] < tol else float("nan"))
    return errs, times


class ProbeLog:
    """The GPU probe scripts' output: one JSON line per row in $OUT/<name>.jsonl as it runs, its table line printed
    then, and every table line again at the end (``close``), where the device tool's output tail shows them."""

    def __init__(self, name: str):
        self.file = open(os.path.join(os.environ.get("OUT", "."), f"{name}.jsonl"), "w")
        self.lines = []

    def row(self, record: dict, line: str) -> None:
        self.record(record)
        self.line(line)

    def record(self, record: dict) -> None:
        """A JSON line alone: for probes that log several records (variants, runs) per table line."""
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def line(self, line: str) -> None:
        """A table line alone: a header, or a row summing up the records logged before it."""
        self.lines.append(line)
        print(line, flush=True)

    def close(self) -> None:
        self.file.close()
        print()
        for line in self.lines:
            print(line)


def host_us_per_call(call, calls: int, synced: bool = False) -> float:
    """Mean wall-clock µs per call over ``calls`` calls of ``call()`` started after a device sync: queued (the host's
    cost of a call while the GPU keeps up), or with synced a sync after each (host and GPU in turn). The probe
    scripts' and ``measure_host_pace``'s host-time measure; syncs again before returning (no sync without CUDA)."""
    import time

    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        call()
        if synced:
            sync()
    us = (time.perf_counter() - t) / calls * 1e6
    sync()
    return us


def cycling_calls(fn, copies):
    """(call, graph_call, captured): functions that call fn on the next copy, round and round; graph_call also adds
    the id of each copy it passes while a CUDA graph is being captured to the set ``captured`` (the check costs
    ~1 µs, so eager timings use call)."""
    import itertools

    import torch

    cycle = itertools.cycle(copies)
    captured = set()

    def call():
        return fn(next(cycle))

    def graph_call():
        case = next(cycle)
        if torch.cuda.is_current_stream_capturing():
            captured.add(id(case))
        return fn(case)

    return call, graph_call, captured


def time_gpu(fn, copies) -> tuple[float | None, float, str | None, int]:
    """(graph µs, eager µs, note, copies in the graph): medians of CUDA-graph replays and of eager calls, cycling
    through the copies.

    The graph holds as many calls as ``do_bench_cudagraph`` estimates fit in its ``rep`` of 50 ms, from five eager
    calls; where that is fewer calls than copies (1 x 128 28/4's 720 copies got 325-678 calls in the first runs),
    the graph is timed again with ``rep`` scaled up so that it reads every copy (up to six times, ``rep`` at most
    20 s of estimated calls: the estimate comes from eager calls, which a GPU shared with other processes makes too
    long; with a 2 s cap the native suite's 8 workers on one GPU left tiny rows at 643 and 807 of 1024 copies). The
    last value counts the distinct copies the graph read, for ``l2_state``. The eager calls find L2 flushed:
    ``do_bench`` clears it before each call. A backend that synchronises with the host (torch_naive reads the
    lengths) cannot be captured: its graph time is None and the note says why. Each timing starts after a garbage
    collection and a device sync (``_settle``): without them the timing that followed the plan's setup read 2-15%
    slow on the large rows (scripts/eager_order_probe.py).
    """
    from triton.testing import do_bench, do_bench_cudagraph

    call, graph_call, captured = cycling_calls(fn, copies)
    # warm-up outside the timed region: compilation, autotuning, planning
    for _ in range(len(copies) + 2):
        call()
    graph_us, note = None, None
    _settle()
    rep = 50
    try:
        for _ in range(6):
            captured.clear()
            graph_us = do_bench_cudagraph(graph_call, rep=rep, return_mode="median") * 1e3
            if len(captured) >= len(copies) or rep >= 20000:
                break
            rep = min(20000, math.ceil(rep * 1.25 * len(copies) / max(len(captured), 1)))
            _settle()
    except Exception as e:  # capture refused (host sync inside the call)
        note = f"no CUDA graph: {type(e).__name__}"
    _settle()
    eager_us = do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3
    return graph_us, eager_us, note, len(captured)


def _settle():
    """A garbage collection and a device sync, so that no finalizer of earlier work (a CUDA graph of the replays, a
    backend's setup) runs inside a timed region. H200, scripts/eager_order_probe.py at 7a1234e: `auto_plan` timed
    between two `auto`s on 128 x 8192 32/8, eager 1001.8 µs against 985.0 and 985.3 (the same kernel), 986.5 with
    it; in the anchor runs 1085-1182 against 984-988."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()


def time_cpu(fn, case, repeats=3) -> float:
    """µs per call on the CPU (wall clock, median of a few): meaningless for GPU speed, shown only as a smoke test."""
    import statistics
    import time

    fn(case)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(case)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def check_backend(fn, case, ref_out, tolerance) -> tuple[bool, float]:
    """Run once and compare with the reference (the gate before timing)."""
    from .check import check_output

    out = fn(case)
    return check_output(out, ref_out, tolerance)


def row_case(row: Row, device: str, seed: int = 0):
    """A row's random paged case (``cases.random_paged_case``): its table sized by ``table_tokens``, its cache in
    the row's fp8 format and V layout; on the GPU no spare (NaN) pages, the benchmark's caches being large."""
    from .cases import random_paged_case, token_major_v

    case = random_paged_case(
        row.seqlens, row.num_q_heads, row.num_kv_heads, row.head_dim, row.page_size, _torch_dtype(row.dtype),
        device, spare_pages=0 if device == "cuda" else 3, extra_table_columns=row.extra_table_columns(), seed=seed,
    )  # fmt: skip
    if row.kv_dtype:
        quantize_kv(case, row.kv_dtype)
    if row.v_layout == "token":
        case = dataclasses.replace(case, v_cache=token_major_v(case.v_cache))
    return case


def run_rows(rows, backends, device, *, progress=True, sabotage=None, on_row=None, warm_l2=False):
    """Check and time every backend on every row. Returns a list of result dicts (one per row x backend).

    warm_l2: time every call on the same cache (no rotation), so rows that fit in L2 read it from there.

    sabotage: optional {backend: fn(out) -> out} to corrupt a backend's output (tests of the correctness gate).
    on_row: optional callback(results so far) after each row (the CLI saves partial results with it).
    """
    import torch

    from .check import output_tolerance
    from .reference import reference_dense

    on_gpu = device == "cuda"
    l2 = _l2_bytes(device) if on_gpu else 0
    bar = _progress(total=len(rows) * len(backends), enabled=progress)
    results = []
    for row in rows:
        case = row_case(row, device, seed=len(results))
        ref_out, _ = reference_dense(*case.args, device=device, **row.feature_kwargs())
        tolerance = output_tolerance(case.args, ref_out, **row.feature_kwargs())
        copies = rotation_copies(case, l2, row.kv_bytes()) if on_gpu and not warm_l2 else [case]
        for name in backends:
            bar.set_description(f"{row.name()} {name}")
            rec = _base_record(row, name)
            # what the graph found in L2: planned from the copies here, set from the copies it read once timed
            rec["l2"] = l2_state(row.kv_bytes(), len(copies), l2)
            rec["copies"] = len(copies)
            try:
                fn = make_backend(name, case, row)
                if sabotage and name in sabotage:
                    fn = (lambda f, s: (lambda c: s(f(c))))(fn, sabotage[name])
                ok, err = check_backend(fn, case, ref_out, tolerance)
                rec.update(max_err=err, tolerance=tolerance)
                if not ok:
                    rec.update(status="wrong", reason=f"max |out - ref| = {err:.3g} > {tolerance:.3g}; not timed")
                elif on_gpu:
                    graph_us, eager_us, note, graph_copies = time_gpu(fn, copies)
                    rec.update(status="ok", graph_us=graph_us, eager_us=eager_us, graph_copies=graph_copies)
                    if graph_us:
                        rec["l2"] = l2_state(row.kv_bytes(), graph_copies, l2)
                    if note:
                        rec["reason"] = note
                else:
                    rec.update(status="ok", eager_us=time_cpu(fn, case))
                if rec["status"] == "ok":  # right after the eager timing, which moves with it
                    rec["host_pace"] = measure_host_pace(device)
            except Skip as e:
                rec.update(status="skipped", reason=str(e))
            except Exception as e:  # a peer failing must not stop the sweep; the record says what happened
                first_line = str(e).splitlines()[0][:200] if str(e) else ""
                rec.update(status="error", reason=f"{type(e).__name__}: {first_line}")
            results.append(rec)
            bar.update(1)
        del copies, case
        if on_gpu:
            torch.cuda.empty_cache()
        if on_row:
            on_row(results)
    bar.close()
    return results


def _base_record(row: Row, backend: str) -> dict:
    rec = dataclasses.asdict(row)
    rec["seqlens"] = row.seqlens if len(set(row.seqlens)) > 1 else [row.seqlens[0]]
    rec.update(
        row=row.name(), backend=backend, batch=row.batch, max_seqlen=max(row.seqlens, default=0),
        bytes=row.io_bytes(), kv_bytes=row.kv_bytes(), flops=row.flops(),
        intensity=row.flops() / max(row.io_bytes(), 1),
    )  # fmt: skip
    return rec


def add_metrics(results, read_bw):
    """GB/s, % of the measured read bandwidth, the bandwidth-bound time and speed-up over the best other backend."""
    by_row = {}
    for rec in results:
        by_row.setdefault(rec["row"], []).append(rec)
    for recs in by_row.values():
        for rec in recs:
            t = rec.get("graph_us") or rec.get("eager_us")
            if read_bw:
                rec["bound_us"] = rec["bytes"] / read_bw * 1e6
            if t:
                rec["gbps"] = rec["bytes"] / (t * 1e-6) / 1e9
                if read_bw:
                    rec["pct_peak"] = 100 * rec["bytes"] / (t * 1e-6) / read_bw
            others = [o.get("graph_us") or o.get("eager_us") for o in recs if o is not rec and o["status"] == "ok"]
            others = [o for o in others if o]
            if t and others:
                rec["speedup_vs_best_other"] = min(others) / t
    return results


def _progress(total, enabled):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is in the [bench] extra; without it, no bar
        enabled = False
    if enabled:
        return tqdm(total=total, file=sys.stderr, dynamic_ncols=True, leave=False)

    class _Quiet:
        def update(self, n):
            pass

        def set_description(self, text):
            pass

        def close(self):
            pass

    return _Quiet()


# ---------------------------------------------------------------------------------------------- provenance


def read_bandwidths(meta) -> str:
    """The run's read bandwidths as text: the % peak column's ceiling and torch.sum's, from a results.json's meta
    (runs before 2026-11-30 recorded torch.sum's alone, as read_bandwidth_gbps)."""
    read, total = meta.get("read_bandwidth_gbps"), meta.get("torch_sum_gbps")
    if "torch_sum_gbps" not in meta:
        read, total = None, read
    if not read:
        return f"read bandwidth (torch.sum) {total:.0f} GB/s" if total else "read bandwidth not measured"
    return f"read bandwidth {read:.0f} GB/s (triton_read; torch.sum {total or 0:.0f})"


def provenance(device, read_bw, timing, sum_bw=None) -> dict:
    """The run's record: commit, versions, GPU, timing method; read_bw the read ceiling the % peak column uses
    (``read_bandwidth_gbps``), sum_bw ``torch.sum``'s (``torch_sum_gbps``, the machine yardstick; before
    2026-11-30 read_bandwidth_gbps held torch.sum's)."""
    import torch
    import triton

    info = {
        # a device machine gets a copy of the tree without .git: the caller passes the commit in
        "commit": os.environ.get("FLASHDECODE_COMMIT") or _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "timing": timing,
        "read_bandwidth_gbps": read_bw / 1e9 if read_bw else None,
        "torch_sum_gbps": sum_bw / 1e9 if sum_bw else None,
    }
    for pkg in ("flashinfer", "flash_attn"):
        try:
            info[pkg] = __import__(pkg).__version__
        except Exception:
            info[pkg] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name, sm_count=props.multi_processor_count, l2_bytes=_l2_bytes(device),
            cuda_runtime=torch.version.cuda,
            driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        )  # fmt: skip
    else:
        info.update(gpu=None, cpu=platform.processor() or platform.machine())
    return info


def _git(*args) -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    return _run(["git", "-C", here, *args])


def _run(cmd) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip() or ""
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------- reporting


def _cell(rec, on_gpu):
    if rec["status"] != "ok":
        return rec["status"]
    if on_gpu and not rec.get("graph_us"):  # no CUDA graph (a host sync in the call): its eager time, marked
        return f"{rec['eager_us']:.1f} (eager)"
    return f"{rec.get('graph_us') or rec.get('eager_us'):.1f}"


def markdown_table(results, meta) -> str:
    """Two tables: rows x backends (graph µs), then every record with its metrics."""
    backends = list(dict.fromkeys(r["backend"] for r in results))
    rows = list(dict.fromkeys(r["row"] for r in results))
    get = {(r["row"], r["backend"]): r for r in results}
    unit = "graph µs" if meta.get("gpu") else "CPU µs (meaningless)"
    lines = [f"| row | K+V MB | {' | '.join(backends)} | best |", "|---|---:|" + "---:|" * len(backends) + "---|"]
    for row in rows:
        recs = [get.get((row, b)) for b in backends]
        ok = [r for r in recs if r and r["status"] == "ok"]
        best = min(ok, key=lambda r: r.get("graph_us") or r.get("eager_us"))["backend"] if ok else "-"
        mb = recs[0]["kv_bytes"] / 1e6 if recs[0] else 0
        cells = " | ".join(_cell(r, bool(meta.get("gpu"))) if r else "" for r in recs)
        lines.append(f"| {row} | {mb:.1f} | {cells} | {best} |")
    head = (
        f"{unit}; GPU {meta.get('gpu')}, commit {str(meta.get('commit'))[:10]}"
        f"{' (dirty)' if meta.get('dirty') else ''}, "
        f"torch {meta.get('torch')}, triton {meta.get('triton')}, flashinfer {meta.get('flashinfer')}, "
        f"{read_bandwidths(meta)}, timing: {meta.get('timing')}"
    )
    if pace := pace_range(results):
        head += f"; host pace over the run (the eager column moves with it): {pace}"
    detail = [
        "| row | backend | graph µs | eager µs | torch op µs | GB/s | % peak | vs best other | bound µs | L2 | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        f = lambda k, fmt: (fmt.format(r[k]) if r.get(k) is not None else "")  # noqa: E731
        # the host's pace beside the eager time it was taken after (measure_host_pace)
        pace = f"{r['host_pace']['torch_op_us']:.2f}" if "host_pace" in r else ""
        detail.append(
            f"| {r['row']} | {r['backend']} | {f('graph_us', '{:.1f}')} | {f('eager_us', '{:.1f}')} | {pace} | "
            f"{f('gbps', '{:.0f}')} | {f('pct_peak', '{:.1f}')} | {f('speedup_vs_best_other', '{:.2f}x')} | "
            f"{f('bound_us', '{:.1f}')} | {r.get('l2', '')} | {r['status']}"
            f"{': ' + r['reason'] if r.get('reason') else ''} |"
        )
    return head + "\n\n" + "\n".join(lines) + "\n\n" + "\n".join(detail) + "\n"


def terminal_table(results) -> str:
    """The bench's console table: one line per row x backend."""
    lines = [
        f"{'row':<34} {'backend':<14} {'graph us':>9} {'eager us':>9} {'GB/s':>6} {'%peak':>6} {'vs best':>8}  status"
    ]
    for r in results:
        g = f"{r['graph_us']:.1f}" if r.get("graph_us") else "-"
        e = f"{r['eager_us']:.1f}" if r.get("eager_us") else "-"
        bw = f"{r['gbps']:.0f}" if r.get("gbps") else "-"
        pk = f"{r['pct_peak']:.1f}" if r.get("pct_peak") else "-"
        sp = f"{r['speedup_vs_best_other']:.2f}x" if r.get("speedup_vs_best_other") else "-"
        status = r["status"] + (f" ({r['reason']})" if r.get("reason") and r["status"] != "ok" else "")
        lines.append(f"{r['row']:<34} {r['backend']:<14} {g:>9} {e:>9} {bw:>6} {pk:>6} {sp:>8}  {status}")
    return "\n".join(lines)


def compare(results, previous_path, threshold=0.05) -> list[str]:
    """Lines for the (row, backend) pairs of a previous results.json that got worse: more than ``threshold``
    slower (graph times, or eager where neither run has one), timed eagerly now where a graph was timed before,
    or no longer ok ("wrong", "error", "skipped", or missing from this run). Rows and backends this run did not
    ask for are not compared (a one-row run against a whole grid reports that row only)."""
    with open(previous_path) as f:
        before = {(r["row"], r["backend"]): r for r in json.load(f)["results"]}
    now = {(r["row"], r["backend"]): r for r in results}
    rows, backends = {r["row"] for r in results}, {r["backend"] for r in results}
    lines = []
    for pair, old in before.items():
        if old.get("status") != "ok" or pair[0] not in rows or pair[1] not in backends:
            continue
        r = now.get(pair)
        name = f"{pair[0]} {pair[1]}"
        if r is None:
            lines.append(f"MISSING {name}: ok before, not in this run")
        elif r["status"] != "ok":
            lines.append(f"NOT OK {name}: {r['status']}{': ' + r['reason'] if r.get('reason') else ''}")
        elif old.get("graph_us") and not r.get("graph_us"):
            lines.append(f"NO GRAPH {name}: graph {old['graph_us']:.1f} us before, now eager only")
        else:
            key = "graph_us" if r.get("graph_us") else "eager_us"
            if old.get(key) and r.get(key) and r[key] > old[key] * (1 + threshold):
                lines.append(
                    f"SLOWER {name}: {old[key]:.1f} -> {r[key]:.1f} us ({r[key] / old[key]:.2f}x)"
                )
    return lines


# ---------------------------------------------------------------------------------------------- command line


def parse_ints(text: str) -> list[int]:
    """'1,2,8' -> [1, 2, 8]; '1024:131072:x2' -> 1024, 2048, ..., 131072; '128:512:128' -> 128, 256, 384, 512."""
    values = []
    for part in text.split(","):
        if ":" in part:
            lo, hi, step = part.split(":")
            lo, hi = int(lo), int(hi)
            if step.startswith("x"):
                factor = int(step[1:])
                if factor < 2:
                    raise ValueError(f"a geometric step must be x2 or more, got {step!r}")
                while lo <= hi:
                    values.append(lo)
                    lo *= factor
            else:
                values.extend(range(lo, hi + 1, int(step)))
        elif part:
            values.append(int(part))
    return values


def add_bench_arguments(p):
    p.add_argument(
        "--preset", default=None,
        help=f"comma-separated presets: {', '.join(PRESETS)} (default: anchor on a GPU, tiny on CPU)",
    )
    p.add_argument("--batch", help="free-form rows: batch sizes, e.g. 1,8,64 or 1:256:x2")
    p.add_argument("--seqlen", help="free-form rows: lengths, e.g. 1024:131072:x2")
    p.add_argument("--heads", default="32/8", help="free-form rows: query/KV heads (default 32/8)")
    p.add_argument("--head-dim", type=int, default=128, help="free-form rows: head dim (default 128)")
    p.add_argument("--page-size", type=int, default=16, help="free-form rows: tokens per page (default 16)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"],
                   help="dtype of the free-form rows, and of the presets' rows when no --batch is given (default bf16)")
    ours = ", ".join(FLASHDECODE_BACKENDS + (PLANNED,))
    p.add_argument(
        "--backends",
        help=f"comma-separated; flashdecode: {ours} ({PLANNED}: auto with a plan_decode plan, the tables' 'with "
        f"plan'); peers: {', '.join(PEERS)} (default: {', '.join(GPU_DEFAULT)} on a GPU, "
        f"{', '.join(CPU_DEFAULT)} on CPU)",
    )
    p.add_argument("--out", help="folder for results.json, results.md and the plots")
    p.add_argument("--compare", help="a previous results.json: print the rows more than 5%% slower, or ok there and "
                   "not now (wrong, error, skipped, missing, no CUDA graph)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="auto (default): cuda if torch sees a GPU, else cpu")
    p.add_argument("--warm-l2", action="store_true", help="no cache rotation: small rows then read K/V from L2")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def rows_from_args(args, on_gpu) -> list[Row]:
    rows = []
    if args.batch or args.seqlen:
        hq, hkv = (int(x) for x in args.heads.split("/"))
        for b in parse_ints(args.batch or "1"):
            for s in parse_ints(args.seqlen or "4096"):
                rows.append(Row([s] * b, hq, hkv, args.head_dim, args.page_size, args.dtype))
    presets = args.preset.split(",") if args.preset else ([] if rows else ["anchor" if on_gpu else "tiny"])
    for name in presets:
        if name not in PRESETS:
            raise SystemExit(f"error: --preset must be among {', '.join(PRESETS)}, got {name!r}")
        for row in PRESETS[name]():
            if args.dtype != "bf16" and not args.batch:
                row = dataclasses.replace(row, dtype=args.dtype)
            rows.append(row)
    # a row in two presets (anchor and dims share 64x4096 32/8) runs once: records are keyed by the row's name
    unique = {}
    for row in rows:
        unique.setdefault(row.name(), row)
    return list(unique.values())


def cmd_bench(args) -> int:
    from .cli import _pick_device

    device = _pick_device(args.device)
    on_gpu = device == "cuda"
    rows = rows_from_args(args, on_gpu)
    backends = args.backends.split(",") if args.backends else list(GPU_DEFAULT if on_gpu else CPU_DEFAULT)
    for b in backends:
        if b not in FLASHDECODE_BACKENDS + (PLANNED,) + PEERS:
            known = ", ".join(FLASHDECODE_BACKENDS + (PLANNED,) + PEERS)
            raise SystemExit(f"error: --backends: unknown backend {b!r}; known: {known}")
    if not on_gpu:
        print("note: no GPU: running on CPU through the Triton interpreter; these timings mean nothing for GPU speed")
    read_bw = measure_read_bandwidth(device, "stream") if on_gpu else None
    sum_bw = measure_read_bandwidth(device, "torch.sum") if on_gpu else None
    if read_bw:
        print(f"measured read bandwidth over 4 GiB: {read_bw / 1e9:.0f} GB/s (triton_read: the % peak column), "
              f"torch.sum {sum_bw / 1e9:.0f} GB/s")
    timing = (
        "median of CUDA-graph replays (triton do_bench_cudagraph) and of eager calls (do_bench)" if on_gpu
        else "CPU wall clock, median of 3 (meaningless)"
    )  # fmt: skip
    meta = provenance(device, read_bw, timing, sum_bw)

    def save_partial(results):
        # a sweep cut short still leaves every finished row on disk
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump({"meta": meta, "results": add_metrics(list(results), read_bw)}, f, indent=1, default=str)

    results = run_rows(
        rows, backends, device, progress=not args.no_progress, on_row=save_partial, warm_l2=args.warm_l2
    )
    add_metrics(results, read_bw)
    print(terminal_table(results))
    if pace := pace_range(results):
        print(f"host pace over the run: {pace} (the eager column moves with it)")
    if args.out:
        write_outputs(results, meta, args.out)
        print(f"wrote {args.out}/results.json, results.md and plots")
    if args.compare:
        slower = compare(results, args.compare)
        print("\n".join(slower) if slower else f"no row more than 5% slower or no longer ok than in {args.compare}")
    return 0


def write_outputs(results, meta, out_dir):
    from .plots import plot_results

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(markdown_table(results, meta))
    plot_results(results, meta, out_dir)


def cmd_plot(args) -> int:
    from .plots import plot_results

    with open(args.results) as f:
        data = json.load(f)
    out_dir = args.out or os.path.dirname(os.path.abspath(args.results))
    for path in plot_results(data["results"], data["meta"], out_dir):
        print(f"wrote {path}")
    return 0
