"""Tables that tools write into the docs themselves, between marker lines, so no figure is typed in.

A doc holds a generated table between two HTML comments (invisible in the rendered page):

  <!-- NAME table: written by WRITER; do not edit -->
  Written by `COMMAND` at COMMIT on MACHINE, DATE. NOTE

  | column | ... |
  |---|...|
  <!-- end of the NAME table -->

`write_table` rewrites such a block: the command that wrote it, the commit (`git rev-parse --short
HEAD`, "+dirty" when tracked files outside docs/ and README.md, which the writers change, have
uncommitted changes), the machine (the CPU's model, usable cores and its native-bfloat16 flags; on
an accelerator the device kind first; the load average), the date (UTC), then the table. With
`key` (the columns that name a row's options, e.g. ("batch", "canvas")), the new rows replace the
block's rows of the same key and the others stay: each run then gets a numbered line ("run 2:
`COMMAND` at ...") and the table a last column `run` naming its row's run, so every figure keeps the
command that produced it.
The file is written atomically (a temporary file in its folder, then os.replace); a marker that is
missing or appears twice is an error (ValueError) naming the marker and the file. `make tpu-check`'s
table (experiments/tools/tpu_docs.py) uses the same markers and functions. The bench tools print
their rows as one fixed-width table (`format_table`, `print_table` with an optional JSON copy;
`format_cell`: numbers rounded for reading, NaN for a failed row) and set a `--quick` smoke run's
sizes with `quick_defaults`.

Synopsis:

  from experiments.tools import doc_tables
  begin, end = doc_tables.markers("demo", "`python -m demo --write_docs`")
  text = f"intro\\n{begin}\\n{end}\\n"
  cols, rows = ["variant", "ms"], [{"variant": "a", "ms": "1.0"}]
  run = doc_tables.describe_run("python -m demo --write_docs")   # command, commit, machine, date
  text = doc_tables.update(text, begin, end, cols, rows, run, key=["variant"])
  assert doc_tables.parse_table(text, begin, end) == rows
  print(doc_tables.text_table(cols, rows))                        # the same table, as printed
  # doc_tables.write_table("docs/benchmarks.md", "demo", "`python -m demo --write_docs`",
  #                        command=..., columns=cols, rows=rows): the same, into the file
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import shlex
import subprocess
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

Row = Dict[str, str]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS_DOC = os.path.join(REPO_ROOT, "docs/benchmarks.md")
RUN_COLUMN = "run"
_RUN_LINE = re.compile(r"^run (\d+): (.*)$")
_SINGLE = "Written by "


def markers(name: str, writer: str) -> Tuple[str, str]:
  """The begin and end marker lines of the table NAME that WRITER (e.g. "`make gpt-bench`") writes."""
  return (f"<!-- {name} table: written by {writer}; do not edit -->",
          f"<!-- end of the {name} table -->")


def _cells(line: str) -> List[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown(columns: Sequence[str], rows: Sequence[Row]) -> str:
  """A markdown table of `rows` under `columns`."""
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows]
  return "\n".join(lines)


def text_table(columns: Sequence[str], rows: Sequence[Row]) -> str:
  """The same cells as a fixed-width text table (the first column left-aligned), as tools print."""
  table = [list(columns)] + [[r[c] for c in columns] for r in rows]
  widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
  lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                     for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in table]
  lines.insert(1, "-" * len(lines[0]))
  return "\n".join(lines)


def _span(text: str, begin: str, end: str, where: str = "") -> Tuple[int, int]:
  """(start, stop) of the text between the markers; ValueError when one is missing or repeated."""
  at = f" in {where}" if where else ""
  for marker in (begin, end):
    count = text.count(marker)
    if count == 0:
      raise ValueError(f"marker {marker!r} not found{at}: add the begin and end marker lines "
                       "where the table goes")
    if count > 1:
      raise ValueError(f"marker {marker!r} appears {count} times{at}: keep one block per table")
  start = text.index(begin) + len(begin)
  stop = text.index(end)
  if stop < start:
    raise ValueError(f"marker {end!r} comes before {begin!r}{at}")
  return start, stop


def block(text: str, begin: str, end: str, where: str = "") -> str:
  """The text between the markers `begin` and `end` (ValueError naming the marker if absent or
  repeated; `where` names the file in the message)."""
  start, stop = _span(text, begin, end, where)
  return text[start:stop]


def replace_block(text: str, begin: str, end: str, content: str, where: str = "") -> str:
  """`text` with the part between the markers replaced by "\\n" + content + "\\n"."""
  start, stop = _span(text, begin, end, where)
  return text[:start] + "\n" + content.strip("\n") + "\n" + text[stop:]


def parse_table(text: str, begin: str, end: str) -> List[Row]:
  """The rows of the markdown table between the markers (the first table line is its header)."""
  lines = [line for line in block(text, begin, end).splitlines() if line.strip().startswith("|")]
  if not lines:
    return []
  header = _cells(lines[0])
  return [dict(zip(header, _cells(line))) for line in lines[2:]]


def merge(old: Sequence[Row], new: Sequence[Row], key: Sequence[str]) -> List[Row]:
  """`old` with each row of the same `key` cells replaced by `new`'s, new ones appended."""
  def k(r):
    return tuple(r.get(c, "") for c in key)
  fresh = {k(r): r for r in new}
  out = [fresh.pop(k(r), r) for r in old]
  return out + [r for r in new if k(r) in fresh]


def _git(root: str, *args: str) -> str:
  try:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          check=False).stdout.strip()
  except OSError:                  # no git on this machine
    return ""


def commit(root: str = REPO_ROOT) -> str:
  """This checkout's short commit, "+dirty" when tracked files outside docs/ and README.md (which
  the table writers change) have uncommitted changes; "unknown" outside a git checkout."""
  head = _git(root, "rev-parse", "--short", "HEAD") or "unknown"
  dirty = _git(root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs",
               ":!README.md")
  return head + ("+dirty" if dirty else "")


def machine(device=None) -> str:
  """The machine a measurement ran on: the CPU's model, usable cores and native bfloat16 flags
  (/proc/cpuinfo: avx512_bf16, amx_bf16), preceded by `device`'s kind when it is an accelerator
  (a jax Device the tool ran on), e.g. "NVIDIA H100 80GB HBM3; host AMD EPYC 7B13, ..."."""
  from experiments.common import cpu_features  # pylint: disable=import-outside-toplevel  (imports jax)
  host = cpu_features.describe()
  if device is not None and getattr(device, "platform", "cpu") != "cpu":
    return f"{device.device_kind}; host {host}"
  return host


def command_line(module: str, argv: Sequence[str]) -> str:
  """`python -m MODULE ARGS`, as the tool was run."""
  return " ".join(["python", "-m", module, *[shlex.quote(a) for a in argv]])


def write_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` through a temporary file in the same folder and os.replace."""
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    if os.path.exists(path):
      os.chmod(tmp, os.stat(path).st_mode & 0o777)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def _runs(content: str) -> List[str]:
  """The provenance lines of a block: one description per run, in order."""
  runs = {}
  for line in content.splitlines():
    m = _RUN_LINE.match(line.strip())
    if m:
      runs[int(m.group(1))] = m.group(2)
    elif line.startswith(_SINGLE):
      runs[1] = line[len(_SINGLE):]
  return [runs[n] for n in sorted(runs)]


def render(columns: Sequence[str], rows: Sequence[Row], runs: Sequence[str]) -> str:
  """A block's content: the provenance line(s), then the table (a `run` column when the rows come
  from more than one run; each row's RUN_COLUMN is the 1-based index into `runs`)."""
  if len(runs) == 1:
    lines = _SINGLE + runs[0]
    table = markdown(columns, rows)
  else:
    lines = "\n".join(f"run {i}: {d}" for i, d in enumerate(runs, 1))
    table = markdown(list(columns) + [RUN_COLUMN], rows)
  return lines + "\n\n" + table


def describe_run(command: str, note: str = "", root: str = REPO_ROOT, device=None,
                 date: Optional[str] = None) -> str:
  """One line: `COMMAND` at COMMIT on MACHINE (`machine(device)`; the 1-minute load average as
  the run ends: the machines are shared, and speeds drop under load), DATE. NOTE"""
  date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
  try:
    load = f", load {os.getloadavg()[0]:.1f}"
  except OSError:
    load = ""
  text = f"`{command}` at {commit(root)} on {machine(device)}{load}, {date}."
  return " ".join((text + " " + note).split())


def update(text: str, begin: str, end: str, columns: Sequence[str], rows: Sequence[Row], run: str,
           key: Optional[Sequence[str]] = None, where: str = "") -> str:
  """`text` with the block between the markers holding `rows` (cells under `columns`) of the run
  described by `run` (`describe_run`); with `key`, merged into the block's rows (module doc)."""
  content = block(text, begin, end, where)
  if key is None:
    return replace_block(text, begin, end, render(columns, rows, [run]), where)
  old_runs = _runs(content)
  old = parse_table(text, begin, end)
  if old and set(old[0]) - {RUN_COLUMN} != set(columns):
    old = []                                     # the table's columns changed: start afresh
  for r in old:
    if RUN_COLUMN not in r or len(old_runs) == 1:
      r[RUN_COLUMN] = "1"
  new = [dict(r, **{RUN_COLUMN: "new"}) for r in rows]
  merged = merge(old, new, key)
  runs, number = [], {}
  for r in merged:                               # the runs some row still comes from, renumbered
    label = r[RUN_COLUMN]
    if label not in number:
      runs.append(run if label == "new" else old_runs[int(label) - 1])
      number[label] = str(len(runs))
  out = [dict(r, **{RUN_COLUMN: number[r[RUN_COLUMN]]}) for r in merged]
  if len(runs) == 1:
    out = [{c: r[c] for c in columns} for r in out]
  return replace_block(text, begin, end, render(columns, out, runs), where)


def check_markers(path: str, name: str, writer: str) -> None:
  """ValueError now (before a long benchmark runs) when `path` lacks the table's markers."""
  begin, end = markers(name, writer)
  with open(path) as f:
    block(f.read(), begin, end, path)


def write_table(path: str, name: str, writer: str, *, command: str, columns: Sequence[str],
                rows: Sequence[Row], key: Optional[Sequence[str]] = None, note: str = "",
                device=None, root: str = REPO_ROOT) -> str:
  """Rewrites the table NAME (markers(name, writer)) in the doc at `path` with `rows` of this run
  (`command`; `note`: what the tool printed above its table; `device`: the jax Device it ran on);
  returns the block's new content."""
  begin, end = markers(name, writer)
  with open(path) as f:
    text = f.read()
  text = update(text, begin, end, columns, rows, describe_run(command, note, root, device), key, path)
  write_atomic(path, text)
  return block(text, begin, end)


# --- the bench tools' printed table and --quick defaults ----------------------------------------

def quick_defaults(args: Any, argv: Sequence[str], **defaults: Any) -> None:
  """For a tool's `--quick` smoke run: sets each `defaults` attribute of the parsed `args` unless its
  flag (`--name`) was given on the command line `argv` (flags given explicitly still win)."""
  given = {a.split("=")[0] for a in argv}
  for name, value in defaults.items():
    if f"--{name}" not in given:
      setattr(args, name, value)


def format_cell(v: Any) -> str:
  """A cell as the table prints it: on/off, nan, thousands separators, 3 significant-ish digits."""
  if isinstance(v, bool):
    return "on" if v else "off"
  if isinstance(v, float):
    if math.isnan(v):
      return "nan"
    if v == 0:
      return "0"
    a = abs(v)
    if a >= 1000:
      return f"{v:,.0f}"
    if a >= 10:
      return f"{v:.1f}"
    if a >= 0.01:
      return f"{v:.3f}"
    return f"{v:.2e}"
  return str(v)


def format_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> str:
  """Fixed-width text table of `rows` (dicts) with a header line of `columns`."""
  cells = [list(columns)] + [[format_cell(r.get(c, "")) for c in columns] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
  lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in cells]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def print_table(header: Sequence[str], rows: Sequence[Dict[str, Any]], columns: Sequence[str],
                json_out: str = "") -> None:
  """Prints `header`'s lines and the table of `rows`; with `json_out`, writes {"header", "rows"}
  there too (the side-by-side tools' output)."""
  for line in header:
    print(line)
  print(format_table(rows, columns))
  if json_out:
    with open(json_out, "w") as fh:
      json.dump({"header": list(header), "rows": list(rows)}, fh, indent=1)
