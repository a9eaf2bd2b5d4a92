# Two commands do everything from a fresh clone (see README.md):
#   make demo   set up .venv, then train the CPU demo (visible + infrared, MACL)
#   make test   set up .venv, then run the whole test suite
#   make test-fast    only the in-process tests (no training, DDP, workers)
#   make test-newest  the whole suite on the newest torch that CI tests, in
#                     its own venv (.venv-newest; NEWEST_TORCH chooses)
# .venv holds the default stack (tools/setup_env.sh: torch 2.1.2, for which
# OpenMMLab publishes prebuilt mmcv; MMSAFE_TORCH=... chooses another).
# TEST_WORKERS: pytest-xdist workers for `make test` (0 runs serially).
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_CONFIG ?= configs/llvip/demo_cpu.py
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
NEWEST_VENV ?= .venv-newest
NEWEST_TORCH ?= torch==2.13.0

.PHONY: setup demo test test-fast test-newest clean

# SETUP_TORCH reaches the set-up only (not the tests' environment).
setup:
	MMSAFE_VENV="$(abspath $(VENV))" $(if $(SETUP_TORCH),MMSAFE_TORCH="$(SETUP_TORCH)") bash tools/setup_env.sh

demo: setup
	$(PY) tools/train.py $(DEMO_CONFIG)

# --dist loadfile: a file's tests share a worker (module-scoped fixtures run
# once); tests/conftest.py orders the files slowest first.
test: setup
	$(PY) -m pytest tests -q -rs -p no:cacheprovider --timeout=900 \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest tests -q -rs -p no:cacheprovider --timeout=900 -m "not slow" $(PYTEST_ARGS)

test-newest:
	$(MAKE) test VENV="$(NEWEST_VENV)" SETUP_TORCH="$(NEWEST_TORCH)"

clean:
	rm -rf work_dirs .pytest_cache
