# podlab: `make run` trains the embedded default, `make test` runs the test suite.
# Both create .venv with the pinned stack on a fresh machine (pyproject.toml).
SHELL := /bin/bash
PYTHON_BOOT ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.podlab-installed
PYTEST_ARGS ?=

.PHONY: venv test test-slow run bench clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,torch]'
	@touch $@

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
