"""A worker's Python environment: `worker.sh setup` (the pinned stack in a venv, or a given
interpreter checked) and `worker.sh tpu-pin` (the libtpu that jax pins), with apt-get and root
access as a TPU VM offers them.
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from worker_common import Fail, HOST, parse_opts, say, warn
from worker_record import lock_acquire, lock_release

LIBTPU_FIND_LINKS = "https://storage.googleapis.com/jax-releases/libtpu_releases.html"
ACCEL_GLOB = os.environ.get("PODLAB_ACCEL_GLOB", "/dev/accel* /dev/vfio/[0-9]*")
DPKG_LOCK_TIMEOUT_S = int(os.environ.get("PODLAB_DPKG_LOCK_TIMEOUT_S", "600"))
DPKG_LOCK_POLL_S = float(os.environ.get("PODLAB_DPKG_LOCK_POLL_S", "10"))
SETUP_LOCK_TIMEOUT_S = int(os.environ.get("PODLAB_SETUP_LOCK_TIMEOUT_S", "3600"))
if "PODLAB_SUDO" in os.environ:
  SUDO = shlex.split(os.environ["PODLAB_SUDO"])
else:
  SUDO = [] if os.geteuid() == 0 else ["sudo", "-n"]


def as_root(args, **kwargs):
  return subprocess.run(SUDO + list(args), **kwargs)


def apt_get(args, out=sys.stdout):
  """`apt-get ARGS` as root; while another apt/dpkg holds the dpkg lock (unattended-upgrades on a
  fresh VM), waits up to PODLAB_DPKG_LOCK_TIMEOUT_S with a message instead of failing at once."""
  start, announced = time.monotonic(), False
  while True:
    proc = as_root(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", *args],
                   capture_output=True, text=True)
    if proc.returncode == 0:
      return 0
    text = proc.stdout + proc.stderr
    if re.search("Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock",
                 text):
      if time.monotonic() - start < DPKG_LOCK_TIMEOUT_S:
        if not announced:
          print("waiting for the dpkg lock: another apt/dpkg process holds it (on a fresh VM "
                "usually unattended-upgrades); waiting up to "
                f"{DPKG_LOCK_TIMEOUT_S} s (PODLAB_DPKG_LOCK_TIMEOUT_S)", file=out, flush=True)
          announced = True
        time.sleep(DPKG_LOCK_POLL_S)
        continue
      warn("\n".join(text.splitlines()[-5:]))
      warn(f"worker.sh: the dpkg lock was still held after {DPKG_LOCK_TIMEOUT_S} s "
           f"(PODLAB_DPKG_LOCK_TIMEOUT_S); see `ps aux | grep -E 'apt|dpkg'` on {HOST}")
      return proc.returncode
    warn("\n".join(text.splitlines()[-20:]))
    return proc.returncode


def find_python311():
  for p in ("python3.11", "/usr/bin/python3.11", "/usr/local/bin/python3.11"):
    found = shutil.which(p)
    if found:
      return found
  return None


# Run by the interpreter being checked: the libtpu constraint jax's metadata declares for its `tpu`
# extra, printed as a requirement (`libtpu==0.0.42.*`).
TPU_PIN = r"""
import re, sys
from importlib import metadata
try:
  requires = metadata.requires("jax") or []
except metadata.PackageNotFoundError:
  sys.exit(f"{sys.executable} has no jax installed; cannot read its libtpu pin")
for r in requires:
  req, _, marker = r.partition(";")
  m = re.match(r"\s*(libtpu(?:-nightly)?)\s*(\[[^\]]*\])?\s*(.*)$", req)
  if m and re.search(r'''extra\s*==\s*['"]tpu['"]''', marker):
    print(m.group(1) + m.group(3).strip().replace(" ", ""))
    sys.exit(0)
sys.exit(f"jax {metadata.version('jax')} declares no libtpu requirement for its tpu extra")
"""

# Run by the interpreter being checked: the versions constraints.txt pins for the packages
# pyproject.toml depends on (and with `tpu`, libtpu at jax's pin); names every mismatch.
CHECK_PINS = r"""
import re, sys, tomllib
from importlib import metadata
constraints, pyproject, tpu = sys.argv[1], sys.argv[2], sys.argv[3] == "tpu"
pins = {}
for line in open(constraints):
  m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line.strip())
  if m:
    pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
deps = tomllib.load(open(pyproject, "rb"))["project"]["dependencies"]
names = [re.sub(r"[-_.]+", "-", re.match(r"^[A-Za-z0-9_.\-]+", d).group(0)).lower() for d in deps]

def have(name):
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None

def satisfies(version, spec):
  for clause in filter(None, spec.split(",")):
    op, want = re.match(r"(==|!=|>=|<=|~=|>|<)?(.*)", clause).groups()
    if op in (None, "=="):
      ok = (version == want[:-2] or version.startswith(want[:-1])) if want.endswith(".*") \
          else version == want
    elif op == "!=":
      ok = not (version.startswith(want[:-1]) if want.endswith(".*") else version == want)
    else:
      try:
        from packaging.specifiers import SpecifierSet
      except ImportError:
        from pip._vendor.packaging.specifiers import SpecifierSet
      ok = version in SpecifierSet(clause)
    if not ok:
      return False
  return True

bad = []
for name in names:
  want = pins.get(name)
  if want is not None and have(name) != want:
    bad.append(f"{name}: installed {have(name) or 'nothing'}, pinned {want}")
checked = len(names)
if tpu:
  spec = None
  for r in metadata.requires("jax") or []:
    req, _, marker = r.partition(";")
    m = re.match(r"\s*libtpu\s*(.*)$", req)
    if m and re.search(r'''extra\s*==\s*['"]tpu['"]''', marker):
      spec = m.group(1).replace(" ", "")
  if spec is None:
    bad.append(f"jax {have('jax')} declares no libtpu pin for jax[tpu]")
  else:
    libtpu = have("libtpu")
    if libtpu is None or not satisfies(libtpu, spec):
      bad.append(f"libtpu: installed {libtpu or 'nothing'}, jax {have('jax')} pins libtpu{spec}")
    checked += 1
if bad:
  sys.exit(f"{sys.executable} does not have the pinned stack:\n  " + "\n  ".join(bad)
           + "\nFix: pip install -c constraints.txt -e . (on TPU also the libtpu above) with that "
             "interpreter, or drop --python so that launch/worker.sh setup creates the "
             "environment.")
extra = f", libtpu {have('libtpu')}" if tpu else ""
print(f"pinned stack present in {sys.executable} ({checked} packages checked{extra})")
"""


def check_pins(repo, python, tpu):
  rc = subprocess.run([python, "-c", CHECK_PINS, os.path.join(repo, "constraints.txt"),
                       os.path.join(repo, "pyproject.toml"), "tpu" if tpu else ""]).returncode
  if rc:
    raise Fail("", 2)


def accel_devices():
  return [d for pattern in ACCEL_GLOB.split() for d in sorted(glob.glob(pattern))
          if os.path.exists(d)]


def setup(repo, args):
  python = venv = jax = None
  venv = os.path.join(os.path.expanduser("~"), "podlab-venv")
  opts = parse_opts(args, {"--python": 1, "--venv": 1, "--jax": 1}, "setup")
  python, venv, jax = opts.get("--python"), opts.get("--venv", venv), opts.get("--jax")
  jax = jax or ("tpu" if accel_devices() else "cpu")
  if jax not in ("tpu", "cpu"):
    raise Fail(f"setup: --jax '{jax}' must be tpu or cpu")
  if python:
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
      raise Fail(f"setup: --python '{python}' is not an executable interpreter on {HOST}")
    check_pins(repo, python, jax == "tpu")
    say(f"PODLAB_PYTHON={python}")
    return 0
  # One setup of a venv at a time: a dropped prepare, re-run while the first still installs, waits
  # for it (and then finds the venv current) instead of running a second pip into the same venv.
  lock = venv.rstrip("/") + ".setup.lock"
  try:
    os.makedirs(os.path.dirname(lock) or ".", exist_ok=True)
  except OSError as e:
    raise Fail(f"setup: cannot create the folder of {venv}: {e.strerror}") from e
  lock_acquire(lock, SETUP_LOCK_TIMEOUT_S, f"setting up {venv} (PODLAB_SETUP_LOCK_TIMEOUT_S)")
  try:
    import hashlib  # pylint: disable=g-import-not-at-top
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "constraints.txt"):
      with open(os.path.join(repo, name), "rb") as f:
        digest.update(f.read())
    stamp_want, stamp_file = f"{digest.hexdigest()[:16]}-{jax}", os.path.join(venv, ".podlab-stamp")
    venv_python = os.path.join(venv, "bin", "python")
    try:
      current = open(stamp_file).read().strip() == stamp_want
    except OSError:
      current = False
    if os.access(venv_python, os.X_OK) and current:
      say(f"environment {venv} is current ({stamp_want}); nothing to install")
      say(f"PODLAB_PYTHON={venv_python}")
      return 0
    base = find_python311()
    if base is None:
      # Ubuntu 22.04 (the TPU VM images) ships Python 3.10; its own archive (jammy-updates,
      # universe) has python3.11 and python3.11-venv: signed Ubuntu packages from the mirror the
      # VM already uses, no third-party PPA and no download outside apt (docs/pod.md).
      say("Python 3.11 not found; installing python3.11 and python3.11-venv from Ubuntu's archive "
          "with apt-get")
      if apt_get(["update", "-qq"]) or apt_get(["install", "-y", "-qq", "python3.11",
                                                "python3.11-venv"]):
        raise Fail(f"could not install Python 3.11 with apt-get on {HOST}. Fix: use a TPU VM image "
                   "that has it (e.g. tpu-ubuntu2204-base plus python3.11), or pass --python with "
                   "a 3.11 interpreter")
      base = find_python311()
      if base is None:
        raise Fail(f"python3.11 still missing after apt-get install on {HOST}")
    if (not os.access(venv_python, os.X_OK)
        and subprocess.run([base, "-m", "venv", venv]).returncode):
      raise Fail(f"could not create the venv {venv}")
    pip = [venv_python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if subprocess.run(pip + ["-U", "pip"]).returncode:
      raise Fail(f"pip upgrade failed in {venv}")
    constraints = os.path.join(repo, "constraints.txt")
    if jax == "tpu":
      # jax[tpu] at the pinned jax: its extra brings libtpu at exactly the version that jax
      # release pins (jax 0.10.2: libtpu==0.0.42.*), which check_pins then verifies. A `tpu`
      # extra in pyproject.toml, when the project declares one, is installed as well.
      pin = re.search(r"^jax==([^\s;#]+)", open(constraints).read(), re.M)
      if pin is None:
        raise Fail("constraints.txt pins no jax version (a line jax==X)")
      project = repo
      if re.search(r"^\s*tpu\s*=", open(os.path.join(repo, "pyproject.toml")).read(), re.M):
        project = repo + "[tpu]"
      if subprocess.run(pip + ["-c", constraints, "-e", project, f"jax[tpu]=={pin.group(1)}",
                               "-f", LIBTPU_FIND_LINKS]).returncode:
        raise Fail(f"installing the pinned stack with jax[tpu]=={pin.group(1)} failed (see pip's "
                   "output above)")
      versions = subprocess.run([venv_python, "-c", "from importlib import metadata as m; "
                                 "print('jax', m.version('jax'), 'libtpu', m.version('libtpu'))"],
                                capture_output=True, text=True).stdout.strip()
      pinned = subprocess.run([venv_python, "-c", TPU_PIN], capture_output=True, text=True)
      say(f"installed {versions} (jax[tpu] pins {pinned.stdout.strip()})")
    elif subprocess.run(pip + ["-c", constraints, "-e", repo]).returncode:
      raise Fail("installing the pinned stack failed")
    check_pins(repo, venv_python, jax == "tpu")
    with open(stamp_file, "w") as f:
      f.write(stamp_want + "\n")
    say(f"PODLAB_PYTHON={venv_python}")
    return 0
  finally:
    lock_release(lock)


def tpu_pin(args):
  python = parse_opts(args, {"--python": 1}, "tpu-pin").get("--python") or os.environ.get(
      "PYTHON", "python3")
  return 2 if subprocess.run([python, "-c", TPU_PIN]).returncode else 0
