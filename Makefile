# corral — two commands for a newcomer: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup system-deps demo test unit lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned (==2.13.0, the CPU wheel pip finds here) by the [torch] extra,
	# so this never pulls CUDA packages.
	$(PY) -m pip install -q -e '.[dev,torch]'
	touch $(STAMP)

setup: $(STAMP)

# Debian packages the multi-host tests and benchmarks need (sshd, rsync, ip, pdsh).
system-deps:
	@bash scripts/system-deps.sh

demo: setup
	$(PY) -m corral run --hosts local:2 --nproc-per-node 2 --master-port 0 \
		--checkpoint-dir .demo-ckpt -- examples/train_ddp.py --steps 60

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -q tests/unit

test: setup system-deps lint
	$(PY) -m pytest -q -ra

bench: setup system-deps
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .demo-ckpt .pytest_cache .mypy_cache .ruff_cache
