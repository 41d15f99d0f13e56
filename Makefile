# podlab: `make run` trains the embedded default, `make test` runs the test suite.
# Both create .venv with the pinned stack on a fresh machine (pyproject.toml).
SHELL := /bin/bash
PYTHON_BOOT ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.podlab-installed
PYTEST_ARGS ?=

.PHONY: venv test test-slow run bench params faults clean-venv
RUN_WORKDIR ?= workdirs/cpu_demo

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,torch]'
	@touch $@

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

# Trains the embedded default (TRM-MLP on generated Sudoku, CPU) and prints the evaluation table.
# The dataset is generated on first use; re-running resumes from $(RUN_WORKDIR) (rm -rf it to restart).
run: $(STAMP)
	$(PY) -m experiments.trm.main --config=configs/cpu_demo.py --workdir=$(RUN_WORKDIR)

# Parameter counts of the six reference TRM configs, from the model code.
params: $(STAMP)
	$(PY) -m experiments.trm.params

BENCH_ARGS ?=
# Benchmarks the real TRM training step (Sudoku TRM-MLP/Att): compile s, ms/step, examples/s, RSS,
# compiled memory, analytic FLOP/s vs the measured matmul peak. Hours at full size on a CPU; narrow it
# with BENCH_ARGS='--models=mlp --dtypes=bfloat16 --batches=64', smoke test with BENCH_ARGS=--quick.
bench: $(STAMP)
	$(PY) -m experiments.trm.bench $(BENCH_ARGS)

FAULT_ARGS ?=
# Fault injection: R trials of train -> SIGKILL (at a random step or during a checkpoint save) or
# SIGTERM -> restart -> compare with an unbroken run; prints a table. Default 4 trials (~5 min here);
# FAULT_ARGS='--trials=20', '--processes=2 --devices=2' for a 2-process run through launch/local.sh.
faults: $(STAMP)
	$(PY) -m experiments.trm.faults $(FAULT_ARGS)

clean-venv:
	rm -rf $(VENV)
