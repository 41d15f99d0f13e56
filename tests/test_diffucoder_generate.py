"""DiffuCoder generation with the tiny random Dream: padding invariance, data parallelism, the
`generate.run` pipeline (checkpoint + tokenizer + batching + stop ids) and the CLI."""

import importlib
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common import config_utils
from experiments.common import errors
from experiments.diffucoder import convert
from experiments.diffucoder import generate
from experiments.diffucoder import random_checkpoint
from experiments.diffucoder import sampler_options
from experiments.diffucoder import sampling
from experiments.diffucoder import tokenizer as tokenizer_lib
from experiments.diffucoder.configs import tiny
from experiments.diffucoder.tools import benchmark
from experiments.diffucoder.tools import decodings
from experiments.diffucoder.tools import step_speed
from experiments.diffucoder.tools import tpu_plan
from experiments.tools import tpu_compile
from experiments.tools import tpu_report
from experiments.tools import tpu_target
from modules import dream

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MASK = tiny.TINY_TOKENS["mask_id"]
PAD = tiny.TINY_TOKENS["pad_id"]


def _model(dtype="float32", seed=0):
  cfg = dream.tiny_config(dtype=dtype, param_dtype=dtype)
  params = dream.dream_forward(cfg).init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32),
                                         jnp.ones((1, 4), bool))
  return generate.model_forward(cfg), params


@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "bfloat16"])
def test_left_padded_row_decodes_like_the_row_alone(dtype):
  forward, params = _model(dtype)
  short, long = [10, 20, 30], [1, 2, 3, 4, 5, 6, 7]
  opts = sampler_options.SamplerOptions(steps=8, alg="entropy")            # temperature 0
  runner = sampling.Runner(forward, opts, mask_id=MASK)
  alone = runner.generate(params, *sampling.left_pad([short], PAD), jax.random.key(0),
                          max_new_tokens=8).tokens
  prompt, valid = sampling.left_pad([short, long], PAD, length=12)   # 9 pads before `short`
  batch = runner.generate(params, prompt, valid, jax.random.key(0), max_new_tokens=8).tokens
  np.testing.assert_array_equal(batch[0, 12:], alone[0, 3:])
  assert not np.any(batch[:, 12:] == MASK)


def _check_data_parallel(opts):
  if jax.local_device_count() < 2:
    pytest.skip("needs several (fake) devices; tests/conftest.py sets 4")
  forward, params = _model()
  n = jax.local_device_count()
  rows = [[5 + i, 6, 7 + i] for i in range(n)]
  prompt, valid = sampling.left_pad(rows, PAD)
  from experiments.common import parallel
  single = sampling.Runner(forward, opts, mask_id=MASK).generate(
      params, prompt, valid, jax.random.key(0), max_new_tokens=8)
  multi = sampling.Runner(forward, opts, mask_id=MASK, data_parallel=True).generate(
      parallel.replicate(params), prompt, valid, jax.random.key(0), max_new_tokens=8)
  np.testing.assert_array_equal(multi.tokens, single.tokens)


def test_data_parallel_equals_single_device():
  _check_data_parallel(sampler_options.SamplerOptions(steps=4, alg="topk_margin"))


@pytest.mark.slow
def test_data_parallel_dual_cache_threshold_equals_single_device():
  _check_data_parallel(sampler_options.SamplerOptions(steps=4, alg="entropy", block_length=4,
                                                      cache="dual", threshold=0.5))


@pytest.mark.slow
@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_data_parallel_fast_dllm_equals_single_device(threshold):
  """M (the batch-average masked count) and the end of a block are taken over all devices."""
  _check_data_parallel(sampler_options.SamplerOptions(steps=4, alg="entropy", block_length=4,
                                                      cache="dual", threshold=threshold,
                                                      block_algorithm="fast_dllm"))


def _tiny_setup(tmp_path, **generate_overrides):
  config = tiny.get_config("dtype=float32")
  ckpt = str(tmp_path / "tiny_hf")
  random_checkpoint.write_random_checkpoint(ckpt,
                                            dream.DreamConfig.from_dict(config.model.to_dict()),
                                            num_shards=2, tokens=config.tokens.to_dict())
  tokenizer_lib.write_byte_level_tokenizer(
      ckpt, tokenizer_lib.tiny_special_tokens(config.tokens.to_dict()), tokenizer_lib.TINY_MERGES,
      first_merge_id=261)
  config.checkpoint = ckpt
  for k, v in generate_overrides.items():
    config.generate[k] = v
  return config


def test_run_end_to_end_matches_single_prompt_decoding(tmp_path):
  config = _tiny_setup(tmp_path, temperature=0.0, steps=8, max_new_tokens=8, batch_size=2,
                       pad_to_multiple=8)
  prompts = generate.read_prompts(["def add(a, b):", "print(x)"], None)
  records = generate.run(config, prompts)
  assert [r["id"] for r in records] == [0, 1]
  tok = tokenizer_lib.load(config.checkpoint)
  params = convert.load_checkpoint(config.checkpoint,
                                   dream.DreamConfig.from_dict(config.model.to_dict()))
  forward = generate.model_forward(dream.DreamConfig.from_dict(config.model.to_dict()))
  runner = sampling.Runner(forward, generate.sampler_options(config), mask_id=MASK)
  stops = generate.stop_ids(config)
  for r in records:
    ids = tok.encode(r["prompt"])
    assert r["prompt_tokens"] == len(ids)
    out = runner.generate(params, *sampling.left_pad([ids], PAD), jax.random.key(0),
                          max_new_tokens=8).tokens[0, len(ids):]
    want = sampling.cut_at_stop(out, stops)
    assert r["completion_ids"] == want
    assert r["completion"] == tok.decode(want)
    assert not set(want) & set(stops)


@pytest.mark.slow        # make test: sharded tokens equal unsharded (tests/test_dream_model_parallel.py)
def test_model_parallel_run_equals_data_parallel(tmp_path):
  """--config.model_parallel=2 (a 2 x 2 mesh; the checkpoint streamed into the device blocks) writes
  the completions the data-parallel run writes."""
  config = _tiny_setup(tmp_path, temperature=0.0, steps=8, max_new_tokens=8, batch_size=1,
                       pad_to_multiple=8, block_length=4, cache="dual")
  prompts = generate.read_prompts(["def add(a, b):", "print(x)", "x = 1"], None)
  data_parallel = generate.run(config, prompts)
  config.model_parallel = 2
  model_parallel = generate.run(config, prompts)
  assert [r["completion_ids"] for r in model_parallel] == [r["completion_ids"] for r in data_parallel]
  assert all(len(r["completion_ids"]) > 0 for r in data_parallel)


def test_chat_template_and_stop_ids(tmp_path):
  config = _tiny_setup(tmp_path, temperature=0.0, steps=4, max_new_tokens=4)
  config.chat_template = True
  assert generate.stop_ids(config) == [PAD, tiny.TINY_TOKENS["dlm_pad_id"],
                                       tiny.TINY_TOKENS["im_end_id"]]
  records = generate.run(config, generate.read_prompts(["hi"], None))
  tok = tokenizer_lib.load(config.checkpoint)
  assert records[0]["prompt_tokens"] == len(tok.encode(tokenizer_lib.chat_prompt("hi")))


def test_bad_inputs_give_clear_errors(tmp_path):
  with pytest.raises(ValueError, match="no prompts"):
    generate.read_prompts([], None)
  bad = tmp_path / "p.jsonl"
  bad.write_text('{"prompt": "ok"}\n{"text": "no prompt field"}\n')
  with pytest.raises(ValueError, match=r"p.jsonl:2: needs a string \"prompt\""):
    generate.read_prompts([], str(bad))
  config = tiny.get_config()
  config.generate.alg = "beam"
  with pytest.raises(config_utils.ConfigError, match="generate.alg='beam'"):
    generate.sampler_options(config)


def test_batches_sort_by_length_and_pad():
  assert generate.batches([5, 1, 3], 2) == [[1, 2], [0, 0]]


@pytest.mark.slow
def test_cli_writes_jsonl(tmp_path):
  config = _tiny_setup(tmp_path)
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text('{"id": "a", "prompt": "def f():"}\n{"id": "b", "prompt": "import os"}\n')
  out = tmp_path / "out.jsonl"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2 "
             + os.environ.get("PODLAB_TEST_XLA_OPT_FLAGS", ""))
  subprocess.run([sys.executable, "-m", "experiments.diffucoder.generate",
                  "--config=configs/tiny.py:dtype=float32", f"--config.checkpoint={config.checkpoint}",
                  f"--prompts_jsonl={prompts}", "--prompt=x", f"--output={out}", "--noprogress"],
                 cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["id"] for r in records] == [0, "a", "b"]
  assert all(len(r["completion_ids"]) <= 16 for r in records)


def test_benchmark_analytic_flops_match_xla_cost_analysis():
  config = step_speed.small_config(hidden=128, layers=2, heads=4, kv_heads=2, vocab=1024,
                                   dtype="float32")
  forward = generate.model_forward(config)
  params = jax.eval_shape(lambda: step_speed.random_params(config))
  b, length = 2, 64
  sd = jax.ShapeDtypeStruct
  compiled = jax.jit(forward).lower(params, sd((b, length), jnp.int32), sd((b, length), jnp.bool_),
                                    sd((b, length), jnp.int32)).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  analytic = step_speed.analytic_flops(config, b, length)
  # matmuls by hand: per token 2 (D (H+2K) Dh + H Dh D + 3 D F) per layer + 2 D V, + 4 L^2 H Dh
  d, f, v = 128, 352, 1024
  per_token = 2 * (2 * (d * 256 + d * d + 3 * d * f)) + 2 * d * v
  assert analytic == b * (length * per_token + 2 * 4 * length * length * d)
  assert 0.97 < cost["flops"] / analytic < 1.1      # XLA also counts norms, softmax, RoPE


@pytest.mark.slow
def test_benchmark_cell_reports_consistent_numbers():
  config = step_speed.small_config(hidden=32, layers=1, heads=2, kv_heads=1, vocab=64,
                                   dtype="float32")
  params = step_speed.random_params(config)
  opts = sampler_options.SamplerOptions(steps=24, alg="entropy")
  row = step_speed.bench_cell(config, params, 2, 32, opts, timed_steps=2)
  assert row["new_tokens"] == 24 and row["batch"] == 2
  np.testing.assert_allclose(row["tokens_per_s"], 2 / (row["ms_step"] / 1e3), rtol=1e-9)
  assert row["gflop_step"] == step_speed.analytic_flops(config, 2, 32) / 1e9


@pytest.mark.parametrize("name", ["diffucoder_7b_base", "diffucoder_7b_instruct", "dream_7b_base"])
def test_model_card_configs_offer_harness_and_card_top_k(name):
  module = importlib.import_module(f"experiments.diffucoder.configs.{name}")
  harness, card = module.get_config(), module.get_config("sampler=card")
  assert module.get_config("sampler=harness").to_dict() == harness.to_dict()
  assert harness.generate.top_k == 0 and generate.sampler_options(harness).top_k is None
  assert card.generate.top_k == 50 and generate.sampler_options(card).top_k == 50
  h, c = harness.to_dict(), card.to_dict()                 # top_k is the only difference
  h["generate"].pop("top_k"), c["generate"].pop("top_k")
  assert h == c
  assert harness.generate.top_p == 0.95 and harness.generate.alg == "entropy"
  assert generate.sampler_options(harness).block_algorithm == "podlab"
  harness.generate.update(block_algorithm="fast_dllm", block_length=32, cache="dual",
                          steps=harness.generate.max_new_tokens // 32, threshold=0.9)
  assert generate.sampler_options(harness).block_algorithm == "fast_dllm"
  with pytest.raises(config_utils.ConfigError, match="arg:sampler='cards'.*sampler=card"):
    module.get_config("sampler=cards")


def test_write_tiny_tokenizer_writes_nothing_before_the_size_check_passes(tmp_path):
  config = tiny.get_config("dtype=float32")
  ckpt = str(tmp_path / "tiny_hf")
  random_checkpoint.write_random_checkpoint(ckpt,
                                            dream.DreamConfig.from_dict(config.model.to_dict()),
                                            tokens=config.tokens.to_dict())
  config.checkpoint = ckpt
  before = sorted(os.listdir(ckpt))
  config.model.num_layers = 3                                       # the wrong size
  with pytest.raises(convert.ConversionError,
                     match="num_layers: config.json 2 vs config.model 3.*--config.model.num_layers=2"):
    generate.write_tiny_tokenizer(config)
  assert sorted(os.listdir(ckpt)) == before                        # no tokenizer file written
  config.model.num_layers = 2
  config.model.param_dtype = "bfloat16"                            # a dtype mismatch fails too
  with pytest.raises(convert.ConversionError, match="--config.model.param_dtype=float32"):
    generate.write_tiny_tokenizer(config)
  assert sorted(os.listdir(ckpt)) == before
  config.model.param_dtype = "float32"
  assert generate.write_tiny_tokenizer(config) == ckpt
  assert "vocab.json" in os.listdir(ckpt)
  tok = tokenizer_lib.load(ckpt)
  assert tok.decode(tok.encode("def add(a, b):")) == "def add(a, b):"
  # The tokenizer's ids must fit the model's vocabulary: checked before writing, too.
  small = tiny.get_config("dtype=float32")
  small.model.vocab_size = 270
  d = str(tmp_path / "small")
  random_checkpoint.write_random_checkpoint(d, dream.DreamConfig.from_dict(small.model.to_dict()),
                                            tokens=small.tokens.to_dict())
  small.checkpoint = d
  with pytest.raises(config_utils.ConfigError, match=r"model.vocab_size=270: the tiny tokenizer's "
                     r"ids reach 271.*--config.model.vocab_size=272"):
    generate.write_tiny_tokenizer(small)
  assert "vocab.json" not in os.listdir(d)


@pytest.mark.slow
def test_benchmark_compare_decodings_on_given_params():
  """Mode 2 takes any Dream config + params: rows are the Runner's own decodings, scored right."""
  forward, params = _model()
  cfg = dream.tiny_config(dtype="float32", param_dtype="float32")
  prompt, valid = sampling.left_pad([[5, 6, 7, 8], [9, 10, 11, 12]], PAD)
  variants = [v for v in decodings.compare_variants(8, 4, 0.5)
              if v[0] in ("plain (reference)", "fast_dllm, no cache", "fast_dllm dual cache")]
  variants = [(name, kw, min(base, 1)) for name, kw, base in variants]
  rows = decodings.compare_decodings(cfg, params, prompt, valid, mask_id=MASK, new_tokens=8,
                                     block_length=4, threshold=0.5, repeats=1, variants=variants)
  assert [r["decoding"] for r in rows] == ["plain (reference)", "fast_dllm, no cache",
                                          "fast_dllm dual cache"]
  for (name, kw, base), r in zip(variants, rows):
    opts = sampler_options.SamplerOptions(**{"steps": 8, "alg": "entropy", **kw})
    out = sampling.Runner(forward, opts, mask_id=MASK).generate(
        params, prompt, valid, jax.random.key(0), max_new_tokens=8)
    np.testing.assert_array_equal(r["tokens"], out.tokens[:, 4:])
    assert r["forwards"] == out.forwards
    assert r["agreement"] == np.mean(r["tokens"] == rows[0]["tokens"])
    assert r["agreement_vs"] == np.mean(r["tokens"] == rows[base]["tokens"])
    np.testing.assert_allclose(r["tokens_per_s"], 16 / r["seconds"])
  assert rows[0]["agreement"] == rows[0]["speedup"] == 1.0
  assert rows[2]["forwards"] == 2 * 4              # per block: the refresh + 3 cached forwards


@pytest.mark.slow                      # 23 s: two interpreters start; make test-slow
def test_benchmark_cli_is_an_entry_program_with_one_line_errors():
  """benchmark.py runs on entry.run_program: two modes at once, or a global batch that does not
  split over a TPU slice's devices, is one line and exit 2 (checked before any compile)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for args, line in [
      (["--compare", "--trained=/nonexistent"],
       "error: --compare and --trained: two modes at once. Fix: pick one"),
      (["--dry_run", "--target=v2-8", "--global_batch=3"],
       "error: --global_batch=3 does not split over the 8 data groups of v2-8 at "
       "--model_parallel=1. Fix: use a multiple of 8")]:
    proc = subprocess.run([sys.executable, "-m", "experiments.diffucoder.tools.benchmark", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == line


def test_benchmark_tpu_dry_run_fix_names_its_flag_the_users_batch_and_a_thin_margin(monkeypatch):
  """Dream 7.6B on a v2-8 does not fit at model_parallel 1; the fix line of `benchmark --dry_run`
  names benchmark's own flag (--model_parallel), the user's global batch (8 rows at every degree,
  not generate.py's batch_size per data group) and the thin margin (the compiles are faked: their
  HBM figures are issue 49's)."""
  gib = 2 ** 30
  compiled = []
  monkeypatch.setattr(tpu_target, "load_libtpu", lambda: "test")
  monkeypatch.setattr(tpu_plan, "lower_step", lambda target, batch, m, *a, **k: (batch, m))

  def fake_report(program, *, target, name="program", **kw):
    batch, m = program
    compiled.append((batch, m))
    if m == 1:
      return tpu_report.Report(name=name, target=target, libtpu_version="test", compiled=False,
                               oom_need_bytes=int(14.35 * gib),
                               compiler_message="RESOURCE_EXHAUSTED")
    return tpu_report.Report(name=name, target=target, libtpu_version="test", compiled=True,
                             argument_bytes=int(7.1 * gib), output_bytes=0, alias_bytes=0,
                             temp_bytes=int(0.4 * gib), peak_bytes=int(7.35 * gib))
  monkeypatch.setattr(tpu_compile, "compile_report", fake_report)
  with pytest.raises(tpu_report.DoesNotFitError) as e:
    benchmark.run_dry_tpu("v2-8", global_batch=8, canvas=512)
  assert compiled == [(8, 1), (8, 2)]
  assert str(e.value).endswith(
      ". Fix: --model_parallel=2 fits at batch 8 (7.35 of 7.48 GiB per TensorCore, margin 133 MiB "
      "(1.7%): tight)")


def test_benchmark_tpu_dry_run_is_generate_dry_runs_program():
  """`benchmark --dry_run --target=TPU` compiles through tpu_plan.dry_run (generate.py --dry_run's
  program): here the tiny model's step on a v5e-8 at model_parallel 2, 8 rows of 32 tokens."""
  try:
    tpu_target.load_libtpu()
  except tpu_target.LibtpuMissingError as e:
    pytest.skip(f"needs libtpu: {e}")
  opts = sampler_options.SamplerOptions(alg="entropy", temperature=0.4, top_p=0.95)
  text = benchmark.run_dry_tpu("v5e-8", dream.tiny_config(), global_batch=8, canvas=32,
                               opts=opts, model_parallel=2)
  assert "dream sampling step b8 mp2" in text and "v5litepod-8" in text
  assert "The generation loop runs the step 24 times per batch" in text   # 32 - 8 prompt tokens
  with pytest.raises(errors.BadInput, match=r"--global_batch=6 does not split over the 4 data "
                     r"groups of v5litepod-8 at --model_parallel=2. Fix: use a multiple of 4"):
    benchmark.run_dry_tpu("v5e-8", dream.tiny_config(), global_batch=6, canvas=32, model_parallel=2)
