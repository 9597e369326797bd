"""Test set-up: without a GPU the Triton kernels run under the interpreter on CPU tensors.

TRITON_INTERPRET must be set before anything imports triton, so it is decided here, at collection time.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import interpreter_patch  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    interpreter_patch.install()  # the same results, faster (tests/interpreter_patch.py)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _no_recorded_calls():
    """Each test starts with no recorded call (flashdecode/launcher.py): a test that changes a module constant must
    not replay launches recorded under another test's constants."""
    from flashdecode import launcher

    launcher.clear()
    yield
    launcher.clear()


def pytest_report_header(config):
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU, Triton interpreter"
    return f"flashdecode tests on {where}"


# hypothesis profiles (tests/strategies.py): "ci" unless --hypothesis-profile or FLASHDECODE_HYPOTHESIS_PROFILE says
import strategies  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.load_profile(strategies.profile_name())


def pytest_sessionfinish(session):
    # an xdist worker hands its fuzz counts to the controller
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["fuzz_examples"] = dict(strategies.EXAMPLES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    strategies.EXAMPLES.update(getattr(node, "workeroutput", {}).get("fuzz_examples", {}))


def pytest_terminal_summary(terminalreporter):
    if strategies.EXAMPLES:
        total = sum(strategies.EXAMPLES.values())
        profile = settings.get_current_profile_name()
        terminalreporter.write_line(f"fuzz: {total} examples run (hypothesis profile {profile})")
        for test_id, count in sorted(strategies.EXAMPLES.items()):
            terminalreporter.write_line(f"  {count:6d}  {test_id}")
