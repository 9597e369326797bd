"""tests/interpreter_patch.py changes the interpreter's speed, not its results: every kernel of a call (single pass,
planner, partials with the fused merge, combine, append) gives bit-identical outputs with Triton's own ``_patch_lang``."""

import os

import pytest
import torch

import flashdecode
from flashdecode import launcher

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU suite's interpreter only")


def _calls():
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(3, 8, 64, generator=gen)
    k = torch.randn(40, 16, 2, 64, generator=gen)
    v = torch.randn(40, 16, 2, 64, generator=gen)
    lens = torch.tensor([5, 200, 77], dtype=torch.int32)
    table = torch.randperm(40, generator=gen)[:39].to(torch.int32).view(3, 13)
    outs = []
    for backend, kw in [("triton", {}), ("triton_splitk", {}), ("triton_splitk", {"num_splits": 3}), ("auto", {})]:
        launcher.clear()
        outs += flashdecode.decode_attention(q, k, v, lens, table, backend=backend, return_lse=True, **kw)
    kc, vc = k.clone(), v.clone()
    slots = torch.tensor([3, 17 * 16 + 15, -1], dtype=torch.int32)
    flashdecode.append_kv(q[:, :2], q[:, 2:4], kc, vc, slots, backend="triton")
    return outs + [kc, vc]


def test_outputs_are_bit_identical_with_and_without_the_patch(monkeypatch):
    from triton.runtime import interpreter

    assert hasattr(interpreter._patch_lang, "__wrapped_once__"), "tests/conftest.py did not install the patch"
    fast = _calls()
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.__wrapped_once__)
    slow = _calls()
    assert len(fast) == len(slow) == 10
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
