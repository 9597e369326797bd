"""Break checks of the Gluon single pass's GPU tests: each mutation below is written into gluon_single.py, the GPU
numerics tests run against it, and the file is restored; every mutation must make them fail.

    python scripts/break_gluon.py [--out DIR]     (on a GPU; about 15 s a mutation)

Prints one line a mutation (caught or MISSED) and writes DIR/break_gluon.json. Exit status 1 when one is missed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "flashdecode" / "gluon_single.py"
TESTS = "tests/test_gluon_single.py"
# (name, text in gluon_single.py, its replacement, what the tests should see[, the -k of the GPU tests that must see
# it: a mutation the CPU tests also catch proves nothing of the GPU tests otherwise])
MUTATIONS = [
    ("no length mask on s", 's = gl.where((first + i * BLOCK_N + offs_n < end)[None, :], s, float("-inf"))', "s = s",
     "zero-filled rows past a length enter the softmax sum"),
    ("no rescale of acc", "v, acc * alpha[:, None])", "v, acc)", "the output of a changed running max is off"),
    ("V read with K's strides", "_issue(v_ring.index(ahead % STAGES), V, next_pages, tok, end, stride_vp, stride_vt,",
     "_issue(v_ring.index(ahead % STAGES), V, next_pages, tok, end, stride_kp, stride_kt,",
     "a V pool of its own strides is read wrong"),
    ("empty rows divided by 0", "out = acc / gl.where(empty, 1.0, l_i)[:, None]", "out = acc / l_i[:, None]",
     "a length-0 row gives NaN, not 0"),
    ("LSE in log2 units", "(m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)",
     "(m_i + gl.log2(gl.where(empty, 1.0, l_i))))", "the LSE is off by a factor"),
    ("page id of the next step skipped", "tok = tok + BLOCK_N\n", "tok = tok + 2 * BLOCK_N\n",
     "every step past the prologue reads the wrong pages"),
    ("fp8: k_scale dropped", "qk_scale = qk_scale * K_SCALE", "qk_scale = qk_scale",
     "an fp8 cache's scores miss their scale"),
    ("fp8: v_scale dropped", "out = out * V_SCALE", "out = out", "an fp8 cache's output misses its scale"),
    ("fp8: tensor k_scale dropped", "qk_scale = qk_scale * gl.load(K_SCALE)", "qk_scale = qk_scale",
     "scores miss a device-tensor k_scale"),
    ("fp8: tensor v_scale dropped", "out = out * gl.load(V_SCALE)", "out = out",
     "the output misses a device-tensor v_scale"),
    ("fp8: q not saturated", "q = gl.minimum(gl.maximum(q.to(gl.float32), -65504.0), 65504.0).to(gl.float16)",
     "q = q.to(gl.float16)", "q past fp16's range becomes inf, the softmax NaN"),
    ("fp8 v_perm: output columns not un-permuted",
     "offs_do = ((offs_do >> 3) & 3) * 32 + (offs_do & 7) * 4 + (offs_do >> 5)", "offs_do = offs_do",
     "v_perm's head-dim columns land permuted"),
    ("splits: every split walks from token 0", "first = gl.program_id(2) * chunk", "first = 0",
     "the splits repeat the first chunk", "splits"),
    ("splits: partial LSE in log2 units", "p_rows = (seq * SPLITS", "lse = lse / LN2\n            p_rows = (seq * SPLITS",
     "the combine weighs the partials wrong", "splits"),
    ("splits: every split's partial in one row", "p_rows = (seq * SPLITS + gl.program_id(2))", "p_rows = (seq * SPLITS)",
     "the partials overwrite each other", "splits"),
    ("fp8: the plan's gate shut", "GLUON_FP8_MIN_PER_SM = 1.4", "GLUON_FP8_MIN_PER_SM = 100.0",
     "the planned fp8 call no longer reaches the kernel", "plan_takes_it_for_an_fp8_cache"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=".", help="folder for break_gluon.json")
    args = parser.parse_args()
    original = SRC.read_text()
    results = []
    try:
        for name, old, new, why, *only in MUTATIONS:
            assert original.count(old) >= 1, f"mutation {name!r}: {old!r} is not in {SRC.name}"
            SRC.write_text(original.replace(old, new))
            run = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", TESTS, "-k",
                 only[0] if only else "not compiles"],
                capture_output=True, text=True,
            )  # fmt: skip
            caught = run.returncode == 1  # 1: tests failed (2-5: the run itself broke, which proves nothing)
            tail = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-200:]
            results.append({"mutation": name, "expect": why, "caught": caught, "rc": run.returncode, "tail": tail})
            print(f"{'caught' if caught else 'MISSED'}  {name}: {tail}", flush=True)
    finally:
        SRC.write_text(original)
    clean = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TESTS],
                           capture_output=True, text=True)  # fmt: skip
    print(f"unmutated: rc {clean.returncode}, {clean.stdout.strip().splitlines()[-1]}")
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    summary = {"mutations": results, "unmutated_rc": clean.returncode}
    (pathlib.Path(args.out) / "break_gluon.json").write_text(json.dumps(summary, indent=1))
    return 0 if all(r["caught"] for r in results) and clean.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
