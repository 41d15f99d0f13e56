"""An embedding table sharded by rows over every device of every host, read and written sparsely.

TRM's puzzle-embedding table for ARC is about 1M x 512 float32 (~2 GB); replicated on every device
(what the reference does) it would take 2 GB of each chip's memory. Here device d of D (global index,
process-major) holds rows [d * R, (d + 1) * R) with R = ceil(N / D) (the last shard zero-padded), so
each device stores N / D rows. Inside the pmapped step:

  lookup:  every device gathers the batch's ids from all devices (all_gather, D*B ints), takes the
           rows it owns (zeros elsewhere) and a psum over devices hands every device all D*B rows;
           it keeps its own B. Exact: each row comes from one device, the others add zeros.
  update:  the row gradients of the global batch are gathered anyway (optim.all_gather_rows); each
           device applies the sparse SignSGD update to the rows it owns (`local_ids` maps the others
           out of range, where the scatter drops them).

Numbers are identical to a replicated table (tested); memory per device is N*E*4 / D bytes plus
[D*B, E] temporaries; communication per step is one all_gather of ids and one psum of D*B rows.

Glossary: N table rows, E row width, D global devices, R rows per device, B per-device batch.

Synopsis (4 fake CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=4):

  import numpy as np
  from experiments.common import layout, parallel
  from experiments.trm import sharded_table
  run = layout.of_devices()                                              # a run has its own
  n = run.devices_per_host
  table = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)             # [N, E]
  shards = sharded_table.shard_host_table(table, run.devices, n, run.process_index)  # [n, R, E]
  ids = np.arange(n * 2, dtype=np.int32).reshape(n, 2) % 10               # [n, B]
  look = parallel.compile_step(
      lambda s, i, dev: sharded_table.lookup(s, i, dev, parallel.AXIS), out_axes=0)
  rows = look(parallel.shard(shards), parallel.shard(ids), parallel.shard(parallel.device_indices()))
  assert np.array_equal(np.asarray(rows), table[ids])
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np


def rows_per_device(num_rows: int, num_devices: int) -> int:
  """R = ceil(N / D) (at least 1)."""
  return max(1, math.ceil(num_rows / num_devices))


def init_host_shards(num_rows: int, dim: int, num_devices: int, local_device_count: int,
                     dtype=np.float32) -> np.ndarray:
  """This host's zero shards [local_device_count, R, E] (never the whole table)."""
  return np.zeros((local_device_count, rows_per_device(num_rows, num_devices), dim), dtype)


def shard_host_table(table: np.ndarray, num_devices: int, local_device_count: int,
                     process_index: int) -> np.ndarray:
  """This host's shards [local_device_count, R, E] of a whole table [N, E] (e.g. imported)."""
  num_rows = table.shape[0]
  r = rows_per_device(num_rows, num_devices)
  padded = np.zeros((num_devices * r,) + table.shape[1:], table.dtype)
  padded[:num_rows] = table
  first = process_index * local_device_count
  return padded.reshape((num_devices, r) + table.shape[1:])[first:first + local_device_count]


def gather_table(host_shards: np.ndarray, num_rows: int) -> np.ndarray:
  """The whole table [N, E] on every host from each host's shards [n, R, E] (tests, export)."""
  shards = np.asarray(host_shards)
  if jax.process_count() > 1:
    shards = np.asarray(multihost_utils.process_allgather(shards, tiled=True))
  return shards.reshape((-1,) + shards.shape[2:])[:num_rows]


def local_ids(ids: jax.Array, device_index: jax.Array, num_local_rows: int) -> jax.Array:
  """Ids relative to this device's shard; ids owned by other devices map to `num_local_rows`
  (out of range: scatters with mode="drop" skip them, gathers with mode="fill" read the fill)."""
  rel = ids - device_index * num_local_rows
  return jnp.where((rel >= 0) & (rel < num_local_rows), rel, num_local_rows)


def lookup(shard: jax.Array, ids: jax.Array, device_index: jax.Array, axis_name: str) -> jax.Array:
  """Rows [B, E] of this device's ids [B] from a table sharded over `axis_name` (inside pmap).

  `device_index`: this device's global index along `axis_name` (passed in, not read inside).
  """
  num_local_rows = shard.shape[0]
  batch = ids.shape[0]
  all_ids = jax.lax.all_gather(ids, axis_name, tiled=True)                        # [D*B]
  mine = local_ids(all_ids, device_index, num_local_rows)
  rows = shard.at[mine].get(mode="fill", fill_value=0)                            # [D*B, E]
  rows = jax.lax.psum(rows, axis_name)                                            # [D*B, E]
  return jax.lax.dynamic_slice_in_dim(rows, device_index * batch, batch, axis=0)  # [B, E]
