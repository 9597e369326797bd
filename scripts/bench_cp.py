"""Context-parallel decode benchmark: one long sequence split across the GPUs of one host (issue 8).

    python -m torch.distributed.run --standalone --nproc_per_node N scripts/bench_cp.py --out DIR
    python scripts/bench_cp.py --summarize DIR      # DIR/cp-N*.json -> DIR/results.json + results.md, prints it

Every rank builds the same seeded paged cache (default: 1 sequence of 1,048,576 tokens, 64 query / 8 KV heads,
head_dim 128, bf16, page 16) and keeps its contiguous shard. It first times plain ``decode_attention`` on the
whole sequence on its own GPU (the 1-GPU baseline, same process), then ``decode_attention_cp`` over NCCL, and
checks the result against the 1-GPU result and a float64 reference computed on the GPU. Times are medians of CUDA
events around each call after warm-up, eagerly and as CUDA-graph replays of the whole step (local kernel,
packing, all-gather, merge). The parts are timed alone as well: the local kernel, the all-gather of the packed
[B, Hq, D + 1] fp32 buffer, the merge. Bandwidth per GPU = the rank's K+V bytes / step time.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

if not torch.cuda.is_available():
    # the CPU smoke run: Triton kernels (the "triton" merge) through the interpreter, set before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")

import flashdecode  # noqa: E402
from flashdecode.bench import measure_read_bandwidth, provenance  # noqa: E402
from flashdecode.cases import random_paged_case  # noqa: E402
from flashdecode.distributed import _all_gather, decode_attention_cp, merge_gathered, shard_paged_cache  # noqa: E402
from flashdecode.reference import gather_sequence  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlen", type=int, default=1 << 20)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", default="64/8", help="Hq/Hkv")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--layout", default="contiguous", choices=["contiguous", "round_robin"])
    p.add_argument("--backend", default="auto", help="local backend (flashdecode.BACKENDS)")
    p.add_argument("--iters", type=int, default=200, help="timed calls per measurement")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--out", default="bench-cp")
    p.add_argument("--summarize", metavar="DIR", help="combine DIR/cp-N*.json into DIR/results.{json,md}")
    return p.parse_args(argv)


def time_us(fn, iters, warmup, graph):
    """(median µs per call, note): CUDA events around each call; graph=True captures fn once and replays it.

    Collective: every rank must call this with the same fn sequence (the all-gathers inside pair up).
    """
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        # the CPU smoke run (gloo): wall clock, no graphs; its numbers mean nothing
        if graph:
            return None, "no CUDA graph on the CPU"
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e6, None
    run, note = fn, None
    if graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            # thread_local: the NCCL watchdog thread may query events while this thread captures
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                fn()
            run = g.replay
            for _ in range(3):
                run()
        except Exception as e:  # capture refused: report eager only
            torch.cuda.synchronize()
            return None, f"no CUDA graph: {type(e).__name__}: {str(e)[:120]}"
    torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3, note


def reference_fp64(q, k_cache, v_cache, seqlens, block_table):
    """Float64 decode attention on the GPU, one KV head at a time (a [L, D] fp64 slice, not [L, Hq, D])."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.zeros(batch, num_q_heads, head_dim, dtype=torch.float64, device=q.device)
    for b, seqlen in enumerate(seqlens.tolist()):
        if seqlen == 0:
            continue
        k = gather_sequence(k_cache, block_table[b], seqlen)  # [L, Hkv, D] in the cache dtype
        v = gather_sequence(v_cache, block_table[b], seqlen)
        for h in range(num_kv_heads):
            qh = q[b, h * group : (h + 1) * group].double()  # [G, D]
            scores = qh @ k[:, h].double().T / math.sqrt(head_dim)  # [G, L]
            out[b, h * group : (h + 1) * group] = torch.softmax(scores, dim=-1) @ v[:, h].double()
    return out


def max_abs(a, b):
    return float((a.double() - b.double()).abs().max())


def run(args):
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        # a CPU smoke run of this script (gloo), to check it end to end on a machine without a GPU
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    hq, hkv = (int(x) for x in args.heads.split("/"))
    log = (lambda *a: print(f"[rank 0/{world}]", *a, flush=True)) if rank == 0 else (lambda *a: None)

    # the same seeded cache on every rank (drawn on the GPU), then this rank's shard
    case = random_paged_case([args.seqlen] * args.batch, hq, hkv, args.head_dim, args.page_size, torch.bfloat16,
                             device, spare_pages=1, seed=0)  # fmt: skip
    shard = shard_paged_cache(*case.args[1:], world, layout=args.layout)[rank]
    kv_bytes = lambda k, n: 2 * n * k.shape[2] * k.shape[3] * k.element_size()  # noqa: E731
    local_tokens = int(shard.cache_seqlens.sum())
    log(f"cache {kv_bytes(case.k_cache, args.seqlen * args.batch) / 1e9:.2f} GB K+V, {local_tokens} tokens per rank")

    # 1-GPU baseline on this GPU: decode_attention over the whole sequence, no communication
    whole = lambda: flashdecode.decode_attention(*case.args, backend=args.backend, return_lse=True)  # noqa: E731
    single_out, single_lse = whole()
    base_graph, base_note = time_us(whole, args.iters, args.warmup, graph=True)
    base_eager, _ = time_us(whole, args.iters, args.warmup, graph=False)
    log(f"1 GPU: graph {base_graph} us, eager {base_eager:.1f} us {base_note or ''}")

    # correctness first: cp against the 1-GPU result and the float64 reference
    rec = dict(
        world=world, rank=rank, local_tokens=local_tokens, local_kv_bytes=kv_bytes(shard.k_cache, local_tokens),
        baseline_graph_us=base_graph, baseline_eager_us=base_eager, notes=[n for n in [base_note] if n],
    )  # fmt: skip
    ref = reference_fp64(case.q, case.k_cache, case.v_cache, case.cache_seqlens, case.block_table)
    err_single = max_abs(single_out, ref)
    # at the output's own scale (no clamp to 1: over 1M random tokens |out| is ~1e-3, an ulp at 1.0 would pass noise)
    ulp = torch.finfo(torch.bfloat16).eps * float(ref.abs().max())
    # gate: the 1-GPU kernel's error twice over, plus the bf16 rounding of each rank's partial and one ulp
    rec.update(err_single_vs_fp64=err_single, tolerance=2 * err_single + 2 * ulp, checks={})
    for merge in ("triton", "torch"):
        out, lse = decode_attention_cp(case.q, *shard.args, backend=args.backend, merge=merge, return_lse=True)
        err_ref = max_abs(out, ref)
        finite = torch.isfinite(single_lse)
        rec["checks"][merge] = dict(
            err_vs_1gpu=max_abs(out, single_out), lse_err_vs_1gpu=max_abs(lse[finite], single_lse[finite]),
            err_vs_fp64=err_ref, passed=max_abs(out, single_out) <= rec["tolerance"] and err_ref <= rec["tolerance"],
        )  # fmt: skip
        log(f"merge {merge}: {rec['checks'][merge]}")
    case = whole = single_out = ref = None  # free the cache before the timings
    torch.cuda.empty_cache()

    # timings: the step (both merges), then its parts alone
    B, D = args.batch, args.head_dim
    packed = torch.zeros(B, hq, D + 1, dtype=torch.float32, device=device)
    gathered = torch.zeros(world * B, hq, D + 1, dtype=torch.float32, device=device)
    q = torch.randn(B, hq, D, dtype=torch.bfloat16, device=device, generator=torch.Generator(device).manual_seed(1))
    parts = {
        "step_triton_merge": lambda: decode_attention_cp(q, *shard.args, backend=args.backend, merge="triton"),
        "step_torch_merge": lambda: decode_attention_cp(q, *shard.args, backend=args.backend, merge="torch"),
        "local_kernel": lambda: flashdecode.decode_attention(q, *shard.args, backend=args.backend, return_lse=True),
        "all_gather": lambda: _all_gather(gathered, packed, None),
        "merge_triton": lambda: merge_gathered(gathered.view(world, B, hq, D + 1), torch.bfloat16, merge="triton"),
        "merge_torch": lambda: merge_gathered(gathered.view(world, B, hq, D + 1), torch.bfloat16, merge="torch"),
    }
    for name, fn in parts.items():
        for graph in (True, False):
            us, note = time_us(fn, args.iters, args.warmup, graph)
            rec[f"{name}_{'graph' if graph else 'eager'}_us"] = us
            if note:
                rec["notes"].append(f"{name}: {note}")
        log(f"{name}: graph {rec[f'{name}_graph_us']} us, eager {rec[f'{name}_eager_us']:.1f} us")
    rec["comm_bytes_received"] = world * B * hq * (D + 1) * 4
    rec["torch_sum_gbps"] = measure_read_bandwidth(device) / 1e9 if rank == 0 and device.type == "cuda" else None

    records = [None] * world
    dist.all_gather_object(records, rec)
    if rank == 0:
        on_gpu = device.type == "cuda"
        meta = provenance(device.type, None, "CUDA events per call, median" if on_gpu else "CPU wall clock (smoke run)",
                          (rec["torch_sum_gbps"] or 0) * 1e9)  # fmt: skip
        meta.update(vars(args), nccl=_nccl_version() if on_gpu else None, nvls=os.environ.get("NCCL_NVLS_ENABLE"))
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"cp-N{world}.json")
        with open(path, "w") as f:
            json.dump(dict(meta=meta, ranks=records), f, indent=1)
        log(f"wrote {path}")
    dist.destroy_process_group()


def _nccl_version():
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def row(data):
    """One summary row from a run's per-rank records: the slowest rank decides the step."""
    ranks, world = data["ranks"], len(data["ranks"])
    r0 = ranks[0]

    def worst(key):
        vals = [r[key] for r in ranks if r.get(key) is not None]
        return max(vals) if vals else None

    step_key = "step_triton_merge_graph_us" if worst("step_triton_merge_graph_us") else "step_triton_merge_eager_us"
    base_key = "baseline_graph_us" if r0.get("baseline_graph_us") else "baseline_eager_us"
    step, gather = worst(step_key), worst("all_gather_graph_us" if "graph" in step_key else "all_gather_eager_us")
    return dict(
        gpus=world, timing="graph" if "graph" in step_key else "eager",
        tokens_per_gpu=max(r["local_tokens"] for r in ranks),
        step_us=step, step_eager_us=worst("step_triton_merge_eager_us"),
        step_torch_merge_us=worst("step_torch_merge_graph_us") or worst("step_torch_merge_eager_us"),
        local_kernel_us=worst("local_kernel_graph_us") or worst("local_kernel_eager_us"),
        all_gather_us=gather, merge_us=worst("merge_triton_graph_us") or worst("merge_triton_eager_us"),
        collective_share=gather / step if step and gather else None,
        gbps_per_gpu=min(r["local_kv_bytes"] / (step * 1e-6) / 1e9 for r in ranks) if step else None,
        baseline_1gpu_us=r0[base_key], speedup=r0[base_key] / step if step else None,
        err_vs_1gpu=max(r["checks"]["triton"]["err_vs_1gpu"] for r in ranks),
        err_vs_fp64=r0["checks"]["triton"]["err_vs_fp64"], tolerance=r0["tolerance"],
        passed=all(c["passed"] for r in ranks for c in r["checks"].values()),
        notes=sorted({n for r in ranks for n in r["notes"]}),
    )  # fmt: skip


def summarize(out_dir):
    runs = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "cp-N*.json"))):
        with open(path) as f:
            data = json.load(f)
        runs[len(data["ranks"])] = data
    if not runs:
        print(f"no cp-N*.json under {out_dir}")
        return 1
    rows = [row(runs[n]) for n in sorted(runs)]
    meta = runs[max(runs)]["meta"]
    how = "CUDA-graph replays" if rows[-1]["timing"] == "graph" else "eager calls"
    fmt = lambda x, p=1: "—" if x is None else f"{x:.{p}f}"  # noqa: E731
    lines = [
        f"# Context-parallel decode, {meta.get('gpu')} ×N (commit {str(meta.get('commit'))[:10]}, torch "
        f"{meta.get('torch')}, triton {meta.get('triton')}, NCCL {meta.get('nccl')}, NVLS {meta.get('nvls')})",
        "",
        f"1 sequence of {meta['seqlen']:,} tokens × batch {meta['batch']}, heads {meta['heads']}, head_dim "
        f"{meta['head_dim']}, bf16, page {meta['page_size']}, {meta['layout']} shards, local backend "
        f"{meta['backend']}, {meta['timing']}. step µs: {how} "
        "of the whole step (local kernel, pack, all-gather, Triton merge); parts timed alone the same way; the "
        "slowest rank counts; collective share = all-gather alone / step; speed-up = 1-GPU decode_attention on the "
        f"whole sequence (same process) / step. Read ceiling (torch.sum, 4 GiB): "
        f"{fmt(meta.get('torch_sum_gbps', meta.get('read_bandwidth_gbps')), 0)} GB/s.",
        "",
        "| GPUs | tokens/GPU | step µs | eager µs | torch-merge µs | local kernel µs | all-gather µs | merge µs "
        "| collective share | GB/s per GPU | 1-GPU µs | speed-up | err vs 1 GPU | err vs fp64 | gate |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        share = "—" if r["collective_share"] is None else f"{100 * r['collective_share']:.1f}%"
        lines.append(
            f"| {r['gpus']} | {r['tokens_per_gpu']:,} | {fmt(r['step_us'])} | {fmt(r['step_eager_us'])} "
            f"| {fmt(r['step_torch_merge_us'])} | {fmt(r['local_kernel_us'])} | {fmt(r['all_gather_us'])} "
            f"| {fmt(r['merge_us'])} | {share} | {fmt(r['gbps_per_gpu'], 0)} | {fmt(r['baseline_1gpu_us'])} "
            f"| {fmt(r['speedup'], 2)}× | {r['err_vs_1gpu']:.2e} | {fmt(r['err_vs_fp64'], 5)} "
            f"| {'pass' if r['passed'] else 'FAIL'} |"
        )
    notes = sorted({n for r in rows for n in r["notes"]})
    if notes:
        lines += ["", "Notes: " + "; ".join(notes)]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(dict(rows=rows, runs={str(n): runs[n] for n in runs}), f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    args = parse_args()
    sys.exit(summarize(args.summarize) if args.summarize else run(args))
