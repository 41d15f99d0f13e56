"""One process of the multi-process TRM training test (tests/test_multiprocess_train.py launches it).

Runs a few pmapped TRM train steps (`train.make_train_step`, the trainer's own step) on fixed global
batches and saves the result, so that the test can compare layouts that split the same 4 devices
differently (1 process x 4 devices vs 2 processes x 2 devices). Every process builds the SAME global
batches from a fixed numpy seed and takes its own devices' rows: global device d = process * local + i
gets rows [d * PER_DEVICE, (d + 1) * PER_DEVICE).

  python tests/_mp_train_worker.py PROCESS_ID NUM_PROCESSES PORT DEVICES_PER_PROCESS OUT_PATH

By hand, 2 x 2 (two shells, same port):

  XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \
    python tests/_mp_train_worker.py 0 2 12355 2 /tmp/mp_train_2x2.npz
  XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \
    python tests/_mp_train_worker.py 1 2 12355 2 /tmp/mp_train_2x2.npz

Process 0 writes OUT_PATH; every other process p writes OUT_PATH with `.process<p>.npz` appended (the
test checks that all hosts hold the same state). np.savez without pickle: parameter leaves are
`params/<i>` and `ema/<i>` with their tree paths in `param_names`; the table is `puzzle_table`;
`metric/<name>` is the psummed metric of every step ([NUM_STEPS]); `batch_ids` the global puzzle ids
of every step ([NUM_STEPS, GLOBAL_BATCH]). Prints `WORKER_OK <process_id>` on success.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments.common import distributed  # noqa: E402
from experiments.common import parallel  # noqa: E402
from experiments.trm import train  # noqa: E402
from experiments.trm.configs import cpu_demo  # noqa: E402
from modules import trm  # noqa: E402

NUM_DEVICES = 4                  # global, in every layout
PER_DEVICE = 2
GLOBAL_BATCH = NUM_DEVICES * PER_DEVICE
NUM_STEPS = 4
SEQ_LEN, VOCAB = 81, 11
NUM_PUZZLE_IDS = 8
PRESENT_IDS = (0, 1, 2, 3, 5, 6)   # ids 4 and 7 never occur: their table rows must stay zero
METADATA = {"seq_len": SEQ_LEN, "vocab_size": VOCAB, "num_puzzle_identifiers": NUM_PUZZLE_IDS}


def config():
  c = cpu_demo.get_config("smoke")            # hidden 32, mlp_t, float32 compute, EMA on
  c.model.puzzle_emb_ndim = c.model.hidden_size
  c.model.puzzle_emb_len = 16
  c.model.halt_max_steps = 2                  # carry resets happen within the 4 steps
  c.global_batch_size = GLOBAL_BATCH
  c.lr_warmup_steps = 1                       # non-zero learning rates from step 1 (table moves)
  c.total_steps = NUM_STEPS
  return c


def global_batches(seed: int = 1234):
  """NUM_STEPS global batches {inputs [8, 81] in 1..10, labels [8, 81] in 2..10, ids [8] in 0..7}.

  Step 1 (every slot takes a row of it: the initial carry is halted) holds every id of PRESENT_IDS;
  every step has ids repeated on one device and across devices of different hosts (rows 0-3 live on
  process 0 and rows 4-7 on process 1 in the 2 x 2 layout).
  """
  rng = np.random.default_rng(seed)
  out = []
  for step in range(NUM_STEPS):
    inputs = rng.integers(1, VOCAB, (GLOBAL_BATCH, SEQ_LEN)).astype(np.int32)
    labels = rng.integers(2, VOCAB, (GLOBAL_BATCH, SEQ_LEN)).astype(np.int32)
    if step == 0:
      # Devices: 0 -> (0, 1), 1 -> (2, 3), 2 -> (5, 2), 3 -> (6, 0): 0 on devices 0 and 3, 2 on 1 and 2.
      ids = np.array([0, 1, 2, 3, 5, 2, 6, 0], np.int32)
    else:
      ids = rng.choice(np.array(PRESENT_IDS), GLOBAL_BATCH).astype(np.int32)
      ids[1] = ids[0]                         # duplicate within device 0
      ids[6] = ids[0]                         # ... and on device 3 (the other host in 2 x 2)
    out.append({"inputs": inputs, "labels": labels, "puzzle_identifiers": ids})
  return out


def _local_rows(batch, process_index: int, local_count: int):
  """This process's devices' rows, shaped [local_count, PER_DEVICE, ...]."""
  first = process_index * local_count * PER_DEVICE
  return {k: v[first:first + local_count * PER_DEVICE].reshape((local_count, PER_DEVICE) + v.shape[1:])
          for k, v in batch.items()}


def _first_local(x) -> np.ndarray:
  """Host copy of this process's first device's value (per-device or replicated output)."""
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_shards[0].data)
  return np.asarray(x)


def main() -> None:
  process_id, num_processes, port, devices_per_process = (int(a) for a in sys.argv[1:5])
  out_path = sys.argv[5]
  info = distributed.initialize(coordinator_address=f"localhost:{port}",
                                num_processes=num_processes, process_id=process_id)
  assert (info.process_index, info.process_count) == (process_id, num_processes), info
  assert info.local_device_count == devices_per_process, info
  assert info.device_count == NUM_DEVICES == num_processes * devices_per_process, info
  n_local = info.local_device_count

  c = config()
  model = trm.TRMModel(train.model_config(c, METADATA))
  assert model.config.prefix_len == 16 and model.config.emb_ndim == c.model.hidden_size
  adam, sign = train.make_optimizers(c, total_steps=NUM_STEPS)
  state = parallel.replicate(train.init_state(model, adam, sign, seed=c.seed))
  carry = parallel.shard(jax.tree.map(lambda x: np.stack([np.asarray(x)] * n_local),
                                      model.initial_carry(model.example_batch(PER_DEVICE))))
  device_index = parallel.shard(parallel.device_indices())
  p_step = parallel.pmap_step(train.make_train_step(model, adam, sign, c, PER_DEVICE),
                              replicated_in=(0,), out_axes=(None, 0, 0), donate_argnums=(0, 1))

  batches = global_batches()
  metrics = []
  for batch in batches:
    local = parallel.shard(_local_rows(batch, info.process_index, n_local))
    state, carry, sums = p_step(state, carry, local, device_index)
    metrics.append({k: float(_first_local(v).reshape(-1)[0]) for k, v in sums.items()})
  host = parallel.unreplicate(state)
  assert int(host.step) == NUM_STEPS, host.step

  params, _ = jax.tree_util.tree_flatten_with_path(host.params)
  ema = jax.tree_util.tree_leaves(host.ema)
  arrays = {"param_names": np.array([jax.tree_util.keystr(p) for p, _ in params]),
            "puzzle_table": np.asarray(host.puzzle_table),
            "sign_count": np.asarray(host.sign_state.count),
            "batch_ids": np.stack([b["puzzle_identifiers"] for b in batches])}
  for i, ((_, p), e) in enumerate(zip(params, ema)):
    arrays[f"params/{i}"] = np.asarray(p)
    arrays[f"ema/{i}"] = np.asarray(e)
  for k in sorted(metrics[0]):
    arrays[f"metric/{k}"] = np.array([m[k] for m in metrics], np.float64)
  path = out_path if info.process_index == 0 else f"{out_path}.process{info.process_index}.npz"
  with open(path, "wb") as f:
    np.savez(f, **arrays)
  distributed.finalize()
  print(f"WORKER_OK {info.process_index}", flush=True)


if __name__ == "__main__":
  main()
