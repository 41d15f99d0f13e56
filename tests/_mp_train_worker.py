"""One process of the multi-process TRM train/eval test (tests/test_multiprocess_train.py runs it).

Runs a few pmapped TRM train steps (`train.make_train_step`, the trainer's own step) on fixed global
batches, then evaluates the result the way the trainer does, and saves both, so that the test can
compare layouts that split the same global batch of 8 over different devices and processes
(1 process x 1 device, 1 process x 4 devices, 2 processes x 2 devices). Every process builds the SAME
global batches from a fixed numpy seed and takes its own devices' rows: with D devices in all and
b = 8 / D rows per device, global device d = process * local + i gets rows [d * b, (d + 1) * b).

Evaluation is the trainer's path end to end: a `sudoku_generated` test split of EVAL_SIZE = 13
examples (not a multiple of the global batch) prepared by `data_source.DataSource.from_config` (each
process in its own data dir OUT_PATH.tfds<process>; the dataset is a pure function of its config),
this host's padded and masked batches from `DataSource.eval_batches` (= `create_eval_iterator`: the
split is cut per host by `tfds.split_for_jax_process`), `evaluators.make_eval_step` pmapped as in
train.py and `evaluators.evaluate`, with the EMA weights (the trainer's choice, `config.ema`) and with the
raw parameters. For reference, the same metrics are computed directly: the eval step vmapped over
one "device" holding all EVAL_SIZE real examples, no padding, no cross-process collective.

  python tests/_mp_train_worker.py PROCESS_ID NUM_PROCESSES PORT DEVICES_PER_PROCESS OUT_PATH

By hand, 1 x 1 (one shell; 1 x 4 likewise with device_count=4 and DEVICES_PER_PROCESS 4):

  XLA_FLAGS=--xla_force_host_platform_device_count=1 JAX_PLATFORMS=cpu \
    python tests/_mp_train_worker.py 0 1 12356 1 /tmp/mp_train_1x1.npz

2 x 2 (two shells, same port):

  XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \
    python tests/_mp_train_worker.py 0 2 12355 2 /tmp/mp_train_2x2.npz
  XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \
    python tests/_mp_train_worker.py 1 2 12355 2 /tmp/mp_train_2x2.npz

Process 0 writes OUT_PATH; every other process p writes OUT_PATH with `.process<p>.npz` appended
(the test checks that all hosts hold the same state). np.savez without pickle: parameter leaves are
`params/<i>` and `ema/<i>` with their tree paths in `param_names`; the table is `puzzle_table`;
`metric/<name>` is the psummed metric of every step ([NUM_STEPS]); `batch_ids` the global puzzle ids
of every step ([NUM_STEPS, GLOBAL_BATCH]); `layout` = [processes, devices per process, rows per
device]. After update 1: `first_params/<i>` the parameters and `first_mu/<i>` AdamATan2's first
moment, (1 - b1) times update 1's gradient (the moment starts at zero), with `first_lr` its learning
rate and `beta1` b1. Evaluation: `eval/<name>` and `eval_raw/<name>` are `evaluators.evaluate`'s
results (EMA / raw weights; ratios, and `count`), `direct/<name>` and `direct_raw/<name>` the direct
computation; `eval_index` this host's real split rows in the order evaluated, `eval_host_rows` the
rows it fed (real + padding), `eval_num_batches` / `eval_num_examples` the iterator's, `eval_inputs`
/ `eval_labels` the whole test split as this process prepared it. Prints `WORKER_OK <process_id>`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments.common import device_step  # noqa: E402
from experiments.common import distributed  # noqa: E402
from experiments.common import layout as layout_lib  # noqa: E402
from experiments.common import metrics as metrics_lib  # noqa: E402
from experiments.common import parallel  # noqa: E402
from experiments.trm import evaluators  # noqa: E402
from experiments.trm import optim  # noqa: E402
from experiments.trm import train  # noqa: E402
from experiments.trm.configs import cpu_demo  # noqa: E402
from input_pipeline import datasets  # noqa: E402
from input_pipeline import data_source  # noqa: E402
from input_pipeline import pipeline  # noqa: E402
from modules import trm  # noqa: E402

GLOBAL_BATCH = 8                 # in every layout; rows per device = GLOBAL_BATCH / global devices
NUM_STEPS = 4
SEQ_LEN, VOCAB = 81, 11
NUM_PUZZLE_IDS = 8
PRESENT_IDS = (0, 1, 2, 3, 5, 6)   # ids 4 and 7 never occur: their table rows must stay zero
METADATA = {"seq_len": SEQ_LEN, "vocab_size": VOCAB, "num_puzzle_identifiers": NUM_PUZZLE_IDS}
EVAL_SIZE = 13                   # test examples: not a multiple of GLOBAL_BATCH (so padding)


def config(data_dir: str = ""):
  c = cpu_demo.get_config("smoke")            # hidden 32, mlp_t, float32 compute, EMA on
  c.model.puzzle_emb_ndim = c.model.hidden_size
  c.model.puzzle_emb_len = 16
  c.model.halt_max_steps = 2                  # carry resets happen within the 4 steps
  c.global_batch_size = GLOBAL_BATCH
  c.lr_warmup_steps = 1                       # non-zero learning rates from step 1 (table moves)
  c.total_steps = NUM_STEPS
  c.dataset.data_dir = data_dir               # eval data only (training uses global_batches())
  c.dataset.builder_kwargs.train_size = 8
  c.dataset.builder_kwargs.test_size = EVAL_SIZE
  return c


def global_batches(seed: int = 1234):
  """NUM_STEPS global batches {inputs [8, 81] in 1..10, labels [8, 81] in 2..10, ids [8] in 0..7}.

  Step 1 (every slot takes a row of it: the initial carry is halted) holds every id of PRESENT_IDS.
  In the 4-device layouts every step has ids repeated on one device and across devices of different
  hosts (rows 0-3 live on process 0 and rows 4-7 on process 1 in the 2 x 2 layout); in 1 x 1 the
  same rows all sit on the one device.
  """
  rng = np.random.default_rng(seed)
  out = []
  for step in range(NUM_STEPS):
    inputs = rng.integers(1, VOCAB, (GLOBAL_BATCH, SEQ_LEN)).astype(np.int32)
    labels = rng.integers(2, VOCAB, (GLOBAL_BATCH, SEQ_LEN)).astype(np.int32)
    if step == 0:
      # 4 devices: 0 -> (0, 1), 1 -> (2, 3), 2 -> (5, 2), 3 -> (6, 0): 0 on devices 0, 3; 2 on 1, 2.
      ids = np.array([0, 1, 2, 3, 5, 2, 6, 0], np.int32)
    else:
      ids = rng.choice(np.array(PRESENT_IDS), GLOBAL_BATCH).astype(np.int32)
      ids[1] = ids[0]                         # duplicate within device 0 (4 devices)
      ids[6] = ids[0]                         # ... and on device 3 (the other host in 2 x 2)
    out.append({"inputs": inputs, "labels": labels, "puzzle_identifiers": ids})
  return out


def _local_rows(batch, process_index: int, local_count: int, per_device: int):
  """This process's devices' rows, shaped [local_count, per_device, ...]."""
  first = process_index * local_count * per_device
  rows = local_count * per_device
  return {k: v[first:first + rows].reshape((local_count, per_device) + v.shape[1:])
          for k, v in batch.items()}


def _first_local(x) -> np.ndarray:
  """Host copy of this process's first device's value (per-device or replicated output)."""
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_shards[0].data)
  return np.asarray(x)


def _direct_eval(model, host_state, table, test):
  """`evaluators.evaluate`'s ratios without padding, hosts or pmap: the eval step vmapped over one
  "device" holding every real test example (mask all True). {"direct": EMA, "direct_raw": raw}."""
  n = test["inputs"].shape[0]
  step = jax.jit(jax.vmap(evaluators.make_eval_step(model, n), in_axes=(None, None, None, 0, 0),
                          axis_name=parallel.AXIS))
  batch = {k: test[k].astype(np.int32)[None] for k in ("inputs", "labels", "puzzle_identifiers")}
  batch["mask"] = np.ones((1, n), bool)
  out = {}
  for name, params in (("direct", host_state.ema), ("direct_raw", host_state.params)):
    sums = {k: float(np.asarray(v)[0]) for k, v in step(params, host_state.model_state, table,
                                                         batch, np.zeros((1,), np.int32)).items()}
    out[name] = metrics_lib.ratios(sums, count_key="count", ratio_keys=evaluators.RATIO_METRICS,
                                   divisors={k: sums["count"] for k in evaluators.LOSS_METRICS})
  return out


def main() -> None:
  process_id, num_processes, port, devices_per_process = (int(a) for a in sys.argv[1:5])
  out_path = sys.argv[5]
  info = distributed.initialize(coordinator_address=f"localhost:{port}",
                                num_processes=num_processes, process_id=process_id)
  assert (info.process_index, info.process_count) == (process_id, num_processes), info
  assert info.local_device_count == devices_per_process, info
  assert info.device_count == num_processes * devices_per_process, info

  c = config(data_dir=f"{out_path}.tfds{info.process_index}")
  n_local = info.local_device_count
  layout = layout_lib.batch_layout(c)
  assert (layout.process_index, layout.hosts) == (info.process_index, num_processes)
  per_device = layout.per_device_batch                                                # 8 / devices
  model = trm.TRMModel(train.model_config(c, METADATA))
  assert model.config.prefix_len == 16 and model.config.emb_ndim == c.model.hidden_size
  adam, sign = train.make_optimizers(c, total_steps=NUM_STEPS)
  assert c.shard_puzzle_table                 # the default: the table's rows split over the devices
  state = parallel.replicate(train.init_state(model, adam, sign, jax.random.key(c.seed), shard_table=True))
  device_state = parallel.shard(train.init_device_state(model, per_device, n_local,
                                                        info.device_count, shard_table=True))
  device_index = parallel.shard(parallel.device_indices())
  p_step = device_step.parallel_train_step(train.make_train_step(model, adam, sign, c, per_device),
                                      c.nonfinite, seed=c.seed,
                                      rng_step_offset=train.TRM.rng_step_offset)

  batches = global_batches()
  metrics = []
  first = {}
  for batch in batches:
    local = parallel.shard(_local_rows(batch, info.process_index, n_local, per_device))
    state, device_state, sums = p_step(state, device_state, local, device_index)
    metrics.append({k: float(_first_local(v).reshape(-1)[0]) for k, v in sums.items()})
    if not first:       # after update 1: its parameters and AdamATan2's first moment (b1 m0 = 0)
      after = parallel.unreplicate(state)
      first = {"params": [np.asarray(x) for x in jax.tree_util.tree_leaves(after.params)],
               "mu": [np.asarray(x) for x in jax.tree_util.tree_leaves(after.opt_state.mu)]}

  # Evaluation as in train.train_and_evaluate's final run_eval (full test split).
  source = data_source.DataSource.from_config(c.dataset, seed=c.seed)
  eval_iter = source.eval_batches(c.dataset.test_split, layout=layout, subset_size=0)
  p_eval_step = parallel.compile_step(evaluators.make_eval_step(model, per_device, sharded=True),
                                   state_in=(0, 1), out_axes=0)
  assert c.ema                                # "eval" uses the EMA weights, as "direct" does
  shards = device_state.puzzle_shard
  results = {"eval": evaluators.evaluate(p_eval_step, state, eval_iter, use_ema=c.ema, table=shards),
             "eval_raw": evaluators.evaluate(p_eval_step, state, eval_iter, use_ema=False,
                                        table=shards)}
  fed = [(b["index"].reshape(-1), b["mask"].reshape(-1)) for b in eval_iter]
  eval_index = np.concatenate([i[m] for i, m in fed])
  eval_host_rows = sum(i.size for i, _ in fed)

  host = parallel.unreplicate(state)
  assert int(host.step) == NUM_STEPS, host.step
  test = pipeline.load_split(datasets.get_builder(source.name, source.data_dir,
                                                  source.builder_kwargs), c.dataset.test_split)
  assert test["inputs"].shape[0] == EVAL_SIZE, test["inputs"].shape
  table = train.host_puzzle_table(host.puzzle_table, device_state, NUM_PUZZLE_IDS)   # [8, E]
  assert host.puzzle_table is None and table.shape == (NUM_PUZZLE_IDS, c.model.hidden_size)
  results.update(_direct_eval(model, host, table, test))

  params, _ = jax.tree_util.tree_flatten_with_path(host.params)
  ema = jax.tree_util.tree_leaves(host.ema)
  arrays = {"param_names": np.array([jax.tree_util.keystr(p) for p, _ in params]),
            "puzzle_table": table,
            "sign_count": np.asarray(host.sign_state.count),
            "batch_ids": np.stack([b["puzzle_identifiers"] for b in batches]),
            "layout": np.array([num_processes, n_local, per_device]),
            "eval_index": eval_index, "eval_host_rows": np.array(eval_host_rows),
            "eval_num_batches": np.array(eval_iter.num_batches),
            "eval_num_examples": np.array(eval_iter.num_examples),
            "eval_inputs": test["inputs"], "eval_labels": test["labels"]}
  for i, ((_, p), e) in enumerate(zip(params, ema)):
    arrays[f"params/{i}"] = np.asarray(p)
    arrays[f"ema/{i}"] = np.asarray(e)
    arrays[f"first_params/{i}"] = first["params"][i]
    arrays[f"first_mu/{i}"] = first["mu"][i]
  arrays["first_lr"] = np.array(optim.warmup_cosine_lr(1, c.lr, c.lr_warmup_steps, NUM_STEPS,
                                                       c.lr_min_ratio))
  arrays["beta1"] = np.array(c.beta1)
  for k in sorted(metrics[0]):
    arrays[f"metric/{k}"] = np.array([m[k] for m in metrics], np.float64)
  for prefix, values in results.items():
    for k, v in values.items():
      arrays[f"{prefix}/{k}"] = np.array(v, np.float64)
  path = out_path if info.process_index == 0 else f"{out_path}.process{info.process_index}.npz"
  with open(path, "wb") as f:
    np.savez(f, **arrays)
  distributed.finalize()
  print(f"WORKER_OK {info.process_index}", flush=True)


if __name__ == "__main__":
  main()
