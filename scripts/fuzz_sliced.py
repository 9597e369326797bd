"""The fuzz test (tests/test_fuzz.py) with ``api.MAX_LAUNCH_BATCH`` = 2, so that every drawn batch of 3 or more
sequences runs in slices (``api._decode_in_slices``), as a batch past 32768 does on a GPU.

One process, no xdist (the patch must hold where the tests run); the plan backend is left out, since a plan refuses
such batches. Runs natively on a GPU, else on the CPU through the interpreter (tests/conftest.py's rule), from the
repository root:

    FLASHDECODE_FUZZ_EXAMPLES=60 .venv/bin/python scripts/fuzz_sliced.py [BACKENDS]

BACKENDS, optional, narrows the run with a pytest -k expression (e.g. "auto" or "triton_splitk or auto").

2026-11-29 at 4ced008: 60 examples per backend, 300 examples, all passed in 10:57 on two CPU cores.
2026-11-29 at b8ad79c on an H200: 80 examples each for `triton`, `triton_splitk` and `auto`, all passed
(docs/benchmarks/h200-2026-11-29/checks-b8ad79c).
"""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["FLASHDECODE_HYPOTHESIS_PROFILE"] = "fuzz"

import pytest  # noqa: E402

import flashdecode.api as api  # noqa: E402

api.MAX_LAUNCH_BATCH = 2
only = f" and ({sys.argv[1]})" if len(sys.argv) > 1 else ""
sys.exit(pytest.main(["-q", "-p", "no:xdist", "-p", "no:cacheprovider", "tests/test_fuzz.py", "-k",
                      "matches_reference and not plan" + only, "--hypothesis-profile", "fuzz"]))  # fmt: skip
