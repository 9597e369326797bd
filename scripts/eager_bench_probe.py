"""Why the benchmark's eager column of our backends is erratic (anchor-d5684e0: `auto` 16 x 4096 12/2 502 µs eager
against 23 in a graph, 64 x 1024 12/2 33 µs in the same run): the benchmark's own loop (bench.run_rows, the
anchor's backends, rotated caches) on a few anchor rows, with each eager timing watched:

- replay hits / misses of the cached launcher during the eager do_bench (a miss runs the host code every call);
- the caching allocator's cudaMalloc / cudaFree counts and retries during it (a cudaFree synchronises the device);
- the host time per queued call right after, and whether a Triton launch hook is set.

Run on the GPU machine (the peers need scripts/gpu_env.sh):

    python scripts/eager_bench_probe.py [--rows 256x256-12/2,16x4096-12/2,... | anchor] [--backends auto,...]
"""

import argparse

import torch

from flashdecode import bench, launcher

DEFAULT_ROWS = "256x256-12/2,64x1024-12/2,16x4096-12/2,1x131072-12/2,1x128-28/4,8x128-28/4,8x2048-28/4,128x8192-32/8"
DEFAULT_BACKENDS = "auto,auto_plan,flashinfer,flashinfer_tc,sglang_triton,vllm_triton"


def parse_row(text):
    shape, heads = text.split("-")
    b, s = (int(x) for x in shape.split("x"))
    hq, hkv = (int(x) for x in heads.split("/"))
    return bench.Row([s] * b, hq, hkv)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS)
    parser.add_argument("--backends", default=DEFAULT_BACKENDS)
    opts = parser.parse_args()
    rows = bench.PRESETS["anchor"]() if opts.rows == "anchor" else [parse_row(r) for r in opts.rows.split(",")]
    watch = {"hits": 0, "misses": 0}
    real_replay = launcher.replay

    def counting_replay(*args, **kwargs):
        ok = real_replay(*args, **kwargs)
        watch["hits" if ok else "misses"] += 1
        return ok

    launcher.replay = counting_replay  # api calls launcher.replay through the module
    real_make_backend = bench.make_backend

    def named_make_backend(name, case, row):
        print(f"{row.name():>16} {name}", flush=True)
        return real_make_backend(name, case, row)

    bench.make_backend = named_make_backend

    def watched_time_gpu(fn, copies):
        """bench.time_gpu's steps (warm-up, graph, eager), the eager one watched, then a second eager timing."""
        from triton import knobs
        from triton.testing import do_bench, do_bench_cudagraph

        call, graph_call, captured = bench.cycling_calls(fn, copies)
        for _ in range(len(copies) + 2):
            call()
        graph_us = do_bench_cudagraph(graph_call, rep=50, return_mode="median") * 1e3
        before = torch.cuda.memory_stats()
        watch.update(hits=0, misses=0)
        eager_us = do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3
        after = torch.cuda.memory_stats()
        hits, misses = watch["hits"], watch["misses"]
        again = do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3
        host = bench.host_us_per_call(call, 200)
        hooked = launcher._hooked(knobs.runtime.launch_enter_hook) or launcher._hooked(knobs.runtime.launch_exit_hook)
        delta = {k: after.get(k, 0) - before.get(k, 0)
                 for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")}
        print(f"    graph {graph_us:7.1f}  eager {eager_us:7.1f} again {again:7.1f}  replay hits {hits:5d} "
              f"misses {misses:4d}  cudaMalloc {delta['num_device_alloc']:3d} cudaFree {delta['num_device_free']:3d} "
              f"retries {delta['num_alloc_retries']:2d}  host/queued call {host:6.1f} µs  hook {hooked}", flush=True)
        return graph_us, eager_us, None, len(captured)

    bench.time_gpu = watched_time_gpu
    # one run_rows call, as the benchmark makes it: every backend on a row, row after row, in one process
    for rec in bench.run_rows(rows, opts.backends.split(","), "cuda", progress=False):
        if rec["status"] != "ok":
            print(f"{rec['row']} {rec['backend']}: {rec['status']} {rec.get('reason', '')}")


if __name__ == "__main__":
    main()
