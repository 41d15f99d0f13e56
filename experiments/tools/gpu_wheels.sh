#!/usr/bin/env bash
# The few wheels podlab needs on a GPU image that has JAX with CUDA, torch, optax, orbax, flax and
# einops but not podlab's other packages (dm-haiku and its jmp and tabulate, ml-collections, absl-py,
# PyYAML, tokenizers; TensorFlow, TFDS and CLU are not needed: the steps and benchmarks import
# without them). Run it where pip can reach PyPI (the versions are constraints.txt's); it fills
# .whl/ (git-ignored) for that image's Python (default 3.12, manylinux x86-64) and prints the
# commands to run there, from a copy of this repository with .whl/ in it:
#
#   experiments/tools/gpu_wheels.sh              # or PYTHON_VERSION=3.11 ... for another image
#   # on the GPU machine:
#   python3 -m pip install --no-deps --target /tmp/podlab_site .whl/*.whl
#   PYTHONPATH=/tmp/podlab_site:$PWD make bench-gpu
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
PLATFORM="${PLATFORM:-manylinux2014_x86_64}"
pin() { grep -i "^$1==" constraints.txt | head -n1; }
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
  --implementation cp --platform "$PLATFORM" --platform manylinux_2_17_x86_64 -d .whl \
  "$(pin dm-haiku)" "$(pin jmp)" "$(pin tabulate)" "$(pin ml_collections)" "$(pin absl-py)" \
  "$(pin PyYAML)" "$(pin tokenizers)"
ls .whl
echo
echo "on the GPU machine, in this repository with .whl/ copied beside it:"
echo "  python3 -m pip install --no-deps --target /tmp/podlab_site .whl/*.whl"
echo "  PYTHONPATH=/tmp/podlab_site:\$PWD make bench-gpu"
