# The commands the README and CI use. Each target creates the environment first (scripts/bootstrap.sh).
VENV ?= .venv
PY := $(VENV)/bin/python
# pytest-xdist workers: the CPU suite runs the Triton interpreter, 2 cores on CI
WORKERS ?= 2

.PHONY: venv run test fuzz bench lint clean

venv:
	@VENV=$(VENV) bash scripts/bootstrap.sh

## run: every backend on a random paged cache, checked against the float64 reference (GPU if present, else CPU)
run: venv
	$(PY) -m flashdecode run

## test: the test suite (Triton interpreter on CPU without a GPU, native on a GPU)
test: venv
	$(PY) -m pytest -q -n $(WORKERS) tests

## fuzz: hypothesis fuzzing of decode_attention against float64, FUZZ_EXAMPLES random cases per backend (prints the count)
FUZZ_EXAMPLES ?= 1000
fuzz: venv
	FLASHDECODE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -n $(WORKERS) --hypothesis-profile fuzz tests/test_fuzz.py

## bench: the benchmark's anchor preset (PERF.md's grid), results under bench-out/
bench: venv
	$(PY) -m flashdecode bench --preset anchor --out bench-out

## lint: ruff (pyflakes, pycodestyle errors) over the package, tests and scripts (ruff installed into the venv on first use)
lint: venv
	@$(PY) -m ruff --version >/dev/null 2>&1 || $(PY) -m pip install -q ruff
	$(PY) -m ruff check src tests scripts

clean:
	rm -rf $(VENV) bench-out .pytest_cache .ruff_cache
