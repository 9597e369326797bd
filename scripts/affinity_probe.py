"""Does the bench's eager column depend on the CPU the process runs on? warm-12e01d7/eager-check saw two levels
(~30 and ~41 µs) on the same row between processes, for the plan and `auto` alike, with graph times unchanged.
The answer (docs/benchmarks/h200-2026-11-29/affinity-25c3857): no. Not the CPU, FlashInfer being loaded or the address
layout, but the host's pace, slow on code that is not ours too; hence ``host_pace`` in every bench record.

The parent prints the host's topology (NUMA nodes, the GPU's node), then starts one child process per setting:
unpinned, pinned to one NUMA node's cores, and pinned to single cores. Each child times a few rows with the bench's
own loop (bench.run_rows: graph and eager medians, rotated caches), then the host time of a queued call, and reports
the CPUs its main thread was seen on, beside two yardsticks of the process's pace that run none of our code (a torch
launch and a piece of plain Python). One JSON line per child and row in $OUT/affinity.jsonl. Under
`setarch $(uname -m) -R` every child gets the same address layout (no ASLR).

Run on the GPU machine:

    python scripts/affinity_probe.py [--unpinned 4] [--cores 0,4,8,12] [--backends auto_plan,auto] [--imports flashinfer]
"""

import argparse
import glob
import json
import os
import subprocess
import sys

ROWS = "4x16384-12/2,8x2048-28/4,1x8192-32/32"
BACKENDS = "auto_plan,auto"


def node_cpus() -> dict[int, str]:
    """NUMA node -> its cpulist text, from sysfs ({0: all} where sysfs has no nodes)."""
    nodes = {}
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*/cpulist")):
        nodes[int(path.split("/node")[-1].split("/")[0])] = open(path).read().strip()
    return nodes or {0: f"0-{os.cpu_count() - 1}"}


def parse_cpulist(text: str) -> list[int]:
    cpus = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def current_cpu() -> int:
    """The CPU this process's main thread last ran on (/proc/self/stat field 39)."""
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[36])


def child(pin: str, rows_text: str, backends: list[str], imports: list[str]) -> None:
    import importlib

    import torch

    for name in imports:
        importlib.import_module(name)

    from eager_bench_probe import parse_row  # this folder is on sys.path when run as a script

    from flashdecode import bench, decode_attention
    from flashdecode.cases import random_paged_case

    seen = {current_cpu()}
    for row in [parse_row(text) for text in filter(None, rows_text.split(","))]:
        for rec in bench.run_rows([row], backends, "cuda", progress=False):
            seen.add(current_cpu())
            print("REC " + json.dumps({"pin": pin, "row": rec["row"], "backend": rec["backend"],
                                       "status": rec["status"], "graph_us": rec.get("graph_us"),
                                       "eager_us": rec.get("eager_us")}), flush=True)
    c = random_paged_case([2048] * 8, 28, 4, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
    out = torch.empty_like(c.q)
    for _ in range(20):
        decode_attention(*c.args, out=out)
    rounds = [bench.host_us_per_call(lambda: decode_attention(*c.args, out=out), 500) for _ in range(5)]
    pace = bench.measure_host_pace("cuda")  # the same process's pace on work that runs none of our code
    seen.add(current_cpu())
    print("REC " + json.dumps({"pin": pin, "row": "8x2048 28/4", "backend": "auto", "host_us_queued": min(rounds),
                               "host_rounds_us": rounds, "torch_add_us": pace["torch_op_us"],
                               "python_us": pace["python_us"], "cpus_seen": sorted(seen)}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unpinned", type=int, default=4)
    parser.add_argument("--cores", default="", help="single cores to pin to (default: the first and middle CPU "
                        "of each NUMA node)")
    parser.add_argument("--rows", default=ROWS, help="rows each child times (empty: the host time alone)")
    parser.add_argument("--backends", default=BACKENDS, help="timed in this order in each child; a peer "
                        "(flashinfer_tc, ...) is loaded into the process with it (scripts/gpu_env.sh)")
    parser.add_argument("--imports", default="", help="modules each child imports first without running them "
                        "(e.g. flashinfer), comma-separated")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child, opts.rows, opts.backends.split(","), [m for m in opts.imports.split(",") if m])
        return

    from flashdecode.bench import ProbeLog

    nodes = node_cpus()
    gpu_node = "?"
    for path in glob.glob("/sys/bus/pci/drivers/nvidia/*/numa_node"):
        gpu_node = open(path).read().strip()
    print(f"NUMA nodes {nodes}; the GPU's node {gpu_node}; this process may run on {sorted(os.sched_getaffinity(0))}",
          flush=True)
    settings = [("unpinned", None)] * opts.unpinned
    settings += [(f"node{n}", parse_cpulist(text)) for n, text in nodes.items()]
    if opts.cores:
        singles = [int(c) for c in opts.cores.split(",")]
    else:
        singles = [cpu for text in nodes.values() for cpu in (lambda c: (c[0], c[len(c) // 2]))(parse_cpulist(text))]
    settings += [(f"cpu{c}", [c]) for c in singles]

    log = ProbeLog("affinity")
    columns = [f"{b[:9]:>9} {r.split('-')[0][:8]:>8}" for r in filter(None, opts.rows.split(","))
               for b in opts.backends.split(",")]
    log.line(f"{'setting':<10} {'cpus seen':<12} " + " ".join(columns) + "  host/call torch add python")
    log.line("(eager µs per row and backend; graph µs in the JSON; host µs per queued call of 8 x 2048 28/4 `auto`, "
             "of a 1-element torch add, and of a fixed piece of Python)")
    for i, (name, cpus) in enumerate(settings):
        pin = name if name != "unpinned" else f"unpinned{i}"
        command = [sys.executable, __file__, "--child", pin, "--rows", opts.rows, "--backends", opts.backends, "--imports", opts.imports]
        proc = subprocess.run(command, capture_output=True, text=True,
                              preexec_fn=(lambda c=cpus: os.sched_setaffinity(0, c)) if cpus else None)
        recs = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("REC ")]
        for rec in recs:
            log.record(rec)
        if proc.returncode or not recs:
            log.line(f"{pin:<10} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
            continue
        eager = " ".join(f"{r.get('eager_us') or 0:18.1f}" for r in recs if "eager_us" in r)
        last = recs[-1]
        log.line(f"{pin:<10} {','.join(map(str, last['cpus_seen'])):<12} {eager}  {last['host_us_queued']:6.1f} "
                 f"{last['torch_add_us']:6.2f} {last['python_us']:6.3f}")
    log.close()


if __name__ == "__main__":
    main()
