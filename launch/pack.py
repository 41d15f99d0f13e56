"""Packs the code that launch/pod.sh ships to a slice's workers: what git tracks, as in the work tree.

  python3 launch/pack.py REPO --out podlab-code.tgz [--include PATH]... [--require PATH]...
  python3 launch/pack.py REPO [--include PATH]...          # no --out: checks and reports only

Shipped: every file git tracks (`git ls-files -c`, submodules' files included) with its content in
the work tree now (uncommitted edits included; tracked files deleted in the work tree left out), and
everything under each `--include PATH` (a file or a folder inside REPO, ignored or not) except what
the deny list names: `.git/` folders, environment files (`.env`, `*.env`) and key files (`id_rsa*`,
`id_dsa*`, `id_ecdsa*`, `id_ed25519*`, `*.pem`, `*.key`, `*.p12`, `*.pfx`, `.netrc`,
`.git-credentials`): under an included folder they are left out (and named), an --include naming
one is refused. Nothing else: an untracked `secret.env` or `id_rsa` in the checkout, a symlinked
`.venv`, `workdirs/` or `data/` stay here. Symlinks are stored as links, never followed; a link
whose target lies outside REPO is not shipped at all (named in the report), and a path that reaches
a file through a symlinked folder is refused. `--require PATH` (the module's file) must be among the
shipped files. Prints the commit, the tracked files modified and not committed (shipped as they are
in the work tree), what it ships that git does not track (each --include, with its file count and
size) and what it left out; a problem is one line on stderr (naming the path and the fix) and exit
2. Standard library only: it runs with any Python 3 on the launching machine.
"""
import argparse
import fnmatch
import os
import subprocess
import sys
import tarfile


DENY = (".git", ".env", "*.env", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key",
        "*.p12", "*.pfx", ".netrc", ".git-credentials")


def denied(rel: str):
  """The deny-list pattern a path (or one of its folders) matches, else None."""
  for part in rel.split(os.sep):
    for pattern in DENY:
      if fnmatch.fnmatch(part, pattern):
        return pattern
  return None


class PackError(Exception):
  """A path that cannot be shipped (the message names it and the fix)."""


def tracked_files(repo: str) -> list:
  """The paths git tracks in `repo` (relative, as git lists them)."""
  try:
    out = subprocess.run(["git", "-C", repo, "ls-files", "-z", "-c", "--recurse-submodules"],
                         capture_output=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    raise PackError(f"{repo} is not a git work tree ({e}): pod.sh ships the files git tracks. "
                    "Fix: launch from a git clone of podlab") from e
  return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def git_state(repo: str):
  """(the commit checked out or None, [the tracked files modified or deleted and not committed])."""
  head = subprocess.run(["git", "-C", repo, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                        text=True)
  status = subprocess.run(["git", "-C", repo, "status", "--porcelain", "-z",
                           "--untracked-files=no"], capture_output=True).stdout.decode("utf-8", "surrogateescape")
  changed = []
  entries = iter(status.split("\0"))
  for entry in entries:
    if len(entry) < 4:
      continue
    code, path = entry[:2], entry[3:]
    if "R" in code or "C" in code:
      next(entries, None)                  # a rename's source follows
    changed.append(path + (" (deleted)" if "D" in code else ""))
  return (head.stdout.strip() or None) if head.returncode == 0 else None, changed


def _inside(path: str, root: str) -> bool:
  return path == root or path.startswith(root + os.sep)


class Packer:
  """Collects the files to ship under `repo` (module doc)."""

  def __init__(self, repo: str):
    self.repo = os.path.abspath(repo)
    self.real = os.path.realpath(self.repo)
    self.files = {}          # relative path -> "tracked" | the --include it came with
    self.left_out = []       # (relative path, why)

  def _check_folders(self, rel: str) -> None:
    """Refuses a path whose folders are (or pass through) a symlink."""
    parent = os.path.dirname(rel)
    if parent and os.path.realpath(os.path.join(self.repo, parent)) != os.path.join(self.real, parent):
      raise PackError(f"{rel}: its folder {parent} is or passes through a symlink (to "
                      f"{os.path.realpath(os.path.join(self.repo, parent))}); pod.sh never follows "
                      "symlinks. Fix: ship the real folder, or remove the symlink")

  def _outside_link(self, rel: str):
    """The target of `rel` when it is a symlink that resolves outside the repository, else None."""
    full = os.path.join(self.repo, rel)
    if not os.path.islink(full):
      return None
    target = os.path.realpath(full)
    return None if _inside(target, self.real) else target

  def _add(self, rel: str, origin: str) -> None:
    target = self._outside_link(rel)
    if target is not None:
      self.left_out.append((rel, f"a symlink to {target}, outside the repository"))
      return
    self.files.setdefault(rel, origin)

  def add_tracked(self) -> None:
    for rel in tracked_files(self.repo):
      full = os.path.join(self.repo, rel)
      if not os.path.lexists(full) or (os.path.isdir(full) and not os.path.islink(full)):
        continue               # deleted in the work tree; a submodule's folder (its files are listed)
      self._check_folders(rel)
      self._add(rel, "tracked")

  def add_include(self, path: str) -> None:
    full = os.path.abspath(os.path.join(self.repo, path))
    rel = os.path.relpath(full, self.repo)
    if not _inside(full, self.repo):
      raise PackError(f"--include {path}: not inside the repository {self.repo}; only the "
                      "repository's files are shipped. Fix: copy it into the repository, or give "
                      "the workers another way to read it (a gs:// bucket)")
    if not os.path.lexists(full):
      raise PackError(f"--include {path}: no such file or folder in {self.repo}. Fix: give a path "
                      "relative to the repository")
    pattern = denied(rel) if rel != "." else None
    if pattern is not None:
      raise PackError(f"--include {path}: never shipped ({pattern}: launch/pack.py's deny list of "
                      "git folders, environment and key files). Fix: give the workers the secret "
                      "another way (a secret manager, the VM's service account), or ship a file "
                      "without it")
    self._check_folders(rel)
    target = self._outside_link(rel)
    if target is not None:
      raise PackError(f"--include {path}: a symlink to {target}, outside the repository; pod.sh "
                      "never follows symlinks out of the repository. Fix: include the files "
                      "themselves (copied into the repository)")
    if os.path.isdir(full) and not os.path.islink(full):
      for folder, dirs, names in os.walk(full):     # never descends into symlinked folders
        dirs.sort()
        for d in [d for d in dirs if denied(d)]:
          dirs.remove(d)
          self.left_out.append((os.path.relpath(os.path.join(folder, d), self.repo),
                                f"never shipped: {denied(d)}, launch/pack.py's deny list"))
        for name in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
          item = os.path.relpath(os.path.join(folder, name), self.repo)
          if denied(name):
            self.left_out.append(
                (item, f"never shipped: {denied(name)}, launch/pack.py's deny list"))
          else:
            self._add(item, rel)
    else:
      self._add(rel, rel)

  def require(self, path: str) -> None:
    full = os.path.realpath(os.path.join(self.repo, path))
    rel = os.path.relpath(full, self.real)
    if not _inside(full, self.real):
      raise PackError(f"{path} is outside the repository {self.repo}: it would not reach the "
                      "workers. Fix: put it in the repository (tracked by git, or --include it)")
    if rel not in self.files:
      raise PackError(f"{rel} is not shipped: git does not track it. Fix: git add {rel}, or pass "
                      f"--include {rel}")

  def untracked(self) -> dict:
    """{--include path: (files, bytes)} of the shipped files git does not track."""
    out = {}
    for rel, origin in self.files.items():
      if origin != "tracked":
        n, size = out.get(origin, (0, 0))
        out[origin] = (n + 1, size + os.lstat(os.path.join(self.repo, rel)).st_size)
    return out

  def write(self, out: str) -> None:
    with tarfile.open(out, "w:gz") as tar:
      for rel in sorted(self.files):
        tar.add(os.path.join(self.repo, rel), arcname=rel, recursive=False)


def _size(n: int) -> str:
  for unit in ("B", "KB", "MB", "GB"):
    if n < 1024 or unit == "GB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
  return ""


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("repo")
  parser.add_argument("--out", help="the .tgz to write (default: check and report only)")
  parser.add_argument("--include", action="append", default=[], help="also ship this untracked path")
  parser.add_argument("--require", action="append", default=[], help="this path must be shipped")
  args = parser.parse_args(argv)
  packer = Packer(args.repo)
  try:
    packer.add_tracked()
    for path in args.include:
      packer.add_include(path)
    for path in args.require:
      packer.require(path)
    if args.out:
      packer.write(args.out)
  except PackError as e:
    print(e, file=sys.stderr)
    return 2
  untracked = packer.untracked()
  print(f"{len(packer.files)} files: those git tracks, as in the work tree"
        + (f", and {sum(n for n, _ in untracked.values())} it does not track" if untracked else ""))
  commit, changed = git_state(packer.repo)
  if changed:
    listed = ", ".join(changed[:20])
    if len(changed) > 20:
      listed += f" and {len(changed) - 20} more"
    print(f"  commit {commit or '(none yet)'}, with {len(changed)} tracked file"
          f"{'s' if len(changed) != 1 else ''} modified and not committed (shipped as in the work "
          f"tree): {listed}")
  else:
    print(f"  commit {commit or '(none yet)'}, no tracked file modified")
  for origin, (n, size) in sorted(untracked.items()):
    what = f"{n} file{'s' if n != 1 else ''}, {_size(size)}"
    print(f"  not tracked by git, shipped because of --include {origin}: {what}")
  for rel, why in packer.left_out:
    print(f"  not shipped: {rel} ({why})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
