"""The cached launcher (flashdecode/launcher.py): a call replayed from its recording gives the same answer on new
tensors, and calls whose host work could differ are recorded apart or not replayed at all.

Under the interpreter a replay calls ``kernel[grid]`` with the rebuilt arguments; on a GPU it calls the compiled
kernels' launchers. Either way each argument comes from the slot the recording resolved it to, which is what these
tests check: a stale pointer would read the previous call's tensors and miss the reference."""

import pytest
import torch
import triton
import triton.language as tl
from feature_helpers import check
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, reference_of

import flashdecode.api as api
from flashdecode import decode_attention, launcher

LENS = [5, 40, 0, 17]


@pytest.fixture
def host_runs(monkeypatch):
    """Counts of each Triton backend's host code runs (a replay runs none)."""
    runs = {"triton": 0, "triton_splitk": 0}
    for name in runs:
        real = api._BACKEND_FNS[name]

        def counted(*args, _name=name, _real=real):
            runs[_name] += 1
            return _real(*args)

        monkeypatch.setitem(api._BACKEND_FNS, name, counted)
    return runs


def _check(c, out, lse):
    ref_out, ref_lse = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, c.q.dtype)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


@pytest.mark.parametrize(
    "backend,num_splits,lens,ran",
    [("triton", None, LENS, "triton"), ("triton_splitk", None, LENS, "triton_splitk"),
     ("triton_splitk", 3, LENS, "triton_splitk"), ("auto", None, [5, 300, 0, 17], "triton_splitk")],
    ids=["single", "planned", "fixed3", "auto"],
)  # fmt: skip
def test_replay_reads_the_new_tensors(backend, num_splits, lens, ran, device, host_runs):
    """Three calls of one metadata on fresh random data (new q, caches, lengths' values, shuffled tables) into
    NaN-filled outputs: the first runs the backend's host code, the next two replay it, and all match the
    reference."""
    for seed in range(3):
        c = case(lens, 4, 2, 32, 16, torch.float32, device, seed=seed)
        out = torch.full_like(c.q, float("nan"))
        out, lse = decode_attention(*c.args, backend=backend, num_splits=num_splits, out=out, return_lse=True)
        _check(c, out, lse)
    assert host_runs[ran] == 1


def test_replay_keeps_address_relations(device, host_runs):
    """out = q (in place) and a separate out are recorded apart: the relation between addresses is in the key."""
    for seed, in_place in enumerate((False, True, False, True)):
        c = case(LENS, 4, 2, 32, 16, torch.float32, device, seed=seed)
        ref_out, _ = reference_of(c)
        q = c.q.clone()
        out = decode_attention(q, *c.args[1:], backend="triton_splitk", out=q if in_place else None)
        assert (out is q) == in_place
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32)
    assert host_runs["triton_splitk"] == 2


def test_replay_keys_on_options_and_alignment(device, host_runs):
    """The caller's options (here softmax_scale and return_lse) and each address modulo 16 (Triton specialises
    pointers on it) are in the key: each change records anew, and every call matches the reference."""
    calls = [dict(), dict(softmax_scale=0.3), dict(return_lse=True), dict(), dict(softmax_scale=0.3)]
    for seed, kwargs in enumerate(calls):
        c = case(LENS, 4, 2, 32, 16, torch.float32, device, seed=seed)
        ref_out, _ = reference_of(c, softmax_scale=kwargs.get("softmax_scale"))
        res = decode_attention(*c.args, backend="triton", **kwargs)
        out = res[0] if kwargs.get("return_lse") else res
        tol = output_tolerance(c, ref_out, torch.float32, softmax_scale=kwargs.get("softmax_scale"))
        assert max_err(out, ref_out) <= tol
    assert host_runs["triton"] == 3
    # q one fp32 element past a 16-byte boundary: same shape and strides, a new recording
    c = case(LENS, 4, 2, 32, 16, torch.float32, device, seed=9)
    buf = torch.empty(c.q.numel() + 1, device=device)
    q = buf[1:].view(c.q.shape).copy_(c.q)
    assert q.data_ptr() % 16 and q.stride() == c.q.stride()
    ref_out, _ = reference_of(c)
    out = decode_attention(q, *c.args[1:], backend="triton")
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32)
    assert host_runs["triton"] == 4


def test_feature_calls_replay_with_their_new_tensors(device, host_runs):
    """Feature tensors (sinks, ALiBi slopes) are inputs like q: a replay reads their new values. Feature scalars
    (softcap, window) are in the key: a new value records anew."""
    calls = [dict(softcap=20.0, window_left=9)] * 2 + [dict(softcap=5.0, window_left=9)] * 2
    for seed, kwargs in enumerate(calls):
        c = case(LENS, 4, 2, 32, 16, torch.float32, device, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        kwargs = dict(kwargs, sinks=torch.randn(4, generator=gen).to(device),
                      alibi_slopes=torch.rand(4, generator=gen).to(device))  # fmt: skip
        check(c.args, "triton_splitk", None, **kwargs)
    assert host_runs["triton_splitk"] == 2


def test_calls_that_are_never_replayed(device, host_runs, monkeypatch):
    """Value validation and ENABLED = False run the host code on every call; the PyTorch backends are not
    recorded."""
    c = case(LENS, 4, 2, 32, 16, torch.float32, device, seed=3)
    for _ in range(2):
        decode_attention(*c.args, backend="triton", validate=True)
    assert host_runs["triton"] == 2
    monkeypatch.setattr(launcher, "ENABLED", False)
    for _ in range(2):
        decode_attention(*c.args, backend="triton")
    assert host_runs["triton"] == 4
    monkeypatch.setattr(launcher, "ENABLED", True)
    decode_attention(*c.args, backend="torch_sdpa")
    assert not launcher._cache


@triton.jit
def _copy_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, tl.load(X + offs))


def test_an_argument_of_no_input_is_not_replayed(device):
    """A launch whose tensor argument is neither an input nor a ``workspace`` cannot be rebuilt: the key is marked
    uncacheable (later calls run the host code), while one whose tensors are inputs replays onto new tensors."""
    x, y = torch.arange(16.0, device=device), torch.zeros(16, device=device)
    stray = torch.zeros(16, device=device)
    with launcher.recording("stray", (x, y)):
        launcher.launch(_copy_kernel, (1,), x, stray, N=16)
    assert launcher._cache["stray"] is launcher.UNCACHEABLE
    assert not launcher.replay("stray", (x, y))
    with launcher.recording("inputs", (x, y)):
        launcher.launch(_copy_kernel, (1,), x, y, N=16)
    x2, y2 = torch.arange(16.0, 32.0, device=device), torch.zeros(16, device=device)
    assert launcher.replay("inputs", (x2, y2))
    assert torch.equal(y2.cpu(), torch.arange(16.0, 32.0))


def test_append_kv_replays_onto_new_tensors(device, monkeypatch):
    """append_kv records its launch too: a second call of the same metadata writes the new tokens into the new caches
    at the new slots without running the launcher's host code, and matches plain indexing (a -1 slot skips)."""
    from flashdecode import append_kv, triton_append

    runs = []
    real = triton_append.append_kv_triton
    monkeypatch.setattr(triton_append, "append_kv_triton", lambda *a: runs.append(1) or real(*a))
    gen = torch.Generator().manual_seed(0)
    for slots in ([3, 17, -1, 40], [41, 0, 9, -1]):
        k, v = (torch.randn(4, 2, 8, generator=gen).to(device) for _ in range(2))
        caches = [torch.randn(6, 8, 2, 8, generator=gen).to(device) for _ in range(2)]
        expected = [c.clone() for c in caches]
        slot_mapping = torch.tensor(slots, dtype=torch.int32, device=device)
        append_kv(k, v, *caches, slot_mapping)
        append_kv(k, v, *expected, slot_mapping, backend="torch")
        assert all(torch.equal(got.cpu(), want.cpu()) for got, want in zip(caches, expected))
    assert len(runs) == 1


def test_compiled_replay_passes_what_jit_run_passes():
    """The compiled replay's generated function calls each kernel's launcher as JITFunction.run ends: grid, stream,
    function, metadata, no launch metadata or hooks, then every argument, constants as recorded and each slot from
    the addresses it is given (checked here with stand-in compiled kernels, on any machine)."""
    calls = []

    class Compiled:
        def __init__(self, name):
            self.function, self.packed_metadata = f"fn-{name}", (4, 1, 0)
            self.run = lambda *args: calls.append(args)

    launches = [
        (None, Compiled("a"), (3, 2, 1), [None, 7, None, 0.5, "x"], [(0, 1), (2, 0)], {}),
        (None, Compiled("b"), (5, 1, 1), [None, None], [(0, 2), (1, 1)], {}),
    ]
    launch_all = launcher._straight_line(launches)
    launch_all([1000, 2000, 3000], "stream")
    assert calls == [
        (3, 2, 1, "stream", "fn-a", (4, 1, 0), None, None, None, 2000, 7, 1000, 0.5, "x"),
        (5, 1, 1, "stream", "fn-b", (4, 1, 0), None, None, None, 3000, 2000),
    ]


class _ThinLauncher:
    """A stand-in for Triton 3.6's CudaLauncher: the same ``__call__`` (scratch allocation elided: none is asked
    for), over a ``launch`` that records what it is given; ``wrapped`` counts the calls that went through
    ``__call__``."""

    def __init__(self, calls, pdl):
        self.launch = lambda *args: calls.append(args)
        self.launch_cooperative_grid, self.launch_pdl = False, pdl
        self.global_scratch_size = self.profile_scratch_size = 0
        self.wrapped = 0

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.wrapped += 1
        global_scratch = profile_scratch = None
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                    global_scratch, profile_scratch, *args)  # fmt: skip


@pytest.mark.parametrize("pdl", [False, True])
def test_direct_replay_passes_what_the_wrapper_passes(monkeypatch, pdl):
    """Through a thin wrapper the replay calls the C function under it with exactly the arguments the wrapper would
    have passed it; with the switch off, or a kernel that asks for scratch memory, it calls the wrapper."""

    class Compiled:
        function, packed_metadata = "fn", (4, 1, 0)

        def __init__(self, run):
            self.run = run

    def replay(run):
        launch = [(None, Compiled(run), (3, 2, 1), [None, 7, 0.5], [(0, 1)], {})]
        launcher._straight_line(launch)([1000, 2000], "stream")

    expected = [(3, 2, 1, "stream", "fn", False, pdl, None, None, (4, 1, 0), None, None, None, 2000, 7, 0.5)]
    via_wrapper, direct = [], []
    monkeypatch.setattr(launcher, "DIRECT", False)
    replay(wrapper := _ThinLauncher(via_wrapper, pdl))
    assert via_wrapper == expected and wrapper.wrapped == 1
    monkeypatch.setattr(launcher, "DIRECT", True)
    replay(bypassed := _ThinLauncher(direct, pdl))
    assert direct == expected and bypassed.wrapped == 0
    scratch = _ThinLauncher([], pdl)
    scratch.global_scratch_size = 64
    assert launcher._direct_launch(scratch) is None
    assert launcher._direct_launch(lambda *args: None) is None


def test_direct_launch_recognises_this_triton():
    """The pinned Triton's CUDA launcher is the thin wrapper ``_direct_launch`` stands in for: if an upgrade changes
    it, replays fall back to the wrapper (correct, ~1 µs a launch slower) and this test says so."""
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    assert launcher._thin_wrapper(driver.CudaLauncher)


@pytest.mark.parametrize("programs", [1, 2, 3, 4, 5, 8])
def test_padded_shared_memory_caps_programs_per_sm(programs):
    """The padded request lets exactly min(programs, what already fitted) programs share an SM of sm_90's 228 KB (1 KB
    reserved a program, 128-byte units): it caps occupancy, never raises it, and leaves a kernel alone that already
    fits no more."""
    per_sm = 233472

    def fit(shared):
        return per_sm // (-(-shared // 128) * 128 + 1024)

    for shared in (0, 1000, 39168, 45000, 55296, 100000):
        padded = launcher.padded_shared_memory(shared, programs, per_sm)
        assert padded >= shared and fit(padded) == min(programs, fit(shared)), (shared, padded)
        assert padded == shared or (fit(shared) > programs and padded % 128 == 0)


def resident_programs(compiled) -> int:
    """How many programs of a compiled (and possibly capped) kernel fit an SM of this GPU: the least of what its
    registers (allocated per warp in units of 256), its launch shared memory (128-byte units, 1 KB reserved a
    program) and the 64 warps an SM holds allow."""
    props = torch.cuda.get_device_properties(0)
    regs = getattr(props, "regs_per_multiprocessor", 65536)
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    warps, shared = compiled.metadata.num_warps, compiled.packed_metadata[2]
    by_regs = regs // (-(-compiled.n_regs * 32 // 256) * 256 * warps)
    by_smem = smem // (-(-shared // 128) * 128 + 1024)
    return min(by_regs, by_smem, 64 // warps)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the occupancy of compiled CUDA kernels")
def test_planned_partials_fit_the_planners_programs_per_sm(device, monkeypatch):
    """A planned split-K call's partial kernel (in place and with the planner launch) runs at most the planner's
    programs per SM for its tile (``triton_splitk.planner_target``) whatever its registers allow: its grid's unused
    chunk slots would otherwise let the programs with work pile onto fewer SMs. Checked from each capped kernel's
    registers, warps and launch shared memory, one call at a time."""
    from flashdecode import triton_splitk

    for lens, hq, hkv in (([4096], 32, 32), ([2048] * 8, 28, 4), ([3000] + [100] * 20, 32, 8)):
        # only this call's kernels (Triton keeps the compiled ones, so a kernel capped before is capped again here)
        monkeypatch.setattr(launcher, "_capped", {})
        c = case(lens, hq, hkv, 128, 16, torch.bfloat16, device, seed=5)
        out = torch.full_like(c.q, float("nan"))
        triton_splitk.decode_splitk(*c.args, 128**-0.5, out, None)
        ref_out, _ = reference_of(c)
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
        target = triton_splitk.planner_target(128, hq // hkv, torch.bfloat16, 1, 2, hkv)
        assert launcher._capped, (lens, hq, hkv)
        for compiled in launcher._capped:
            assert resident_programs(compiled) <= target, (hq, hkv, compiled.n_regs, compiled.packed_metadata, target)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the occupancy of compiled CUDA kernels")
@pytest.mark.parametrize("token_major", [False, True], ids=["v-hd-major", "v-token-major"])
def test_fp8_long_tile_keeps_its_programs_per_sm(token_major, device, monkeypatch):
    """An fp8 cache's 128-token tile (``FP8_LONG_TILE``) runs at most ``FP8_LONG_PROGRAMS_PER_SM`` programs per SM in
    the single pass (a grid of more than one program per SM), in fixed splits and planned: a token-major V takes
    fewer registers than a head-dim-major one, and the tile uses more than 48 KB of shared memory, which the cap
    must still pad."""
    from test_fp8 import fp8_case

    from flashdecode import triton_common, triton_splitk
    from flashdecode.cases import token_major_v
    from flashdecode.check import output_tolerance as args_tolerance
    from flashdecode.reference import reference_dense
    from flashdecode.triton_single import decode_single

    # 20 sequences x 8 KV heads: 160 single-pass programs, more than one a SM
    args = fp8_case([700, 1500, 33, 4096] * 5, "e4m3", torch.bfloat16, device, seed=9, hq=32, hkv=8, d=128)
    if token_major:
        args = (*args[:2], token_major_v(args[2]), *args[3:])
    scales = dict(k_scale=0.05, v_scale=0.3)
    ref_out, _ = reference_dense(*args, **scales)
    features = triton_common.Features(kv_fp8=True, **scales)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    calls = dict(
        single=lambda out: decode_single(*args, 128**-0.5, out, features=features, num_sms=num_sms),
        fixed=lambda out: triton_splitk.decode_splitk(*args, 128**-0.5, out, num_splits=4, features=features,
                                                      long_tile=True),
        planned=lambda out: triton_splitk.decode_splitk(*args, 128**-0.5, out, features=features, long_tile=True),
    )  # fmt: skip
    for name, call in calls.items():
        # only this call's kernels (Triton keeps the compiled ones, so a kernel capped before is capped again here)
        monkeypatch.setattr(launcher, "_capped", {})
        out = torch.full_like(args[0], float("nan"))
        call(out)
        assert max_err(out, ref_out) <= args_tolerance(args, ref_out, **scales), name
        assert launcher._capped, name
        for compiled in launcher._capped:
            assert resident_programs(compiled) <= triton_common.FP8_LONG_PROGRAMS_PER_SM, (
                name, compiled.n_regs, compiled.packed_metadata)


def test_fp8_long_tile_cap_rule():
    """The fp8 128-token tile is capped at FP8_LONG_PROGRAMS_PER_SM programs per SM, except a single pass of more than
    that and at most FP8_LONG_ONE_WAVE per SM, which runs as one wave; other tiles are not capped."""
    from flashdecode import triton_common as tc

    fp8 = tc.launch_config(128, 4, torch.bfloat16, 1, kv_itemsize=1, single=True)
    assert tc.uses_tile(fp8, tc.FP8_LONG_TILE) and (tc.FP8_LONG_PROGRAMS_PER_SM, tc.FP8_LONG_ONE_WAVE) == (2, 3)
    got = {n: tc.tile_programs_per_sm(fp8, n, 132) for n in (0, 100, 264, 265, 396, 397, 1000)}
    assert got == {0: 2, 100: 2, 264: 2, 265: 3, 396: 3, 397: 2, 1000: 2}
    assert tc.tile_programs_per_sm(fp8, 300, None) == 2
    assert tc.tile_programs_per_sm(tc.launch_config(128, 4, torch.bfloat16, 1, single=True), 300, 132) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the occupancy of compiled CUDA kernels")
@pytest.mark.parametrize("token_major", [False, True], ids=["v-hd-major", "v-token-major"])
def test_fp8_single_pass_of_one_wave_of_three(token_major, device, monkeypatch):
    """A single pass of 2.5 programs per SM with the fp8 128-token tile is capped at 3 a SM (``FP8_LONG_ONE_WAVE``):
    token-major V's registers let exactly 3 fit, head-dim-major V's still 2; the output matches the reference."""
    from test_fp8 import fp8_case

    from flashdecode.cases import token_major_v
    from flashdecode.check import output_tolerance as args_tolerance
    from flashdecode.reference import reference_dense

    props = torch.cuda.get_device_properties(0)
    batch = -(-5 * props.multi_processor_count // 16)  # x 8 KV heads: 2.5 programs per SM
    args = fp8_case([300, 17, 128] * (batch // 3) + [64] * (batch % 3), "e4m3", torch.bfloat16, device, seed=4, hq=32,
                    hkv=8, d=128)  # fmt: skip
    if token_major:
        args = (*args[:2], token_major_v(args[2]), *args[3:])
    scales = dict(k_scale=0.05, v_scale=0.3)
    ref_out, _ = reference_dense(*args, **scales)
    monkeypatch.setattr(launcher, "_capped", {})
    launcher.clear()
    out = torch.full_like(args[0], float("nan"))
    decode_attention(*args, out=out, backend="triton", **scales)
    assert max_err(out, ref_out) <= args_tolerance(args, ref_out, **scales)
    (compiled,) = launcher._capped
    assert launcher._capped[compiled] == 3
    assert resident_programs(compiled) == (3 if token_major else 2), (compiled.n_regs, compiled.packed_metadata)
