"""Token-major V pages (``v_token_major``) against head-dim-major ones, through plan_decode and `auto`, for fp8 (e4m3)
and bf16 caches. Graph µs, caches rotated out of L2, every variant checked against the float64 reference first; an
odd-length batch with NaN in every slot past each sequence checks the last partial run's token-by-token path on the
device. Writes $OUT/vt.jsonl, prints a table.

    python scripts/vt_probe.py
    python scripts/vt_probe.py stages   # fp8 rows: token-major V with FP8_LONG_TILE at 3 and 4 stages
    python scripts/vt_probe.py cap      # fp8 rows: FP8_LONG_TILE capped at 2 programs per SM or not ("_free")
    python scripts/vt_probe.py pair     # the plan with and without token-major V only, fp8 and bf16
    python scripts/vt_probe.py pages    # the same at page sizes 16, 32 and 64, on four rows
    python scripts/vt_probe.py wave     # e4m3 single pass at 2 or 3 programs per SM (FP8_LONG_PROGRAMS_PER_SM)
    python scripts/vt_probe.py sat      # e4m3 token-major split-K (fixed and planned) planned for 2 or 3 a SM
    python scripts/vt_probe.py uneven   # e4m3 uneven batches, both V layouts: the plan at 2 or 3 a SM, and `auto`
"""

import dataclasses
import itertools
import sys

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, launcher, plan_decode, triton_common, triton_splitk
from flashdecode.bench import FP8_K_SCALE, FP8_V_SCALE, ProbeLog, Row, _l2_bytes, quantize_kv, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.cases import token_major_v as token_major
from flashdecode.check import max_err
from flashdecode.reference import reference_dense

ROWS = [
    Row([4096] * 64, 32, 8), Row([131072], 32, 8), Row([8192] * 8, 32, 8), Row([65536], 12, 2),
    Row([4096] * 16, 12, 2), Row([1024] * 64, 12, 2), Row([2048] * 8, 28, 4), Row([131072], 12, 12),
    Row([4096] * 16, 12, 12), Row([131072] + [1024] * 63, 32, 8),
]  # fmt: skip


def scaled(kv):
    return (FP8_K_SCALE, FP8_V_SCALE) if kv == "e4m3" else (1.0, 1.0)


def odd_lengths_check():
    """Lengths off the 16-token runs, NaN in every slot past each sequence: token-major V equals the reference."""
    lens = [1, 15, 17, 33, 1000, 4097, 130, 2049]
    for kv in ("e4m3", "bf16"):
        c = random_paged_case(lens, 32, 8, 128, 16, torch.bfloat16, "cuda", seed=5)
        for b, n in enumerate(lens):
            page = int(c.block_table[b, n // 16])
            c.k_cache[page, n % 16 :] = float("nan")
            c.v_cache[page, n % 16 :] = float("nan")
        if kv == "e4m3":
            quantize_kv(c, "e4m3")
        ks, vs = scaled(kv)
        ref, _ = reference_dense(c.q, c.k_cache.float() * ks, c.v_cache.float() * vs, *c.args[3:], device="cuda")
        kw = dict(k_scale=ks, v_scale=vs) if kv == "e4m3" else {}
        vt = token_major(c.v_cache)
        for name, extra in [("auto", {}), ("single", dict(num_splits=1)), ("split3", dict(num_splits=3)),
                            ("plan", dict(plan=plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)))]:
            out = torch.full_like(c.q, float("nan"))
            decode_attention(c.q, c.k_cache, vt, c.cache_seqlens, c.block_table, out=out, **kw, **extra)
            err = max_err(out, ref)
            print(f"odd lengths {kv} {name}: err {err:.4f}", flush=True)
            assert err < 0.05, f"odd lengths {kv} {name}: wrong, err {err}"


# (name, token-major V, FP8_LONG_TILE's stages, plan or auto, FP8_LONG_TILE capped at its programs per SM)
VARIANTS = [("plan", False, 3, True, True), ("plan_vt", True, 3, True, True), ("auto", False, 3, False, True),
            ("auto_vt", True, 3, False, True)]  # fmt: skip
STAGE_VARIANTS = [("plan", False, 3, True, True), ("plan_vt", True, 3, True, True), ("plan_vt4", True, 4, True, True),
                  ("plan_4", False, 4, True, True), ("auto_vt4", True, 4, False, True)]  # fmt: skip
# uncapped ("_free"): as the library ran while a cap above 48 KB of shared memory did nothing
CAP_VARIANTS = [("plan", False, 3, True, True), ("plan_vt", True, 3, True, True),
                ("plan_vt_free", True, 3, True, False), ("plan_free", False, 3, True, False),
                ("auto_vt", True, 3, False, True)]  # fmt: skip
PAIR_VARIANTS = [("plan", False, 3, True, True), ("plan_vt", True, 3, True, True)]
_cap = launcher.cap_programs_per_sm


def set_cap(on):
    """Cap kernels at their programs per SM (the library's behaviour) or launch every one unpadded."""
    for compiled in launcher._capped:
        meta = compiled.packed_metadata
        compiled.packed_metadata = (meta[0], meta[1], compiled.metadata.shared)
    launcher._capped.clear()
    launcher.cap_programs_per_sm = _cap if on else (lambda compiled, programs: False)


def prepared(seqlens, hq, hkv, page, kv, l2):
    """A uniform-head-dim-128 case in `kv` ("e4m3" or "bf16"): its float64 reference, the scale arguments, rotation
    copies with head-dim-major and with token-major V, and its plan."""
    c = random_paged_case(seqlens, hq, hkv, 128, page, torch.bfloat16, "cuda", spare_pages=0)
    if kv == "e4m3":
        quantize_kv(c, "e4m3")
    ks, vs = scaled(kv)
    ref, _ = reference_dense(c.q, c.k_cache.float() * ks, c.v_cache.float() * vs, *c.args[3:], device="cuda")
    kw = dict(k_scale=ks, v_scale=vs) if kv == "e4m3" else {}
    nhd = rotation_copies(c, l2)
    vt = [dataclasses.replace(x, v_cache=token_major(x.v_cache)) for x in nhd]
    return ref, kw, nhd, vt, plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)


def timed(copies, ref, label, **kwargs):
    """Graph µs of decode_attention(**kwargs) cycling through `copies`, once checked against `ref`."""
    launcher.clear()
    it = itertools.cycle(copies)

    def fn():
        x = next(it)
        return decode_attention(x.q, x.k_cache, x.v_cache, x.cache_seqlens, x.block_table, **kwargs)

    err = max_err(fn(), ref)
    assert err < 0.05, f"{label}: wrong, err {err}"
    return do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3


def plan_note(p):
    return f"S{p.num_splits}{'L' if p.long_tile else ''}"


def wave():
    """The e4m3 single pass (FP8_LONG_TILE) capped at 2 or 3 programs per SM, both V layouts, pages 16 and 64: does
    a grid of more than 2 and at most 3 programs per SM run faster as one wave of 3 where the registers allow it
    (token-major V: 164)? Then token-major V through the library's rule (FP8_LONG_ONE_WAVE): the single pass,
    `auto` and the plan."""
    log = ProbeLog("vt-wave")
    l2 = _l2_bytes("cuda")
    for batch, page in itertools.product((33, 40, 48, 64), (16, 64)):
        ref, kw, nhd, vt, p = prepared([4096] * batch, 32, 8, page, "e4m3", l2)
        res = {}
        # (name, copies, cap: the cap as named on every grid, or None: the library's rule; call)
        for name, copies, cap, extra in (
            ("hd2", nhd, 2, dict(num_splits=1)), ("hd3", nhd, 3, dict(num_splits=1)),
            ("vt2", vt, 2, dict(num_splits=1)), ("vt3", vt, 3, dict(num_splits=1)),
            ("vt_single", vt, None, dict(num_splits=1)), ("vt_auto", vt, None, {}), ("vt_plan", vt, None, dict(plan=p)),
        ):  # fmt: skip
            triton_common.FP8_LONG_PROGRAMS_PER_SM, triton_common.FP8_LONG_ONE_WAVE = (2, 3) if cap is None else (
                cap, None)
            set_cap(True)
            res[name] = timed(copies, ref, f"{batch} P{page} {name}", **kw, **extra)
        triton_common.FP8_LONG_PROGRAMS_PER_SM, triton_common.FP8_LONG_ONE_WAVE = 2, 3
        record = dict(batch=batch, page=page, programs=batch * 8, plan=plan_note(p),
                      **{k: round(v, 2) for k, v in res.items()})  # fmt: skip
        line = f"{batch}x4096 32/8 e4m3 P{page:<3d} {batch * 8:4d} programs {plan_note(p):6s} "
        log.row(record, line + "  ".join(f"{k} {v:6.1f}" for k, v in res.items()))
    log.close()


def uneven(batch, seed):
    """`batch` lengths drawn uniformly from 1024..8192 (mean ~4600): plan_decode leaves such a batch to the device's
    planner."""
    g = torch.Generator().manual_seed(seed)
    return [int(n) for n in torch.randint(1024, 8193, (batch,), generator=g)]


SAT_ROWS = [
    Row([131072], 32, 8), Row([8192] * 8, 32, 8), Row([65536], 12, 2), Row([4096] * 16, 12, 2),
    Row([2048] * 8, 28, 4), Row([131072], 12, 12), Row(uneven(16, 1), 32, 8), Row(uneven(34, 2), 32, 8),
    Row(uneven(48, 3), 32, 8), Row(uneven(8, 4), 12, 2), Row([131072] + [1024] * 63, 32, 8),
]  # fmt: skip


def set_saturation(n):
    """Plan the fp8 128-token tile's split-K grids for n programs per SM and cap them there (library: 2)."""
    triton_splitk.PLANNER_SATURATION["fp8_long"] = n
    triton_common.FP8_LONG_PROGRAMS_PER_SM = n
    triton_splitk.planner_target.cache_clear()
    triton_common._launch_config.cache_clear()


def saturation():
    """e4m3 with token-major V (164 registers: 3 programs of the 128-token tile fit an SM, 2 with head-dim-major V):
    the plan's split-K grids (fixed splits of uniform rows, the device's planner for uneven ones) planned and capped
    at 2 programs per SM (the library) or 3, pages 16 and 64. The lead of sweeps/token-major-v-cap section 4: uneven
    batches of 2-3 programs per SM keep the planned path's 2-a-SM model."""
    log = ProbeLog("vt-sat")
    l2 = _l2_bytes("cuda")
    for row, page in itertools.product(SAT_ROWS, (16, 64)):
        ref, kw, nhd, vt, _ = prepared(row.seqlens, row.num_q_heads, row.num_kv_heads, page, "e4m3", l2)
        res, notes = {}, []
        for n in (2, 3):
            set_saturation(n)
            c = vt[0]
            p = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
            notes.append(plan_note(p))
            res[f"sat{n}"] = timed(vt, ref, f"{row.name()} P{page} sat{n}", **kw, plan=p)
            res[f"auto{n}"] = timed(vt, ref, f"{row.name()} P{page} auto{n}", **kw)
        set_saturation(2)
        record = dict(row=row.name(), seqlens=row.seqlens, page=page, plans=notes,
                      **{k: round(v, 2) for k, v in res.items()})  # fmt: skip
        line = f"{row.name()[:30]:<30} P{page:<3d} {'/'.join(notes):12s} "
        line += "  ".join(f"{k} {v:7.1f}" for k, v in res.items())
        log.row(record, line + f"   sat2 / sat3 {res['sat2'] / res['sat3']:.3f}x")
    log.close()


UNEVEN_ROWS = [
    Row(uneven(4, 5), 32, 8), Row(uneven(8, 6), 32, 8), Row(uneven(16, 1), 32, 8), Row(uneven(24, 7), 32, 8),
    Row(uneven(34, 2), 32, 8), Row(uneven(48, 3), 32, 8), Row(uneven(64, 8), 32, 8), Row(uneven(4, 9), 12, 2),
    Row(uneven(8, 4), 12, 2), Row(uneven(32, 10), 12, 2), Row(uneven(8, 11), 28, 4), Row(uneven(24, 12), 28, 4),
]  # fmt: skip


def uneven_batches():
    """e4m3 batches of lengths 1024..8192 (plan_decode leaves most to the device's planner), head-dim-major and
    token-major V at page 16: the plan (the 128-token fp8 tile) planned and capped at 2 programs per SM (the library)
    or 3, against `auto` (its planned calls take the 64-token FP8_SPLIT_TILE)."""
    log = ProbeLog("vt-uneven")
    l2 = _l2_bytes("cuda")
    for row in UNEVEN_ROWS:
        ref, kw, nhd, vt, _ = prepared(row.seqlens, row.num_q_heads, row.num_kv_heads, 16, "e4m3", l2)
        res, notes = {}, []
        for layout, copies in (("hd", nhd), ("vt", vt)):
            for n in (2, 3):
                set_saturation(n)
                c = copies[0]
                p = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
                notes.append(plan_note(p))
                res[f"{layout}_plan{n}"] = timed(copies, ref, f"{row.name()} {layout} plan{n}", **kw, plan=p)
            set_saturation(2)
            res[f"{layout}_auto"] = timed(copies, ref, f"{row.name()} {layout} auto", **kw)
        record = dict(row=row.name(), seqlens=row.seqlens, plans=notes[:2],
                      **{k: round(v, 2) for k, v in res.items()})  # fmt: skip
        line = f"{row.name()[:26]:<26} {'/'.join(notes[:2]):12s} " + "  ".join(f"{k} {v:6.1f}" for k, v in res.items())
        log.row(record, line)
    log.close()


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "wave":
        return wave()
    if mode == "sat":
        odd_lengths_check()
        return saturation()
    if mode == "uneven":
        return uneven_batches()
    variants, kvs = dict(stages=(STAGE_VARIANTS, ("e4m3",)), cap=(CAP_VARIANTS, ("e4m3",)),
                         pair=(PAIR_VARIANTS, ("e4m3", "bf16"))).get(mode, (VARIANTS, ("e4m3", "bf16")))
    odd_lengths_check()
    log = ProbeLog(f"vt{'-' + mode if mode else ''}")
    l2 = _l2_bytes("cuda")
    rows = [(row, 16) for row in ROWS]
    if mode == "pages":
        variants, kvs = PAIR_VARIANTS, ("e4m3", "bf16")
        rows = [(ROWS[i], page) for i in (0, 1, 4, 7) for page in (16, 32, 64)]
    for kv in kvs:
        for row, page in rows:
            ref, kw, nhd, vt, p = prepared(row.seqlens, row.num_q_heads, row.num_kv_heads, page, kv, l2)
            res = {}
            for name, use_vt, stages, planned, capped in variants:
                set_cap(capped)
                triton_common.FP8_LONG_TILE["num_stages"] = stages
                triton_common._launch_config.cache_clear()
                res[name] = timed(vt if use_vt else nhd, ref, f"{row.name()} {kv} {name}", **kw,
                                  **(dict(plan=p) if planned else {}))  # fmt: skip
            triton_common.FP8_LONG_TILE["num_stages"] = 3
            triton_common._launch_config.cache_clear()
            set_cap(True)
            record = dict(row=row.name(), page=page, kv=kv, splits=plan_note(p),
                          **{k: round(v, 2) for k, v in res.items()})  # fmt: skip
            line = f"{row.name():<24} P{page:<3d} {kv:5s} {plan_note(p):6s} "
            line += "  ".join(f"{k} {v:7.1f}" for k, v in res.items())
            log.row(record, line + f"   plan / plan_vt {res['plan'] / res['plan_vt']:.3f}x")
    log.close()


if __name__ == "__main__":
    main()
