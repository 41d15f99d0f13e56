# podlab: `make run` trains the embedded default, `make test` runs the test suite.
# Both create .venv with the pinned stack on a fresh machine (pyproject.toml).
SHELL := /bin/bash
PYTHON_BOOT ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.podlab-installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: 2 = this project's 2-core machines (most of a test is
# single-threaded XLA compilation, so two run side by side; 3 measured no faster); PYTEST_WORKERS=0
# runs in one process. --dist worksteal: each worker takes half of the tests (tests/conftest.py
# puts the longest files first) and an idle worker takes tests from the end of the other's queue.
PYTEST_WORKERS ?= 2

.PHONY: venv test test-slow run bench bench-throughput profile params faults clean-venv bazel-test
RUN_WORKDIR ?= workdirs/cpu_demo

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	PYTHONWARNINGS=ignore $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,torch,tpu]'
	@touch $@

test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m slow -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# Trains the embedded default (TRM-MLP on generated Sudoku, CPU) and prints the evaluation table.
# The dataset is generated on first use; re-running resumes from $(RUN_WORKDIR) (rm -rf it to restart).
run: $(STAMP)
	$(PY) -m experiments.trm.main --config=configs/cpu_demo.py --workdir=$(RUN_WORKDIR)

# Parameter counts of the six reference TRM configs, from the model code.
params: $(STAMP)
	$(PY) -m experiments.trm.tools.params

BENCH_ARGS ?=
# podlab's real TRM training step beside the reference's PyTorch step (Sudoku TRM-MLP/Att, float32
# and bfloat16, batch 64 and 256), alternating in one process: median ms, p10-p90, examples/s, peak
# heap, podlab/reference speed; the header names the CPU and whether it has native bfloat16. Hours at
# full size on a 2-core CPU: narrow it with BENCH_ARGS='--models=mlp --dtypes=float32 --batches=64
# --steps=3', smoke test with BENCH_ARGS=--quick; add --write_docs to merge the table into
# docs/benchmarks.md's trm-bench block (experiments/tools/doc_tables.py).
bench: $(STAMP)
	$(PY) -m experiments.trm.tools.bench_reference $(BENCH_ARGS)

THROUGHPUT_ARGS ?=
# podlab's step alone (the earlier `make bench`): compile s, ms/step, examples/s, RSS, compiled
# memory, analytic FLOP/s vs the measured matmul peak, the largest batch that fits. Narrow it with
# THROUGHPUT_ARGS='--models=mlp --dtypes=bfloat16 --batches=64', smoke test with THROUGHPUT_ARGS=--quick;
# add --write_docs to merge the table into docs/benchmarks.md's trm-bench-throughput block.
bench-throughput: $(STAMP)
	$(PY) -m experiments.trm.tools.bench $(THROUGHPUT_ARGS)

PROFILE_ARGS ?=
# Where TRM's training step spends its time, per operation of the compiled program (a jax.profiler
# trace joined with the optimized HLO): on a CPU ms, calls, matmul GFLOP and GFLOP/s against this
# CPU's measured peak, overlap; on a GPU ms and launches per kernel, its GEMM dtype and HLO source;
# PROFILE_ARGS='--tpu=v5litepod-1' compiles for a TPU instead (op counts, bf16 products run in
# float32, scatters, compiler bytes). Default: make run's model; PROFILE_ARGS='--model=att
# --dtype=float32 --batch=64 --steps=1 --warmup=1' for a recipe.
profile: $(STAMP)
	$(PY) -m experiments.trm.tools.profile_step $(PROFILE_ARGS)

.PHONY: bench-gpu
BENCH_GPU_ARGS ?=
BENCH_GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
# podlab's bf16 steps beside the references' on one CUDA GPU: TRM-MLP/Att at batch 768 and 256 (the
# reference under torch.compile, and eager) and GPT-2 124M beside nanoGPT (compile=True): ms/step,
# p10-p90, items/s, TFLOP/s, MFU, peak device memory, podlab/reference. No venv needed: on a GPU
# image run experiments/tools/gpu_wheels.sh's two commands (python3 with PYTHONPATH set).
# BENCH_GPU_ARGS=--quick: a smoke run at tiny sizes (also on a CPU).
bench-gpu:
	$(BENCH_GPU_PY) -m experiments.tools.bench_gpu $(BENCH_GPU_ARGS)

FAULT_ARGS ?=
# Fault injection: R trials of train -> SIGKILL (at a random step or during a checkpoint save) or
# SIGTERM -> restart -> compare with an unbroken run; prints a table. Default 4 trials (~2 min here);
# FAULT_ARGS='--trials=20', '--processes=2 --devices=2' for a 2-process run through launch/local.sh.
faults: $(STAMP)
	$(PY) -m experiments.trm.tools.faults $(FAULT_ARGS)

.PHONY: tpu-check
TPU_CHECK_ARGS ?=
# Every pod config compiled for its TPU target by the TPU compiler (libtpu), on this CPU: one table of
# per-chip HBM (the compiler's peak and margin), FLOPs, speed bounds and MFU at them (compiler
# estimates), written into docs/tpu.md's table and the README's excerpt. Tens of minutes on 2 cores;
# TPU_CHECK_ARGS=--only=trm narrows it (the other rows of the docs' table stay).
tpu-check: $(STAMP)
	$(PY) -m experiments.tools.tpu_check --write_docs $(TPU_CHECK_ARGS)

.PHONY: diffucoder-bench diffucoder-train
DIFFUCODER_BENCH_ARGS ?=
MDM_WORKDIR ?= workdirs/shakespeare_mdm
# The masked-diffusion Dream of configs/shakespeare_mdm.py on shakespeare_char (~11 min on 2 CPU
# cores; prepares the data on first use from the repository's input_pipeline/data/tinyshakespeare;
# resumes from $(MDM_WORKDIR)).
MDM_TRAIN = $(PY) -m experiments.diffucoder.main --config=configs/shakespeare_mdm.py \
    --workdir=$(MDM_WORKDIR)
diffucoder-train: $(STAMP)
	$(MDM_TRAIN)
# The diffusion speed-ups on that TRAINED model (trained first when $(MDM_WORKDIR) has no finished
# run; MDM_WORKDIR=DIR points at another): forwards per token, tokens/s, agreement with the plain
# sampler and the completions' likelihood under the plain model, for plain, blocks, prefix / dual
# cache, threshold 0.9 and Fast-dLLM's exact loop (a few minutes). The random-model tables and the
# 7.6B dry run: python -m experiments.diffucoder.tools.benchmark [--compare | --dry_run] (its docstring;
# --write_docs merges the random-model table into docs/benchmarks.md).
diffucoder-bench: $(STAMP)
	@test -f $(MDM_WORKDIR)/final_eval.json || $(MDM_TRAIN)
	$(PY) -m experiments.diffucoder.tools.benchmark --trained=$(MDM_WORKDIR) $(DIFFUCODER_BENCH_ARGS)

.PHONY: gpt-run gpt-bench
GPT_WORKDIR ?= workdirs/shakespeare_char_cpu
GPT_BENCH_ARGS ?=
GPT_ARGS ?=
GPT_SAMPLE_ARGS ?=
# nanoGPT's README CPU recipe (shakespeare_char, 4x4x128, 2000 iterations; prepares the data on
# first use from the repository's input_pipeline/data/tinyshakespeare), then 2 samples. Re-running
# resumes from $(GPT_WORKDIR). A short run: GPT_ARGS='--config.max_iters=20 --config.eval_interval=10'
# GPT_SAMPLE_ARGS=--max_new_tokens=100 GPT_WORKDIR=/tmp/gpt (the trainer's and sample's flags).
gpt-run: $(STAMP)
	$(PY) -m experiments.nanogpt.main --config=configs/shakespeare_char_cpu.py --workdir=$(GPT_WORKDIR) \
	    $(GPT_ARGS)
	$(PY) -m experiments.nanogpt.sample --config=configs/shakespeare_char_cpu.py \
	    --workdir=$(GPT_WORKDIR) --num_samples=2 $(GPT_ARGS) $(GPT_SAMPLE_ARGS)
# ms/iteration of the CPU recipe's training step and KV-cache vs no-cache sampling of 500 tokens;
# GPT_BENCH_ARGS='--torch --skip_sampling --write_docs' writes the step table into docs/benchmarks.md.
gpt-bench: $(STAMP)
	$(PY) -m experiments.nanogpt.tools.bench $(GPT_BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)

# Bazel: `bazel test //...` over the same test files as `make test` (the @pytest.mark.slow
# tests are NAME_slow targets tagged out; BAZEL_ARGS=--config=slow runs only them). The Bazel is
# Debian's bazel-bootstrap 4.2.3, installed here with apt when missing: it works offline with the
# local stand-ins in third_party/ (WORKSPACE says why not npm's @bazel/bazel 2.1.0). Its output base
# is ~/.cache/bazel/_bazel_$USER/<hash of the checkout path>; BAZEL_TARGETS=//tests:test_layers narrows.
BAZEL ?= bazel
BAZEL_TARGETS ?= //...
BAZEL_ARGS ?=
define INSTALL_BAZEL
	@command -v $(BAZEL) >/dev/null || { echo "$@: installing Debian's bazel-bootstrap"; \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); export DEBIAN_FRONTEND=noninteractive; \
	  $$sudo apt-get install -y -q bazel-bootstrap || \
	  { $$sudo apt-get update -q && $$sudo apt-get install -y -q bazel-bootstrap; }; }
endef
bazel-test: $(STAMP)
	$(INSTALL_BAZEL)
	$(BAZEL) test $(BAZEL_ARGS) $(BAZEL_TARGETS)

# Bazel's analysis of every target, nothing built or run (seconds once Bazel is installed): a BUILD
# graph Bazel refuses (a cycle, a missing label) fails here. CI runs it after make test.
.PHONY: bazel-check
bazel-check: $(STAMP)
	$(INSTALL_BAZEL)
	$(BAZEL) build --nobuild $(BAZEL_TARGETS)
