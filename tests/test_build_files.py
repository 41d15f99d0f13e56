"""The Bazel BUILD files cannot drift from the source tree (issue 7).

Fails when a Python module, test, package or launch script has no BUILD target, when a target lists a
file that does not exist, when a target imports a project module without depending on the target
that owns it, when a test's `slow` flag disagrees with its pytest markers, or when the targets'
deps form a cycle (which Bazel refuses before running anything; named as Bazel names it). Each failure prints the
BUILD stanza to add. The BUILD files are read by executing them as Python with stand-ins for the
rules (they are Starlark, a subset of Python); the source tree is the real checkout (resolved path),
also under `bazel test`, so new files show up there too.

Glossary: a *package* is a folder with a BUILD (or BUILD.bazel) file; a *label* is `//pkg:name`;
the *owner* of a file is the target that lists it in `srcs`.

Synopsis:

  .venv/bin/python -m pytest tests/test_build_files.py -q
  .venv/bin/python tests/test_build_files.py modules/gpt.py    # prints the stanza for one file
  .venv/bin/python tests/test_build_files.py --fix             # rewrites the BUILD files' stanzas
"""
from __future__ import annotations

import ast
import dataclasses
import os
import pathlib
import sys
from typing import Dict, List, Optional, Sequence, Set

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("modules", "input_pipeline", "experiments", "launch", "tests", "third_party")
SKIP_DIRS = {"__pycache__", ".venv", ".pytest_cache", ".git"}
PROJECT_PACKAGES = ("modules", "input_pipeline", "experiments", "tests")
MACROS = "//third_party/py:defs.bzl"
# Top-level import name -> pip distribution, for the `# pip:` comments of suggested stanzas.
PIP_NAMES = {"haiku": "dm-haiku", "tensorflow": "tensorflow-cpu",
             "tensorflow_datasets": "tensorflow-datasets", "orbax": "orbax-checkpoint",
             "ml_collections": "ml-collections", "absl": "absl-py", "ml_dtypes": "ml-dtypes"}


@dataclasses.dataclass
class Target:
  """One rule call of a BUILD file."""
  package: str                   # "experiments/trm" ("" for the root)
  kind: str                      # "podlab_py_library", "filegroup", ...
  name: str
  srcs: List[str]                # labels as written
  deps: List[str]
  data: List[str]
  slow: bool = False

  @property
  def label(self) -> str:
    return f"//{self.package}:{self.name}"


def build_file(directory: pathlib.Path) -> Optional[pathlib.Path]:
  for name in ("BUILD.bazel", "BUILD"):
    if (directory / name).is_file():
      return directory / name
  return None


def read_build(package: str) -> List[Target]:
  """Executes //package's BUILD file with recording stand-ins for the rules it may call."""
  path = build_file(REPO_ROOT / package)
  targets: List[Target] = []
  if path is None:
    return targets

  def rule(kind):
    def record(name, srcs=(), deps=(), data=(), slow=False, **unused):
      del unused
      targets.append(Target(package, kind, name, list(srcs), list(deps), list(data), slow))
    return record

  def exports_files(srcs, **unused):
    del unused
    targets.append(Target(package, "exports_files", "", list(srcs), [], []))

  scope = {name: rule(name) for name in ("podlab_py_library", "podlab_py_binary", "podlab_py_test",
                                         "filegroup", "sh_binary", "sh_library")}
  scope.update(load=lambda *args, **kwargs: None, exports_files=exports_files,
               package=lambda **kwargs: None, licenses=lambda *args: None)
  try:
    exec(compile(path.read_text(), str(path), "exec"), scope)  # pylint: disable=exec-used
  except NameError as e:
    raise AssertionError(f"{path}: {e}; tests/test_build_files.py reads BUILD files with stand-ins "
                         "for the podlab macros and a few native rules; add one for it") from e
  return targets


def source_files() -> List[str]:
  """Repo-relative paths of the files that need a BUILD target: every .py file and every script."""
  found = []
  for top in SOURCE_DIRS:
    for dirpath, dirnames, filenames in os.walk(REPO_ROOT / top):
      dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
      if (pathlib.Path(dirpath) / "WORKSPACE").exists():      # a local repository (rule stand-ins)
        dirnames[:] = []
        continue
      for f in sorted(filenames):
        path = pathlib.Path(dirpath) / f
        if f.endswith((".py", ".sh")) or (os.access(path, os.X_OK) and "." not in f):
          found.append(str(path.relative_to(REPO_ROOT)))
  return found


def package_of(relpath: str) -> str:
  """The package owning a file: its nearest folder with a BUILD file."""
  d = pathlib.PurePosixPath(relpath).parent
  while str(d) != "." and build_file(REPO_ROOT / d) is None:
    d = d.parent
  return "" if str(d) == "." else str(d)


def packages() -> List[str]:
  found = [""] if build_file(REPO_ROOT) else []
  for top in SOURCE_DIRS:
    for dirpath, dirnames, _ in os.walk(REPO_ROOT / top):
      dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
      if (pathlib.Path(dirpath) / "WORKSPACE").exists():
        dirnames[:] = []
        continue
      if build_file(pathlib.Path(dirpath)):
        found.append(str(pathlib.Path(dirpath).relative_to(REPO_ROOT)))
  return found


def all_targets() -> List[Target]:
  return [t for p in packages() for t in read_build(p)]


def file_of_label(package: str, label: str) -> Optional[str]:
  """The repo-relative path a file label names (None for a rule label)."""
  if label.startswith("@"):
    return None
  if label.startswith("//"):
    pkg, _, name = label[2:].partition(":")
    if not name:
      return None
  else:
    pkg, name = package, label.lstrip(":")
  return f"{pkg}/{name}" if pkg else name


def normalize(package: str, label: str) -> str:
  """`:x` -> `//package:x`, `//a/b` -> `//a/b:b`."""
  if label.startswith(":"):
    return f"//{package}{label}"
  if label.startswith("//") and ":" not in label:
    return f"{label}:{label.rsplit('/', 1)[-1]}"
  return label


def owners(targets: Sequence[Target]) -> Dict[str, Target]:
  """Repo-relative .py path -> the Python target listing it in srcs."""
  owned = {}
  for kind in ("podlab_py_library", "podlab_py_binary", "podlab_py_test"):   # libraries first
    for t in targets:
      if t.kind == kind:
        for s in t.srcs:
          path = file_of_label(t.package, s)
          if path and path.endswith(".py"):
            owned.setdefault(path, t)
  return owned


def _lazy_import(node: ast.AST) -> Optional[str]:
  """The module of a `lazy_import.module("name")` call (experiments/common/lazy_import.py): an
  import that runs on first use, a dependency all the same."""
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
      and node.func.attr == "module" and isinstance(node.func.value, ast.Name)
      and node.func.value.id == "lazy_import" and node.args
      and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
    return node.args[0].value
  return None


def project_imports(relpath: str) -> Set[str]:
  """Repo-relative paths of the project modules a file imports (and the packages on the way)."""
  tree = ast.parse((REPO_ROOT / relpath).read_text(), relpath)
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [(a.name, None) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names += [(node.module, a.name) for a in node.names]
    elif _lazy_import(node):
      names.append((_lazy_import(node), None))
  found = set()
  folder = pathlib.PurePosixPath(relpath).parent
  for module, attr in names:
    parts = module.split(".")
    sibling = folder / f"{parts[0]}.py"      # `import x` of tests/x.py (pytest puts tests/ on the path)
    if not (REPO_ROOT / folder / "__init__.py").exists() and (REPO_ROOT / sibling).is_file():
      found.add(str(sibling))
      continue
    if parts[0] not in PROJECT_PACKAGES:
      continue
    candidates = [parts + [attr]] if attr else []
    candidates.append(parts)
    for c in candidates:
      base = "/".join(c)
      hit = next((p for p in (f"{base}.py", f"{base}/__init__.py") if (REPO_ROOT / p).is_file()),
                 None)
      if hit:
        found.add(hit)
        break
  return found


def required_deps(relpath: str) -> Set[str]:
  """Files whose owners a target with `relpath` in srcs must depend on: what it imports, and the
  __init__.py of its own package (the parent's, for an __init__.py)."""
  need = project_imports(relpath)
  folder = pathlib.PurePosixPath(relpath).parent
  if relpath.endswith("__init__.py"):
    folder = folder.parent
  init = f"{folder}/__init__.py"
  if str(folder) != "." and (REPO_ROOT / init).is_file():
    need.add(init)
  need.discard(relpath)
  return need


def third_party_imports(relpath: str) -> List[str]:
  """pip distributions a file imports (standard library and project modules excluded)."""
  tree = ast.parse((REPO_ROOT / relpath).read_text(), relpath)
  tops = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      tops.update(a.name.split(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      tops.add(node.module.split(".")[0])
    elif _lazy_import(node):
      tops.add(_lazy_import(node).split(".")[0])
  tops -= set(sys.stdlib_module_names) | set(PROJECT_PACKAGES) | {"__future__"}
  return sorted({PIP_NAMES.get(t, t.replace("_", "-")) for t in tops})


def relative_label(package: str, target: Target) -> str:
  if target.package == package:
    return f":{target.name}"
  if target.name == target.package.rsplit("/", 1)[-1]:
    return f"//{target.package}"
  return target.label


def has_slow_marker(relpath: str) -> bool:
  """Whether the file uses `pytest.mark.slow` (as a decorator, in pytestmark or in a param)."""
  tree = ast.parse((REPO_ROOT / relpath).read_text(), relpath)
  return any(isinstance(n, ast.Attribute) and n.attr == "slow" and isinstance(n.value, ast.Attribute)
             and n.value.attr == "mark" for n in ast.walk(tree))


def intended_package(relpath: str) -> str:
  """The package a file should be in: its own folder when that is a Python package."""
  folder = pathlib.PurePosixPath(relpath).parent
  return str(folder) if (REPO_ROOT / folder / "__init__.py").is_file() else package_of(relpath)


def intended_label(package: str, relpath: str) -> str:
  """The label a file's stanza gets, relative to `package`."""
  pkg = intended_package(relpath)
  p = pathlib.PurePosixPath(relpath)
  name = p.parent.name if p.name == "__init__.py" else p.stem
  if pkg == package:
    return f":{name}"
  return f"//{pkg}" if name == pkg.rsplit("/", 1)[-1] else f"//{pkg}:{name}"


def stanza(relpath: str, targets: Optional[Sequence[Target]] = None) -> str:
  """The BUILD stanza that would own `relpath` (deps from its imports, pip deps as comments)."""
  targets = all_targets() if targets is None else targets
  owned = owners(targets)
  package = intended_package(relpath)
  name_in_pkg = str(pathlib.PurePosixPath(relpath).relative_to(package)) if package else relpath
  stem = pathlib.PurePosixPath(relpath).stem
  is_test = relpath.startswith("tests/test_") and relpath.endswith(".py")
  if stem == "__init__":
    stem = pathlib.PurePosixPath(relpath).parent.name
  deps = []
  for need in sorted(required_deps(relpath)):
    owner = owned.get(need)
    deps.append(f'"{relative_label(package, owner) if owner else intended_label(package, need)}",')
  deps = sorted(set(deps), key=lambda d: (d.startswith('"//'), d))   # ":local" first
  deps += [f"# pip: {p}" for p in third_party_imports(relpath)]
  lines = [f'{"podlab_py_test" if is_test else "podlab_py_library"}(',
           f'    name = "{stem}",', f'    srcs = ["{name_in_pkg}"],']
  if is_test and has_slow_marker(relpath):
    lines.append("    slow = True,")
  lines += ["    deps = ["] + [f"        {d}" for d in deps] + ["    ],", ")"]
  where = build_file(REPO_ROOT / package)
  where = where.relative_to(REPO_ROOT) if where else f"{package}/BUILD (a new file)"
  return f'# in {where}, which loads "{MACROS}"\n' + "\n".join(lines)


# ---------------------------------------------------------------------------------------------------


def test_every_python_package_has_a_build_file():
  missing = []
  for top in SOURCE_DIRS:
    for init in sorted((REPO_ROOT / top).rglob("__init__.py")):
      if not any(p in SKIP_DIRS for p in init.parts) and build_file(init.parent) is None:
        missing.append(str(init.parent.relative_to(REPO_ROOT)))
  assert not missing, ("Python packages without a BUILD file (create one per package, see "
                       f"modules/BUILD): {missing}")


def test_every_source_file_is_listed_by_a_target():
  targets = all_targets()
  listed = set()
  for t in targets:
    for label in t.srcs + t.data:
      path = file_of_label(t.package, label)
      if path:
        listed.add(path)
  missing = [f for f in source_files() if f not in listed]
  assert not missing, ("files with no BUILD target (add them, e.g.):\n\n"
                       + "\n\n".join(stanza(f, targets) if f.endswith(".py") else
                                     f"# {f}: list it in srcs or data of a target in "
                                     f"{package_of(f) or '//'}/BUILD" for f in missing))


def test_every_listed_file_exists():
  bad = []
  for t in all_targets():
    for label in t.srcs + t.data:
      path = file_of_label(t.package, label)
      if path and not (REPO_ROOT / path).exists():
        pkg = label[2:].partition(":")[0] if label.startswith("//") else t.package
        name = label.rpartition(":")[2]
        if not any(x.name == name for x in read_build(pkg)):     # nor a rule of that package
          bad.append(f"{t.label} lists {label!r}, but {path} does not exist")
  assert not bad, "targets list missing files (remove or rename them):\n" + "\n".join(bad)


def test_every_dep_names_a_target():
  targets = all_targets()
  labels = {t.label for t in targets}
  bad = [f"{t.label} depends on {d!r}, which no BUILD file defines"
         for t in targets for d in t.deps
         if not d.startswith("@") and normalize(t.package, d) not in labels]
  assert not bad, "deps on targets that do not exist (fix or remove them):\n" + "\n".join(bad)


def test_every_test_file_has_its_own_test_target():
  targets = all_targets()
  tests = {(t.package, t.name): t for t in targets if t.kind == "podlab_py_test"}
  problems = []
  for f in source_files():
    p = pathlib.PurePosixPath(f)
    if not (p.parts[0] == "tests" and p.name.startswith("test_") and p.suffix == ".py"):
      continue
    t = tests.get((package_of(f), p.stem))
    if t is None:
      problems.append(f"{f} has no podlab_py_test named {p.stem!r}:\n{stanza(f, targets)}")
    elif t.slow != has_slow_marker(f):
      problems.append(f"{t.label}: slow = {t.slow}, but {f} "
                      f"{'has' if has_slow_marker(f) else 'has no'} @pytest.mark.slow tests; "
                      f"set slow = {has_slow_marker(f)}")
  assert not problems, "\n\n".join(problems)


def test_targets_depend_on_the_project_modules_they_import():
  targets = all_targets()
  owned = owners(targets)
  problems = []
  for t in targets:
    if not t.kind.startswith("podlab_py_"):
      continue
    deps = {normalize(t.package, d) for d in t.deps}
    srcs = [file_of_label(t.package, s) for s in t.srcs]
    for src in srcs:
      if not src or not src.endswith(".py") or not (REPO_ROOT / src).is_file():
        continue
      if src in owned and owned[src].label in deps:     # a binary over its library
        continue
      for need in sorted(required_deps(src)):
        owner = owned.get(need)
        if owner is None:
          problems.append(f"{t.label}: {src} imports {need}, which no target lists in srcs")
        elif owner.label != t.label and owner.label not in deps:
          problems.append(f"{t.label}: {src} imports {need}; add "
                          f'"{relative_label(t.package, owner)}" to its deps')
  assert not problems, "\n".join(sorted(set(problems)))


def test_the_drift_checks_catch_a_missing_and_an_extra_file(tmp_path, monkeypatch):
  """The checks above on a tiny fake tree: an unlisted module and a listed file that is gone."""
  (tmp_path / "modules").mkdir()
  (tmp_path / "modules" / "__init__.py").write_text("")
  (tmp_path / "modules" / "a.py").write_text("import numpy\n")
  (tmp_path / "modules" / "b.py").write_text("from modules import a\n")
  (tmp_path / "modules" / "BUILD").write_text(
      'podlab_py_library(name = "modules", srcs = ["__init__.py"])\n'
      'podlab_py_library(name = "a", srcs = ["a.py", "gone.py"], deps = [":modules"])\n')
  monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
  assert REPO_ROOT == tmp_path
  targets = all_targets()
  assert [t.label for t in targets] == ["//modules:modules", "//modules:a"]
  assert source_files() == ["modules/__init__.py", "modules/a.py", "modules/b.py"]
  assert required_deps("modules/b.py") == {"modules/a.py", "modules/__init__.py"}
  text = stanza("modules/b.py", targets)
  assert 'name = "b"' in text and '":a",' in text and '":modules",' in text
  assert third_party_imports("modules/a.py") == ["numpy"]
  with pytest.raises(AssertionError, match="modules/b.py"):
    test_every_source_file_is_listed_by_a_target()
  with pytest.raises(AssertionError, match="gone.py"):
    test_every_listed_file_exists()


def find_cycle(targets: Sequence[Target]) -> Optional[List[str]]:
  """A dependency cycle among `targets` as labels, first label repeated at the end (or None).

  Edges are `deps` and the `data` entries that name a rule; a label no target defines (a pip
  comment, an external `@repo`, a plain file) ends a path. Depth-first, in BUILD-file order, so
  the same graph always reports the same cycle.
  """
  by_label = {t.label: t for t in targets}
  edges: Dict[str, List[str]] = {}
  for t in targets:
    if not t.name:
      continue
    out = []
    for d in t.deps + t.data:
      if d.startswith("@"):
        continue
      label = normalize(t.package, d)
      if label in by_label and label not in out:
        out.append(label)
    edges[t.label] = out
  state: Dict[str, int] = {}            # 1: on the current path, 2: done
  path: List[str] = []

  def visit(label: str) -> Optional[List[str]]:
    state[label] = 1
    path.append(label)
    for nxt in edges.get(label, ()):
      if state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    path.pop()
    state[label] = 2
    return None

  for label in edges:
    if label not in state:
      found = visit(label)
      if found:
        return found
  return None


def cycle_message(cycle: Sequence[str]) -> str:
  """One line naming a cycle as Bazel's analysis does: `cycle in dependency graph: //a -> //b -> //a`."""
  return "cycle in dependency graph: " + " -> ".join(cycle)


def test_the_build_graph_has_no_cycle():
  """Bazel refuses a cyclic graph before it runs any test; this finds the cycle without Bazel. The
  usual cause: a package `__init__.py` that imports its own modules, which (as every module of a
  package does) depend on that `__init__.py`. Fix the imports: keep `__init__.py` import-free."""
  cycle = find_cycle(all_targets())
  assert cycle is None, cycle_message(cycle)


def test_a_cycle_between_two_build_files_is_named(tmp_path, monkeypatch):
  """The cycle check on a temporary tree of two BUILD files whose targets depend on each other."""
  for pkg in ("a", "b"):
    (tmp_path / "modules" / pkg).mkdir(parents=True)
  (tmp_path / "modules" / "a" / "BUILD").write_text(
      'podlab_py_library(name = "x", srcs = ["x.py"], deps = ["//modules/b:y", "# pip: numpy"])\n'
      'podlab_py_library(name = "free", srcs = ["free.py"])\n')
  (tmp_path / "modules" / "b" / "BUILD").write_text(
      'podlab_py_library(name = "y", srcs = ["y.py"], deps = [":z"])\n'
      'podlab_py_library(name = "z", srcs = ["z.py"], deps = ["//modules/a:x", "//modules/a:free"])\n')
  monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
  with pytest.raises(AssertionError) as raised:
    test_the_build_graph_has_no_cycle()
  assert str(raised.value).splitlines()[0] == (
      "cycle in dependency graph: //modules/a:x -> //modules/b:y -> //modules/b:z -> //modules/a:x")
  # Cut the edge back to a: the same check passes.
  (tmp_path / "modules" / "b" / "BUILD").write_text(
      'podlab_py_library(name = "y", srcs = ["y.py"], deps = [":z"])\n'
      'podlab_py_library(name = "z", srcs = ["z.py"], deps = ["//modules/a:free"])\n')
  test_the_build_graph_has_no_cycle()


# ---------------------------------------------------------------------------------------------------
# Rewriting the BUILD files from the sources (`python tests/test_build_files.py --fix`).

_RULE_START = ("podlab_py_library(", "podlab_py_test(", "podlab_py_binary(", "filegroup(",
               "exports_files(", "sh_binary(", "podlab_sh_binary(")


def _blocks(text: str):
  """(header lines before the first rule, [rule blocks as text]) of a BUILD file."""
  lines = text.splitlines()
  header, blocks, current = [], [], None
  for line in lines:
    if current is None and not line.startswith(_RULE_START):
      if blocks:
        continue
      header.append(line)
      continue
    if line.startswith(_RULE_START):
      current = [line]
      blocks.append(current)
    elif current is not None:
      current.append(line)
      if line == ")":
        current = None
  return header, ["\n".join(b).strip() for b in blocks]


def _field(block: str, name: str) -> Optional[str]:
  """The text of `    name = [...],` (a list field) in a rule block, or None."""
  lines = block.splitlines()
  for i, line in enumerate(lines):
    if line.startswith(f"    {name} = ["):
      if line.rstrip().endswith("],"):
        return line
      for j in range(i + 1, len(lines)):
        if lines[j].startswith("    ],"):
          return "\n".join(lines[i:j + 1])
  return None


def fix_build_files() -> List[str]:
  """Rewrites every package's library and test stanzas from the sources (deps from the imports,
  plus the old deps that still name a target; `data` fields and other rules kept; rules listing
  files that no longer exist dropped). Returns the BUILD files it changed. Binaries and other
  rules are kept as they are when their files exist."""
  changed = []
  for package in packages():
    if not package.startswith(PROJECT_PACKAGES):
      continue
    directory = REPO_ROOT / package
    path = build_file(directory) or directory / "BUILD"
    old_text = path.read_text() if path.is_file() else ""
    header, blocks = _blocks(old_text)
    old = {}
    keep = []
    for block in blocks:
      name_line = next((l for l in block.splitlines() if l.strip().startswith("name = ")), "")
      name = name_line.split('"')[1] if '"' in name_line else ""
      kind = block.split("(", 1)[0]
      srcs = [t for t in read_build_text(package, block) for t in t.srcs]
      missing = [s for s in srcs if not (directory / s).is_file() and not s.startswith(("//", ":"))]
      if kind in ("podlab_py_library", "podlab_py_test") and not any("/" in x for x in srcs):
        old[name] = block
      elif not missing:
        keep.append(block)          # binaries, data, and targets of files in sub-folders
    files = sorted(p.name for p in directory.glob("*.py") if p.is_file())
    files.sort(key=lambda f: (f != "__init__.py", f.startswith("test_"), f))
    stanzas = []
    targets = all_targets()
    if package.endswith("/configs"):     # config files load by path: one target bundles them all
      stanzas.append(_bundle_stanza(package, files, targets))
      files = []
    for name in files:
      rel = f"{package}/{name}" if package else name
      body = stanza(rel, targets).split("\n", 1)[1]
      stem = body.split('"')[1]
      body = _keep_old_deps(body, old.get(stem, ""), package, targets)
      data = _field(old.get(stem, ""), "data")
      if data:
        body = body[:-1] + data + "\n)"
      stanzas.append(body)
    if not header:
      header = [f"# {package}: podlab_py_* targets of its modules.",
                f'load("{MACROS}", "podlab_py_library")']
    kinds = sorted({b.split("(", 1)[0] for b in stanzas + keep if b.startswith("podlab_py_")})
    header = [l for l in header if not l.startswith("load(")]
    while header and not header[-1].strip():
      header.pop()
    header.append(f'load("{MACROS}", ' + ", ".join(f'"{k}"' for k in kinds) + ")")
    text = "\n".join(header) + "\n\n" + "\n\n".join(stanzas + keep) + "\n"
    if text != old_text:
      path.write_text(text)
      changed.append(str(path.relative_to(REPO_ROOT)))
  return changed


def _keep_old_deps(body: str, old_block: str, package: str, targets: Sequence[Target]) -> str:
  """`body` (a stanza from the imports) plus the deps of `old_block` that still name a target:
  deps no import shows (a module a test runs as `python -m`, or imports by a string) stay."""
  if not old_block:
    return body
  labels = {t.label for t in targets}
  have = {normalize(package, d) for t in read_build_text(package, body) for d in t.deps}
  extra = [d for t in read_build_text(package, old_block) for d in t.deps
           if not d.startswith("@") and normalize(package, d) in labels
           and normalize(package, d) not in have]
  if not extra:
    return body
  lines = body.splitlines()
  start = lines.index("    deps = [")
  end = lines.index("    ],", start)
  deps = [l for l in lines[start + 1:end] if not l.strip().startswith("#")]
  pips = [l for l in lines[start + 1:end] if l.strip().startswith("#")]
  deps = sorted(set(deps) | {f'        "{d}",' for d in extra},
                key=lambda d: (d.strip().startswith('"//'), d.strip()))
  return "\n".join(lines[:start + 1] + deps + pips + lines[end:])


def _bundle_stanza(package: str, files: Sequence[str], targets: Sequence[Target]) -> str:
  """One library of all `files` of a package (its name: the package's), deps of all of them."""
  owned = owners(targets)
  own = {f"{package}/{f}" for f in files}
  need, pips = set(), set()
  for f in files:
    need |= required_deps(f"{package}/{f}")
    pips |= set(third_party_imports(f"{package}/{f}"))
  deps = set()
  for n in need - own:
    owner = owned.get(n)
    deps.add(f'"{relative_label(package, owner) if owner else intended_label(package, n)}",')
  deps = sorted(deps, key=lambda d: (d.startswith('"//'), d)) + [f"# pip: {p}" for p in sorted(pips)]
  name = package.rsplit("/", 1)[-1]
  lines = ["podlab_py_library(", f'    name = "{name}",', "    srcs = ["]
  lines += [f'        "{f}",' for f in files] + ["    ],", "    deps = ["]
  lines += [f"        {d}" for d in deps] + ["    ],", ")"]
  return "\n".join(lines)


def read_build_text(package: str, text: str) -> List[Target]:
  """The targets of a piece of BUILD text (see read_build)."""
  targets: List[Target] = []

  def rule(kind):
    def record(name="", srcs=(), deps=(), data=(), slow=False, **unused):
      del unused
      targets.append(Target(package, kind, name, list(srcs), list(deps), list(data), slow))
    return record

  scope = {name: rule(name) for name in ("podlab_py_library", "podlab_py_binary", "podlab_py_test",
                                         "filegroup", "sh_binary", "podlab_sh_binary",
                                         "exports_files")}
  scope["glob"] = lambda patterns, **unused: []
  exec(compile(text, f"{package}/BUILD", "exec"), scope)  # pylint: disable=exec-used
  return targets


if __name__ == "__main__":
  if sys.argv[1:] == ["--fix"]:
    for changed in fix_build_files():
      print(f"rewrote {changed}")
  else:
    for arg in sys.argv[1:]:
      print(stanza(arg), end="\n\n")
