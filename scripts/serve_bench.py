"""Llama-3-8B-shaped end-to-end check and benchmark: flashdecode's greedy loop vs transformers' generate (SDPA).

For each batch size: B random prompts of the same length (so generate needs no padding), greedy decoding with
both. Our loop prefills equal-length prompts in one batched forward, so every matrix product has the shape it has in
generate() (prefill [B x L], decode [B x 1]) and in bf16 the two runs differ only in the decode attention kernel.
Tokens are compared per sequence up to the first step where generate's top-2 logits are within --near-tie of
each other (past that, rounding may legitimately pick the other token). The same rule is applied to a control:
generate() with transformers' eager attention against generate() with SDPA, i.e. another correct attention
implementation; its violations show how often the rule fails on rounding alone. Decode speed is measured the same
way for both: wall time of a run generating N tokens minus one generating 1 token (prefill and first token cancel),
divided into B * (N - 1) tokens. Writes results.json and results.md under --out.

The model has random bf16 weights (normal(0, 0.02), norms 1), created on the meta device and materialised directly
on the GPU with a fixed seed: nothing is downloaded and nothing is built on the host.

    .venv/bin/python scripts/serve_bench.py --out bench-serve            # the H200 run (about 3 minutes)
    .venv/bin/python scripts/serve_bench.py --tiny --out /tmp/serve      # a tiny model, CPU or GPU, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch
import transformers

from flashdecode.integrations.transformers import LLAMA3_8B_SHAPE, generate, random_llama

TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=128, max_position_embeddings=512,
)  # fmt: skip


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device):
    sync(device)
    t0 = time.perf_counter()
    result = fn()
    sync(device)
    return result, time.perf_counter() - t0


def hf_generate(model, ids, new_tokens, **kw):
    return model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
        eos_token_id=None, pad_token_id=0, **kw,
    )  # fmt: skip


# a top-2 gap of at most this many ulps of the logits' dtype (at the top logit's magnitude) is a near-tie too: the
# logits are bf16 numbers, so a gap of 2 ulps is the second-smallest difference they can express, and a one-ulp
# rounding of either logit flips it (HF's own eager and SDPA attentions diverge at gaps of several ulps: the control)
NEAR_TIE_ULPS = 4


def near_tie_gaps(values):
    """[N, B] top-2 gaps of HF's logits, and the [N, B] thresholds: max(--near-tie, NEAR_TIE_ULPS ulps of bf16 at
    |top-1|)."""
    gaps = values[..., 0] - values[..., 1]
    top = values[..., 0].abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(top)) - 7)  # bf16: 8 significant bits
    return gaps, NEAR_TIE_ULPS * ulp


def compare(ours, theirs, top2, near_tie):
    """Per sequence b: ours[b] vs theirs[b] (HF's tokens), with HF's own top-2 logits top2 [N, B, 2] (values) at that
    sequence's steps. ok iff the tokens are equal up to the sequence's first near-tie (gap < near_tie or within
    NEAR_TIE_ULPS bf16 ulps), i.e. the first divergence is absent or at/after it. Returns one dict per sequence
    (with HF's top-2 ids there)."""
    values, ids = top2
    gaps, ulp_tie = near_tie_gaps(values)  # [N, B]
    rows = []
    for b, (a, h) in enumerate(zip(ours, theirs)):
        diverge = next((t for t, (x, y) in enumerate(zip(a, h)) if x != y), None)
        ties = ((gaps[:, b] < near_tie) | (gaps[:, b] <= ulp_tie[:, b])).tolist()
        tie = next((t for t, is_tie in enumerate(ties) if is_tie), None)
        ok = diverge is None or (tie is not None and diverge >= tie)
        row = dict(seq=b, first_divergence=diverge, first_near_tie=tie, ok=ok, gap_at_divergence=None)
        if diverge is not None:
            row.update(gap_at_divergence=float(gaps[diverge, b]), ours_token=a[diverge], hf_token=h[diverge],
                       hf_top2_ids=ids[diverge, b].tolist(), hf_top2_logits=values[diverge, b].tolist())  # fmt: skip
        rows.append(row)
    return rows


def failures(rows):
    """One line per sequence that breaks the rule."""
    return [
        f"seq {r['seq']}: diverges at step {r['first_divergence']} (got {r['ours_token']}, HF {r['hf_token']}; "
        f"HF top-2 ids {r['hf_top2_ids']} logits {[round(v, 4) for v in r['hf_top2_logits']]}, gap "
        f"{r['gap_at_divergence']:.4f}), first near-tie at step {r['first_near_tie']}"
        for r in rows if not r["ok"]
    ]  # fmt: skip


def summary(rows):
    return dict(
        tokens_equal=sum(r["first_divergence"] is None for r in rows),
        violations=sum(not r["ok"] for r in rows),
        ok=all(r["ok"] for r in rows),
        per_sequence=rows,
    )


def run_batch(model, batch, prompt_len, new_tokens, near_tie, device, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed + batch)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=gen).to(device)
    prompts = [row.tolist() for row in ids.cpu()]
    # correctness: HF's tokens and logits (fp32 copies of the step logits), then ours
    out = hf_generate(model, ids, new_tokens, output_logits=True, return_dict_in_generate=True)
    theirs = out.sequences[:, prompt_len:].tolist()
    # HF's top-2 per step: values (fp32 copies of its logits) and ids, [N, B, 2] each
    top = [lg.float().topk(2, dim=-1) for lg in out.logits]
    top2 = (torch.stack([t.values for t in top]).cpu(), torch.stack([t.indices for t in top]).cpu())
    del out, top
    result = dict(batch=batch, prompt_len=prompt_len, new_tokens=new_tokens)
    # control: another correct attention (transformers' eager) under the same rule against SDPA
    model.set_attn_implementation("eager")
    try:
        control = hf_generate(model, ids, new_tokens)[:, prompt_len:].tolist()
    finally:
        model.set_attn_implementation("sdpa")
    result["hf_eager_control"] = summary(compare(control, theirs, top2, near_tie))
    for mode, graph in (("eager", False), ("cuda_graph", True)):
        if graph and torch.device(device).type != "cuda":
            continue
        run = lambda n: generate(model, prompts, n, page_size=16, cuda_graph=graph)  # noqa: E731
        res = run(new_tokens)  # warm-up (kernel compilation) and the tokens
        rows = compare(res.tokens, theirs, top2, near_tie)
        full, t_full = timed(lambda: run(new_tokens), device)
        _, t_one = timed(lambda: run(1), device)
        result[mode] = dict(
            summary(rows),
            cuda_graph_used=full.cuda_graph,
            notes=full.notes,
            decode_tok_s=batch * (new_tokens - 1) / (t_full - t_one),
            loop_decode_tok_s=full.decode_tokens / full.decode_s if full.decode_s else None,
        )
    hf_run = lambda n: hf_generate(model, ids, n)  # noqa: E731
    hf_run(new_tokens)
    _, t_full = timed(lambda: hf_run(new_tokens), device)
    _, t_one = timed(lambda: hf_run(1), device)
    result["hf_sdpa"] = dict(decode_tok_s=batch * (new_tokens - 1) / (t_full - t_one))
    gaps, ulp_tie = near_tie_gaps(top2[0])
    result["min_hf_gap"] = float(gaps.min())
    result["hf_steps_near_tie"] = f"{int(((gaps < near_tie) | (gaps <= ulp_tie)).sum())}/{gaps.numel()}"
    return result


def provenance(device):
    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    return dict(
        commit=os.environ.get("FLASHDECODE_COMMIT") or git("rev-parse", "--short", "HEAD"),
        device=torch.cuda.get_device_name() if torch.device(device).type == "cuda" else platform.processor(),
        torch=torch.__version__, transformers=transformers.__version__, python=sys.version.split()[0],
        timing="wall time of generate(N) - generate(1), synchronised, after one warm-up run",
    )  # fmt: skip


def markdown(results, meta):
    lines = [
        f"# Serving: {meta['model']} (random {meta['dtype']} weights), "
        "flashdecode loop vs transformers generate (SDPA)",
        "",
        f"commit {meta['commit']}, {meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}; "
        f"prompt {meta['prompt_len']} tokens, {meta['new_tokens']} new; near-tie: top-2 gap < {meta['near_tie']} "
        f"or <= {NEAR_TIE_ULPS} bf16 ulps at the top logit.",
        f"Timing: {meta['timing']}.",
        "",
        "| batch | HF SDPA tok/s | ours eager tok/s | ours CUDA graph tok/s | speedup (graph) | identical seqs "
        "(eager / graph) | rule violations (eager / graph) | control: HF eager-attn violations | HF steps near-tie "
        "| tokens ok |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    details = []
    for r in results:
        modes = [m for m in ("eager", "cuda_graph") if m in r]
        hf = r["hf_sdpa"]["decode_tok_s"]
        graph = r["cuda_graph"]["decode_tok_s"] if "cuda_graph" in r else float("nan")
        cells = [
            r["batch"], f"{hf:.0f}", f"{r['eager']['decode_tok_s']:.0f}", f"{graph:.0f}", f"{graph / hf:.2f}x",
            " / ".join(f"{r[m]['tokens_equal']}/{r['batch']}" for m in modes),
            " / ".join(str(r[m]["violations"]) for m in modes),
            f"{r['hf_eager_control']['violations']}/{r['batch']}",
            r["hf_steps_near_tie"],
            "yes" if all(r[m]["ok"] for m in modes) else "NO",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        for m in (*modes, "hf_eager_control"):
            details += [f"- batch {r['batch']}, {m}: {line}" for line in failures(r[m]["per_sequence"])]
    lines += [
        "",
        "Decode tokens/s = B x (N - 1) / (t(N new tokens) - t(1 new token)). Rule, per sequence: tokens equal to "
        "generate()'s up to that sequence's first step whose top-2 logits in generate() differ by less than the "
        "near-tie threshold (a divergence there or later is rounding). tokens ok = no violation by our loop. The "
        "control applies the same rule to generate() with eager attention against generate() with SDPA. The B prompts "
        "have one length and our loop prefills them in one forward, so every matrix product has generate()'s shape "
        "and in bf16 only the decode attention differs (docs/serving.md, 'Token check').",
        "",
        "Sequences that break the rule:" if details else "No sequence breaks the rule.",
        *details,
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--near-tie", type=float, default=0.05, help="top-2 logit gap counted as a near-tie")
    parser.add_argument("--tiny", action="store_true", help="a tiny model instead of Llama-3-8B's shape")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = TINY if args.tiny else LLAMA3_8B_SHAPE
    t0 = time.perf_counter()
    model = random_llama(shape, dtype, device, seed=args.seed, std=0.1 if args.tiny else 0.02)
    print(f"model built in {time.perf_counter() - t0:.1f} s on {device}", flush=True)
    meta = dict(
        provenance(device), model="tiny Llama" if args.tiny else "Llama-3-8B shape", prompt_len=args.prompt_len,
        new_tokens=args.new_tokens, near_tie=args.near_tie, dtype=str(dtype),
    )  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    results = []
    for batch in args.batches:
        t0 = time.perf_counter()
        with torch.inference_mode():
            results.append(run_batch(model, batch, args.prompt_len, args.new_tokens, args.near_tie, device, args.seed))
        r = results[-1]
        graph = f", graph {r['cuda_graph']['decode_tok_s']:.0f} tok/s" if "cuda_graph" in r else ""
        print(f"batch {batch}: {time.perf_counter() - t0:.1f} s, HF {r['hf_sdpa']['decode_tok_s']:.0f} tok/s, "
              f"ours eager {r['eager']['decode_tok_s']:.0f} tok/s{graph}", flush=True)
        for m in ("eager", "cuda_graph", "hf_eager_control"):
            if m in r:
                print(f"  {m}: {r[m]['tokens_equal']}/{batch} identical, {r[m]['violations']} rule violations",
                      flush=True)  # fmt: skip
                for line in failures(r[m]["per_sequence"]):
                    print(f"    {line}", flush=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)
    text = markdown(results, meta)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(r["eager"]["ok"] and r.get("cuda_graph", r["eager"])["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
