# Two commands do everything from a fresh clone (see README.md):
#   make demo   set up .venv, then train the CPU demo (visible + infrared, MACL)
#   make test   set up .venv, then run the whole test suite
#   make test-fast    only the in-process tests (no training, DDP, workers)
#   make test-oldest  the whole suite on the oldest supported stack, in its
#                     own venv (.venv-oldest: torch 2.0.1, mmcv 2.0.1,
#                     mmengine 0.7.4, mmdet 3.0.0), as CI does
#   make test-newest  the whole suite on the newest stack CI tests, in its
#                     own venv (.venv-newest: the newest torch mmcv builds
#                     against, mmcv 2.1.0, mmengine 0.10.7, mmdet 3.3.0)
# .venv holds the default stack (tools/setup_env.sh: torch 2.1.2, mmcv
# 2.1.0, mmdet 3.3, for which OpenMMLab publishes prebuilt mmcv;
# MMSAFE_TORCH=... chooses another torch). tools/setup_plan.py names the
# stacks.
# TEST_WORKERS: pytest-xdist workers for `make test` (0 runs serially).
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_CONFIG ?= configs/llvip/demo_cpu.py
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
OLDEST_VENV ?= .venv-oldest
NEWEST_VENV ?= .venv-newest
# another torch for the newest venv (default: the newest stack's)
NEWEST_TORCH ?=

.PHONY: setup demo test test-fast test-oldest test-newest clean

# SETUP_STACK and SETUP_TORCH reach the set-up only (not the tests).
setup:
	MMSAFE_VENV="$(abspath $(VENV))" $(if $(SETUP_STACK),MMSAFE_STACK="$(SETUP_STACK)") $(if $(SETUP_TORCH),MMSAFE_TORCH="$(SETUP_TORCH)") bash tools/setup_env.sh

demo: setup
	$(PY) tools/train.py $(DEMO_CONFIG)

# --dist loadfile: a file's tests share a worker (module-scoped fixtures run
# once); tests/conftest.py orders the files slowest first.
test: setup
	$(PY) -m pytest tests -q -rs -p no:cacheprovider --timeout=900 \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest tests -q -rs -p no:cacheprovider --timeout=900 -m "not slow" $(PYTEST_ARGS)

# the tests that do not depend on the stack (pytest marker one_end: the
# benchmark scripts, the Windows launchers, the set-up planner, the docs)
# run at the newest end only
test-oldest:
	MMSAFE_TESTS_AT_ONE_END=newest $(MAKE) test VENV="$(OLDEST_VENV)" SETUP_STACK=oldest

test-newest:
	$(MAKE) test VENV="$(NEWEST_VENV)" SETUP_STACK=newest $(if $(NEWEST_TORCH),SETUP_TORCH="$(NEWEST_TORCH)")

clean:
	rm -rf work_dirs .pytest_cache
