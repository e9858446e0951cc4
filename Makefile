# One command each: `make test` (set up + run the tests), `make demo` (set up + main job).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-pythons demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

# The same suite on every supported Python, one virtual environment each
# (.venv-python3.13, ...). PYTHONS takes commands or paths (with pyenv, for instance
# PYTHONS="$$(pyenv root)/versions/3.13.0/bin/python").
PYTHONS ?= python3.11 python3.13
test-pythons:
	set -e; for p in $(PYTHONS); do \
	  v=$$($$p -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  $(MAKE) test PYTHON=$$p VENV=.venv-python$$v; \
	done

demo: $(STAMP)
	$(PY) -m constrained_decoding.demo

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/regex_bench.py --batch-sizes 1,64

clean:
	rm -rf $(VENV) .venv-python*
