"""`python -m experiments.nanogpt.sample` (nanoGPT's sample.py), run as a subprocess as a user types
it: `--init_from=<GPT-2 folder>` on a random GPT-2-layout folder written by the repo's own writer
(experiments/nanogpt/hf_gpt2.make_random; a bytes-only tokenizer), greedy decoding
(--temperature=0); the printed sample is the text of experiments/nanogpt/sampling.generate's tokens
on the same weights, with and without the KV cache. Bad input is one line and exit 2."""

import os
import pathlib
import subprocess
import sys

import numpy as np

from experiments.nanogpt import hf_gpt2
from experiments.nanogpt import sampling
from input_pipeline import gpt2_bpe
from modules import gpt

REPO = pathlib.Path(__file__).resolve().parents[1]
NEW_TOKENS = 12
START = "To be, or"
SEP = b"\n---------------  ("


def _sample(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONIOENCODING="utf-8")
  env.pop("PODLAB_VERBOSE", None)
  return subprocess.run([sys.executable, "-m", "experiments.nanogpt.sample"] + list(args), cwd=REPO,
                        env=env, capture_output=True, timeout=300)


def test_init_from_a_gpt2_folder_prints_the_greedy_tokens_of_generate(tmp_path):
  folder = tmp_path / "gpt2-random"
  hf_gpt2.make_random(str(folder), "tiny", seed=5)
  cfg, params = hf_gpt2.load_pretrained(str(folder))
  tok = gpt2_bpe.load(str(folder))
  prompt = np.asarray([tok.encode(START, allowed_special=True)], np.int32)
  want = sampling.generate(gpt.GPTModel(cfg), params, prompt, NEW_TOKENS, temperature=0.0)
  assert want.shape == (1, prompt.shape[1] + NEW_TOKENS)
  assert len(set(want[0, prompt.shape[1]:].tolist())) > 1        # not one token repeated
  for cache in ("--kv_cache", "--nokv_cache"):
    proc = _sample(f"--init_from={folder}", f"--start={START}", "--num_samples=2",
                   f"--max_new_tokens={NEW_TOKENS}", "--temperature=0", cache)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    out = proc.stdout
    header, _, rest = out.partition(b"\n")
    assert header.decode().startswith(f"GPT-2 folder {folder}: ") and "'n_layer': " in header.decode()
    assert header.decode().endswith(", GELU tanh (config.json: gelu_new)")   # the folder's GELU
    samples = rest.split(SEP)
    assert len(samples) == 3 and samples[1].startswith(f"{NEW_TOKENS} tokens in ".encode())
    first = samples[0]
    second = samples[1].split(b"\n", 1)[1]                       # after the timing line's end
    assert first.decode("utf-8") == tok.decode(want[0].tolist())   # greedy: seeds do not matter
    assert second.decode("utf-8") == tok.decode(want[0].tolist())


def test_init_from_with_a_config_or_a_missing_folder_is_one_line(tmp_path):
  for args, expect in (
      ([f"--init_from={tmp_path}", "--config=configs/shakespeare_char_cpu.py"],
       "samples from a GPT-2 folder alone. Fix: drop --config"),
      ([f"--init_from={tmp_path / 'nope'}"], f"--init_from={tmp_path / 'nope'}: ")):
    proc = _sample(*args)
    err = proc.stderr.decode(errors="replace")
    lines = [l for l in err.splitlines() if l.strip()]
    assert proc.returncode == 2, (proc.returncode, err[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], lines


def test_prompt_ids_outside_the_vocabulary_are_refused_and_gelu_exact_is_named(tmp_path):
  """A folder whose tokenizer (257 ids) outgrows its model (200 ids): "<|endoftext|>" (id 256) is
  refused in one line, exit 2 (torch raises IndexError there; JAX would read NaN logits). A prompt
  inside the vocabulary ("Tobe": byte-level ids below 94; a space is 220) samples, and --gelu=exact
  is named in the first line."""
  folder = tmp_path / "gpt2-small-vocab"
  hf_gpt2.make_random(str(folder), "tiny", seed=5, vocab_size=200)
  proc = _sample(f"--init_from={folder}", "--start=<|endoftext|>", "--num_samples=1",
                 "--max_new_tokens=2")
  err = proc.stderr.decode(errors="replace")
  lines = [l for l in err.splitlines() if l.strip()]
  assert proc.returncode == 2, (proc.returncode, err[-3000:])
  assert len(lines) == 1 and lines[0] == (
      "error: --start='<|endoftext|>': token ids [256] of the prompt are outside the model's "
      "vocabulary of 200 ids (its tokenizer has more). Fix: use a prompt the model's vocabulary "
      "covers, or a folder whose vocab.json and config.json vocab_size agree"), lines
  proc = _sample(f"--init_from={folder}", "--start=Tobe", "--num_samples=1", "--max_new_tokens=2",
                 "--gelu=exact")
  assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
  header = proc.stdout.decode().splitlines()[0]
  assert header.endswith(", GELU exact (nanoGPT's; config.json: gelu_new)"), header
