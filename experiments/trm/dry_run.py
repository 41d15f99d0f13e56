"""Compile a TRM config's training step for one host of its pod, here, before spending pod time.

  python -m experiments.trm.main --config=configs/v4_64.py --dry_run

`main.py --dry_run` gives this process `devices_per_host` fake CPU devices (4 for a v4-64 host),
then `run(config)` builds the model, optimizer state and ACT carry abstractly (`jax.eval_shape`, no
memory), lowers and compiles the REAL pmapped training step (`train.make_train_step`) for the per-host
batch, and prints: devices (global, hosts, per host), global / per-host / per-device batch, training
examples, steps per epoch and in total, parameter counts, compile time, per-device memory of the
compiled step (XLA CPU's estimate; a TPU's differs) and analytic FLOPs per step. A config, shape or
divisibility error shows up here, on a laptop, as it would on the pod.
"""

from __future__ import annotations

import time
from typing import Any, Dict

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.common import config_utils
from experiments.common import parallel
from experiments.common import sharded_table
from experiments.trm import bench
from experiments.trm import train
from input_pipeline import datasets
from modules import trm

GB = 1e9


def pod_layout(config: ml_collections.ConfigDict) -> Dict[str, int]:
  """Hosts and devices of the config's pod and its batch per host and per device (with checks)."""
  E = config_utils.ConfigError
  per_host = config.devices_per_host if config.devices_per_host > 0 else jax.local_device_count()
  n_global = config.num_devices if config.num_devices > 0 else per_host * jax.process_count()
  if n_global % per_host:
    raise E("devices_per_host", config.devices_per_host,
            f"does not divide num_devices={n_global}", "set the pod's real chips per host")
  hosts = n_global // per_host
  if config.global_batch_size % n_global:
    raise E("global_batch_size", config.global_batch_size, f"not divisible by the {n_global} devices",
            f"use a multiple of {n_global}")
  return dict(num_devices=n_global, hosts=hosts, devices_per_host=per_host,
              global_batch=config.global_batch_size,
              per_host_batch=config.global_batch_size // hosts,
              per_device_batch=config.global_batch_size // n_global)


def _puzzle_ids_bound(config: ml_collections.ConfigDict):
  """(upper bound, note) on the puzzle ids of an unprepared ARC dataset: tasks x (num_aug + 1) + 1,
  counting the tasks in the manual dir's JSON files (a few seconds; nothing is built)."""
  ds = config.dataset
  if ds.name != "arc_agi" or not ds.manual_dir:
    raise config_utils.ConfigError(
        "dataset.manual_dir", ds.manual_dir,
        f"{ds.name} is not prepared in {ds.data_dir} and its puzzle-id count comes from the data",
        "prepare it first, or pass --config.dataset.manual_dir=<folder with the ARC JSON files>")
  from input_pipeline import arc  # pylint: disable=g-import-not-at-top
  kwargs = ds.builder_kwargs
  tasks = len(arc.load_variant(ds.manual_dir, kwargs.get("variant", "arc1")))
  bound = tasks * (int(kwargs.get("num_aug", 1000)) + 1) + 1
  return bound, (f" (upper bound {tasks} tasks x {int(kwargs.get('num_aug', 1000)) + 1} + 1 from "
                 f"{ds.manual_dir}; duplicates of tasks with few colours are dropped when built)")


def _num_train_examples(config: ml_collections.ConfigDict, meta: Dict[str, Any]):
  """From the prepared dataset, else from the builder's size knobs; None when unknown."""
  splits = meta.get("splits") or {}
  if config.dataset.train_split in splits:
    return int(splits[config.dataset.train_split]), "prepared dataset"
  kwargs = config.dataset.builder_kwargs
  for knob in ("subsample_size", "train_size"):
    if knob in kwargs and kwargs[knob]:
      return int(kwargs[knob]), f"builder_kwargs.{knob} (dataset not prepared here)"
  return None, "unknown: dataset not prepared here"


def run(config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """Compiles one host's training step of `config` on this machine's devices; returns the report."""
  train.validate_config(config)
  layout = pod_layout(config)
  n_local = jax.local_device_count()
  if n_local != layout["devices_per_host"]:
    raise config_utils.ConfigError(
        "devices_per_host", layout["devices_per_host"],
        f"this process has {n_local} devices", "run through `main.py --dry_run`, which sets them")
  ds = config.dataset
  meta = datasets.get_metadata(ds.name, ds.builder_kwargs.to_dict(), ds.data_dir)
  ids_note = ""
  if meta.get("num_puzzle_identifiers") is None:   # known only from the data (ARC)
    meta["num_puzzle_identifiers"], ids_note = _puzzle_ids_bound(config)
  model = trm.TRMModel(train.model_config(config, meta))
  num_train, train_source = _num_train_examples(config, meta)
  if num_train and "train_groups" in meta:       # materialised augmentations (ARC): reference 4.5
    rows = num_train
    num_train = train.epoch_examples(meta, rows)
    train_source = (f"per epoch: {meta['train_groups']} tasks x {meta['mean_puzzle_examples']:.2f} "
                    f"examples of one augmentation ({rows:,} stored rows, prepared dataset)")
  total_steps = (train.num_train_steps(config, num_train) if num_train
                 else max(int(config.total_steps), 1))
  adam, sign = train.make_optimizers(config, total_steps)
  b = layout["per_device_batch"]

  shard = bool(config.shard_puzzle_table)
  state = jax.eval_shape(lambda: train.init_state(model, adam, sign, config.seed, shard_table=shard))
  per_device = lambda x: jax.ShapeDtypeStruct((n_local,) + tuple(x.shape), x.dtype)
  carry = jax.tree.map(per_device, jax.eval_shape(
      lambda: model.initial_carry(model.example_batch(b))))
  # The pod's shards: N / (all devices of all hosts) rows each, although only one host is compiled.
  rows = None
  if shard and model.config.prefix_len:
    rows = sharded_table.rows_per_device(model.config.num_puzzle_identifiers, layout["num_devices"])
    carry = train.DeviceState(carry, jax.ShapeDtypeStruct((n_local, rows, model.config.emb_ndim),
                                                          jnp.float32))
  else:
    carry = train.DeviceState(carry, None)
  batch = jax.tree.map(per_device, jax.eval_shape(lambda: model.example_batch(b)))
  device_index = jax.ShapeDtypeStruct((n_local,), jnp.int32)
  p_step = parallel.pmap_step(train.make_train_step(model, adam, sign, config, b),
                              replicated_in=(0,), out_axes=(None, 0, 0), donate_argnums=(0, 1))
  t0 = time.perf_counter()
  compiled = p_step.lower(state, carry, batch, device_index).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  flops = bench.analytic_flops(model.config)
  table = state.puzzle_table
  n_ids, e = model.config.num_puzzle_identifiers, model.config.emb_ndim
  if rows is not None:
    table_text = (f"({n_ids:,}, {e}) sharded: {rows:,} rows = {rows * e * 4 / GB:.3f} GB per device "
                  f"(replicated it would be {n_ids * e * 4 / GB:.3f} GB on every device){ids_note}")
  elif table is not None:
    table_text = f"{tuple(table.shape)} replicated: {n_ids * e * 4 / GB:.3f} GB on every device"
  else:
    table_text = None
  return dict(
      layout, train_examples=num_train, train_examples_source=train_source,
      steps_per_epoch=(num_train // config.global_batch_size) if num_train else None,
      total_steps=total_steps if num_train else None,
      adam_params=trm.adam_param_count(state.params),
      puzzle_table=table_text,
      compile_s=compile_s,
      temp_gb=mem.temp_size_in_bytes / GB if mem else float("nan"),
      argument_gb=mem.argument_size_in_bytes / GB if mem else float("nan"),
      output_gb=mem.output_size_in_bytes / GB if mem else float("nan"),
      gflop_per_example=flops.total / 1e9,
      tflop_per_device_step=flops.total * b / 1e12,
      tflop_per_global_step=flops.total * config.global_batch_size / 1e12,
      forward_dtype=model.config.forward_dtype, remat=model.config.remat)


def format_report(r: Dict[str, Any]) -> str:
  def n(x):
    return "unknown" if x is None else f"{x:,}"
  rows = [
      ("devices", f"{r['num_devices']} = {r['hosts']} hosts x {r['devices_per_host']} "
                  f"(compiled for one host on {r['devices_per_host']} fake CPU devices)"),
      ("batch", f"global {r['global_batch']}, per host {r['per_host_batch']}, per device "
                f"{r['per_device_batch']}"),
      ("train examples", f"{n(r['train_examples'])} ({r['train_examples_source']})"),
      ("steps per epoch", n(r["steps_per_epoch"])),
      ("total steps", n(r["total_steps"])),
      ("Adam parameters", n(r["adam_params"])),
      ("puzzle table", "none" if r["puzzle_table"] is None else r["puzzle_table"]),
      ("compute", f"{r['forward_dtype']}, remat {'on' if r['remat'] else 'off'}"),
      ("compile", f"{r['compile_s']:.1f} s"),
      ("memory per device", f"temp {r['temp_gb']:.2f} GB + arguments {r['argument_gb']:.2f} GB "
                            f"(outputs {r['output_gb']:.2f} GB; XLA CPU estimate)"),
      ("FLOPs per step", f"{r['gflop_per_example']:.2f} GFLOP/example, "
                         f"{r['tflop_per_device_step']:.2f} TFLOP/device, "
                         f"{r['tflop_per_global_step']:.1f} TFLOP global (analytic)"),
  ]
  width = max(len(k) for k, _ in rows)
  return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
