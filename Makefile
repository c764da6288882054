# Two entry points do all the set-up on a fresh machine:
#   make demo   builds .venv if missing, then runs the built-in example cold and warm
#   make test   builds .venv if missing, then runs the test suite (what CI runs)
# TORCH picks the torch build installed first, so that the range in pyproject.toml
# does not pull a several-GB CUDA build onto a CPU machine.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fcache-installed

.PHONY: demo test lint bench-smoke proto clean-venv

$(STAMP): pyproject.toml
	@# The Redis tier's tests start a real redis-server (Debian's package); CI runs as root.
	command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; } \
		|| { echo "make: the tests need redis-server (apt-get install redis-server)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fcache demo

# Two pytest processes (pytest-xdist), each test file on one of them (a file's fixtures,
# such as a cold-compiled model, are built once); -v prints each test as it finishes.
TEST_ARGS ?= -n 2 --dist loadfile -v --durations=15

test: $(STAMP)
	@echo "make test: 11-15 minutes on 2 cores (the slowest tests compile real models in"
	@echo "fresh processes, minutes each); each test is printed as it finishes."
	$(PY) -m pytest $(TEST_ARGS) tests

lint: $(STAMP)
	$(VENV)/bin/ruff check fcache service tests bench
	$(VENV)/bin/ruff format --check fcache service tests bench

bench-smoke: $(STAMP)
	$(PY) -m bench.run --smoke

proto:
	scripts/gen_proto.sh

clean-venv:
	rm -rf $(VENV)
