"""Dream with its weights sharded over a model axis (modules/dream.py model parallelism, the sampler's
`Runner(mesh=...)`, experiments/common/parallel.py `mesh_2d` / `shard_map_step`) against the
unsharded model: float32 logits within 1e-5 relative and identical sampled tokens.

Two random models:
- "tiny": 16 query heads, 8 KV heads (GQA groups of 2), SwiGLU width 160, vocabulary 272, 2 layers:
  model degrees 1, 2, 4 and 8 all divide it.
- "mid": the 7.6B's head grouping kept, 28 query heads and 4 KV heads (7:1), at a small width
  (D 224, head 8, SwiGLU 608, V 1024, 4 layers; 2.4M parameters, 36x tiny): degrees 1, 2 and 4.
In-process tests use the suite's 4 fake CPU devices (meshes 1x4, 2x2, 4x1); the 8-device meshes
(tiny: 1x8, 2x4; mid: 2x4, 4x2, 8x1) run this file as a script in a subprocess with 8 fake
devices.
"""
import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common import checkpointing
from experiments.common import config_utils
from experiments.common import parallel
from experiments.diffucoder import convert
from experiments.diffucoder import hf_layout
from experiments.diffucoder import model_sharding
from experiments.diffucoder import orbax_params
from experiments.diffucoder import random_checkpoint
from experiments.diffucoder import sampler_options
from experiments.diffucoder import sampling
from experiments.diffucoder.configs import common
from experiments.diffucoder.tools import tpu_plan
from experiments.tools import tpu_target
from modules import dream

CFG = dream.tiny_config(num_heads=16, num_kv_heads=8, dtype="float32", param_dtype="float32")
MID = dream.tiny_config(vocab_size=1024, hidden_size=224, intermediate_size=608, num_layers=4,
                        num_heads=28, num_kv_heads=4, dtype="float32", param_dtype="float32")
CONFIGS = {"tiny": CFG, "mid": MID}
MASK_ID = 1
NEW = 16


@functools.lru_cache(maxsize=None)
def host_params(name="tiny"):
  """The unsharded parameter tree (numpy) of a random HF-layout checkpoint of CONFIGS[name]."""
  cfg = CONFIGS[name]
  tensors = {n: random_checkpoint.random_tensor(n, s, i, 0)
             for i, (n, s) in enumerate(hf_layout.hf_tensor_specs(cfg))}
  return convert.params_from_tensors(tensors.__getitem__, cfg, place=np.asarray)


def sharded_params(mesh, name="tiny"):
  """host_params in the model-parallel layout, each tensor put straight into its device blocks."""
  cfg, m = CONFIGS[name], mesh.shape[model_sharding.MODEL_AXIS]
  specs = dream.param_partition_specs(cfg, model_sharding.MODEL_AXIS)
  return {mod: {n: model_sharding.put_sharded(dream.model_parallel_layout(mod, n, v, cfg, m), mesh,
                                        specs[mod][n])
                for n, v in p.items()} for mod, p in host_params(name).items()}, specs


def forward_of(model):
  def forward(params, tokens, valid, positions, context=None, return_kv=False):
    return model.apply(params, tokens, valid, positions, context, return_kv)
  return forward


def batch(seed=0, B=8, L=9, vocab_size=CFG.vocab_size):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab_size, (B, L)).astype(np.int32)
  valid = np.ones((B, L), bool)
  valid[1, :3] = False
  valid[3, :1] = False
  return tokens, valid


def sharded_logits(data, model, name="tiny"):
  """Unsharded and sharded (logits, kv of the prefix, logits of a block with the prefix as context)."""
  cfg = CONFIGS[name]
  mesh = model_sharding.mesh_2d(data, model)
  tokens, valid = batch(vocab_size=cfg.vocab_size)
  full = dream.dream_forward(cfg)
  params = jax.tree.map(jnp.asarray, host_params(name))
  ref_logits, ref_kv = full.apply(params, tokens, valid, return_kv=True)
  ref_ctx = full.apply(params, tokens[:, 6:], valid[:, 6:],
                       context=([(k[:, :6], v[:, :6]) for k, v in ref_kv], valid[:, :6]))
  sparams, specs = sharded_params(mesh, name)
  sm = dream.dream_forward(cfg, model_sharding.MODEL_AXIS, model)
  rows, kv_spec = P(parallel.AXIS), P(parallel.AXIS, None, model_sharding.MODEL_AXIS, None)
  logits_spec = P(parallel.AXIS, None, model_sharding.MODEL_AXIS)

  def both(p, t, v):
    logits, kv = sm.apply(p, t, v, return_kv=True)
    ctx = ([(k[:, :6], vv[:, :6]) for k, vv in kv], v[:, :6])
    return logits, kv, sm.apply(p, t[:, 6:], v[:, 6:], context=ctx)

  f = model_sharding.shard_map_step(both, mesh, in_specs=(specs, rows, rows),
                              out_specs=(logits_spec, kv_spec, logits_spec))
  logits, kv, ctx_logits = f(sparams, tokens, valid)
  return (np.asarray(ref_logits), np.asarray(ref_kv[1][1]), np.asarray(ref_ctx),
          np.asarray(logits), np.asarray(kv[1][1]), np.asarray(ctx_logits))


def rel(a, b):
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


P = jax.sharding.PartitionSpec


@pytest.mark.parametrize("name", ["tiny", "mid"])
@pytest.mark.parametrize("data,model", [(1, 4), (2, 2), (4, 1)])
def test_sharded_logits_equal_unsharded(data, model, name):
  ref, ref_kv, ref_ctx, logits, kv, ctx = sharded_logits(data, model, name)
  assert logits.shape == ref.shape == (8, 9, CONFIGS[name].vocab_size)
  assert rel(logits, ref) < 1e-5
  assert rel(kv, ref_kv) < 1e-5                  # layer 1's v, all KV heads (gathered over model)
  assert rel(ctx, ref_ctx) < 1e-5                # the block with the prefix's sharded kv as context
  valid = batch()[1]
  # The cached block equals the same positions of the full forward (the context contract).
  assert rel(ctx[valid[:, 6:]], ref[:, 6:][valid[:, 6:]]) < 1e-5


def test_model_parallel_layout_puts_each_devices_heads_in_its_block():
  H, K, Dh, F = CFG.num_heads, CFG.num_kv_heads, CFG.head_dim, CFG.intermediate_size
  cols = np.arange((H + 2 * K) * Dh)
  out = dream.model_parallel_layout("dream/layer_0/self_attn/qkv_proj", "b", cols, CFG, 4)
  block = out.reshape(4, -1)[1] // Dh                                # device 1's heads
  q = [4, 5, 6, 7]                                                   # query heads 4-7 ...
  kv = [2, 3]                                                        # ... use KV heads 2, 3
  assert block[::Dh].tolist() == q + [H + k for k in kv] + [H + K + k for k in kv]
  assert np.array_equal(
      dream.model_parallel_layout("dream/layer_0/self_attn/qkv_proj", "b", out, CFG, 4, inverse=True),
      cols)
  gu = dream.model_parallel_layout("dream/layer_0/mlp/gate_up_proj", "w", np.arange(2 * F)[None],
                                   CFG, 2)[0]
  assert gu.reshape(2, -1)[1].tolist() == list(range(80, 160)) + list(range(F + 80, 2 * F))
  norm = np.arange(64.0)
  assert dream.model_parallel_layout("dream/norm", "weight", norm, CFG, 4) is norm


def test_bad_model_degree_and_mesh_size_name_the_numbers():
  assert dream.valid_model_degrees(dream.DREAM_7B) == [1, 2, 4]
  assert dream.valid_model_degrees(CFG) == [1, 2, 4, 8]
  assert dream.valid_model_degrees(MID) == [1, 2, 4]                 # 7:1 grouping, as the 7.6B
  with pytest.raises(ValueError, match=r"degree 8 does not divide num_heads=28, num_kv_heads=4.*\[1, 2, 4\]"):
    dream.check_model_degree(dream.DREAM_7B, 8)
  with pytest.raises(ValueError, match=r"degree 3 does not divide num_heads=28, num_kv_heads=4"):
    dream.check_model_degree(dream.DREAM_7B, 3)
  with pytest.raises(ValueError, match=r"3 x 2 \(data x model\) mesh needs 6 devices and there are 4"):
    model_sharding.mesh_2d(3, 2)
  config = common.base_config(model=dream.DREAM_7B, tokens={}, max_new_tokens=8, steps=8,
                              temperature=0.0, top_p=1.0, alg="entropy", chat_template=False)
  config.model_parallel = 8
  with pytest.raises(config_utils.ConfigError, match=r"model_parallel.*8.*valid degrees.*\[1, 2, 4\]"):
    common.check_model_parallel(config, num_devices=8)
  config.model_parallel = 4
  with pytest.raises(config_utils.ConfigError, match=r"model_parallel.*4.*does not divide the 6 devices.*\[1, 2\]"):
    common.check_model_parallel(config, num_devices=6)


PROMPTS = [[30, 31, 32, 33, 34], [40, 41, 42, 43, 44, 45, 46, 47], [50, 51, 52], [60, 61, 62, 63]]


def generate(opts, mesh=None, name="tiny"):
  cfg = CONFIGS[name]
  prompt, valid = sampling.left_pad([list(np.random.default_rng(i).integers(20, 272, len(p)))
                                     for i, p in enumerate(PROMPTS)], 0)
  if mesh is None:
    params = jax.tree.map(jnp.asarray, host_params(name))
    out = sampling.generate(forward_of(dream.dream_forward(cfg)), params, prompt, valid,
                            jax.random.key(0), opts, max_new_tokens=NEW, mask_id=MASK_ID)
  else:
    params, specs = sharded_params(mesh, name)
    model = dream.dream_forward(cfg, model_sharding.MODEL_AXIS, mesh.shape[model_sharding.MODEL_AXIS])
    out = sampling.generate(forward_of(model), params, prompt, valid, jax.random.key(0), opts,
                            max_new_tokens=NEW, mask_id=MASK_ID, mesh=mesh, param_specs=specs)
  assert not np.any(out.tokens[:, -NEW:] == MASK_ID)
  return out


GREEDY = {
    "entropy": sampler_options.SamplerOptions(steps=8, alg="entropy"),
    "topk_margin": sampler_options.SamplerOptions(steps=8, alg="topk_margin"),
    "dual_threshold": sampler_options.SamplerOptions(steps=8, alg="maskgit_plus", block_length=8,
                                                     cache="dual", threshold=0.3),
    "prefix_fast_dllm": sampler_options.SamplerOptions(steps=8, alg="entropy", block_length=16,
                                                       cache="prefix", block_algorithm="fast_dllm"),
}


@pytest.mark.parametrize("name,data,model", [("entropy", 2, 2), ("topk_margin", 1, 4),
                                             ("dual_threshold", 2, 2), ("prefix_fast_dllm", 1, 4)])
def test_greedy_tokens_equal_unsharded(name, data, model):
  ref = generate(GREEDY[name])
  out = generate(GREEDY[name], model_sharding.mesh_2d(data, model))
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert out.forwards == ref.forwards
  assert len(np.unique(ref.tokens[:, -NEW:])) > 4          # a real completion, not one repeated id


@pytest.mark.parametrize("name,data,model", [
    ("entropy", 2, 2), ("topk_margin", 1, 4),
    pytest.param("dual_threshold", 1, 4, marks=pytest.mark.slow),        # 10-20 s each on 2 cores
    pytest.param("prefix_fast_dllm", 2, 2, marks=pytest.mark.slow)])
def test_mid_7_to_1_greedy_tokens_equal_unsharded(name, data, model):
  """The 7:1 grouping (28 query / 4 KV heads): each algorithm at degree 2 or 4 (1 in the logits
  test), the same tokens and forward counts as the unsharded sampler."""
  ref = generate(GREEDY[name], name="mid")
  out = generate(GREEDY[name], model_sharding.mesh_2d(data, model), name="mid")
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert out.forwards == ref.forwards
  assert len(np.unique(ref.tokens[:, -NEW:])) > 4


def test_random_choices_do_not_depend_on_the_model_degree():
  """Keys are folded per data group, so a 2 x 2 mesh draws what a 2 x 1 mesh draws: origin's random
  unmasking and temperature + top-p sampling (the gathered-row path)."""
  opts = sampler_options.SamplerOptions(steps=8, alg="origin", temperature=0.7, top_p=0.9)
  a = generate(opts, model_sharding.mesh_2d(2, 1))
  b = generate(opts, model_sharding.mesh_2d(2, 2))
  np.testing.assert_array_equal(a.tokens, b.tokens)


# make test: the tiny model at model degree 8 and 4 (the 4-device tests cover 1x4 and 2x2);
# make test-slow: the mid model (degree 8 > its 4 KV heads is refused) at 2x4, 4x2 and 8x1.
EIGHT_DEVICE_MESHES = {"tiny": [(1, 8), (2, 4)], "mid": [(2, 4), (4, 2), (8, 1)]}


@pytest.mark.parametrize("name", ["tiny", pytest.param("mid", marks=pytest.mark.slow)])
def test_eight_device_meshes(name):
  """EIGHT_DEVICE_MESHES on 8 fake CPU devices (a subprocess): logits, kv and cached logits."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8 "
             + os.environ.get("PODLAB_TEST_XLA_OPT_FLAGS", ""))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = os.pathsep.join([root, os.path.join(root, "tests")])
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), name], env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["devices"] == 8
  assert sorted(result["logits"]) == sorted(f"{name} {d}x{m}" for d, m in EIGHT_DEVICE_MESHES[name])
  for mesh, errs in result["logits"].items():
    assert max(errs) < 1e-5, (mesh, errs)


def _eight_device_main(name):
  out = {"devices": jax.device_count(), "logits": {}}
  for data, model in EIGHT_DEVICE_MESHES[name]:
    ref, ref_kv, ref_ctx, logits, kv, ctx = sharded_logits(data, model, name)
    out["logits"][f"{name} {data}x{model}"] = [rel(logits, ref), rel(kv, ref_kv), rel(ctx, ref_ctx)]
  print(json.dumps(out))


if __name__ == "__main__":
  _eight_device_main(sys.argv[1])




@pytest.mark.slow
def test_tpu_compile_splits_the_weights_over_the_model_axis(libtpu):
  """The TPU compiler's per-device arguments of the sampler step (tpu_plan, canvas 512) on a v4-8:
  model_parallel 4 holds a quarter of the sharded weights plus the replicated norms per device."""
  cfg = dream.tiny_config(vocab_size=4096, hidden_size=256, intermediate_size=512, num_heads=8,
                          num_kv_heads=4)
  target = tpu_target.parse_target("v4-8")
  shapes = dream.param_shapes(cfg)
  total = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(shapes))
  norms = sum(a.size * a.dtype.itemsize for m, p in shapes.items() for a in p.values()
              if "norm" in m)
  reports = {m: tpu_plan.compile_step(target, 1, m, cfg) for m in (1, 4)}   # the same 1-row canvas
  assert all(r.compiled and r.fits for r in reports.values())
  assert reports[1].argument_bytes >= total
  # Only the sharded weights change: each device keeps a quarter of them.
  saved = reports[1].argument_bytes - reports[4].argument_bytes
  assert saved == pytest.approx((total - norms) * 3 / 4, rel=1e-3)   # (TPU pads small arrays)
  assert reports[4].items_per_step == 1 and reports[4].item_name == "tokens"


def test_load_checkpoint_onto_a_mesh_from_safetensors_and_orbax(tmp_path, monkeypatch):
  """Both checkpoint kinds land in the model-parallel layout, split by the partition specs; the orbax
  folder is restored into the specs' NamedShardings (each device reads its block), never whole to
  one host array."""
  cfg = dream.tiny_config(dtype="float32", param_dtype="float32")          # H 4, K 2: m = 2
  hf = str(tmp_path / "hf")
  random_checkpoint.write_random_checkpoint(hf, cfg, num_shards=2)
  host = convert.load_params(hf, cfg, place=np.asarray)
  orbax_params.save_params(host, str(tmp_path / "orbax"), cfg)
  mesh = model_sharding.mesh_2d(2, 2)
  specs = dream.param_partition_specs(cfg, model_sharding.MODEL_AXIS)
  targets = []
  read_tree = checkpointing.read_tree
  monkeypatch.setattr(checkpointing, "read_tree",
                      lambda path, **kw: targets.append(kw.get("target")) or read_tree(path, **kw))
  for path in (hf, str(tmp_path / "orbax")):
    params = convert.load_checkpoint(path, cfg, mesh=mesh)
    for module, p in host.items():
      for name, value in p.items():
        got = params[module][name]
        assert got.sharding.spec == specs[module][name], (module, name)
        assert got.sharding.mesh == mesh
        np.testing.assert_array_equal(
            np.asarray(got), dream.model_parallel_layout(module, name, value, cfg, 2))
        want = dream.model_parallel_layout(module, name, value, cfg, 2)
        for shard in got.addressable_shards:          # each device holds its block, equal values
          np.testing.assert_array_equal(np.asarray(shard.data), want[shard.index])
  w = params["dream/layer_0/self_attn/qkv_proj"]["w"]
  assert w.addressable_shards[1].data.shape == (64, (4 + 2 * 2) * 16 // 2)   # device (0, 1)'s half
  # The orbax restore asked for every array in its partition spec's sharding on the mesh.
  assert len(targets) == 1
  for module, p in targets[0].items():
    for name, t in p.items():
      assert isinstance(t.sharding, jax.sharding.NamedSharding), (module, name)
      assert t.sharding.mesh == mesh and t.sharding.spec == specs[module][name], (module, name)


def test_orbax_restore_onto_a_mesh_casts_the_saved_dtype(tmp_path):
  """A float32 orbax folder restored sharded into a bfloat16 config: the values cast, the layout
  permuted, the shardings the specs'."""
  cfg32 = dream.tiny_config(dtype="float32", param_dtype="float32")
  cfg16 = dream.tiny_config(dtype="bfloat16", param_dtype="bfloat16")
  hf = str(tmp_path / "hf")
  random_checkpoint.write_random_checkpoint(hf, cfg32, num_shards=1)
  host = convert.load_params(hf, cfg32, place=np.asarray)
  orbax_params.save_params(host, str(tmp_path / "orbax"), cfg32)
  mesh = model_sharding.mesh_2d(2, 2)
  lines = []
  params = convert.load_checkpoint(str(tmp_path / "orbax"), cfg16, mesh=mesh, log=lines.append)
  assert lines and "float32 -> bfloat16" in lines[0]
  name = ("dream/layer_0/mlp/gate_up_proj", "w")
  got = params[name[0]][name[1]]
  assert got.dtype == jnp.bfloat16
  assert got.sharding.spec == dream.param_partition_spec(*name, model_sharding.MODEL_AXIS)
  want = dream.model_parallel_layout(*name, host[name[0]][name[1]], cfg32, 2).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
