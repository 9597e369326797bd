"""Why the benchmark's eager column reads 10-15% slow on the large 32/8 rows for whichever of our backends is timed
second on a row (anchor-21ed679: 128 x 8192 32/8 `auto` 984 µs eager, the plan 1110, the same kernel, graph 973
both; with the order reversed the second one is slow). bench.run_rows on those rows with `auto`, `auto_plan`, `auto`
(three timings a row), with ``bench.time_gpu`` as it is and in variants:

- ``as-is``: the graph replays, then eager ``do_bench``;
- ``gc``: a garbage collection and a device sync between the two (the graph of the replays freed first);
- ``eager-first``: eager ``do_bench`` before the graph replays.

Run on the GPU machine: ``python scripts/eager_order_probe.py``. Prints graph / eager µs per row and backend.
"""

import gc
import sys

import torch
from triton.testing import do_bench, do_bench_cudagraph

from flashdecode import bench

ROWS = [bench.Row([8192] * 128, 32, 8), bench.Row([2048] * 256, 32, 8), bench.Row([4096] * 64, 32, 8)]


def time_gpu(fn, copies, variant):
    call, graph_call, captured = bench.cycling_calls(fn, copies)
    for _ in range(len(copies) + 2):
        call()
    if variant == "eager-first":
        eager = do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3
    graph = do_bench_cudagraph(graph_call, rep=50, return_mode="median") * 1e3
    if variant == "gc":
        gc.collect()
        torch.cuda.synchronize()
    if variant != "eager-first":
        eager = do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3
    return graph, eager, None, len(captured)


def main():
    variants = sys.argv[1:] or ["as-is", "gc", "eager-first"]
    for variant in variants:
        bench.time_gpu = lambda fn, copies, v=variant: time_gpu(fn, copies, v)
        # the same backend twice (the results list keeps both), auto_plan between
        results = bench.run_rows(ROWS, ["auto", "auto_plan", "auto"], "cuda", progress=False)
        for r in results:
            print(f"{variant:>12} {r['row']:<16} {r['backend']:<10} graph {r.get('graph_us') or 0:7.1f}  "
                  f"eager {r.get('eager_us') or 0:7.1f}  {r['status']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
