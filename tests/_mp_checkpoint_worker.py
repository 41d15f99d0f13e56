"""One process of the 2-process checkpoint test (tests/test_distributed.py launches two).

Run by hand (two shells, same port and directory):

  XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \
    python tests/_mp_checkpoint_worker.py --process_id=0 --port=12355 --dir=/tmp/mp_ckpt
  XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu PODLAB_PROCESS_ID=1 \
    PODLAB_NUM_PROCESSES=2 PODLAB_COORDINATOR=localhost:12355 \
    python tests/_mp_checkpoint_worker.py --dir=/tmp/mp_ckpt

Without --process_id the process initialises from the PODLAB_* environment variables. Prints
`WORKER_OK <process_id>` and exits 0 when every check passed.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from experiments.common import checkpointing  # noqa: E402
from experiments.common import distributed  # noqa: E402
from experiments.common import parallel  # noqa: E402


def _same_bits(a: np.ndarray, b: np.ndarray, name: str) -> None:
  a, b = np.asarray(a), np.asarray(b)
  if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
    raise AssertionError(f"{name}: {a.dtype}{a.shape} {a!r} != {b.dtype}{b.shape} {b!r}")


def _check_tree(got, want, name: str) -> None:
  got_leaves, got_def = jax.tree_util.tree_flatten_with_path(got)
  want_leaves, want_def = jax.tree_util.tree_flatten_with_path(want)
  assert got_def == want_def, f"{name}: structure {got_def} != {want_def}"
  for (path, g), (_, w) in zip(got_leaves, want_leaves):
    _same_bits(g, w, name + jax.tree_util.keystr(path))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--process_id", type=int, default=None)
  parser.add_argument("--port", type=int, default=None)
  parser.add_argument("--dir", required=True)
  args = parser.parse_args()
  if args.process_id is None:
    info = distributed.initialize()  # From PODLAB_* environment variables.
  else:
    info = distributed.initialize(coordinator_address=f"localhost:{args.port}", num_processes=2,
                                  process_id=args.process_id)
  pid = info.process_index
  assert (info.process_count, info.local_device_count, info.device_count) == (2, 2, 4), info
  assert parallel.REPLICATED.mesh().devices.shape == (4,)
  assert parallel.REPLICATED.local_mesh().devices.shape == (2,)

  local_mesh = parallel.REPLICATED.local_mesh()
  w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
  replicated = {
      "params": {
          "w": w,
          "w_bf16": (w * 3).astype(ml_dtypes.bfloat16),
          # Replicated over this host's devices, and pmap-stacked (one identical row per device).
          "w_replicated": jax.device_put(w, NamedSharding(local_mesh, P())),
          "w_stacked": jax.device_put(np.stack([w[0]] * 2),
                                      NamedSharding(local_mesh, P(parallel.AXIS))),
      },
      "step": np.int32(7),
      "flags": np.array([True, False, True]),
  }
  want_replicated = dict(replicated, params=dict(replicated["params"], w_replicated=w,
                                                 w_stacked=w[0]))
  # Different on every device of every process: value = 100 * process + 10 * local row + k.
  rows = np.arange(2)[:, None] * 10 + np.arange(5)[None, :] + 100 * pid
  per_device = {
      "carry": {"z": rows.astype(np.float32) + 0.25,
                "z_bf16": rows.astype(ml_dtypes.bfloat16)},
      "halted": jax.device_put((rows % 2 == 0), NamedSharding(local_mesh, P(parallel.AXIS))),
      "count": rows.astype(np.int32),
  }
  want_per_device = jax.tree.map(np.asarray, per_device)

  ckpt = checkpointing.CheckpointManager(args.dir, save_interval_steps=5, max_to_keep=2)
  assert ckpt.restore(replicated_like=replicated, per_device_like=per_device) is None
  assert ckpt.save(5, replicated=replicated, per_device=per_device)
  assert not ckpt.save(7, replicated=replicated, per_device=per_device)  # Off-interval.
  later = jax.tree.map(
      lambda x: ~np.asarray(x) if x.dtype == bool else (np.asarray(x) + 1).astype(x.dtype),
      per_device)
  assert ckpt.save(7, replicated=replicated, per_device=later, force=True)
  ckpt.wait_until_finished()
  assert ckpt.all_steps() == [5, 7], ckpt.all_steps()

  step, got_replicated, got_per_device = ckpt.restore(
      replicated_like=replicated, per_device_like=per_device)
  assert step == 7, step
  _check_tree(got_replicated, want_replicated, "replicated")
  _check_tree(got_per_device, later, "per_device@7")
  templates = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), want_per_device)
  step, _, got_per_device = ckpt.restore(5, replicated_like=replicated, per_device_like=templates)
  assert step == 5
  _check_tree(got_per_device, want_per_device, "per_device@5")
  ckpt.close()
  distributed.finalize()
  print(f"WORKER_OK {pid}", flush=True)


if __name__ == "__main__":
  main()
