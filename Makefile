# Two commands do everything from a fresh clone (see README.md):
#   make demo   set up .venv, then train the CPU demo (visible + infrared, MACL)
#   make test   set up .venv, then run the whole test suite
#   make test-fast  only the in-process tests (no training, DDP, workers)
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_CONFIG ?= configs/llvip/demo_cpu.py
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast clean

setup:
	bash tools/setup_env.sh

demo: setup
	$(PY) tools/train.py $(DEMO_CONFIG)

test: setup
	$(PY) -m pytest tests -q -rs -p no:cacheprovider --timeout=900 $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest tests -q -rs -p no:cacheprovider --timeout=900 -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf work_dirs .pytest_cache
