"""Host (Python) time per eager decode_attention call, measured on any CPU with the Triton launches stubbed out.

The GPU-side counterpart is scripts/host_overhead.py (real launches, the GPU host). This one isolates flashdecode's
own per-call work (validation, backend choice, features, launch arguments, output and workspace allocation): every
kernel object is replaced by a stub whose ``kernel[grid](*args, **kwargs)`` takes the arguments and returns None,
so Triton's argument binding (JITFunction.run) is not counted. Case: B=8, Hq=28, Hkv=4, D=128, page 16, bf16, CPU
tensors (TRITON_INTERPRET=1 so the Triton backends accept them), out= given as in host_overhead.py.

    python scripts/host_cpu.py [--calls 2000] [--profile]

Measured on the dev CPU, launches stubbed (us per call, best of 7 rounds of 2000 calls; range over 4 runs
alternating the two trees):
    before (0757bc8):                              triton 30.3-34.0, triton_splitk 42.1-46.7
    after (memoised metadata checks, shared plain
    Features, strides without views):              triton 14.9-15.4, triton_splitk 30.7-34.3
The planned path's remaining extra is triton_splitk.decode_splitk's own argument building (docs/design.md).
Each backend is now timed with the cached launcher off (the host code above) and on (a replay; under the stubs it
takes the interpreter's branch, kernel[grid] with tensors). 1acc50f, on a day the dev CPU ran ~2.7x slower than for
the numbers above: triton 41.6 -> 23.8, triton_splitk 103.5 -> 41.5. b9bc217 (every ``_*_kernel`` stubbed; the
list of four had missed ``_zero_counters_kernel``, which ran in the interpreter: triton_splitk ~1.9 ms a call):
triton 28.1 -> 11.3, triton_splitk 45.6 -> 19.2.
"""

import argparse
import os

os.environ["TRITON_INTERPRET"] = "1"

import cProfile  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

from flashdecode import decode_attention, launcher, triton_single, triton_splitk  # noqa: E402
from flashdecode.cases import random_paged_case  # noqa: E402


class _StubKernel:
    """Takes a launch like a Triton kernel does (``kernel[grid](*args, **kwargs)``) and does nothing; ``fn`` is the
    real kernel's, which the cached launcher reads the argument names from."""

    def __init__(self, real):
        self.fn = real.fn

    def __getitem__(self, grid):
        return self._launch

    @staticmethod
    def _launch(*args, **kwargs):
        return None


def stub_launches():
    """Stub every kernel the two backends launch: each module-level JIT function named ``_*_kernel`` (a kernel left
    real runs in the interpreter and swamps the host time: ``_zero_counters_kernel`` did, ~1.9 ms a call)."""
    stubbed = []
    for module in (triton_single, triton_splitk):
        for name, obj in list(vars(module).items()):
            if name.startswith("_") and name.endswith("_kernel") and isinstance(obj, triton.runtime.jit.KernelInterface):
                setattr(module, name, _StubKernel(obj))
                stubbed.append(name)
    for name in ("_decode_single_kernel", "_partial_kernel", "_combine_kernel"):
        assert name in stubbed, f"{name} is gone: update the stub list"
    return stubbed


def per_call_us(variants, args, out, calls, rounds=7):
    """Fastest round per (backend, cached launcher on), the variants taking turns round by round (a slow spell of
    the machine then hits all, not one); other load on the machine only ever adds time."""

    def run(backend, cached, n):
        launcher.ENABLED = cached
        for _ in range(n):
            decode_attention(*args, backend=backend, out=out)

    for variant in variants:
        run(*variant, 200)
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for variant in variants:
            t = time.perf_counter()
            run(*variant, calls)
            best[variant] = min(best[variant], (time.perf_counter() - t) / calls * 1e6)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of each backend's calls")
    opts = parser.parse_args()
    print("stubbed:", ", ".join(stub_launches()))
    c = random_paged_case([128] * 8, 28, 4, 128, 16, torch.bfloat16, "cpu", spare_pages=0)
    out = torch.empty_like(c.q)
    backends = ("triton", "triton_splitk")
    variants = [(backend, cached) for backend in backends for cached in (False, True)]
    for (backend, cached), us in per_call_us(variants, c.args, out, opts.calls).items():
        how = "replayed (cached launcher)" if cached else "host code every call"
        print(f"{backend}, {how}: {us:.1f} us host per call (launches stubbed, best of 7 x {opts.calls} calls)")
    launcher.ENABLED = True
    for backend in backends if opts.profile else ():
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(opts.calls):
            decode_attention(*c.args, backend=backend, out=out)
        prof.disable()
        print(f"{backend}, {opts.calls} calls:")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
