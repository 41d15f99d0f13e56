"""The docs cannot go stale: every citation and every path they name resolves in the checkout.

Three checks over the real checkout (resolved path, so also under `bazel test`), no imports of the
project (runs in well under a second):

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

Citations known to be stale are listed in KNOWN_STALE. Empty it once they are renamed; an entry
that no longer fails makes the test fail, so the list cannot outlive its reason.

  .venv/bin/python -m pytest tests/test_docs.py -q
  .venv/bin/python tests/test_docs.py          # prints every finding (file, citation, problem)
"""
from __future__ import annotations

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


if __name__ == "__main__":
  items = findings()
  print(_report(items.items()) or "no findings")
  print(f"{len(items)} findings, {len([k for k in items if k in KNOWN_STALE])} of them known stale")
  sys.exit(0)
