"""tests/interpreter_patch.py changes the interpreter's speed, not its results: every kernel of a call (single pass,
planner, partials with the fused merge, combine, append) gives bit-identical outputs with Triton's own ``_patch_lang``
and overflow checks."""

import os

import pytest
import torch

import flashdecode
from flashdecode import launcher

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU suite's interpreter only")


def _calls(monkeypatch):
    from flashdecode import triton_splitk

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
    with monkeypatch.context() as m:  # the planner kernel's cut, merged in the last partial program of each sequence
        m.setattr(triton_splitk, "FUSED_EXPECTED_CHUNKS", 10**6)
        m.setattr(triton_splitk, "INLINE_PLAN_MAX_BATCH", 0)
        m.setattr(triton_splitk, "INLINE_FUSED_MAX_BATCH", 0)
        launcher.clear()
        outs += flashdecode.decode_attention(q, k, v, lens, table, backend="triton_splitk", return_lse=True)
    kc, vc = k.clone(), v.clone()
    slots = torch.tensor([3, 17 * 16 + 15, -1], dtype=torch.int32)
    flashdecode.append_kv(q[:, :2], q[:, 2:4], kc, vc, slots, backend="triton")
    return outs + [kc, vc]


def test_outputs_are_bit_identical_with_and_without_the_patch(monkeypatch):
    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter

    sanitize = TritonSemantic.binary_op_sanitize_overflow_impl
    assert hasattr(interpreter._patch_lang, "__wrapped_once__"), "tests/conftest.py did not install the patch"
    assert hasattr(sanitize, "__wrapped_once__"), "tests/conftest.py did not install the patch"
    fast = _calls(monkeypatch)
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.__wrapped_once__)
    monkeypatch.setattr(TritonSemantic, "binary_op_sanitize_overflow_impl", sanitize.__wrapped_once__)
    slow = _calls(monkeypatch)
    assert len(fast) == len(slow) == 12
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)


def test_the_skipped_overflow_check_is_one_the_interpreter_discards():
    """skip_discarded_overflow_checks relies on device_assert returning unread without ``debug``: the interpreter's
    options must leave it off (a Triton that turns it on gets the check back, since the skip tests it per call)."""
    from triton.runtime import interpreter

    assert interpreter.interpreter_builder.options.debug is False
