"""Test set-up: without a GPU the Triton kernels run under the interpreter on CPU tensors.

TRITON_INTERPRET must be set before anything imports triton, so it is decided here, at collection time.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device():
    return DEVICE


def pytest_report_header(config):
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU, Triton interpreter"
    return f"flashdecode tests on {where}"
