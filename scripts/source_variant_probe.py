"""What pieces of the decode's inner loop cost: the plan timed with source variants of ``attend_range``, each in a
process of its own (a Triton kernel's cache key is fixed once computed, so a variant cannot replace it in a running
process). A variant is a list of text replacements in src/flashdecode/triton_common.py, applied to a copy of the
tree. Some variants are wrong in general and only bound a cost: without the masks, a row whose every tile is full
still gets the exact result (checked against float64); without the rescale of the state or the score scale, the
output is wrong and only the time means anything (no check, marked so). The baseline runs first and last: the
run's noise. (At fce2bca the set held the library with its tokens past the range clamped to its last token, which
needs no load mask, against the masked loads: a wash, reverted; docs/design.md, "Masks and clamped tokens".)

    python scripts/source_variant_probe.py    # on the GPU machine; writes $OUT/variants.jsonl, a table last
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = "flashdecode/triton_common.py"
# every length a multiple of 128 tokens: the single pass's 32- and 128-token tiles and the splits' are all full
ROWS = [([256] * 256, 12, 2), ([1024] * 64, 12, 2), ([4096] * 16, 12, 2), ([65536], 12, 2), ([4096] * 64, 32, 8),
        ([2048] * 8, 28, 4), ([128], 28, 4)]  # fmt: skip

LOAD_MASKS = [
    ("k = tl.load(K + k_row[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)",
     "k = tl.load(K + k_row[:, None] + offs_d[None, :])"),
    ("v = tl.load(V + v_row[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)",
     "v = tl.load(V + v_row[:, None] + offs_d[None, :])"),
]  # fmt: skip
SCORE_MASK = [('s = tl.where(mask_n[None, :], s, float("-inf"))', "s = s")]
RESCALE = [
    ("acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)", "acc = acc + tl.dot(p.to(v.dtype), v)"),
    ("l_tile = l_tile * alpha[:, None] + p", "l_tile = l_tile + p"),
]
SCALE = [("        else:\n            s = s * qk_scale\n", "        else:\n            s = s\n")]
# (name, replacements, whether the output is still exact on ROWS)
VARIANTS = [
    ("library", [], True),
    ("no load masks", LOAD_MASKS, True),
    ("no masks", LOAD_MASKS + SCORE_MASK, True),
    ("no masks, no rescale", LOAD_MASKS + SCORE_MASK + RESCALE, False),
    ("no masks, no scale", LOAD_MASKS + SCORE_MASK + SCALE, False),
    ("library again", [], True),
]


def variant_tree(replacements, where):
    """A copy of src/ with the replacements made in TARGET (each must match exactly once)."""
    dst = os.path.join(where, "src")
    shutil.copytree(os.path.join(ROOT, "src"), dst, ignore=shutil.ignore_patterns("__pycache__"))
    path = os.path.join(dst, TARGET)
    text = open(path).read()
    for old, new in replacements:
        if text.count(old) != 1:
            sys.exit(f"replacement matches {text.count(old)} times, not once: {old!r}")
        text = text.replace(old, new)
    open(path, "w").write(text)
    return dst


def worker(check: bool):
    """One process: the plan on ROWS, checked (or not) and timed; one JSON line a row on stdout."""
    import itertools

    import torch

    import flashdecode
    from flashdecode import decode_attention, plan_decode

    # the variant's tree, not the checkout's (PYTHONPATH comes before the editable install)
    assert flashdecode.__file__.startswith(os.environ["PYTHONPATH"].split(os.pathsep)[0]), flashdecode.__file__
    from flashdecode.bench import probe_case, probe_graph_us

    for seqlens, hq, hkv in ROWS:
        case, ref, copies = probe_case(seqlens, hq, hkv)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        out = torch.empty_like(case.q)
        decode_attention(*case.args, out=out, plan=plan)
        err = (out.double() - ref).abs().max().item()
        if check and not err < 2e-2:
            sys.exit(f"{len(seqlens)}x{seqlens[0]} {hq}/{hkv}: error {err:.3g} against float64")
        it = itertools.cycle(copies)
        us = probe_graph_us(lambda: decode_attention(*next(it).args, out=out, plan=plan))
        print(json.dumps(dict(row=f"{len(seqlens)}x{seqlens[0]} {hq}/{hkv}", us=round(us, 2), err=err)), flush=True)


def main():
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2] == "1")
    results = {}
    with open(os.path.join(os.environ.get("OUT", "."), "variants.jsonl"), "w") as log:
        for name, replacements, exact in VARIANTS:
            with tempfile.TemporaryDirectory() as tmp:
                src = variant_tree(replacements, tmp)
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
                proc = subprocess.run([sys.executable, __file__, "--worker", "1" if exact else "0"], env=env,
                                      capture_output=True, text=True)  # fmt: skip
            if proc.returncode:
                sys.exit(f"{name}: {proc.stderr[-2000:]}")
            for line in proc.stdout.splitlines():
                rec = dict(json.loads(line), variant=name, checked=exact)
                log.write(json.dumps(rec) + "\n")
                results.setdefault(rec["row"], {})[name] = rec["us"]
            print(f"{name}: done", flush=True)
    names = [v[0] for v in VARIANTS]
    print(f"\n{'row (graph µs)':<18}" + "".join(f"{n:>22}" for n in names))
    for row, res in results.items():
        print(f"{row:<18}" + "".join(f"{res.get(n, float('nan')):22.2f}" for n in names))
    print("(no rescale, no scale: outputs wrong, times only)")


if __name__ == "__main__":
    main()
