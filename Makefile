# Both targets create (or reuse) the virtual environment in .venv themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test bench quality clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m streamtrace demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m pytest -q bench -p no:cacheprovider --pin-cpu 0

quality: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,quality]'
	$(PY) bench/quality.py

clean:
	rm -rf $(VENV) build *.egg-info
