"""What pieces of the decode's inner loop cost: the plan timed with source variants of ``attend_range``, each in a
process of its own (a Triton kernel's cache key is fixed once computed, so a variant cannot replace it in a running
process). A variant is a list of text replacements in src/flashdecode/triton_common.py, applied to a copy of the
tree. Some variants are wrong in general and only bound a cost: without the masks, a row whose every tile is full
still gets the exact result (checked against float64); without the rescale of the state or the score scale, the
output is wrong and only the time means anything (no check, marked so). The baseline runs first and last: the
run's noise. (At fce2bca the set held the library with its tokens past the range clamped to its last token, which
needs no load mask, against the masked loads: a wash, reverted; docs/design.md, "Masks and clamped tokens".)

    python scripts/source_variant_probe.py [loop | start]   # on the GPU; writes $OUT/variants-<set>.jsonl, a table

loop (the default): the loop's masks, rescale and score scale, on rows of several shapes; start: the single pass's
length and q loads replaced by constants, on 256 x 256 12/2 (a variant's repeats listed in order).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = "flashdecode/triton_common.py"
SINGLE = "flashdecode/triton_single.py"
# every length a multiple of 128 tokens: the single pass's 32- and 128-token tiles and the splits' are all full
ROWS = [([256] * 256, 12, 2), ([1024] * 64, 12, 2), ([4096] * 16, 12, 2), ([65536], 12, 2), ([4096] * 64, 32, 8),
        ([2048] * 8, 28, 4), ([128], 28, 4)]  # fmt: skip

# replacements: (file under src/, old text, new text)
LOAD_MASKS = [
    (COMMON, "k = tl.load(K + k_row[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)",
     "k = tl.load(K + k_row[:, None] + offs_d[None, :])"),
    (COMMON, "v = tl.load(V + v_row[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)",
     "v = tl.load(V + v_row[:, None] + offs_d[None, :])"),
]  # fmt: skip
SCORE_MASK = [(COMMON, 's = tl.where(mask_n[None, :], s, float("-inf"))', "s = s")]
RESCALE = [
    (COMMON, "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)", "acc = acc + tl.dot(p.to(v.dtype), v)"),
    (COMMON, "l_tile = l_tile * alpha[:, None] + p", "l_tile = l_tile + p"),
]
SCALE = [(COMMON, "        else:\n            s = s * qk_scale\n", "        else:\n            s = s\n")]
# the single pass's start: its length a constant (exact on rows of 256-token sequences only), q a constant (wrong)
LENGTH = [(SINGLE, "        seqlen = tl.load(SEQLENS + seq * stride_sl)\n", "        seqlen = tl.full([], 256, tl.int32)\n")]
Q_CONST = [(COMMON, "    q = load_q_rows(Q + seq * stride_qb, stride_qt, stride_qh, row_tok, row_head, mask_h, offs_d, HEAD_DIM)\n",
            "    q = (tl.zeros([BLOCK_H, BLOCK_D], tl.float32) + 0.01).to(Q.dtype.element_ty)\n")]  # fmt: skip
# set "loop" (the default), (name, replacements, whether the output is still exact on ROWS)
VARIANTS = [
    ("library", [], True),
    ("no load masks", LOAD_MASKS, True),
    ("no masks", LOAD_MASKS + SCORE_MASK, True),
    ("no masks, no rescale", LOAD_MASKS + SCORE_MASK + RESCALE, False),
    ("no masks, no scale", LOAD_MASKS + SCORE_MASK + SCALE, False),
    ("library again", [], True),
]
# set "start": what the single pass's first loads cost, on 256 x 256 12/2 (each twice, the library three times)
START_ROWS = [([256] * 256, 12, 2)]
START = [("library", [], True), ("length a constant", LENGTH, True), ("q a constant", Q_CONST, False),
         ("both", LENGTH + Q_CONST, False)] * 2 + [("library", [], True)]  # fmt: skip


def variant_tree(replacements, where):
    """A copy of src/ with the replacements made (each must match its file exactly once)."""
    dst = os.path.join(where, "src")
    shutil.copytree(os.path.join(ROOT, "src"), dst, ignore=shutil.ignore_patterns("__pycache__"))
    for name, old, new in replacements:
        path = os.path.join(dst, name)
        text = open(path).read()
        if text.count(old) != 1:
            sys.exit(f"replacement matches {name} {text.count(old)} times, not once: {old!r}")
        open(path, "w").write(text.replace(old, new))
    return dst


SETS = {"loop": (VARIANTS, ROWS), "start": (START, START_ROWS)}


def worker(check: bool, rows):
    """One process: the plan on rows, checked (or not) and timed; one JSON line a row on stdout."""
    import itertools

    import torch

    import flashdecode
    from flashdecode import decode_attention, plan_decode

    # the variant's tree, not the checkout's (PYTHONPATH comes before the editable install)
    assert flashdecode.__file__.startswith(os.environ["PYTHONPATH"].split(os.pathsep)[0]), flashdecode.__file__
    from flashdecode.bench import probe_case, probe_graph_us

    for seqlens, hq, hkv in rows:
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
        return worker(sys.argv[2] == "1", SETS[sys.argv[3]][1])
    which = sys.argv[1] if len(sys.argv) > 1 else "loop"
    if which not in SETS:
        sys.exit(f"usage: python scripts/source_variant_probe.py [{' | '.join(SETS)}], got {which!r}")
    variants = SETS[which][0]
    results = {}
    with open(os.path.join(os.environ.get("OUT", "."), f"variants-{which}.jsonl"), "w") as log:
        for name, replacements, exact in variants:
            with tempfile.TemporaryDirectory() as tmp:
                src = variant_tree(replacements, tmp)
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
                proc = subprocess.run([sys.executable, __file__, "--worker", "1" if exact else "0", which], env=env,
                                      capture_output=True, text=True)  # fmt: skip
            if proc.returncode:
                sys.exit(f"{name}: {proc.stderr[-2000:]}")
            for line in proc.stdout.splitlines():
                rec = dict(json.loads(line), variant=name, checked=exact)
                log.write(json.dumps(rec) + "\n")
                results.setdefault(rec["row"], {}).setdefault(name, []).append(rec["us"])
            print(f"{name}: done", flush=True)
    names = list(dict.fromkeys(v[0] for v in variants))
    print(f"\n{'row (graph µs)':<18}" + "".join(f"{n:>22}" for n in names))
    for row, res in results.items():
        print(f"{row:<18}" + "".join(f"{' / '.join(f'{u:.2f}' for u in res.get(n, [])):>22}" for n in names))
    print("(unchecked variants: outputs wrong, times only)")


if __name__ == "__main__":
    main()
