# corral — two commands for a newcomer: `make demo` and `make test`.
# (`make test-fast` is the edit loop: unit tests and the quick local integration tests.)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pytest-xdist workers of `make test` and `make test-fast`
TEST_WORKERS ?= 4
STAMP := $(VENV)/.installed-stamp

# The project's own torch: the CPU build of one exact version. The [torch] extra in
# pyproject.toml is a range, so `pip install 'corral[torch]'` keeps a user's own torch.
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

# Where setup takes torch from, printed as one word:
#   local      a CPU wheel pip finds without any index (find-links, e.g. /opt/wheels);
#   gpu        no local CPU wheel, an NVIDIA GPU here (nvidia-smi): PyPI's default build;
#   cpu-index  neither: PyTorch's CPU wheel index, so no CUDA package is ever pulled.
define torch_source
if $(PY) -m pip install --dry-run --ignore-installed --no-index --no-deps -q 'torch==$(TORCH_VERSION)+cpu' \
	>/dev/null 2>&1; then echo local; \
elif command -v nvidia-smi >/dev/null 2>&1; then echo gpu; \
else echo cpu-index; fi
endef

.PHONY: setup system-deps demo test test-fast unit lint bench gpu-check wheelhouse clean torch-source

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# torch first (see torch_source); the [torch] extra's range is then met, so the editable
# install below leaves that torch as it is.
$(STAMP): pyproject.toml | $(PY)
	@src="$$($(torch_source))"; echo "corral: installing torch $(TORCH_VERSION) ($$src)"; \
	case "$$src" in \
	  local) $(PY) -m pip install -q 'torch==$(TORCH_VERSION)+cpu' ;; \
	  gpu) $(PY) -m pip install -q 'torch==$(TORCH_VERSION)' ;; \
	  *) $(PY) -m pip install -q --extra-index-url '$(TORCH_CPU_INDEX)' \
	       'torch==$(TORCH_VERSION)+cpu' ;; \
	esac
	$(PY) -m pip install -q -e '.[dev,torch,ft,mlflow,tensorboard,wandb]'
	touch $(STAMP)

# corral's byte code, as an installed wheel has it: every corral process (the CLI, each
# agent, each rank's wrapper) would otherwise compile its modules again whenever
# PYTHONDONTWRITEBYTECODE keeps Python from caching them (incremental: only changed files).
setup: $(STAMP)
	@$(PY) -m compileall -q -j 0 src >/dev/null

# Print where setup would take torch from (local, gpu or cpu-index); installs nothing.
torch-source: | $(PY)
	@$(torch_source)

# Debian packages the multi-host tests and benchmarks need (sshd, rsync, ip, pdsh).
system-deps:
	@bash scripts/system-deps.sh

# A fresh checkpoint dir each time, so every `make demo` trains (a finished run's last
# checkpoint would otherwise be resumed: "already complete at step 60/60").
demo: setup
	rm -rf .demo-ckpt
	$(PY) -m corral run --hosts local:2 --nproc-per-node 2 --master-port 0 \
		--checkpoint-dir .demo-ckpt -- examples/train_ddp.py --steps 60
	@echo "corral is installed in $(VENV): run 'source $(VENV)/bin/activate' (or use $(VENV)/bin/corral)"

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -q tests/unit

# The edit loop: unit tests and the local integration tests; no netns testbed, no
# test marked slow (both run in `make test`).
test-fast: setup
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup -m 'not netns and not slow' \
		tests/unit tests/integration

# Tests run on TEST_WORKERS pytest-xdist workers (most of them wait on processes, servers
# and browsers, so more workers than cores pays); the netns testbed's tests are split in
# two groups, each run by one worker on a testbed of its own (worker gwN: testbed
# instance N, tests/parallel.py). The end of the run lists the 25 tests
# that cost the most CPU (their processes included, tests/cpumeter.py) and the total,
# after the 25 slowest by wall time.
test: setup system-deps lint
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup --durations=25 --cpu-report=25

# corral's GPU paths on this machine's GPUs (NCCL, FSDP2 bf16, calibrate, NVML health,
# launch/teardown benchmarks); without a GPU: a CPU dry run of its plumbing, exit 0.
# Steps that need more GPUs than there are are listed SKIPPED with the reason.
# With WHEELHOUSE=DIR (made by `make wheelhouse` elsewhere) nothing is downloaded:
# corral and its dependencies are installed from DIR (pip --no-index) into $(PYTHON),
# the machine's own interpreter with its CUDA torch, and the check runs with it:
#   make gpu-check WHEELHOUSE=wheelhouse PYTHON=python3
gpu-check: $(if $(WHEELHOUSE),,setup)
ifneq ($(WHEELHOUSE),)
	$(PYTHON) scripts/gpu_check.py --wheelhouse '$(WHEELHOUSE)'
else
	@$(PY) -c 'import pynvml' 2>/dev/null || $(PY) -m pip install -q -e '.[gpu]' || true
	$(PY) scripts/gpu_check.py
endif

# Wheels of corral and all its runtime dependencies (not torch) plus the [gpu] extra, for
# a machine that reaches no package registry; default: this machine's Python and platform.
#   make wheelhouse PY_VERSION=3.12 PLATFORM=manylinux2014_x86_64 [WHEELHOUSE=wheelhouse]
# (PLATFORM may list several tags, e.g. "manylinux2014_x86_64 manylinux_2_28_x86_64")
wheelhouse:
	$(PYTHON) scripts/wheelhouse.py --dest '$(or $(WHEELHOUSE),wheelhouse)' \
		$(if $(PY_VERSION),--python-version $(PY_VERSION)) \
		$(foreach p,$(PLATFORM),--platform $(p))

bench: setup system-deps
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .demo-ckpt .pytest_cache .mypy_cache .ruff_cache
