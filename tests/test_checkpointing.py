"""Tests for experiments/common/checkpointing.py on one process with 4 fake CPU devices.

  .venv/bin/python -m pytest tests/test_checkpointing.py -q

The 2-process save/restore check lives in tests/test_distributed.py.
"""
import json
import pathlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import ml_dtypes
import numpy as np
import pytest

from experiments.common import checkpointing
from experiments.common import distributed
from experiments.common import layout
from experiments.common import parallel


class AdamState(NamedTuple):
  count: np.ndarray
  mu: dict


def _replicated(seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  w = rng.standard_normal((3, 5)).astype(np.float32)
  w[0, 0] = np.nan  # Bitwise comparison must survive NaN.
  mesh = parallel.REPLICATED.local_mesh()
  return {
      "params": {
          "dense": {"w": w, "b": np.zeros(5, np.float32)},
          "emb": w.astype(ml_dtypes.bfloat16),
          "on_device": jnp.asarray(w * 2),  # Single-device jax array.
          "replicated": jax.device_put(w + 1, NamedSharding(mesh, P())),
          "pmap_stacked": jax.pmap(lambda x: x)(np.stack([w[1]] * 4)),
      },
      "opt": AdamState(count=np.int32(seed), mu={"w": np.ones((3, 5), ml_dtypes.bfloat16)}),
      "step": np.int32(1000 + seed),
      "rng": np.array([seed, 42], np.uint32),
      "done": np.array([True, False, True]),
  }


def _expected_replicated(replicated: dict) -> dict:
  """What restore gives back: host numpy, pmap-stacked leaves without their device axis."""
  out = jax.tree.map(np.asarray, replicated)
  out["params"]["pmap_stacked"] = out["params"]["pmap_stacked"][0]
  return out


def _per_device(seed: int = 0) -> dict:
  n = jax.local_device_count()
  rows = np.arange(n)[:, None] * 10 + np.arange(6)[None, :] + 100 * seed  # Differs per device.
  return {
      "carry": {"z_h": rows.astype(np.float32) / 3, "z_l": rows.astype(ml_dtypes.bfloat16)},
      "halted": jax.pmap(lambda x: x % 2 == 0)(rows),
      "steps": rows.astype(np.int32),
  }


def _assert_bitwise(got, want) -> None:
  got_leaves, got_def = jax.tree_util.tree_flatten_with_path(got)
  want_leaves, want_def = jax.tree_util.tree_flatten_with_path(want)
  assert got_def == want_def
  for (path, g), (_, w) in zip(got_leaves, want_leaves):
    name = jax.tree_util.keystr(path)
    assert isinstance(g, np.ndarray), (name, type(g))
    w = np.asarray(w)
    assert (g.dtype, g.shape) == (w.dtype, w.shape), name
    assert g.tobytes() == w.tobytes(), name


@pytest.fixture
def ckpt_dir(tmp_path) -> pathlib.Path:
  return tmp_path / "ckpt"


def test_round_trip_is_bitwise(ckpt_dir):
  replicated, per_device = _replicated(), _per_device()
  assert jax.local_device_count() == 4
  with checkpointing.CheckpointManager(ckpt_dir, save_interval_steps=10) as ckpt:
    assert ckpt.directory == str(ckpt_dir)
    assert ckpt.save(10, replicated=replicated, per_device=per_device)
    step, got_replicated, got_per_device = ckpt.restore(
        replicated_like=replicated, per_device_like=per_device)
  assert step == 10
  _assert_bitwise(got_replicated, _expected_replicated(replicated))
  assert isinstance(got_replicated["opt"], AdamState)
  _assert_bitwise(got_per_device, jax.tree.map(np.asarray, per_device))
  assert got_per_device["carry"]["z_h"].shape == (4, 6)


def test_restore_from_shape_dtype_templates_in_a_new_manager(ckpt_dir):
  replicated, per_device = _replicated(1), _per_device(1)
  with checkpointing.CheckpointManager(ckpt_dir, enable_async=False) as ckpt:
    assert ckpt.save(0, replicated=replicated, per_device=per_device)
  expected = _expected_replicated(replicated)
  to_spec = lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)
  with checkpointing.CheckpointManager(ckpt_dir) as ckpt:
    step, got_replicated, got_per_device = ckpt.restore(
        replicated_like=jax.tree.map(to_spec, expected),
        per_device_like=jax.tree.map(to_spec, per_device))
  assert step == 0
  _assert_bitwise(got_replicated, expected)
  _assert_bitwise(got_per_device, jax.tree.map(np.asarray, per_device))


def test_off_interval_saves_are_skipped_unless_forced(ckpt_dir):
  replicated, per_device = _replicated(), _per_device()
  with checkpointing.CheckpointManager(ckpt_dir, save_interval_steps=5) as ckpt:
    assert not ckpt.save(3, replicated=replicated, per_device=per_device)  # Even the first save.
    assert ckpt.save(5, replicated=replicated, per_device=per_device)
    assert not ckpt.save(7, replicated=replicated, per_device=per_device)
    assert ckpt.save(7, replicated=replicated, per_device=per_device, force=True)
    assert not ckpt.save(7, replicated=replicated, per_device=per_device, force=True)  # Exists.
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [5, 7] and ckpt.latest_step() == 7
    assert ckpt.restore(replicated_like=replicated, per_device_like=per_device)[0] == 7


def test_max_to_keep_deletes_oldest(ckpt_dir):
  replicated, per_device = _replicated(), _per_device()
  with checkpointing.CheckpointManager(ckpt_dir, max_to_keep=2, save_interval_steps=1) as ckpt:
    for step in range(1, 5):
      assert ckpt.save(step, replicated=replicated, per_device=per_device)
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [3, 4]
  assert sorted(p.name for p in ckpt_dir.iterdir()) == ["3", "4"]


def test_empty_directory_restores_none(ckpt_dir):
  with checkpointing.CheckpointManager(ckpt_dir) as ckpt:
    assert ckpt.latest_step() is None and ckpt.all_steps() == []
    assert ckpt.restore(replicated_like=_replicated(), per_device_like=_per_device()) is None
    with pytest.raises(checkpointing.CheckpointError, match="no complete checkpoint .*/ckpt/3"):
      ckpt.restore(3, replicated_like=_replicated(), per_device_like=_per_device())


def test_interrupted_save_is_ignored(ckpt_dir):
  replicated, per_device = _replicated(), _per_device()
  with checkpointing.CheckpointManager(ckpt_dir, save_interval_steps=1) as ckpt:
    assert ckpt.save(1, replicated=replicated, per_device=per_device)
  # What a crash halfway through writing step 2 leaves behind (orbax 0.12.8 names it without the
  # timestamp its docs show; both forms are ignored).
  leftover = ckpt_dir / "2.orbax-checkpoint-tmp"
  (ckpt_dir / "3.orbax-checkpoint-tmp-1700000000000000").mkdir()
  (leftover / "replicated").mkdir(parents=True)
  (leftover / "replicated" / "manifest.ocdbt").write_bytes(b"\x00partial")
  with checkpointing.CheckpointManager(ckpt_dir, save_interval_steps=1) as ckpt:
    assert ckpt.all_steps() == [1] and ckpt.latest_step() == 1
    step, got, _ = ckpt.restore(replicated_like=replicated, per_device_like=per_device)
    assert step == 1
    _assert_bitwise(got, _expected_replicated(replicated))
    assert ckpt.save(2, replicated=replicated, per_device=per_device)  # Retrying step 2 works.
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [1, 2]
    step, got, _ = ckpt.restore(replicated_like=replicated, per_device_like=per_device)
    assert step == 2
    _assert_bitwise(got, _expected_replicated(replicated))
  assert (ckpt_dir / "3.orbax-checkpoint-tmp-1700000000000000").exists()  # Kept by default ...
  with checkpointing.CheckpointManager(ckpt_dir, cleanup_tmp_directories=True) as ckpt:
    assert ckpt.save(4, replicated=replicated, per_device=per_device, force=True)
  assert sorted(p.name for p in ckpt_dir.iterdir()) == ["1", "2", "4"]  # ... removed on request.


# On the error path orbax 0.12.8 leaves a tensorstore callback aimed at its closed event loop.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_corrupt_checkpoint_names_its_path(ckpt_dir):
  replicated, per_device = _replicated(), _per_device()
  with checkpointing.CheckpointManager(ckpt_dir, save_interval_steps=1) as ckpt:
    assert ckpt.save(1, replicated=replicated, per_device=per_device)
    assert ckpt.save(2, replicated=replicated, per_device=per_device)
  for path in (ckpt_dir / "2" / "replicated").rglob("*"):
    if path.is_file() and path.parent.name == "d":
      with open(path, "r+b") as f:
        f.truncate(3)
  with checkpointing.CheckpointManager(ckpt_dir) as ckpt:
    with pytest.raises(checkpointing.CheckpointError, match=f"checkpoint {ckpt_dir}/2 is corrupt"):
      ckpt.restore(replicated_like=replicated, per_device_like=per_device)
    assert ckpt.restore(1, replicated_like=replicated, per_device_like=per_device)[0] == 1


def test_mismatched_templates_and_topology_are_clear_errors(ckpt_dir):
  replicated, per_device = _replicated(), _per_device()
  with checkpointing.CheckpointManager(ckpt_dir, save_interval_steps=1) as ckpt:
    assert ckpt.save(1, replicated=replicated, per_device=per_device)
    wrong = _expected_replicated(replicated)
    wrong["params"]["dense"]["w"] = np.zeros((5, 3), np.float32)
    with pytest.raises(checkpointing.CheckpointError, match=f"checkpoint {ckpt_dir}/1"):
      ckpt.restore(replicated_like=wrong, per_device_like=per_device)
    with pytest.raises(checkpointing.CheckpointError, match="leading axis local_device_count=4"):
      ckpt.restore(replicated_like=replicated, per_device_like={"x": np.zeros((2, 3))})
  # A checkpoint written by 2 processes x 4 devices cannot give this run its per-device rows.
  meta = ckpt_dir / "1" / "meta" / "metadata"
  meta.write_text(meta.read_text().replace('"process_count": 1', '"process_count": 2'))
  with checkpointing.CheckpointManager(ckpt_dir) as ckpt:
    with pytest.raises(checkpointing.CheckpointError, match="restore_per_device=False"):
      ckpt.restore(replicated_like=replicated, per_device_like=per_device)
    step, got, none = ckpt.restore(replicated_like=replicated, per_device_like=per_device,
                                   restore_per_device=False)
  assert (step, none) == (1, None)
  _assert_bitwise(got, _expected_replicated(replicated))


def test_device_counts_come_from_the_layout_and_the_format_is_kept(ckpt_dir):
  run = layout.of_devices()
  assert (run.hosts, run.devices_per_host, run.devices) == (1, 4, 4)
  with checkpointing.CheckpointManager(ckpt_dir, layout=run, save_interval_steps=1) as ckpt:
    assert ckpt.save(1, replicated={"w": np.zeros(2, np.float32)}, per_device=_per_device())
    assert ckpt.restore(per_device_like=_per_device(), replicated_like={"w": np.zeros(2)})[0] == 1
  assert json.loads((ckpt_dir / "1" / "meta" / "metadata").read_text()) == {
      "format_version": 1, "step": 1, "process_count": 1, "local_device_count": 4,
      "items": ["per_device", "replicated"]}
  with pytest.raises(ValueError, match=r"layout of 8 devices \(2 x 4\) but this run's mesh has 4"):
    checkpointing.CheckpointManager(ckpt_dir, layout=layout.of(8, devices_per_host=4, hosts=2))


def test_bad_leaves_are_rejected_on_save(ckpt_dir):
  mesh = parallel.REPLICATED.mesh()
  sharded = jax.device_put(np.arange(16.0).reshape(2, 8), NamedSharding(mesh, P(None, parallel.AXIS)))
  with checkpointing.CheckpointManager(ckpt_dir, save_interval_steps=1) as ckpt:
    with pytest.raises(checkpointing.CheckpointError, match=r"replicated\['w'\].*per_device"):
      ckpt.save(1, replicated={"w": sharded}, per_device={})
    with pytest.raises(checkpointing.CheckpointError,
                       match=r"per_device\['c'\]: shape \(3, 2\) must have leading axis"):
      ckpt.save(1, replicated={}, per_device={"c": np.zeros((3, 2))})
    with pytest.raises(checkpointing.CheckpointError, match=r"per_device\['c'\]: dtype float64"):
      ckpt.save(1, replicated={}, per_device={"c": np.zeros((4, 2))})
    assert ckpt.all_steps() == []
  assert not any(p.name.startswith("1") for p in ckpt_dir.iterdir())


def test_empty_trees_are_allowed(ckpt_dir):
  """A trainer without per-device state (orbax itself refuses empty pytrees)."""
  replicated = {"w": np.arange(3, dtype=np.float64), "opt": (), "none": None}
  with checkpointing.CheckpointManager(ckpt_dir, save_interval_steps=1) as ckpt:
    assert ckpt.save(1, replicated=replicated, per_device={})
    assert ckpt.save(2, replicated={}, per_device=None)
    assert ckpt.restore(2, replicated_like={}, per_device_like=None) == (2, {}, None)
    step, got, per_device = ckpt.restore(1, replicated_like=replicated, per_device_like={})
    assert (step, per_device) == (1, {})
    _assert_bitwise(got, replicated)
    with pytest.raises(checkpointing.CheckpointError, match="has no per_device state"):
      ckpt.restore(1, replicated_like=replicated, per_device_like=_per_device())
