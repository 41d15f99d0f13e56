"""The docs cannot go stale: every citation and every path they name resolves in the checkout.

Checks over the real checkout (resolved path, so also under `bazel test`), no imports of the project
(a few seconds: it tokenizes every Python file):

1. Markdown citations. Every `*.md` name written in code, tests, BUILD files, `docs/` and README.md
   (e.g. `docs/trm.md`) is a file of the checkout, taken from the repository root or from the citing
   file's folder. `../shared/data/...` is allowed: the shared data folder lies outside the repository
   by design. Citations of `../shared/docs/...` are not allowed, because a fresh clone has no
   `../shared`; the facts live in `docs/`.
2. Sections. A citation "docs/X.md section N" (also "sections N-M", "sections N and M", "N.M")
   names a numbered heading of that page ("## 4. ..." or "### 4.5 ...").
3. Paths in docs. Every repo-relative path in backticks, code blocks or link targets of `docs/*.md`
   and README.md exists:
   - a file or folder under a top-level source folder (e.g. `experiments/trm/train.py`,
     `launch/pod.sh`, `tests/test_launch.py::test_x`);
   - a config (`configs/cpu_demo.py:smoke`, resolved in `experiments/*/`);
   - a Bazel package (`//experiments/trm:main_bin`);
   - a dotted module (`python -m experiments.trm.main`; a trailing attribute is allowed).

Also, bare citations of the reference page by number ("reference 4.5", "reference section 2") are
stale: they must name the page ("docs/trm.md section 4.5").

The docs' budget, and the rules they state:

4. README.md + docs/*.md wrap to at most 2,500 lines at 100 columns (`cat README.md docs/*.md | fold
   -s -w 100 | wc -l`, counted here without running fold), and no Markdown table cell is over 200
   characters. Tool-written tables are included: none has such a cell, and their writers keep it so.
5. No commit hash or issue number outside docs/benchmarks.md and the tool-written tables (between
   `<!-- ... written by ... do not edit -->` and `<!-- end of ... -->`): measurements carry their
   commits there; the other docs, and the comments and docstrings of code outside tests/, describe.
   Hex words that are not commits (a checksum, a task id, another repository's commit) are listed
   in NOT_A_COMMIT.
6. docs/architecture.md's import rules, parsed from its text, hold for the imports of every module
   of the layered packages (ast; `lazy_import.module` and `importlib.import_module` of a literal
   count as imports): the layers import one way (`modules/` <- `input_pipeline/` <- `experiments/`),
   no experiment imports another (nor `common/` or `tools/` any), a run imports no tools module
   except through `lazy_import` (the dry run), and the modules a training step needs load no
   TensorFlow, TFDS or CLU at import. Rules the code breaks today are listed in KNOWN_VIOLATIONS
   with the reason; an entry that no longer fails makes the test fail.

Citations known to be stale are listed in KNOWN_STALE. Empty it once they are renamed; an entry
that no longer fails makes the test fail, so the list cannot outlive its reason.

  .venv/bin/python -m pytest tests/test_docs.py -q
  .venv/bin/python tests/test_docs.py          # prints every finding (file, citation, problem)
"""
from __future__ import annotations

import functools
import glob
import os
import pathlib
import re
import sys
from typing import Dict, Iterator, List, Set, Tuple

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# Folders that are not the project's source: build outputs, data, environments (see .gitignore).
EXCLUDED_DIRS = {".git", ".venv", "data", "workdirs", "logs", "build", "node_modules",
                 "__pycache__", ".pytest_cache", "shared"}
MAX_BYTES = 2_000_000

MD_NAME = re.compile(r"(?<![\w/.-])((?:\.\./|\./)?(?:[\w.-]+/)*[\w.-]*\w\.md)\b")
SECTION_CITATION = re.compile(
    r"(docs/[\w./-]+?\.md)[\s,#*\"]*(?:\(|,)?\s*sections?\s+(\d+(?:\.\d+)?)"
    r"((?:\s*(?:-|and|,|&)\s*\d+(?:\.\d+)?)*)")
BARE_REFERENCE = re.compile(
    r"(?i)\b(reference\s+(?:page,?\s+)?(?:section\s+)?\d+(?:\.\d+)?\b"
    r"|section\s+\d+(?:\.\d+)?\s+of\s+the\s+reference(?:\s+page)?)")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)
BACKTICK_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
TOKEN_SPLIT = re.compile(r"[\s=,;()\"'\[\]{}|]+")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")

# (file, citation) pairs known to be stale, while a rename is in progress (empty: every citation
# resolves inside the repository).
KNOWN_STALE: Set[Tuple[str, str]] = set()


def _text_files() -> Iterator[Tuple[str, str]]:
  """(repo-relative path, text) of every UTF-8 file of the checkout outside EXCLUDED_DIRS."""
  for root, dirs, files in os.walk(REPO_ROOT):
    dirs[:] = sorted(d for d in dirs if d not in EXCLUDED_DIRS and not d.startswith("bazel-")
                     and not d.endswith(".egg-info"))
    for name in sorted(files):
      path = pathlib.Path(root) / name
      if path.is_symlink() or path.stat().st_size > MAX_BYTES:
        continue
      try:
        text = path.read_text(encoding="utf-8")
      except (UnicodeDecodeError, OSError):
        continue
      yield path.relative_to(REPO_ROOT).as_posix(), text


def _doc_files() -> List[str]:
  docs = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "docs").glob("*.md"))
  return (["README.md"] if (REPO_ROOT / "README.md").exists() else []) + docs


def _source_dirs() -> Set[str]:
  """Top-level folders of the checkout that hold the project (not data, envs or build outputs)."""
  return {p.name for p in REPO_ROOT.iterdir() if p.is_dir() and p.name not in EXCLUDED_DIRS
          and not p.name.startswith("bazel-") and not p.name.endswith(".egg-info")
          and (not p.name.startswith(".") or p.name == ".ci")}


def md_citation_problems(rel: str, text: str) -> Iterator[Tuple[str, str]]:
  """(citation, problem) for every `*.md` name in `text` that is not a file of the checkout."""
  here = (REPO_ROOT / rel).parent
  for m in MD_NAME.finditer(text):
    cited = m.group(1)
    if cited.startswith("../shared/data/"):
      continue
    if cited.startswith("../shared/"):
      yield cited, "outside the repository (a fresh clone has no ../shared): cite docs/ instead"
    elif not ((REPO_ROOT / cited).is_file() or (here / cited).is_file()):
      yield cited, "no such file in the checkout"


def section_problems(rel: str, text: str, headings: Dict[str, Set[str]]) -> Iterator[Tuple[str, str]]:
  """(citation, problem) for "docs/X.md section N" citations whose page has no heading N."""
  for m in SECTION_CITATION.finditer(text):
    page = m.group(1)
    if page not in headings:
      continue                      # a missing page is md_citation_problems' finding
    numbers = [m.group(2)] + re.findall(r"\d+(?:\.\d+)?", m.group(3))
    for n in numbers:
      if n not in headings[page]:
        yield f"{page} section {n}", f"{page} has no heading numbered {n}"


def bare_reference_problems(text: str) -> Iterator[Tuple[str, str]]:
  for m in BARE_REFERENCE.finditer(text):
    yield (re.sub(r"\s+", " ", m.group(1)).lower(),
           "cites a reference section by number without the page: write docs/X.md section N")


def _tokens(span: str) -> Iterator[str]:
  for tok in TOKEN_SPLIT.split(span):
    tok = tok.strip(".,:;`*")
    if tok:
      yield tok


def path_problem(token: str, source_dirs: Set[str]) -> str:
  """Why `token` (from a doc's backticks, code block or link) is not in the checkout; "" if it is
  or is not a repo path at all."""
  if token.startswith("//"):                             # a Bazel label: its package must exist
    pkg = token[2:].split(":", 1)[0]
    if (REPO_ROOT / pkg / "BUILD").is_file() or (REPO_ROOT / pkg / "BUILD.bazel").is_file():
      return ""
    return f"no Bazel package {pkg}"
  if "://" in token or token.startswith(("/", "-", "..", "#", "~", "$", "@")):
    return ""                                            # URLs, absolute, flags, outside, env
  token = token.split(":", 1)[0]                         # path:line, test.py::test, config:arg
  if any(c in token for c in "<>$~@?"):
    return ""                                            # placeholders
  first = token.split("/", 1)[0]
  if any(PLACEHOLDER.match(part.split(".", 1)[0]) for part in token.split("/")) and not (
      REPO_ROOT / token).exists():
    return ""                                            # modules/NEW.py, logs/pod/NAME
  if "/" in token and first == "configs":
    if glob.glob(str(REPO_ROOT / "experiments" / "*" / token)):
      return ""
    return f"no experiments/*/{token}"
  if "/" in token and first in source_dirs:
    if "*" in token:
      return "" if glob.glob(str(REPO_ROOT / token)) else f"nothing matches {token}"
    return "" if (REPO_ROOT / token.rstrip("/")).exists() else f"no such path {token}"
  if DOTTED.match(token) and token.split(".", 1)[0] in source_dirs:
    parts = token.split(".")
    for k in range(len(parts), 1, -1):    # a module (+ attributes after it), or a whole package
      base = REPO_ROOT.joinpath(*parts[:k])
      if base.with_suffix(".py").is_file() or (k == len(parts) and (base / "__init__.py").is_file()):
        return ""
    return f"no module {token}"
  return ""


def doc_path_problems(rel: str, text: str, source_dirs: Set[str]) -> Iterator[Tuple[str, str]]:
  spans = [m.group(1) for m in FENCE.finditer(text)]
  rest = FENCE.sub("", text)
  spans += [m.group(1) for m in BACKTICK_SPAN.finditer(rest)]
  spans += [m.group(1) for m in LINK_TARGET.finditer(rest)]
  for span in spans:
    for tok in _tokens(span):
      problem = path_problem(tok, source_dirs)
      if problem:
        yield tok, problem


def findings() -> Dict[Tuple[str, str], str]:
  """{(file, citation or path): problem} over the whole checkout."""
  files = dict(_text_files())
  headings = {rel: set(HEADING.findall(text)) for rel, text in files.items()
              if rel.startswith("docs/") and rel.endswith(".md")}
  source_dirs = _source_dirs()
  out: Dict[Tuple[str, str], str] = {}
  for rel, text in files.items():
    if rel == "tests/test_docs.py":
      continue                       # this file names stale citations on purpose
    for cited, problem in md_citation_problems(rel, text):
      out[(rel, cited)] = problem
    for cited, problem in section_problems(rel, text, headings):
      out[(rel, cited)] = problem
    for cited, problem in bare_reference_problems(text):
      out[(rel, cited)] = problem
  for rel in _doc_files():
    for tok, problem in doc_path_problems(rel, files.get(rel, ""), source_dirs):
      out[(rel, tok)] = problem
  return out


def _report(items) -> str:
  return "\n".join(f"  {f}: {c!r}: {p}" for (f, c), p in sorted(items))


def test_every_citation_and_doc_path_resolves():
  found = findings()
  new = {k: v for k, v in found.items() if k not in KNOWN_STALE}
  assert not new, ("stale citations or paths (fix them; a renamed file or section must be renamed "
                   "where it is cited):\n" + _report(new.items()))


def test_known_stale_citations_are_still_stale():
  found = findings()
  fixed = sorted(k for k in KNOWN_STALE if k not in found)
  assert not fixed, ("fixed, so remove from KNOWN_STALE in tests/test_docs.py:\n"
                     + "\n".join(f"  {k}" for k in fixed))


def test_checks_catch_what_they_are_for():
  """The checks themselves, on made-up text (a check that finds nothing proves nothing)."""
  src = _source_dirs()
  assert "experiments" in src and "data" not in src
  assert path_problem("experiments/trm/train.py", src) == ""
  assert path_problem("experiments/trm/train.py:42", src) == ""
  assert path_problem("tests/test_docs.py::test_checks_catch_what_they_are_for", src) == ""
  assert path_problem("experiments/trm/no_such_module.py", src) != ""
  assert path_problem("configs/cpu_demo.py:smoke", src) == ""
  assert path_problem("configs/no_such_config.py", src) != ""
  assert path_problem("//experiments/trm:main_bin", src) == ""
  assert path_problem("//experiments/no_such_pkg:x", src) != ""
  assert path_problem("experiments.trm.main", src) == ""
  assert path_problem("experiments.common.config_utils.ConfigError", src) == ""
  assert path_problem("experiments.trm.no_such_module", src) != ""
  assert path_problem("launch/*.sh", src) == "" and path_problem("launch/*.zzz", src) != ""
  assert path_problem("experiments/trm/BUILD", src) == ""
  assert path_problem("modules/NEW.py", src) == ""     # a placeholder, not a path
  for ignored in ("workdirs/cpu_demo", "data/tfds/", "experiments/<name>/main.py", "gs://b/x",
                  "~/podlab-venv", "../shared/data/arc", "$PODLAB_X/y", "/abs/path"):
    assert path_problem(ignored, src) == "", ignored
  md = dict(md_citation_problems("experiments/x.py",
                                 "see docs/testing.md, docs/nope.md, ../shared/docs/a-reference.md "
                                 "and ../shared/data/README.md"))
  assert set(md) == {"docs/nope.md", "../shared/docs/a-reference.md"}, md
  heads = {"docs/trm.md": {"1", "2", "4", "4.5"}}
  sec = dict(section_problems("x.py", "docs/trm.md section 4.5; (docs/trm.md,\n  section 3); "
                                      "docs/trm.md sections 1-2 and docs/trm.md sections 4 and 7",
                              heads))
  assert set(sec) == {"docs/trm.md section 3", "docs/trm.md section 7"}, sec
  bare = [c for c, _ in bare_reference_problems("(reference 4.5) the reference section 2; "
                                                "section 5 of the reference page; the reference's 1000; docs/trm.md "
                                                "section 4")]
  assert bare == ["reference 4.5", "reference section 2", "section 5 of the reference page"], bare


# --- The docs' budget: length, table cells, no commit hashes or issue numbers -------------------

WRAP_COLUMNS = 100
MAX_WRAPPED_LINES = 2_500
MAX_TABLE_CELL = 200
# Measurements (with their commits) live in docs/benchmarks.md and in the tables the tools write.
HASH_ALLOWED_FILES = {"docs/benchmarks.md"}
TOOL_REGION = re.compile(
    r"^<!-- [^\n]*written by [^\n]*do not edit -->\n.*?^<!-- end of [^\n]*-->$", re.M | re.S)
# 7 to 40 hex digits with a digit and a letter, not part of a path, name or number.
COMMIT_HASH = re.compile(
    r"(?<![\w./+-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-])")
ISSUE_NUMBER = re.compile(r"(?i)(?<![\w&])(?:issues?\s+#?\d+|#\d+\b)")
# Hex words that are not this repository's commits, each with what it is.
NOT_A_COMMIT = {
    "86c4e6aa": "the first digits of tinyshakespeare's sha256",
    "ac0c5833": "an ARC-AGI-1 evaluation task's id",
    "e591f30": "a commit of maxtext, another repository: the version docs/tpu.md compares with",
}
# Kinds of files, outside tests/, whose whole text is prose or configuration (Python: only its
# comments and docstrings are checked; its string values may be data, such as a tool's table rows).
PROSE_FILES = re.compile(r"(^|/)(Makefile|BUILD|WORKSPACE|\.bazelrc|\.gitignore|run)$"
                         r"|\.(md|sh|bzl|toml|cfg|txt|yaml|yml)$")


def fold_line_count(text: str, width: int = WRAP_COLUMNS) -> int:
  """The lines `fold -s -w WIDTH | wc -l` prints for `text` (GNU fold: columns are characters, a
  tab stops at multiples of 8, a line too long breaks after its last blank, else at WIDTH)."""

  def advance(column: int, c: str) -> int:
    if c == "\b":
      return max(column - 1, 0)
    if c == "\r":
      return 0
    if c == "\t":
      return column + 8 - column % 8
    return column + 1

  lines, line, column = 0, "", 0
  for c in text:
    if c == "\n":
      lines, line, column = lines + 1, "", 0
      continue
    while True:
      column = advance(column, c)
      if column <= width:
        line += c
        break
      blank = max(line.rfind(" "), line.rfind("\t"))
      if blank >= 0:                      # break after the last blank, rescan the rest
        lines, line = lines + 1, line[blank + 1:]
        column = 0
        for d in line:
          column = advance(column, d)
        continue
      if not line:                        # one character wider than the line: it stays
        line += c
        break
      lines, line, column = lines + 1, "", 0
  return lines                           # wc -l counts newlines: a last unended line is not one


def docs_text() -> str:
  """README.md and docs/*.md as `cat README.md docs/*.md` concatenates them."""
  return "".join((REPO_ROOT / rel).read_text(encoding="utf-8") for rel in _doc_files())


def table_cells(text: str) -> Iterator[Tuple[int, str]]:
  """(line number, cell) of every Markdown table row; `\\|` stays inside its cell."""
  for number, line in enumerate(text.splitlines(), 1):
    row = line.strip()
    if row.startswith("|"):
      for cell in re.split(r"(?<!\\)\|", row.strip("|")):
        yield number, cell.strip()


def _python_prose(text: str) -> str:
  """The comments and docstrings (string statements) of Python source, the rest blanked."""
  import ast
  import io
  import tokenize
  keep = []
  try:
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
      if tok.type == tokenize.COMMENT:
        keep.append((tok.start, tok.end))
    tree = ast.parse(text)
  except (SyntaxError, tokenize.TokenError):
    return text
  for node in ast.walk(tree):             # docstrings: of modules, classes, functions, attributes
    if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)):
      keep.append(((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)))
  lines = text.splitlines()
  out = [[" "] * len(l) for l in lines]
  for (l0, c0), (l1, c1) in keep:
    for l in range(l0, l1 + 1):
      src = lines[l - 1]
      a = c0 if l == l0 else 0
      b = c1 if l == l1 else len(src)
      out[l - 1][a:b] = src[a:b]
  return "\n".join("".join(l) for l in out)


def provenance_findings() -> Iterator[Tuple[str, int, str]]:
  """(file, line, word) for every commit hash or issue number outside the allowed places: docs
  and README outside docs/benchmarks.md and the tool-written tables, and the prose (comments,
  docstrings, Markdown, build and shell files) of everything but tests/."""
  for rel, text in _text_files():
    if rel in HASH_ALLOWED_FILES or rel.startswith("tests/"):
      continue
    if rel.endswith(".py"):
      prose = _python_prose(text)
    elif PROSE_FILES.search(rel):
      prose = text
    else:
      continue                            # data files (JSON, CSV): checksums, not citations
    if rel.endswith(".md"):               # tool-written tables carry their commits
      prose = TOOL_REGION.sub(lambda m: "\n" * m.group(0).count("\n"), prose)
    for number, line in enumerate(prose.splitlines(), 1):
      for m in COMMIT_HASH.finditer(line):
        if m.group(0) not in NOT_A_COMMIT:
          yield rel, number, m.group(0)
      for m in ISSUE_NUMBER.finditer(line):
        yield rel, number, m.group(0)


def test_docs_fit_the_line_budget():
  n = fold_line_count(docs_text())
  assert n <= MAX_WRAPPED_LINES, (
      f"README.md + docs/*.md wrap to {n} lines at {WRAP_COLUMNS} columns (`cat README.md "
      f"docs/*.md | fold -s -w {WRAP_COLUMNS} | wc -l`), over the budget of {MAX_WRAPPED_LINES}: "
      "link to the one home of a fact instead of restating it")


def test_no_table_cell_is_a_paragraph():
  """Every table, tool-written ones included (their writers keep cells short too)."""
  long = [f"  {rel}:{number}: {len(cell)} characters: {cell[:60]}..."
          for rel in _doc_files()
          for number, cell in table_cells((REPO_ROOT / rel).read_text(encoding="utf-8"))
          if len(cell) > MAX_TABLE_CELL]
  assert not long, (f"table cells over {MAX_TABLE_CELL} characters (shorten, or move the detail "
                    "into a list below the table):\n" + "\n".join(long))


def test_no_commit_hashes_or_issue_numbers_outside_the_measurements():
  found = [f"  {rel}:{number}: {word}" for rel, number, word in provenance_findings()]
  assert not found, ("commit hashes or issue numbers (a measurement's commit belongs in "
                     "docs/benchmarks.md or a tool-written table; describe, do not cite history; "
                     "a hex word that is no commit goes in NOT_A_COMMIT with what it is):\n"
                     + "\n".join(found))


def test_budget_checks_catch_what_they_are_for():
  assert fold_line_count("") == 0
  assert fold_line_count("a\n") == 1
  assert fold_line_count("x" * 100 + "\n") == 1
  assert fold_line_count("x" * 101 + "\n") == 2
  assert fold_line_count(("word " * 30).strip() + "\n") == 2   # 149 characters, broken at a blank
  assert fold_line_count("a\n\nb") == 2
  assert [c for _, c in table_cells("| a | b `x\\|y` |\n|---|---|\ntext | no\n")] == [
      "a", "b `x\\|y`", "---", "---"]
  hashes = [m.group(0) for m in COMMIT_HASH.finditer(
      "commit a8d4590, (3031a56; run 02b0496) 1234567 deadbeef abcdefa0123 v4_64-b5f11edd "
      "x/8120f2bdf7163b61e4361b5f3e27901bf06b6193/y sha 86c4e6aa...")]
  assert hashes == ["a8d4590", "3031a56", "02b0496", "abcdefa0123", "86c4e6aa"], hashes
  issues = [m.group(0) for m in ISSUE_NUMBER.finditer("(issue 48) Issues 7 issue #3 #12 &#39; x#1")]
  assert issues == ["issue 48", "Issues 7", "issue #3", "#12"], issues
  prose = _python_prose('"""Doc a8d4590."""\nx = "a8d4590"  # see 3031a56\n"""x: 02b0496."""\n')
  assert "a8d4590." in prose and '"a8d4590"' not in prose and "3031a56" in prose, prose
  assert "02b0496" in prose, prose


# --- docs/architecture.md's import rules, against every module's imports ------------------------

ARCHITECTURE = "docs/architecture.md"
LAYERED = re.compile(r"`(\w+)/`")
NO_EXPERIMENT = re.compile(r"\(nor ((?:`\w+/`(?:,| or| and)?\s*)+)any experiment")
STEP_MODULES = re.compile(r"named at the top through\s+`lazy_import\.module\(\.\.\.\)`\s+by the"
                          r"\s+modules a\s+training step needs \(([^)]*)\)")
DATA_LIBRARIES = ("tensorflow", "tensorflow_datasets", "clu")
EXPERIMENT_SHARED = ("common", "tools")
# Rules the code breaks today: (rule, importing file) -> why. The test fails when one is fixed, so
# the entry goes with the violation.
KNOWN_VIOLATIONS: Dict[Tuple[str, str], str] = {}


@functools.lru_cache(maxsize=None)
def _module_path(module: str) -> "pathlib.Path | None":
  base = REPO_ROOT.joinpath(*module.split("."))
  for path in (base.with_suffix(".py"), base / "__init__.py"):
    if path.is_file():
      return path
  return None


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)
def module_imports(path: pathlib.Path) -> Tuple[Tuple[str, int, str], ...]:
  """(imported module, line, kind) for every import of `path`; kind is "top" (runs when the module
  loads), "local" (in a function) or "lazy" (`lazy_import.module("...")`, `importlib.import_module`
  of a literal). `from a import b` imports module a.b where that is a module, else a."""
  import ast
  tree = ast.parse(path.read_text(encoding="utf-8"))
  package = _module_name(path).split(".")
  if path.name != "__init__.py":
    package = package[:-1]

  def visit(node, local: bool) -> Iterator[Tuple[str, int, str]]:
    kind = "local" if local else "top"
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield alias.name, node.lineno, kind
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
      for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield (sub if alias.name != "*" and _module_path(sub) else base), node.lineno, kind
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in ("module", "import_module") and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
      yield node.args[0].value, node.lineno, "lazy"
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
      return                                # never runs
    for child in ast.iter_child_nodes(node):
      yield from visit(child, local or isinstance(
          node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

  return tuple(visit(tree, False))


def architecture_rules() -> Tuple[List[str], bool, List[str], bool, List[str]]:
  """What docs/architecture.md states: (the layers, lowest first; whether no experiment imports
  another; the shared folders of experiments/ that import no experiment either (["common",
  "tools"]); whether a run imports no tools module; the files of the modules a training step needs,
  which must load without TensorFlow, TFDS and CLU)."""
  text = (REPO_ROOT / ARCHITECTURE).read_text(encoding="utf-8")
  intro = re.sub(r"\s+", " ", text.split("\n\n", 2)[1])
  layers = [LAYERED.search(part).group(1) for part in intro.split(" <- ") if LAYERED.search(part)]
  flat = re.sub(r"\s+", " ", text)
  shared = NO_EXPERIMENT.search(flat)
  no_experiment = LAYERED.findall(shared.group(1)) if shared else []
  step = STEP_MODULES.search(flat)
  step_files: List[str] = []
  for name in (step.group(1).split(", ") if step else []):
    if name == "the experiments' train modules":
      step_files += sorted(p.relative_to(REPO_ROOT).as_posix()
                           for p in REPO_ROOT.glob("experiments/*/train.py"))
    else:
      step_files.append(f"experiments/common/{name}.py")
  return (layers, "no experiment imports another" in flat, no_experiment,
          "a run imports no tools module" in flat, step_files)


def _loads_at_import(module: str, seen: Set[str]) -> Iterator[str]:
  """Every module that importing `module` runs (its packages, its top-level imports, theirs...)."""
  parts = module.split(".")
  for k in range(1, len(parts) + 1):
    name = ".".join(parts[:k])
    if name in seen:
      continue
    seen.add(name)
    yield name
    path = _module_path(name)
    if path is not None:
      for target, _, kind in module_imports(path):
        if kind == "top":
          yield from _loads_at_import(target, seen)


def architecture_violations() -> Dict[Tuple[str, str], List[str]]:
  """{(rule, importing file): [what breaks it]} over every module of the layered packages."""
  layers, separate_experiments, no_experiment, tools_apart, step_files = architecture_rules()
  out: Dict[Tuple[str, str], List[str]] = {}
  for path in sorted(p for layer in layers for p in (REPO_ROOT / layer).rglob("*.py")):
    rel = path.relative_to(REPO_ROOT).as_posix()
    folders = rel.split("/")[:-1]
    for target, line, kind in module_imports(path):
      tparts = target.split(".")
      if tparts[0] in layers and layers.index(tparts[0]) > layers.index(folders[0]):
        out.setdefault(("layers", rel), []).append(f"line {line}: {target}")
      if (separate_experiments and folders[0] == tparts[0] == "experiments" and len(folders) > 1
          and (folders[1] not in EXPERIMENT_SHARED or folders[1] in no_experiment)
          and len(tparts) > 1 and tparts[1] not in EXPERIMENT_SHARED + (folders[1],)
          and _module_path(target)):
        # an experiment imports no other, and common/ (what every run needs) and tools/ (the tools
        # across experiments) none at all
        out.setdefault(("experiments", rel), []).append(f"line {line}: {target}")
      if (tools_apart and "tools" not in folders and "tools" in tparts[:-1] + tparts[-1:]
          and kind != "lazy" and tparts[0] in layers):
        out.setdefault(("tools", rel), []).append(f"line {line}: {target} ({kind} import)")
  for rel in step_files:
    loaded = set(_loads_at_import(_module_name(REPO_ROOT / rel), set()))
    bad = sorted(m for m in loaded if m.split(".")[0] in DATA_LIBRARIES and "." not in m)
    if bad:
      out.setdefault(("step loads no data library", rel), []).append(
          f"importing it loads {', '.join(bad)}")
  return out


def test_architecture_states_its_rules():
  layers, separate_experiments, no_experiment, tools_apart, step_files = architecture_rules()
  assert layers == ["modules", "input_pipeline", "experiments"], layers
  assert no_experiment == list(EXPERIMENT_SHARED), (
      f"{ARCHITECTURE} no longer says that `common/` and `tools/` import no experiment: "
      f"{no_experiment}")
  assert separate_experiments and tools_apart, (
      f"{ARCHITECTURE} no longer says 'no experiment imports another' and 'a run imports no tools "
      "module': update the rules here with the doc")
  assert "experiments/common/trainer.py" in step_files and all(
      (REPO_ROOT / f).is_file() for f in step_files), step_files


def test_the_import_rules_catch_what_they_are_for(tmp_path, monkeypatch):
  """On a tiny tree with this docs/architecture.md: experiments/tools/ importing an experiment,
  an experiment importing another, and common/ importing one are each caught; an experiment
  importing the shared tools/ is not."""
  files = {"docs/architecture.md": (REPO_ROOT / ARCHITECTURE).read_text(encoding="utf-8"),
           "modules/__init__.py": "", "input_pipeline/__init__.py": "",
           "experiments/__init__.py": "", "experiments/tools/__init__.py": "",
           "experiments/tools/shared.py": "",
           "experiments/tools/rows.py": "from experiments.trm import train\n",
           "experiments/common/__init__.py": "",
           "experiments/common/run.py": "import experiments.trm.train\n",
           "experiments/trm/__init__.py": "",
           "experiments/trm/train.py": "from experiments.tools import shared\n",
           "experiments/gpt/__init__.py": "",
           "experiments/gpt/train.py": "from experiments.trm import train\n"}
  for rel, text in files.items():
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text(text, encoding="utf-8")
  monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
  _module_path.cache_clear()
  module_imports.cache_clear()
  try:
    found = architecture_violations()
  finally:
    _module_path.cache_clear()
    module_imports.cache_clear()
  assert sorted(k for k in found if k[0] == "experiments") == [
      ("experiments", "experiments/common/run.py"), ("experiments", "experiments/gpt/train.py"),
      ("experiments", "experiments/tools/rows.py")], found


def test_imports_follow_the_architecture():
  found = architecture_violations()
  new = {k: v for k, v in found.items() if k not in KNOWN_VIOLATIONS}
  assert not new, (f"imports that break {ARCHITECTURE}'s rules (move the code to the layer, "
                   "experiment or tools folder it belongs to):\n"
                   + "\n".join(f"  {rule}: {rel}: {'; '.join(v)}"
                                for (rule, rel), v in sorted(new.items())))
  fixed = sorted(k for k in KNOWN_VIOLATIONS if k not in found)
  assert not fixed, f"fixed, so remove from KNOWN_VIOLATIONS in tests/test_docs.py: {fixed}"


if __name__ == "__main__":
  items = findings()
  print(_report(items.items()) or "no findings")
  print(f"{len(items)} findings, {len([k for k in items if k in KNOWN_STALE])} of them known stale")
  sys.exit(0)
