"""`flashdecode run | bench | plot`: the command line.

Without a GPU, Triton runs through its interpreter on CPU tensors; TRITON_INTERPRET is set here before any
kernel module is imported.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _pick_device(requested: str) -> str:
    import torch

    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        raise SystemExit("error: --device cuda asked for, but torch sees no GPU")
    return requested


def _dtype(name: str):
    import torch

    table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if name not in table:
        raise argparse.ArgumentTypeError(f"--dtype must be one of {sorted(table)}, got {name!r}")
    return table[name]


def _heads(text: str) -> tuple[int, int]:
    try:
        hq, hkv = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--heads must look like 32/8 (query/KV heads), got {text!r}") from None
    return hq, hkv


def _seqlens(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seqlens must be comma-separated integers, e.g. 0,17,4096, got {text!r}")


def cmd_run(args) -> int:
    """Every backend on one random paged cache, checked against the float64 reference; a table of error and time."""
    device = _pick_device(args.device)
    import torch

    from . import BACKENDS, decode_attention
    from .api import TRITON_MAX_HEAD_DIM
    from .cases import random_paged_case
    from .check import check_output, output_tolerance
    from .reference import reference_dense

    on_gpu = device == "cuda"
    if args.seqlens:
        seqlens = args.seqlens
    elif on_gpu:
        # ragged, production-like: short and long sequences in one batch
        seqlens = [1, 15, 16, 17, 1000, 4096, 30000, 8191]
    else:
        seqlens = [0, 1, 17, 200]
    hq, hkv = args.heads or ((32, 8) if on_gpu else (8, 2))
    head_dim = args.head_dim or (128 if on_gpu else 64)
    case = random_paged_case(seqlens, hq, hkv, head_dim, args.page_size, args.dtype, device, seed=args.seed)
    print(
        f"flashdecode run on {torch.cuda.get_device_name() if on_gpu else 'CPU (Triton interpreter)'}: "
        f"B={len(seqlens)} seqlens={seqlens} heads={hq}/{hkv} D={head_dim} page={args.page_size} "
        f"dtype={str(args.dtype).replace('torch.', '')}"
    )
    try:
        # the API's checks first (torch_naive's include the lengths' bounds on any device): a bad case is reported as
        # decode_attention reports it, not by the float64 reference below, which takes the case on trust
        decode_attention(*case.args, backend="torch_naive")
    except (TypeError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    ref_out, _ = reference_dense(*case.args)
    tolerance = output_tolerance(case.args, ref_out)
    rows, failed = [], 0
    for backend in BACKENDS:
        try:
            out = decode_attention(*case.args, backend=backend)
        except ValueError as e:
            # the known refusals say why and the others run: triton_tma off Hopper or with other pages, the Triton
            # kernels above their head dims; any other error fails the run
            if backend != "triton_tma" and not (backend.startswith("triton") and head_dim > TRITON_MAX_HEAD_DIM):
                raise
            print(f"{backend}: not run: {e}")
            continue
        ok, err = check_output(out, ref_out, tolerance)
        failed += not ok
        rel = float((out.double().cpu() - ref_out).norm() / ref_out.norm().clamp_min(1e-30))
        us = _time_call(lambda b=backend: decode_attention(*case.args, backend=b), on_gpu)
        rows.append((backend, err, rel, ok, us))
    print(f"{'backend':<14} {'max|err|':>10} {'rel err':>10} {'ok':>4} {'time':>12}")
    for backend, err, rel, ok, seconds in rows:
        print(f"{backend:<14} {err:>10.3g} {rel:>10.3g} {'yes' if ok else 'NO':>4} {_fmt_time(seconds):>12}")
    print(f"tolerance: 2 x torch_naive's error + 1 ulp = {tolerance:.3g}")
    if not on_gpu:
        print("note: CPU timings (Triton interpreter) say nothing about GPU speed")
    return 1 if failed else 0


def _time_call(fn, on_gpu: bool) -> float:
    """Seconds per call: median of triton's do_bench on a GPU, one wall-clock call on the CPU."""
    if on_gpu:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3
    fn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashdecode", description="Paged-KV decode attention kernels")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="run every backend on a random paged cache and check it against the reference",
        description="Every backend on one random paged KV cache (shuffled pages, NaN in the unused ones), checked "
        "against the float64 reference: a table of error, pass/fail and time. Without a GPU the Triton kernels run "
        "through Triton's interpreter on the CPU, with a smaller default case.",
    )  # fmt: skip
    run.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                     help="auto (default): cuda if torch sees a GPU, else cpu")
    run.add_argument("--seqlens", type=_seqlens,
                     help="comma-separated lengths, e.g. 0,17,4096 (default: 1,15,16,17,1000,4096,30000,8191 on a "
                     "GPU, 0,1,17,200 on the CPU)")
    run.add_argument("--heads", type=_heads, help="query/KV heads, e.g. 32/8 (default: 32/8 on a GPU, 8/2 on the CPU)")
    run.add_argument("--head-dim", type=int, help="head dim D (default: 128 on a GPU, 64 on the CPU)")
    run.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default: 16)")
    run.add_argument("--dtype", type=_dtype, default="bf16", metavar="{bf16,fp16,fp32}",
                     help="q and cache dtype (default: bf16)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random case (default: 0)")
    run.set_defaults(func=cmd_run)

    from .bench import add_bench_arguments, cmd_bench, cmd_plot

    bench = sub.add_parser(
        "bench", help="benchmark backends and peers; tables, JSON and plots",
        description="Each row checked against the float64 reference, then timed by CUDA-graph replay with the caches "
        "rotated out of L2 (and eagerly, host time included); GB/s, and % peak against the same process's fastest "
        "plain read of 4 GiB (triton_read). Writes "
        "results.json, results.md and plots under --out. Without a GPU: the 'tiny' preset through Triton's "
        "interpreter, whose timings mean nothing for GPU speed.",
    )  # fmt: skip
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)
    plot = sub.add_parser("plot", help="redraw the plots of a saved results.json")
    plot.add_argument("results", help="path to results.json")
    plot.add_argument("--out", help="folder for the PNGs (default: beside results.json)")
    plot.set_defaults(func=cmd_plot)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
