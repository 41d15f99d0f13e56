"""Weights by their public names against a loopback Hub (tests/hub_server.py) serving tiny folders
under the real ids: nanoGPT's sampler and finetune recipe with `gpt2` / `gpt2-xl`, DiffuCoder's
generate with `apple/DiffuCoder-7B-Instruct`, the library's refusal of token ids beyond the model's
vocabulary, and planning (a dry run) that needs no download. The commands exactly as the docs type
them run in the slow tests; the default suite runs their shorter forms."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common import layout as layout_lib
from experiments.common import trainer
from experiments.diffucoder import convert
from experiments.diffucoder import generate
from experiments.diffucoder import random_checkpoint
from experiments.diffucoder import tokenizer as tokenizer_lib
from experiments.diffucoder.configs import diffucoder_7b_instruct
from experiments.diffucoder.configs import tiny as dream_tiny
from experiments.nanogpt import hf_gpt2
from experiments.nanogpt import sampling
from experiments.nanogpt import train
from experiments.nanogpt.configs import finetune_shakespeare
from input_pipeline import gpt2_bpe
from input_pipeline import hub
from modules import dream
from modules import gpt
import hub_server

REPO = pathlib.Path(__file__).resolve().parents[1]
DIFFUCODER = "apple/DiffuCoder-7B-Instruct"
WORDS = ("the king and queen of verona speak of love and death in the night while the citizens of "
         "rome hear me speak before we proceed").split()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """Tiny folders in the real layouts: GPT-2 (a BPE learned from a small text; also one whose
  model has fewer ids than its tokenizer) and Dream (2 shards, a byte-level tokenizer)."""
  root = tmp_path_factory.mktemp("hub_folders")
  rng = np.random.default_rng(0)
  text = "".join(" ".join(rng.choice(WORDS, 8)) + ".\n" for _ in range(400))
  (root / "texts").mkdir()
  (root / "texts" / "input.txt").write_text(text)
  hf_gpt2.make_random(str(root / "gpt2"), "tiny", seed=1, bpe_text=str(root / "texts" / "input.txt"),
                      bpe_vocab_size=300)
  hf_gpt2.make_random(str(root / "small_vocab"), "tiny", seed=2, vocab_size=200)   # 257-id tokenizer
  config = dream_tiny.get_config("dtype=float32")
  random_checkpoint.write_random_checkpoint(str(root / "dream"), dream.DreamConfig.from_dict(
      config.model.to_dict()), num_shards=2, tokens=config.tokens.to_dict())
  tokenizer_lib.write_byte_level_tokenizer(
      str(root / "dream"), tokenizer_lib.tiny_special_tokens(config.tokens.to_dict()),
      tokenizer_lib.TINY_MERGES, first_merge_id=261)
  return root


@pytest.fixture
def server(folders, monkeypatch, tmp_path):
  with hub_server.HubServer() as s:
    for size in hub.GPT2_NAMES.values():
      s.add(size, hub_server.folder_files(str(folders / "gpt2")))
    s.add("someone/small-vocab", hub_server.folder_files(str(folders / "small_vocab")))
    s.add(DIFFUCODER, hub_server.folder_files(str(folders / "dream")))
    hub_server.use(monkeypatch, s, str(tmp_path))
    yield s


def _run(args, server, home, timeout=600, **env_extra):
  env = hub_server.subprocess_env(server, str(home), PYTHONIOENCODING="utf-8", **env_extra)
  env.pop("PODLAB_VERBOSE", None)
  return subprocess.run([sys.executable, "-m"] + args, cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=timeout)


def _greedy(folder, start, n):
  cfg, params = hf_gpt2.load_pretrained(folder)
  tok = gpt2_bpe.load(folder)
  prompt = np.asarray([tok.encode(start, allowed_special=True)], np.int32)
  return tok.decode(sampling.generate(gpt.GPTModel(cfg), params, prompt, n, temperature=0.0)[0])


def test_sample_init_from_a_name(server, folders, tmp_path):
  shared = tmp_path / "shared"                             # --cache_dir: the pod's shared cache
  proc = _run(["experiments.nanogpt.sample", "--init_from=gpt2", "--start=the king",
               "--num_samples=1", "--max_new_tokens=6", "--temperature=0", f"--cache_dir={shared}"],
              server, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  header, text = proc.stdout.split("\n", 1)
  folder = next((shared / "models--openai-community--gpt2" / "snapshots").iterdir())
  assert header.startswith(f"GPT-2 folder gpt2 ({folder}): {{'n_layer': 2")
  assert text.split("\n---------------  (")[0] == _greedy(str(folders / "gpt2"), "the king", 6)
  assert "gpt2 = openai-community/gpt2: fetching" in proc.stderr


def test_ids_beyond_the_vocabulary_are_refused_by_the_library(server):
  """A name whose folder's tokenizer (257 ids) outgrows its model (200): generate and apply name
  the ids and the vocabulary size instead of NaN logits and token 0."""
  folder = hf_gpt2.resolve("someone/small-vocab", "--init_from")
  cfg, params = hf_gpt2.load_pretrained(folder)
  eot = gpt2_bpe.load(folder).encode("<|endoftext|>", allowed_special=True)
  assert eot == [256] and cfg.vocab_size == 200
  message = r"token ids \[256\] are outside the model's vocabulary of 200 ids \(0\.\.199\)"
  with pytest.raises(ValueError, match=message):
    sampling.generate(gpt.GPTModel(cfg), params, np.asarray([[65, 256]]), 2)
  with pytest.raises(ValueError, match=message):
    gpt.GPTModel(cfg).apply(params, jnp.asarray([[256, 65]]))
  logits = jax.jit(gpt.GPTModel(cfg).apply)(params, jnp.asarray([[199, 65]]))   # traced: unchecked
  assert logits.shape == (1, 2, 200) and bool(jnp.isfinite(logits).all())


def test_finetune_recipe_from_a_name(server, folders, tmp_path):
  """configs/finetune_shakespeare.py with init_from=gpt2-xl (here a tiny folder under that id):
  the run's first step downloads it, the data is prepared with its tokenizer, and the weights the
  run starts from are the folder's, bit for bit (the whole run: test_finetune_as_typed)."""
  c = finetune_shakespeare.get_config("tiny")
  c.init_from = "gpt2-xl"
  c.dataset.manual_dir = str(folders / "texts")
  c.dataset.data_dir = str(tmp_path / "tfds")
  experiment = train.NanoGPT()
  experiment.prepare(c)                                    # what a run does before building
  folder = hub.cached("gpt2-xl", hub.GPT2_NAMES)
  assert train.data_config(c).builder_kwargs.tokenizer_dir == folder
  assert train.data_vocab_size(c) == 300 and server.gets("model.safetensors") == 1
  _, built = trainer.build(experiment, c)
  assert (built.model_config.n_layer, built.model_config.vocab_size) == (2, 300)
  params = trainer.load_init(experiment, built, c, c.init_from)
  _, want = hf_gpt2.crop_block_size(*hf_gpt2.load_pretrained(str(folders / "gpt2")), 64)
  for module, leaves in want.items():
    for leaf, value in leaves.items():
      np.testing.assert_array_equal(np.asarray(params[module][leaf]), value)


def test_planning_needs_no_download(monkeypatch, tmp_path):
  """The XL recipe offline, with and without init_from=gpt2-xl: the named size and GPT-2's
  packaged vocabulary size the model (what `--dry_run --target=v4-8` compiles); the inputs line
  says where the weights and data will come from."""
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf"))
  monkeypatch.setattr(hub, "_RESOLVED", {})
  c = finetune_shakespeare.get_config("gpt2-xl,devices=4")
  c.dataset.data_dir = str(tmp_path / "tfds")
  layout = layout_lib.batch_layout(c, devices=4, devices_per_host=4, process_index=0,
                                   platform="tpu", target="v4-8")
  for init_from in ("", "gpt2-xl"):
    c.init_from = init_from
    folder, model = train.run_model(c, layout)
    assert (model.n_layer, model.n_head, model.n_embd, model.block_size, model.vocab_size,
            model.dtype) == (48, 25, 1600, 1024, 50257, "bfloat16")
    assert (folder is None) == (init_from == "")
    inputs = dict(train.NanoGPT().describe_inputs(c))
    assert "GPT-2's packaged vocabulary stands in" in inputs["data"]
  assert inputs["weights"].startswith("gpt2-xl = openai-community/gpt2-xl (http")
  assert "not in the cache; downloaded into" in inputs["weights"]
  assert train.gelu_line(c, model) == "GELU tanh (config.json: gelu_new)"


def test_diffucoder_checkpoint_by_name(server, folders):
  """generate.run with config.checkpoint=apple/DiffuCoder-7B-Instruct (a tiny Dream folder under
  that id): the weights and the tokenizer come from the name; the 7B recipe as it is checks the
  downloaded folder and names the overrides that would match it."""
  config = dream_tiny.get_config("dtype=float32")
  config.checkpoint = DIFFUCODER
  config.generate.max_new_tokens = config.generate.steps = 4
  records = generate.run(config, generate.read_prompts(["def add(a, b):"], None))
  assert len(records) == 1 and len(records[0]["completion_ids"]) <= 4
  assert records[0]["prompt_tokens"] == len(tokenizer_lib.load(str(folders / "dream")).encode(
      "def add(a, b):"))
  big = diffucoder_7b_instruct.get_config()
  with pytest.raises(convert.ConversionError, match=r"--config.model.num_layers=2"):
    convert.check_checkpoint_folder(DIFFUCODER, dream.DreamConfig.from_dict(big.model.to_dict()))
  assert server.gets("config.json", DIFFUCODER) == 1            # downloaded once, used twice


# --------------------------------------------------------------------------------------------------
# The commands as the docs type them.

@pytest.mark.slow
def test_sample_as_typed(server, tmp_path):
  """`python -m experiments.nanogpt.sample --init_from=gpt2`: nanoGPT's 10 samples of 500 tokens;
  then offline (HF_HUB_OFFLINE=1): the cached gpt2 samples again, gpt2-xl (not cached) is one line
  naming the name, its page and the fallback, exit 2."""
  proc = _run(["experiments.nanogpt.sample", "--init_from=gpt2"], server, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.count("---------------  (500 tokens in ") == 10
  before = len(server.requests)
  proc = _run(["experiments.nanogpt.sample", "--init_from=gpt2", "--num_samples=1",
               "--max_new_tokens=2"], server, tmp_path, HF_HUB_OFFLINE="1")
  assert proc.returncode == 0 and len(server.requests) == before, proc.stderr[-3000:]
  proc = _run(["experiments.nanogpt.sample", "--init_from=gpt2-xl"], server, tmp_path,
              HF_HUB_OFFLINE="1")
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and lines[-1] == (
      f"error: --init_from=gpt2-xl: gpt2-xl = openai-community/gpt2-xl ({server.url}/"
      f"openai-community/gpt2-xl): not in the Hugging Face cache ({tmp_path}/hf/hub) and "
      "HF_HUB_OFFLINE=1 forbids downloading it. Fix: run once with a network, or download its "
      "safetensors, config.json and tokenizer files from that page and pass the folder as "
      "--init_from=FOLDER"), proc.stderr[-3000:]


@pytest.mark.slow
def test_finetune_as_typed(server, tmp_path):
  """`python -m experiments.nanogpt.main --config=configs/finetune_shakespeare.py
  --config.init_from=gpt2-xl` against a tiny folder with GPT-2's vocabulary and 1024 positions
  under that id; only the run's length is cut (1 update, 1 evaluation batch) to fit a CPU test."""
  folder = tmp_path / "gpt2xl_like"
  cfg = gpt.GPTConfig(block_size=1024, vocab_size=hf_gpt2.GPT2_VOCAB_SIZE, n_layer=2, n_head=4,
                      n_embd=64, bias=True, gelu="tanh")
  make = hf_gpt2.random_tensors(cfg, seed=0)
  hf_gpt2.save_pretrained(str(folder), cfg, _params(cfg, make))
  gpt2_bpe.copy_packaged_gpt2(str(folder))
  server.add("openai-community/gpt2-xl", hub_server.folder_files(str(folder)), revision="main")
  proc = _run(["experiments.nanogpt.main", "--config=configs/finetune_shakespeare.py",
               "--config.init_from=gpt2-xl", f"--workdir={tmp_path / 'work'}",
               f"--config.dataset.data_dir={tmp_path / 'tfds'}", "--config.max_iters=0",
               "--config.eval_iters=1"], server, tmp_path, timeout=1800,
              XLA_FLAGS="--xla_force_host_platform_device_count=1 "      # a 1-device CPU, as typed
              + os.environ.get("PODLAB_TEST_XLA_OPT_FLAGS", ""))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "init_from gpt2-xl: model weights loaded" in proc.stdout + proc.stderr


def _params(cfg, make):
  params = {}
  for name, _, module, leaf in hf_gpt2.tensor_map(cfg):
    params.setdefault(module, {})[leaf] = make(name)
  return params


@pytest.mark.slow
def test_generate_as_typed(server, tmp_path):
  """`python -m experiments.diffucoder.generate --config=configs/diffucoder_7b_instruct.py
  --config.checkpoint=apple/DiffuCoder-7B-Instruct --prompt=...`: the name resolves (the tiny
  folder is downloaded) and the 7B config's first check of it (the tokenizer's special ids) is one
  line, exit 2; with the tiny config the same name generates."""
  proc = _run(["experiments.diffucoder.generate", "--config=configs/diffucoder_7b_instruct.py",
               f"--config.checkpoint={DIFFUCODER}", "--prompt=def add(a, b):"], server, tmp_path)
  errors_ = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
  assert proc.returncode == 2 and len(errors_) == 1, proc.stderr[-3000:]
  assert errors_[0].startswith("error: tokenizer ids differ from the config: <|mask|> config "
                               "151666 vs tokenizer 259")
  assert f"{DIFFUCODER}: fetching the safetensors" in proc.stderr
  out = tmp_path / "out.jsonl"
  proc = _run(["experiments.diffucoder.generate", "--config=configs/tiny.py:dtype=float32",
               f"--config.checkpoint={DIFFUCODER}", "--prompt=def add(a, b):", f"--output={out}",
               "--noprogress"], server, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert [json.loads(l)["id"] for l in out.read_text().splitlines()] == [0]
