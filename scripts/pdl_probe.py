"""Does a PDL wait cover the whole chain, or only the grid right before it?

Three launches in one stream: A lets its successor start, spins for about a millisecond and then sets a flag; B is
launched with programmatic dependent launch, lets its successor start and returns at once, without waiting for A;
C reads the flag. If C,
launched with PDL, waits (``gdc_wait``) and still finds the flag unset, a wait covers only the grid before it, and a
kernel whose programs can return before their own wait breaks the chain for the kernels after it.

Controls: C launched with PDL but not waiting (must see the flag unset at least sometimes, or the probe cannot see
a race at all), and C launched normally (stream order).

    python scripts/pdl_probe.py
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _spin_then_flag(FLAG, SINK, iters):
    # B may launch at once
    tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(SINK).to(tl.float32)
    for _ in range(iters):
        x = x * 1.0000001 + 1e-7
    tl.store(SINK, x)
    tl.store(FLAG, 1)


@triton.jit
def _early_exit():
    tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _read_flag(FLAG, OUT, WAIT: tl.constexpr):
    if WAIT:
        tl.extra.cuda.gdc_wait()
    tl.store(OUT, tl.load(FLAG, volatile=True))


def trial(c_pdl: bool, c_wait: bool, iters: int) -> int:
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.full((1,), -1, dtype=torch.int32, device="cuda")
    sink = torch.ones(1, dtype=torch.float32, device="cuda")
    _spin_then_flag[(1,)](flag, sink, iters)
    _early_exit[(1,)](launch_pdl=True)
    _read_flag[(1,)](flag, out, WAIT=c_wait, launch_pdl=c_pdl)
    torch.cuda.synchronize()
    return int(out.item())


def main():
    iters = 2_000_000
    for label, c_pdl, c_wait in [
        ("C normal launch", False, False),
        ("C with PDL, waits", True, True),
        ("C with PDL, no wait (control)", True, False),
    ]:
        trial(c_pdl, c_wait, 10)  # compile
        seen = [trial(c_pdl, c_wait, iters) for _ in range(20)]
        print(f"{label:32s} flag seen set in {sum(seen)} of {len(seen)} trials", flush=True)


if __name__ == "__main__":
    main()
