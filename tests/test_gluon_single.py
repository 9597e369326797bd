"""The Gluon single pass (gluon_single): where decode_single takes it, that it compiles for sm_90 as measured, and
on the GPU that it matches the float64 reference on odd inputs.

Gluon kernels do not run under TRITON_INTERPRET (a launch needs a GPU driver), so on the CPU the kernel is compiled
for sm_90 in a subprocess and its PTX / registers checked; the H200 suite runs the numerics below.
"""

import os
import subprocess
import sys

import pytest
import torch
from feature_helpers import lse_tolerance as feature_lse_tolerance
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, ragged_lengths, reference_of

from flashdecode import decode_attention, gluon_single, plan_decode
from flashdecode.cases import poison_page_tails
from flashdecode.check import output_tolerance as args_output_tolerance
from flashdecode.reference import reference_dense
from flashdecode.triton_common import Features
from flashdecode.triton_single import decode_single

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="Gluon kernels run on a GPU only (the H200 suite runs these)")


def test_pays_on_the_measured_grids_only():
    sms = 132
    assert not gluon_single.pays(sms, sms, 6)  # one wave: the tl kernel's one-wave tile
    assert not gluon_single.pays(int(gluon_single.GLUON_MIN_PER_SM * sms) - 1, sms, 6)
    assert gluon_single.pays(int(gluon_single.GLUON_MIN_PER_SM * sms), sms, 6)
    assert gluon_single.pays(int(gluon_single.GLUON_MAX_PER_SM * sms), sms, 6)
    assert not gluon_single.pays(int(gluon_single.GLUON_MAX_PER_SM * sms) + 1, sms, 6)
    assert not gluon_single.pays(4 * sms, None, 6)  # SM count unknown
    assert gluon_single.pays(4 * sms, sms, 2) and not gluon_single.pays(4 * sms, sms, 1)  # MHA: the tl kernel
    # an fp8 cache: its own range (2, 3 and 15 programs a SM pay, one wave does not), any group
    assert gluon_single.pays(2 * sms, sms, 6, kv_fp8=True) and not gluon_single.pays(2 * sms, sms, 6)
    assert gluon_single.pays(15 * sms, sms, 6, kv_fp8=True) and not gluon_single.pays(15 * sms, sms, 6)
    assert not gluon_single.pays(sms, sms, 6, kv_fp8=True)
    assert not gluon_single.pays(int(gluon_single.GLUON_FP8_MIN_PER_SM * sms) - 1, sms, 6, kv_fp8=True)
    assert not gluon_single.pays(int(gluon_single.GLUON_FP8_MAX_PER_SM * sms) + 1, sms, 6, kv_fp8=True)
    assert gluon_single.pays(4 * sms, sms, 1, kv_fp8=True)


def test_switches_turn_it_off(monkeypatch):
    """GLUON_MIN_PER_SM = 0 turns the kernel off for every cache, GLUON_FP8_MIN_PER_SM = 0 for fp8 caches only, and
    FP8_DOT_F16 = False (fp8 products in q's dtype, which this kernel does not compute) leaves fp8 to the tl kernel."""
    from flashdecode import triton_common

    sms = 132
    monkeypatch.setattr(gluon_single, "GLUON_FP8_MIN_PER_SM", 0)
    assert not gluon_single.pays(4 * sms, sms, 6, kv_fp8=True) and gluon_single.pays(4 * sms, sms, 6)
    monkeypatch.setattr(gluon_single, "GLUON_FP8_MIN_PER_SM", 1.5)
    monkeypatch.setattr(gluon_single, "GLUON_MIN_PER_SM", 0)
    assert not gluon_single.pays(4 * sms, sms, 6, kv_fp8=True) and not gluon_single.pays(4 * sms, sms, 6)
    c = case([40], 12, 2, 128, 16, torch.bfloat16, "cpu")
    fp8 = c.k_cache.to(torch.float8_e4m3fn)
    assert gluon_single.fits(c.q, fp8, fp8, Features(kv_fp8=True))
    monkeypatch.setattr(triton_common, "FP8_DOT_F16", False)
    assert not gluon_single.fits(c.q, fp8, fp8, Features(kv_fp8=True)) and gluon_single.fits(*c.args[:3])


def test_direct_calls_check_their_scales():
    """decode_single_gluon refuses scale tensors it would misread (before any launch): not fp32, not one element, or
    on another device than q; and K / V of two dtypes."""
    c = case([40], 12, 2, 128, 16, torch.bfloat16, "cpu")
    fp8 = c.k_cache.to(torch.float8_e4m3fn)
    args = (c.q, fp8, fp8, c.cache_seqlens, c.block_table, 0.1, torch.empty_like(c.q))
    one = torch.tensor(0.5)
    for bad in (torch.tensor(0.5, dtype=torch.float64), torch.ones(2), torch.tensor(0.5, device="meta")):
        with pytest.raises(AssertionError, match="k_scale"):
            gluon_single.decode_single_gluon(*args, k_scale=bad, v_scale=one)
    with pytest.raises(AssertionError, match="both floats or both"):
        gluon_single.decode_single_gluon(*args, k_scale=one, v_scale=0.5)
    for block_n in (16, 256):
        with pytest.raises(AssertionError, match="v_perm"):
            gluon_single.decode_single_gluon(*args, block_n=block_n, v_perm=True)
    # v_perm left to the default: off past 128 tokens a step (the refusal is then the CPU launch's, not v_perm's)
    with pytest.raises(Exception) as refused:
        gluon_single.decode_single_gluon(*args, block_n=256)
    assert "v_perm" not in str(refused.value)
    with pytest.raises(AssertionError, match="v_perm"):
        gluon_single.decode_single_gluon(c.q, c.k_cache, c.v_cache, *args[3:], v_perm=True)
    with pytest.raises(AssertionError, match="one dtype"):
        gluon_single.decode_single_gluon(c.q, fp8, c.k_cache.to(torch.float8_e5m2), *args[3:])


def test_supports_needs_a_gpu(monkeypatch):
    c = case([40, 7], 12, 2, 128, 16, torch.bfloat16, "cpu")
    assert gluon_single.fits(c.q, c.k_cache, c.v_cache)
    # CPU tensors (and the interpreter): never
    assert not gluon_single.supports(*c.args)
    # an fp8 cache needs sm_90 (where it was tested), a 16-bit one sm_80
    assert gluon_single.min_capability(c.k_cache.to(torch.float8_e4m3fn)) == 9
    assert gluon_single.min_capability(c.k_cache) == 8
    if GPU:
        g = case([40, 7], 12, 2, 128, 16, torch.bfloat16, "cuda")
        assert gluon_single.supports(*g.args)
        # a Triton it was not tested with: the tl kernel
        monkeypatch.setattr(gluon_single.triton, "__version__", "3.7.0")
        assert not gluon_single.supports(*g.args)


def _pool_at(k_cache, offset_elements):
    """k_cache's values in a new pool that starts offset_elements into its buffer (misaligned for odd offsets)."""
    buf = torch.zeros(k_cache.numel() + 16, dtype=k_cache.dtype)
    pool = buf[offset_elements : offset_elements + k_cache.numel()].view(k_cache.shape)
    pool.copy_(k_cache)
    return pool


def test_decode_single_gives_an_fp8_cache_its_gate_and_scales(monkeypatch):
    """decode_single's wiring, on the CPU with the kernel stubbed: at 3 programs a SM (inside the fp8 gate, below the
    16-bit one) an fp8 call goes to the Gluon kernel with its scales, a bf16 call does not."""

    sms = 4
    c = case([40] * 6, 12, 2, 128, 16, torch.bfloat16, "cpu")  # 6 sequences x 2 KV heads = 3 programs a SM
    calls = []
    monkeypatch.setattr(gluon_single, "supports", lambda *a, **k: True)
    monkeypatch.setattr(gluon_single, "decode_single_gluon", lambda *a, **k: calls.append(k) or (a[6], a[7]))
    k8, v8 = c.k_cache.to(torch.float8_e4m3fn), c.v_cache.to(torch.float8_e4m3fn)
    out = torch.empty_like(c.q)
    fp8 = Features(kv_fp8=True, k_scale=0.5, v_scale=2.0)
    decode_single(c.q, k8, v8, c.cache_seqlens, c.block_table, 0.1, out, features=fp8, num_sms=sms)
    assert calls == [dict(k_scale=0.5, v_scale=2.0)]
    calls.clear()
    from flashdecode import triton_single

    tl_calls = []
    monkeypatch.setattr(triton_single, "launch", lambda kernel, *a, **k: tl_calls.append(kernel))
    decode_single(*c.args, 0.1, out, num_sms=sms)
    assert not calls and tl_calls == [triton_single._decode_single_kernel]


def test_fits_refuses_what_it_does_not_compute():
    """Every call the kernel does not compute is refused (decode_single then runs the tl kernel)."""
    from flashdecode.cases import token_major_v

    c = case([40, 7], 12, 2, 128, 16, torch.bfloat16, "cpu")
    q, k, v = c.q, c.k_cache, c.v_cache
    assert gluon_single.fits(q, k, v, Features())
    for features in (Features(softcap=5.0), Features(alibi_slopes=torch.ones(12)), Features(sinks=torch.zeros(12)),
                     Features(window_left=8), Features(q_len=2)):
        assert not gluon_single.fits(q, k, v, features), features
    assert not gluon_single.fits(q.unsqueeze(1), k, v)  # [B, q_len, Hq, D]
    assert not gluon_single.fits(q.float(), k.float(), v.float())
    assert not gluon_single.fits(q.half(), k, v)  # q's dtype differs from the cache's
    # an fp8 cache fits when the call says so (its scales), K and V of one fp8 dtype, q fp16 / bf16
    fp8, e5m2 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e5m2)
    assert gluon_single.fits(q, fp8, fp8, Features(kv_fp8=True, k_scale=0.5, v_scale=2.0))
    assert gluon_single.fits(q.half(), e5m2, e5m2, Features(kv_fp8=True))
    assert not gluon_single.fits(q, fp8, fp8)  # an fp8 cache without kv_fp8
    assert not gluon_single.fits(q, k, v, Features(kv_fp8=True))  # kv_fp8 on a 16-bit cache
    assert not gluon_single.fits(q, fp8, e5m2, Features(kv_fp8=True))
    assert not gluon_single.fits(q.float(), fp8, fp8, Features(kv_fp8=True))
    assert not gluon_single.fits(q, fp8, fp8, Features(kv_fp8=True, softcap=5.0))
    d64 = case([40], 12, 2, 64, 16, torch.bfloat16, "cpu")
    assert not gluon_single.fits(d64.q, d64.k_cache, d64.v_cache)
    g32 = case([40], 32, 1, 128, 16, torch.bfloat16, "cpu")
    assert not gluon_single.fits(g32.q, g32.k_cache, g32.v_cache)
    assert not gluon_single.fits(q, k, token_major_v(v))
    # head stride 136 elements: rows not 16-byte aligned
    wide = torch.zeros(*k.shape[:3], 136, dtype=k.dtype)[..., :128]
    assert not gluon_single.fits(q, k, wide)
    # a pool 2 bytes into its buffer, against one 16 bytes in
    assert not gluon_single.fits(q, _pool_at(k, 1), v)
    assert gluon_single.fits(q, _pool_at(k, 8), v)
    # a pool past 2^31 elements (offsets past 32 bits), on the meta device (no memory)
    huge = torch.empty(2**31 // (16 * 2 * 128) + 1, 16, 2, 128, dtype=torch.bfloat16, device="meta")
    assert not gluon_single.fits(q, huge, huge)


_COMPILE = r"""
import re, subprocess, sys, tempfile, os
sys.path.insert(0, "src")
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from flashdecode import gluon_single

kernel = gluon_single._decode_single_gluon_kernel
POINTERS = dict(Q="*bf16", K="*bf16", V="*bf16", OUT="*bf16", LSE="*fp32", SEQLENS="*i32", BLOCK_TABLE="*i32",
                O_PART="*fp32", LSE_PART="*fp32")
# as a launch specialises them on the GPU: pointers and the page / token / head strides divisible by 16
ALIGNED = set(POINTERS) | {"stride_qb", "stride_qh", "stride_kp", "stride_kt", "stride_kh", "stride_vp", "stride_vt",
                           "stride_vh", "stride_btb", "stride_ob", "stride_oh"}
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
for extra in (dict(), dict(USE_PDL=False, WRITE_LSE=False), dict(SAME_STRIDES=False, GROUP=16, PAGE_SIZE=1),
              dict(GROUP=1, PAGE_SIZE=64, STAGES=3), dict(GROUP=7, PAGE_SIZE=32), dict(Q_REGS=False),
              dict(DEFER_SUM=False), dict(KV_FP8=True), dict(KV_FP8=True, SCALE_PTR=True, GROUP=16, STAGES=3),
              dict(KV_FP8=True, V_PERM=True), dict(KV_FP8=True, V_PERM=True, BLOCK_N=64, GROUP=1, maxnreg=128),
              dict(SPLITS=4), dict(KV_FP8=True, V_PERM=True, BLOCK_N=64, SPLITS=16, maxnreg=128)):
    # constexprs left out take their defaults; a register cap (decode_single_gluon's maxnreg) is an option
    extra = dict(extra)
    options = dict(num_warps=4, **({"maxnreg": extra.pop("maxnreg")} if "maxnreg" in extra else {}))
    defaults = {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}
    consts = {**defaults, **dict(GROUP=6, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_N=32, STAGES=2, SAME_STRIDES=True,
                                 WRITE_LSE=True, USE_PDL=True), **extra}
    # an fp8 cache's K and V, and its scales as fp32 values or pointers
    ptrs = dict(POINTERS, **(dict(K="*fp8e4nv", V="*fp8e4nv") if consts.get("KV_FP8") else {}))
    ptrs.update(dict(K_SCALE="*fp32", V_SCALE="*fp32") if consts.get("SCALE_PTR") else {})
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n in ("qk_scale", "K_SCALE", "V_SCALE") else "i32")
           for n in kernel.arg_names}
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED}
    compiled = triton.compile(GluonASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                              options=options)
    ptx = compiled.asm["ptx"]
    # the K / V gather: 16-byte cp.async whose source size is a register (16, or 0 past the end: zero-filled,
    # nothing read); an unmasked copy has the literal 0x10 there
    copies = re.findall(r"cp\.async\.cg\.shared\.global(?:\.L2::\w+)? \[[^]]+\], \[[^]]+\], 0x10, ([^;]+);", ptx)
    assert copies and all(size.startswith("%r") for size in copies), (extra, set(copies))
    assert ("griddepcontrol.wait" in ptx) == consts["USE_PDL"], extra
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    # 4 programs a SM (16 warps) need at most 128 registers a thread: the measured kernel had 113-116
    assert regs <= 128, (extra, regs)
    # and without spills (a cap that spilled would pass the count): no local memory
    assert re.search(r"STACK:0 .*LOCAL:0", usage), (extra, usage)
    print(extra, regs)
print("compiled")
"""


@pytest.mark.skipif(gluon_single.gluon is None, reason="this Triton has no Gluon")
def test_compiles_for_sm90_with_four_programs_a_sm():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


def test_break_script_mutations_are_in_the_kernel_source():
    """scripts/break_gluon.py's mutations (run on the GPU) each name text that gluon_single.py still holds: a
    constant or line changed since would make the script stop at that mutation."""
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("break_gluon", os.path.join(root, "scripts", "break_gluon.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    source = script.SRC.read_text()
    missing = [name for name, old, *_ in script.MUTATIONS if old not in source]
    assert not missing and len(script.MUTATIONS) >= 13, missing


def _check(c, dtype=torch.bfloat16, out=None, **kwargs):
    """decode_single forced onto the Gluon kernel (NaN-filled out) against the float64 reference, output and LSE;
    with kwargs (stages, block_n), decode_single_gluon itself."""
    poison_page_tails(c)
    ref_out, ref_lse = reference_of(c)
    out = torch.full_like(c.q, float("nan")) if out is None else out.fill_(float("nan"))
    lse = torch.full(c.q.shape[:-1], float("nan"), dtype=torch.float32, device=c.q.device)
    if kwargs:
        gluon_single.decode_single_gluon(*c.args, c.q.shape[-1] ** -0.5, out, lse, **kwargs)
    else:
        decode_single(*c.args, c.q.shape[-1] ** -0.5, out, lse, gluon=True)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, dtype)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)
    # empty sequences: zeros and -inf
    empty = c.cache_seqlens == 0
    assert (out[empty] == 0).all() and (lse[empty] == float("-inf")).all()


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "hq,hkv,page",
    [(12, 2, 16), (8, 8, 16), (28, 4, 1), (32, 8, 32), (16, 1, 64), (14, 2, 7), (6, 2, 128)],
    ids=["H12/2-P16", "H8/8-P16", "H28/4-P1", "H32/8-P32", "H16/1-P64", "H14/2-P7", "H6/2-P128"],
)
def test_matches_reference_on_ragged_rows(hq, hkv, page, dtype):
    lengths = ragged_lengths(page, long=700) + [33, 64, 95]
    _check(case(lengths, hq, hkv, 128, page, dtype, "cuda", seed=page), dtype)


@needs_gpu
@pytest.mark.parametrize(
    "stages,block_n,defer_sum",
    [(2, 32, False), (3, 32, False), (4, 32, False), (2, 16, False), (4, 64, False), (3, 128, False), (2, 32, True),
     (3, 128, True)],
)  # fmt: skip
def test_ring_depths_and_steps(stages, block_n, defer_sum):
    lengths = [0, 1, 31, 32, 33, 200, 1025, 127, 129]
    c = case(lengths, 12, 2, 128, 16, torch.bfloat16, "cuda", seed=stages)
    _check(c, stages=stages, block_n=block_n, defer_sum=defer_sum)


@needs_gpu
@pytest.mark.parametrize(
    "fp8,q_dtype,hq,hkv,page,stages,block_n,tensor_scales,v_perm",
    [("e4m3", torch.bfloat16, 12, 2, 16, 2, 32, False, False), ("e5m2", torch.float16, 32, 8, 7, 3, 32, False, False),
     ("e4m3", torch.float16, 16, 1, 64, 2, 64, True, False), ("e4m3", torch.bfloat16, 28, 4, 1, 4, 16, True, False),
     ("e4m3", torch.bfloat16, 12, 2, 16, 2, 32, False, True), ("e5m2", torch.float16, 32, 8, 7, 3, 32, True, True),
     ("e5m2", torch.bfloat16, 12, 2, 16, 3, 32, True, False), ("e4m3", torch.float16, 8, 8, 16, 2, 32, False, False),
     ("e4m3", torch.bfloat16, 8, 8, 32, 2, 32, True, True), ("e4m3", torch.bfloat16, 12, 2, 16, 2, 64, False, True),
     ("e5m2", torch.float16, 16, 1, 1, 3, 64, True, True), ("e4m3", torch.bfloat16, 28, 4, 64, 2, 128, False, True),
     ("e4m3", torch.bfloat16, 12, 2, 16, 2, 32, False, None)],
)  # fmt: skip
def test_fp8_cache(fp8, q_dtype, hq, hkv, page, stages, block_n, tensor_scales, v_perm):
    """An fp8 cache (k_scale != v_scale, floats or device tensors) on ragged rows with NaN in unused pages and past
    each length, against the float64 reference of the dequantised cache."""
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fp8]
    lengths = ragged_lengths(page, long=700) + [33, 64, 95]
    c = case(lengths, hq, hkv, 128, page, torch.float32, "cuda", seed=page + stages)
    poison_page_tails(c)
    k8, v8 = (c.k_cache / 0.05).to(dtype), (c.v_cache / 0.3).to(dtype)
    args = (c.q.to(q_dtype), k8, v8, c.cache_seqlens, c.block_table)
    scales = dict(k_scale=0.05, v_scale=0.3)
    ref_out, ref_lse = reference_dense(*args, **scales)
    if tensor_scales:
        scales = {k: torch.tensor(v, device="cuda") for k, v in scales.items()}
    out = torch.full_like(args[0], float("nan"))
    lse = torch.full(args[0].shape[:-1], float("nan"), dtype=torch.float32, device="cuda")
    gluon_single.decode_single_gluon(*args, 128**-0.5, out, lse, stages=stages, block_n=block_n, v_perm=v_perm,
                                     **scales)  # fmt: skip
    assert max_err(out, ref_out) <= args_output_tolerance(args, ref_out, k_scale=0.05, v_scale=0.3)
    assert lse_err(lse, ref_lse) <= feature_lse_tolerance(args, ref_lse, k_scale=0.05, v_scale=0.3)
    empty = c.cache_seqlens == 0
    assert (out[empty] == 0).all() and (lse[empty] == float("-inf")).all()


def _fp8_args(lengths, hq, hkv, page, fp8, q_dtype, seed, device="cuda"):
    """A ragged fp8 case (k_fp8 = k / 0.05, v_fp8 = v / 0.3) with NaN in unused pages and past each length."""
    c = case(lengths, hq, hkv, 128, page, torch.float32, device, seed=seed)
    poison_page_tails(c)
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fp8]
    return (c.q.to(q_dtype), (c.k_cache / 0.05).to(dtype), (c.v_cache / 0.3).to(dtype), c.cache_seqlens, c.block_table)


@needs_gpu
@pytest.mark.parametrize("path", ["gluon", "gluon-v_perm", "tl"])
def test_fp8_q_past_fp16_range_saturates(path):
    """An fp8 cache's products run in fp16, where q saturates at +-65504 (fp16's inf would give inf - inf = NaN in
    the softmax). Here K's head-dim column 0 holds 2^-6 in every slot (small, so that the column's large product
    leaves the fp32 scores their precision) and q's column 0 is +-1e5 (bf16): the column adds one constant to a
    head's scores, so the output is the reference's of the unsaturated q, and the LSE that of q saturated (2.4
    from the unsaturated one's). Both GPU kernels: the Gluon pass (with and without v_perm) and the tl single pass."""
    q, k8, v8, lens, table = _fp8_args([0, 1, 33, 700, 64, 95], 12, 2, 16, "e4m3", torch.bfloat16, seed=21)
    k8[..., 0] = 2.0**-6
    q[:, 0::3, 0], q[:, 1::3, 0] = 1e5, -1e5
    args = (q, k8, v8, lens, table)
    scales = dict(k_scale=0.05, v_scale=0.3)
    # in fp32: bf16 rounds 65504 to 65536, which moves the LSE by 0.002 (measured: the first form of this test)
    saturated = (q.float().clamp(-65504.0, 65504.0),) + args[1:]
    ref_out, _ = reference_dense(*args, **scales)
    _, ref_lse = reference_dense(*saturated, **scales)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:-1], float("nan"), dtype=torch.float32, device="cuda")
    if path == "tl":
        decode_single(*args, 128**-0.5, out, lse, features=Features(kv_fp8=True, **scales), gluon=False)
    else:
        gluon_single.decode_single_gluon(*args, 128**-0.5, out, lse, v_perm=path.endswith("v_perm"), **scales)
    assert max_err(out, ref_out) <= args_output_tolerance(args, ref_out, **scales)
    assert lse_err(lse, ref_lse) <= feature_lse_tolerance(saturated, ref_lse, **scales)


@needs_gpu
@pytest.mark.parametrize("v_perm", [False, True], ids=["staged", "v_perm"])
def test_fp8_graph_replays_new_tensor_scales(v_perm):
    """Scales as device tensors are read by the kernel: a CUDA graph captured with them, replayed after new values
    are written into the same tensors, gives the attention of the new scales."""
    args = _fp8_args([0, 5, 300, 129, 64], 12, 2, 16, "e4m3", torch.bfloat16, seed=22)
    k_scale, v_scale = torch.tensor(0.05, device="cuda"), torch.tensor([0.3], device="cuda")
    out = torch.empty_like(args[0])
    lse = torch.empty(args[0].shape[:-1], dtype=torch.float32, device="cuda")
    run = lambda: gluon_single.decode_single_gluon(  # noqa: E731
        *args, 128**-0.5, out, lse, k_scale=k_scale, v_scale=v_scale, v_perm=v_perm
    )  # fmt: skip
    run()  # compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    k_scale.fill_(0.1)
    v_scale.fill_(0.6)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = reference_dense(*args, k_scale=0.1, v_scale=0.6)
    assert max_err(out, ref_out) <= args_output_tolerance(args, ref_out, k_scale=0.1, v_scale=0.6)
    assert lse_err(lse, ref_lse) <= feature_lse_tolerance(args, ref_lse, k_scale=0.1, v_scale=0.6)


@needs_gpu
@pytest.mark.parametrize(
    "kv,hq,hkv,page,splits,tensor_scales",
    [("bf16", 12, 2, 16, 4, False), ("bf16", 28, 4, 1, 2, False), ("e4m3", 32, 8, 16, 16, False),
     ("e5m2", 8, 8, 32, 64, True), ("e4m3", 12, 2, 7, 3, True)],
)  # fmt: skip
def test_splits_merge_to_the_reference(kv, hq, hkv, page, splits, tensor_scales):
    """splits > 1: each (sequence, KV head) cut into equal chunks of whole steps (some empty on short or empty
    sequences), fp32 partials merged by triton_splitk's combine, against the float64 reference, output and LSE."""
    lengths = [0, 1, 33, 700, 64, 3000, 129]
    if kv == "bf16":
        c = case(lengths, hq, hkv, 128, page, torch.bfloat16, "cuda", seed=splits)
        poison_page_tails(c)
        args, scales = c.args, {}
        ref_out, ref_lse = reference_of(c)
        out_tol, lse_tol = output_tolerance(c, ref_out, torch.bfloat16), lse_tolerance(c, ref_lse)
    else:
        args = _fp8_args(lengths, hq, hkv, page, kv, torch.bfloat16, seed=splits)
        scales = dict(k_scale=0.05, v_scale=0.3)
        ref_out, ref_lse = reference_dense(*args, **scales)
        out_tol = args_output_tolerance(args, ref_out, **scales)
        lse_tol = feature_lse_tolerance(args, ref_lse, **scales)
        if tensor_scales:
            scales = {k: torch.tensor(v, device="cuda") for k, v in scales.items()}
    out = torch.full_like(args[0], float("nan"))
    lse = torch.full(args[0].shape[:-1], float("nan"), dtype=torch.float32, device="cuda")
    gluon_single.decode_single_gluon(*args, 128**-0.5, out, lse, splits=splits, **scales)
    assert max_err(out, ref_out) <= out_tol
    assert lse_err(lse, ref_lse) <= lse_tol
    empty = args[3] == 0
    assert (out[empty] == 0).all() and (lse[empty] == float("-inf")).all()
    # without an LSE, and for fp8 with V staged as fp16 (v_perm off)
    staged = dict(v_perm=False, block_n=32) if kv != "bf16" else {}
    out.fill_(float("nan"))
    gluon_single.decode_single_gluon(*args, 128**-0.5, out, None, splits=splits, **staged, **scales)
    assert max_err(out, ref_out) <= out_tol


@needs_gpu
def test_plan_takes_it_for_an_fp8_cache(monkeypatch):
    """A planned even batch of 3 programs a SM on an e4m3 cache goes through the Gluon kernel (counted) with the
    call's scales, and matches the float64 reference of the dequantised cache."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    c = case([80] * (3 * sms // 2), 12, 2, 128, 16, torch.float32, "cuda", seed=12)
    args = (c.q.bfloat16(), (c.k_cache / 0.05).to(torch.float8_e4m3fn), (c.v_cache / 0.3).to(torch.float8_e4m3fn),
            c.cache_seqlens, c.block_table)  # fmt: skip
    calls = []
    real = gluon_single.decode_single_gluon
    monkeypatch.setattr(gluon_single, "decode_single_gluon", lambda *a, **k: calls.append(k) or real(*a, **k))
    from flashdecode import launcher

    launcher.clear()
    plan = plan_decode(args[0], args[1], args[3], args[4])
    out = decode_attention(*args, plan=plan, k_scale=0.05, v_scale=0.3)
    assert calls and calls[0]["k_scale"] == 0.05 and calls[0]["v_scale"] == 0.3, (plan, calls)
    ref_out, _ = reference_dense(*args, k_scale=0.05, v_scale=0.3)
    assert max_err(out, ref_out) <= args_output_tolerance(args, ref_out, k_scale=0.05, v_scale=0.3)


def _supports_by_fits(monkeypatch):
    """gluon_single.supports reduced to ``fits`` (no GPU, Triton version or interpreter check): the CPU tests of the
    plan's choices."""
    monkeypatch.setattr(gluon_single, "supports", lambda q, k, v, lens, table, f=None: gluon_single.fits(q, k, v, f))


def _meta_call(batch, length, hq, hkv, dtype=torch.float8_e4m3fn):
    """(q, k_cache, lengths, table) of an even batch, the cache uninitialised (a plan reads its metadata only)."""
    pages = batch * length // 16
    k = torch.empty(pages, 16, hkv, 128, dtype=dtype)
    lens = torch.full((batch,), length, dtype=torch.int32)
    table = torch.arange(pages, dtype=torch.int32).view(batch, -1)
    return torch.empty(batch, hq, 128, dtype=torch.bfloat16), k, lens, table


def test_plan_gives_even_fp8_splits_to_the_gluon_pass(monkeypatch):
    """On a 132-SM GPU (faked, the kernel's support reduced to ``fits``) the plan runs an fp8 cache's even split
    batches on the Gluon pass with S the power of two at or below 4 programs a SM (gsplit-6b09e9b's rows), and leaves
    a bf16 cache, uneven lengths, a window, too many pairs or too few programs to the tl kernels."""
    from flashdecode import api, plan

    monkeypatch.setattr(api, "_num_sms", lambda dev: 132)
    _supports_by_fits(monkeypatch)
    for shape, splits in (((1, 131072, 32, 8), 64), ((1, 65536, 12, 2), 256), ((4, 16384, 12, 2), 64),
                          ((8, 8192, 32, 8), 8)):  # fmt: skip
        p = plan_decode(*_meta_call(*shape))
        assert p.gluon and (p.backend, p.num_splits) == ("triton_splitk", splits), (shape, p)
    assert not plan_decode(*_meta_call(1, 131072, 32, 8, torch.bfloat16)).gluon
    q, k, lens, table = _meta_call(2, 65536, 32, 8)
    assert plan_decode(q, k, lens, table).gluon
    assert not plan_decode(q, k, torch.tensor([65536, 30000], dtype=torch.int32), table).gluon  # uneven
    assert not plan_decode(q, k, lens, table, window_left=4096).gluon
    assert not plan_decode(*_meta_call(16, 8192, 32, 8)).gluon  # 128 pairs: unmeasured
    assert not plan_decode(*_meta_call(2, 8192, 12, 2)).gluon  # 32 splits of 256 tokens: 128 programs
    for switch in ("GLUON_MIN_PER_SM", "GLUON_FP8_MIN_PER_SM"):
        with monkeypatch.context() as m:
            m.setattr(gluon_single, switch, 0)
            assert not plan_decode(*_meta_call(1, 131072, 32, 8)).gluon, switch
    monkeypatch.setattr(plan, "GLUON_FP8_SPLITS", False)
    assert not plan_decode(*_meta_call(1, 131072, 32, 8)).gluon


def test_plan_gives_fp8_grids_of_the_gluon_gate_the_single_pass(monkeypatch):
    """On a 132-SM GPU (faked) an fp8 cache's even batch of 1.45 programs a SM, which the shapes would split, runs the
    single pass (where decode_single takes the Gluon kernel: gate-62026a7); below the gate, with a bf16 cache or with
    the rule off it keeps its splits."""
    from flashdecode import api, plan

    monkeypatch.setattr(api, "_num_sms", lambda dev: 132)
    _supports_by_fits(monkeypatch)
    for shape in ((96, 1024, 12, 2), (16, 4096, 12, 12)):
        p = plan_decode(*_meta_call(*shape))
        assert (p.backend, p.num_splits) == ("triton", 1) and "Gluon single pass" in p.reason, (shape, p)
        assert plan_decode(*_meta_call(*shape, torch.bfloat16)).num_splits != 1, shape
    assert plan_decode(*_meta_call(80, 1024, 12, 2)).num_splits != 1  # 1.21 a SM
    monkeypatch.setattr(plan, "GLUON_FP8_SINGLE", False)
    assert plan_decode(*_meta_call(96, 1024, 12, 2)).num_splits != 1
    for backend, splits, dual in (("triton", 1, False), ("triton_splitk", 1, False), ("triton_splitk", None, True)):
        with pytest.raises(ValueError, match="gluon"):
            plan.DecodePlan(backend, splits, dual, "", (), gluon=True)


def test_a_gluon_plan_falls_back_where_the_call_is_not_supported(monkeypatch):
    """A plan made for the Gluon pass, called where it cannot run (here the CPU interpreter; on a GPU, token-major V
    pages, which the plan does not see), runs triton_splitk's fixed splits instead: the float64 reference's output."""
    from flashdecode import api, plan

    monkeypatch.setattr(api, "_num_sms", lambda dev: 4)
    monkeypatch.setattr(plan, "GLUON_SPLIT_MIN_TOKENS", 16)
    args = _fp8_args([700, 700], 4, 2, 16, "e4m3", torch.bfloat16, seed=3, device="cpu")
    real = gluon_single.supports
    _supports_by_fits(monkeypatch)
    p = plan_decode(args[0], args[1], args[3], args[4])
    assert p.gluon and p.num_splits == 4, p
    monkeypatch.setattr(gluon_single, "supports", real)
    out, lse = decode_attention(*args, plan=p, k_scale=0.05, v_scale=0.3, return_lse=True)
    ref_out, ref_lse = reference_dense(*args, k_scale=0.05, v_scale=0.3)
    assert max_err(out, ref_out) <= args_output_tolerance(args, ref_out, k_scale=0.05, v_scale=0.3)
    assert lse_err(lse, ref_lse) <= feature_lse_tolerance(args, ref_lse, k_scale=0.05, v_scale=0.3)


def test_a_gluon_plan_calls_the_split_pass_with_the_call_tensors(monkeypatch):
    """The wiring of a Gluon plan, on the CPU with the kernel stubbed (its numerics are the GPU tests'): the call's
    q / caches / lengths / table / out / lse, its softmax scale, the plan's splits and the call's fp8 scales reach
    ``decode_single_gluon``, and what it writes is the call's result."""
    from flashdecode import api, launcher, plan

    monkeypatch.setattr(api, "_num_sms", lambda dev: 4)
    monkeypatch.setattr(plan, "GLUON_SPLIT_MIN_TOKENS", 16)
    monkeypatch.setattr(launcher, "ENABLED", False)
    _supports_by_fits(monkeypatch)
    args = _fp8_args([700, 700], 4, 2, 16, "e4m3", torch.bfloat16, seed=3, device="cpu")
    p = plan_decode(args[0], args[1], args[3], args[4])
    calls = []

    def stub(*a, **k):
        calls.append((a, k))
        a[6].fill_(7.0)
        a[7].fill_(3.0)
        return a[6], a[7]

    monkeypatch.setattr(gluon_single, "decode_single_gluon", stub)
    k_scale = torch.tensor(0.05)
    out, lse = decode_attention(*args, plan=p, k_scale=k_scale, v_scale=0.3, softmax_scale=0.2, return_lse=True)
    (a, k), = calls
    assert all(x is y for x, y in zip(a[:5], args)) and a[5] == 0.2 and a[6] is out and a[7] is lse
    assert k["splits"] == p.num_splits == 4 and k["k_scale"] is k_scale and k["v_scale"] == 0.3
    assert (out == 7.0).all() and (lse == 3.0).all()


@needs_gpu
def test_plan_runs_even_fp8_splits_on_the_gluon_pass(monkeypatch):
    """1 x 16384 32/8 e4m3 on the H200: the plan takes 64 Gluon splits (counted), merged to the float64 reference."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    args = _fp8_args([16384], 32, 8, 16, "e4m3", torch.bfloat16, seed=4)
    calls = []
    real = gluon_single.decode_single_gluon
    monkeypatch.setattr(gluon_single, "decode_single_gluon", lambda *a, **k: calls.append(k) or real(*a, **k))
    from flashdecode import launcher

    launcher.clear()
    p = plan_decode(args[0], args[1], args[3], args[4])
    assert p.gluon and p.num_splits == min(64, 1 << (4 * sms // 8).bit_length() - 1), p
    out, lse = decode_attention(*args, plan=p, k_scale=0.05, v_scale=0.3, return_lse=True)
    assert calls and calls[0]["splits"] == p.num_splits, calls
    ref_out, ref_lse = reference_dense(*args, k_scale=0.05, v_scale=0.3)
    assert max_err(out, ref_out) <= args_output_tolerance(args, ref_out, k_scale=0.05, v_scale=0.3)
    assert lse_err(lse, ref_lse) <= feature_lse_tolerance(args, ref_lse, k_scale=0.05, v_scale=0.3)
    # the same call again: the launcher replays the recorded launches (workspaces anew) into a NaN-filled out
    again = torch.full_like(out, float("nan"))
    decode_attention(*args, plan=p, k_scale=0.05, v_scale=0.3, out=again)
    assert max_err(again, ref_out) <= args_output_tolerance(args, ref_out, k_scale=0.05, v_scale=0.3)
    launcher.clear()


@needs_gpu
def test_plan_runs_fp8_grids_of_the_gluon_gate_as_its_single_pass(monkeypatch):
    """An even e4m3 batch of 1.45 programs a SM (which the shapes would split): the plan's single pass, through the
    Gluon kernel (counted), matches the float64 reference."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    args = _fp8_args([512] * -(-145 * sms // 200), 12, 2, 16, "e4m3", torch.bfloat16, seed=6)
    calls = []
    real = gluon_single.decode_single_gluon
    monkeypatch.setattr(gluon_single, "decode_single_gluon", lambda *a, **k: calls.append(k) or real(*a, **k))
    from flashdecode import launcher

    launcher.clear()
    p = plan_decode(args[0], args[1], args[3], args[4])
    assert (p.backend, p.num_splits) == ("triton", 1), p
    out = decode_attention(*args, plan=p, k_scale=0.05, v_scale=0.3)
    assert calls and "splits" not in calls[0], calls
    ref_out, _ = reference_dense(*args, k_scale=0.05, v_scale=0.3)
    assert max_err(out, ref_out) <= args_output_tolerance(args, ref_out, k_scale=0.05, v_scale=0.3)
    launcher.clear()


@needs_gpu
def test_strided_inputs_and_separate_v_pages():
    """q and out as views of wider tensors, V pages in a pool of another layout (its own strides), the table a
    column view: the kernel reads every stride it is given."""
    c = case([5, 300, 0, 129, 64], 24, 4, 128, 16, torch.bfloat16, "cuda", seed=3)
    wide_q = torch.randn(5, 24, 256, dtype=torch.bfloat16, device="cuda")
    wide_q[..., :128] = c.q
    # V's page, token and head strides all differ from K's (16384, 1024, 256 against 8192, 512, 128)
    v_pool = torch.full((c.v_cache.shape[0], 16, 4, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
    v_pool[..., :128] = c.v_cache
    wide_table = torch.full((5, 2 * c.block_table.shape[1]), -1, dtype=torch.int32, device="cuda")
    wide_table[:, ::2] = c.block_table
    wide_lens = torch.zeros(10, dtype=torch.int32, device="cuda")
    wide_lens[::2] = c.cache_seqlens
    strided = type(c)(wide_q[..., :128], c.k_cache, v_pool[..., :128], wide_lens[::2], wide_table[:, ::2])
    out = torch.empty(5, 24, 256, dtype=torch.bfloat16, device="cuda")[..., :128]
    _check(strided, out=out)


@needs_gpu
def test_shuffled_table_is_the_same_attention():
    """Pages moved to other slots of the pool, the table rewritten to match: the same output."""
    c = case([700, 33, 1, 256], 12, 2, 128, 16, torch.bfloat16, "cuda", seed=5)
    out = torch.empty_like(c.q)
    decode_single(*c.args, 128**-0.5, out, gluon=True)
    perm = torch.randperm(c.k_cache.shape[0], device="cuda")
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device="cuda")
    valid = c.block_table >= 0
    valid &= c.block_table < c.k_cache.shape[0]
    table = torch.where(valid, inverse[c.block_table.clamp(0, perm.numel() - 1)].to(torch.int32), c.block_table)
    moved = type(c)(c.q, c.k_cache[perm], c.v_cache[perm], c.cache_seqlens, table)
    again = torch.empty_like(c.q)
    decode_single(*moved.args, 128**-0.5, again, gluon=True)
    assert torch.equal(out, again)


@needs_gpu
@pytest.mark.parametrize("hq,hkv,taken", [(4, 4, False), (8, 4, True)], ids=["MHA-tl", "group2-gluon"])
def test_decode_single_takes_it_by_group(hq, hkv, taken, monkeypatch):
    """At 4 programs a SM decode_single takes the Gluon kernel for groups of 2 and more, the tl kernel for one query
    head a KV head (GLUON_MIN_GROUP), and both match the reference."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    c = case([64] * (4 * sms // hkv), hq, hkv, 128, 16, torch.bfloat16, "cuda", seed=2)
    calls = []
    real = gluon_single.decode_single_gluon
    monkeypatch.setattr(gluon_single, "decode_single_gluon", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = torch.full_like(c.q, float("nan"))
    decode_single(*c.args, 128**-0.5, out, num_sms=sms)
    assert bool(calls) == taken
    ref_out, _ = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)


@needs_gpu
def test_plan_takes_it_where_it_pays(monkeypatch):
    """A planned even batch of 4 programs a SM goes through the Gluon kernel (counted), and its output matches the
    float64 reference; the same call with the kernel switched off takes the tl single pass and agrees."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    batch = -(-4 * sms // 2)
    c = case([96] * batch, 12, 2, 128, 16, torch.bfloat16, "cuda", seed=11)
    calls = []
    real = gluon_single.decode_single_gluon
    monkeypatch.setattr(gluon_single, "decode_single_gluon", lambda *a, **k: calls.append(1) or real(*a, **k))
    from flashdecode import launcher

    launcher.clear()
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    out = decode_attention(*c.args, plan=plan)
    assert calls, plan
    ref_out, _ = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
    monkeypatch.setattr(gluon_single, "GLUON_MIN_PER_SM", 0)
    launcher.clear()
    calls.clear()
    tl_out = decode_attention(*c.args, plan=plan)
    assert not calls
    assert max_err(tl_out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
    launcher.clear()
