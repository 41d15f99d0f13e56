#!/usr/bin/env bash
# One worker of a podlab run: set up its environment, start the run detached, follow, stop, report.
#
# launch/pod.sh runs this on every TPU VM worker (through `gcloud ... ssh --worker=all`) and
# launch/local.sh runs it once per local process, so a pod and a local pod share this code path.
#
#   launch/worker.sh setup [--python PATH] [--venv DIR] [--jax tpu|cpu]
#       Idempotent. Without --python: create DIR (default ~/podlab-venv) with Python 3.11 and install
#       the pinned stack (constraints.txt; on TPU jax[tpu], so libtpu at the version jax pins) unless
#       DIR's stamp says it is current. Python 3.11 missing (Ubuntu 22.04 TPU images ship 3.10):
#       `apt-get install python3.11 python3.11-venv` from Ubuntu's own archive, after waiting for the
#       dpkg lock. With --python: use that interpreter as is, only check the pinned versions.
#       Prints `PODLAB_PYTHON=<interpreter>` last.
#       One setup of a venv at a time (a lock, DIR.setup.lock): a second waits for the first.
#   launch/worker.sh prepare [--stop-others] [setup options]
#       Run from a freshly unpacked <dir>.new (launch/pod.sh): refuses while a podlab run is alive
#       here, else `clean [--stop-others]`, moves it to <dir> (the old copy to <dir>.old) and runs
#       `setup`; output prefixed `[worker <i>] `, then `PODLAB_WORKER_EXIT worker=<i> rc=<code>
#       phase=prepare`.
#   launch/worker.sh clean [--stop-others]
#       On a TPU VM: stops podlab's own stale processes that still hold a TPU device (found with
#       `lsof`, installed if missing: a recorded run's processes, by identity, or a process carrying
#       a recorded PODLAB_RUN_ID) and removes the libtpu lockfile, with sudo when not root. Other
#       holders are listed (user, pid, command) and make it fail (exit 2), leaving them and the
#       lockfile alone; --stop-others stops them too. Refuses while a podlab run is alive here.
#   launch/worker.sh run --run-id ID [--attempt A] --log-dir DIR [--detach] [--follow [--numbered]]
#                        [--from-line N | --from I:N,...] -- COMMAND [ARGS...]
#       Starts COMMAND (argv, never re-parsed by a shell) under a supervisor that appends its
#       stdout+stderr to DIR/worker-<i>.log (never truncated), records pid, run id and exit code in
#       $PODLAB_STATE_DIR (default ~/.podlab), and exports PODLAB_RUN_ID=ID, PODLAB_RUN_ATTEMPT=A.
#       --detach: the run gets its own session and process group, so it outlives this shell, its ssh
#       connection and its launcher. Idempotent: when run ID attempt A is alive here it attaches to it
#       (never a second process); when it already ended it reports its exit code (never reruns it);
#       another run alive here refuses, naming it (`PODLAB_WORKER_REFUSED ...`, exit 2).
#       Then (unless --detach without --follow) waits for the run like `attach`.
#   launch/worker.sh attach [--run-id ID [--attempt A]] [--follow [--numbered]] [--from-line N | --from I:N,...]
#       Waits for this worker's current run (or run ID attempt A) to end; --follow prints its log,
#       each line prefixed `[worker <i>] ` (--numbered: `[worker <i> <line number>] `) from line N+1
#       on; ends with `PODLAB_WORKER_EXIT worker=<i> rc=<exit code|lost> run=ID attempt=A log=<file>`
#       and exits with the run's exit code.
#   launch/worker.sh status
#       One line per recorded run here (running: its recorded supervisor or command is alive with the
#       recorded start time in this boot; lost: no exit code and neither is: a pid alone is never
#       trusted, nor signalled): `PODLAB_STATUS worker=<i> state=running|exited|lost|none
#       run=ID attempt=A pid=P rc=R step=S stopped=0|1 log=<file> last=<last log line>`.
#   launch/worker.sh logs [-f] [-n LINES] [--prefix]
#       The current run's log (-f: follow it until the run ends; --prefix: `[worker <i>] ` lines).
#   launch/worker.sh stop [--grace S] [--run-id ID] [--by-user]
#       Stops this machine's live podlab runs (or only run ID): SIGTERM to the run's process group
#       (the trainer saves a checkpoint and exits 143), SIGKILL after S seconds (default
#       $PODLAB_STOP_GRACE_S, else 10). --by-user records it, so that `pod.sh --watch` does not
#       relaunch a run its user stopped.
#   launch/worker.sh tpu-pin [--python PATH]
#       Prints the libtpu requirement that PATH's jax pins for jax[tpu], e.g. `libtpu==0.0.42.*`.
#
# The worker index <i> is $PODLAB_PROCESS_ID when set (local runs, tests), else the TPU VM's
# `agent-worker-number` from the metadata server, else the `-w-<i>` suffix of the hostname.
#
# Environment knobs: PODLAB_STATE_DIR, PODLAB_STOP_GRACE_S, PODLAB_DPKG_LOCK_TIMEOUT_S (default 600:
# how long apt-get waits for the dpkg lock), PODLAB_SETUP_LOCK_TIMEOUT_S (default 3600: how long a
# setup waits for another setup of the same venv), PODLAB_SUDO (the sudo command; default `sudo -n` when
# not root, none as root). Test hooks: PODLAB_ACCEL_GLOB (the TPU device files, default
# `/dev/accel* /dev/vfio/[0-9]*`), PODLAB_LIBTPU_LOCKFILE (/tmp/libtpu_lockfile), PODLAB_LSOF (lsof),
# PODLAB_DPKG_LOCK_POLL_S (10).
set -uo pipefail

STATE_DIR="${PODLAB_STATE_DIR:-$HOME/.podlab}"
STOP_GRACE_S="${PODLAB_STOP_GRACE_S:-10}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
SELF="$HERE/worker.sh"
METADATA_URL="http://metadata.google.internal/computeMetadata/v1/instance/attributes"
LIBTPU_FIND_LINKS="https://storage.googleapis.com/jax-releases/libtpu_releases.html"
ACCEL_GLOB="${PODLAB_ACCEL_GLOB:-/dev/accel* /dev/vfio/[0-9]*}"
LIBTPU_LOCKFILE="${PODLAB_LIBTPU_LOCKFILE:-/tmp/libtpu_lockfile}"
LSOF="${PODLAB_LSOF:-lsof}"
DPKG_LOCK_TIMEOUT_S="${PODLAB_DPKG_LOCK_TIMEOUT_S:-600}"
DPKG_LOCK_POLL_S="${PODLAB_DPKG_LOCK_POLL_S:-10}"
SETUP_LOCK_TIMEOUT_S="${PODLAB_SETUP_LOCK_TIMEOUT_S:-3600}"
if [[ -n "${PODLAB_SUDO+x}" ]]; then
  SUDO="$PODLAB_SUDO"
elif [[ "$(id -u)" == 0 ]]; then
  SUDO=""
else
  SUDO="sudo -n"
fi
RUN_ID_RE='^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'

die() { echo "worker.sh: error: $*" >&2; exit 2; }

worker_index() {
  if [[ -n "${PODLAB_PROCESS_ID:-}" ]]; then echo "$PODLAB_PROCESS_ID"; return; fi
  local n
  n="$(curl -sf -m 5 -H 'Metadata-Flavor: Google' "$METADATA_URL/agent-worker-number" 2>/dev/null)"
  if [[ "$n" =~ ^[0-9]+$ ]]; then echo "$n"; return; fi
  n="$(hostname)"
  if [[ "$n" =~ -w-([0-9]+)$ ]]; then echo "${BASH_REMATCH[1]}"; return; fi
  echo 0
}

# The TPU device files present here (none off TPU). ACCEL_GLOB is expanded unquoted on purpose.
accel_devices() {
  local d
  # shellcheck disable=SC2086
  for d in $ACCEL_GLOB; do [[ -e "$d" ]] && echo "$d"; done
  return 0
}
on_tpu_vm() { [[ -n "$(accel_devices)" ]]; }

# A command run as root: through $SUDO when not root ($SUDO is a command prefix, split on purpose).
as_root() {
  # shellcheck disable=SC2086
  $SUDO "$@"
}

# Runs `apt-get ARGS` as root; while another apt/dpkg holds the dpkg lock (unattended-upgrades on a
# fresh VM), waits up to PODLAB_DPKG_LOCK_TIMEOUT_S with a message instead of failing at once.
apt_get() {
  local start=$SECONDS out rc announced=0
  while :; do
    out="$(as_root env DEBIAN_FRONTEND=noninteractive apt-get "$@" 2>&1)"; rc=$?
    (( rc == 0 )) && return 0
    if grep -qE "Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock" <<<"$out"; then
      if (( SECONDS - start < DPKG_LOCK_TIMEOUT_S )); then
        if (( ! announced )); then
          echo "waiting for the dpkg lock: another apt/dpkg process holds it (on a fresh VM usually" \
               "unattended-upgrades); waiting up to ${DPKG_LOCK_TIMEOUT_S} s (PODLAB_DPKG_LOCK_TIMEOUT_S)"
          announced=1
        fi
        sleep "$DPKG_LOCK_POLL_S"
        continue
      fi
      printf '%s\n' "$out" | tail -n 5 >&2
      echo "worker.sh: the dpkg lock was still held after ${DPKG_LOCK_TIMEOUT_S} s" \
           "(PODLAB_DPKG_LOCK_TIMEOUT_S); see \`ps aux | grep -E 'apt|dpkg'\` on $(hostname)" >&2
      return "$rc"
    fi
    printf '%s\n' "$out" | tail -n 20 >&2
    return "$rc"
  done
}

# --------------------------------------------------------------------------------------------------
# setup

find_python311() {
  local p
  for p in python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11; do
    if command -v "$p" >/dev/null 2>&1; then command -v "$p"; return 0; fi
  done
  return 1
}

# The version constraint jax's metadata declares for libtpu under its `tpu` extra, printed as a
# requirement (`libtpu==0.0.42.*`): libtpu must be the one this jax was built and tested with.
tpu_pin() {
  "$1" - <<'EOF'
import re, sys
from importlib import metadata
try:
  requires = metadata.requires("jax") or []
except metadata.PackageNotFoundError:
  sys.exit(f"{sys.executable} has no jax installed; cannot read its libtpu pin")
for r in requires:
  req, _, marker = r.partition(";")
  m = re.match(r"\s*(libtpu(?:-nightly)?)\s*(\[[^\]]*\])?\s*(.*)$", req)
  if m and re.search(r"""extra\s*==\s*['"]tpu['"]""", marker):
    print(m.group(1) + m.group(3).strip().replace(" ", ""))
    sys.exit(0)
sys.exit(f"jax {metadata.version('jax')} declares no libtpu requirement for its tpu extra")
EOF
}

# Checks that PYTHON has the versions pinned in constraints.txt for the packages pyproject.toml
# depends on (and, with `tpu`, libtpu at jax's pin); names every mismatch.
check_pins() {
  local python="$1" tpu="${2:-}"
  "$python" - "$REPO/constraints.txt" "$REPO/pyproject.toml" "$tpu" <<'EOF'
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
  """`version` meets `spec` (comma-separated clauses; == and != with an optional .* wildcard)."""
  for clause in filter(None, spec.split(",")):
    op, want = re.match(r"(==|!=|>=|<=|~=|>|<)?(.*)", clause).groups()
    if op in (None, "=="):
      ok = (version == want[:-2] or version.startswith(want[:-1])) if want.endswith(".*") else version == want
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
    if m and re.search(r"""extra\s*==\s*['"]tpu['"]""", marker):
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
             "interpreter, or drop --python so that launch/worker.sh setup creates the environment.")
extra = f", libtpu {have('libtpu')}" if tpu else ""
print(f"pinned stack present in {sys.executable} ({checked} packages checked{extra})")
EOF
}

cmd_setup() {
  local python="" venv="$HOME/podlab-venv" jax=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --python) [[ $# -ge 2 ]] || die "setup: --python needs a value"; python="$2"; shift 2 ;;
      --python=*) python="${1#*=}"; shift ;;
      --venv) [[ $# -ge 2 ]] || die "setup: --venv needs a value"; venv="$2"; shift 2 ;;
      --venv=*) venv="${1#*=}"; shift ;;
      --jax) [[ $# -ge 2 ]] || die "setup: --jax needs a value"; jax="$2"; shift 2 ;;
      --jax=*) jax="${1#*=}"; shift ;;
      *) die "setup: unknown option '$1' (expected --python, --venv, --jax)" ;;
    esac
  done
  if [[ -z "$jax" ]]; then if on_tpu_vm; then jax=tpu; else jax=cpu; fi; fi
  [[ "$jax" == tpu || "$jax" == cpu ]] || die "setup: --jax '$jax' must be tpu or cpu"
  local tpu_flag=""
  [[ "$jax" == tpu ]] && tpu_flag=tpu
  if [[ -n "$python" ]]; then
    [[ -x "$python" ]] || die "setup: --python '$python' is not an executable interpreter on $(hostname)"
    check_pins "$python" "$tpu_flag" || exit 2
    echo "PODLAB_PYTHON=$python"
    return 0
  fi
  local stamp_want stamp_file="$venv/.podlab-stamp"
  # One setup of a venv at a time: a dropped prepare, re-run while the first still installs, waits
  # for it (and then finds the venv current) instead of running a second pip into the same venv.
  local setup_lock="${venv%/}.setup.lock"
  mkdir -p "$(dirname "$setup_lock")" || die "setup: cannot create the folder of $venv"
  lock_acquire "$setup_lock" "$SETUP_LOCK_TIMEOUT_S" "setting up $venv (PODLAB_SETUP_LOCK_TIMEOUT_S)"
  trap 'lock_release "$setup_lock"' EXIT
  stamp_want="$(cat "$REPO/pyproject.toml" "$REPO/constraints.txt" | sha256sum | cut -c1-16)-$jax"
  if [[ -x "$venv/bin/python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp_want" ]]; then
    lock_release "$setup_lock"
    echo "environment $venv is current ($stamp_want); nothing to install"
    echo "PODLAB_PYTHON=$venv/bin/python"
    return 0
  fi
  local base
  if ! base="$(find_python311)"; then
    # Ubuntu 22.04 (the TPU VM images) ships Python 3.10; its own archive (jammy-updates, universe)
    # has python3.11 and python3.11-venv: signed Ubuntu packages from the mirror the VM already
    # uses, no third-party PPA and no download outside apt (docs/pod.md).
    echo "Python 3.11 not found; installing python3.11 and python3.11-venv from Ubuntu's archive with apt-get"
    apt_get update -qq && apt_get install -y -qq python3.11 python3.11-venv \
      || die "could not install Python 3.11 with apt-get on $(hostname). Fix: use a TPU VM image that \
has it (e.g. tpu-ubuntu2204-base plus python3.11), or pass --python with a 3.11 interpreter"
    base="$(find_python311)" || die "python3.11 still missing after apt-get install on $(hostname)"
  fi
  [[ -x "$venv/bin/python" ]] || "$base" -m venv "$venv" || die "could not create the venv $venv"
  local pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" -U pip || die "pip upgrade failed in $venv"
  if [[ "$jax" == tpu ]]; then
    # jax[tpu] at the pinned jax: its extra brings libtpu at exactly the version that jax release
    # pins (jax 0.10.2: libtpu==0.0.42.*), which check_pins then verifies from jax's metadata.
    # A `tpu` extra in pyproject.toml, when the project declares one, is installed as well.
    local jax_pin project="$REPO"
    jax_pin="$(sed -n 's/^jax==\([^[:space:];#]*\).*/\1/p' "$REPO/constraints.txt")"
    [[ -n "$jax_pin" ]] || die "constraints.txt pins no jax version (a line jax==X)"
    grep -qE '^[[:space:]]*tpu[[:space:]]*=' "$REPO/pyproject.toml" && project="$REPO[tpu]"
    "${pip[@]}" -c "$REPO/constraints.txt" -e "$project" "jax[tpu]==$jax_pin" -f "$LIBTPU_FIND_LINKS" \
      || die "installing the pinned stack with jax[tpu]==$jax_pin failed (see pip's output above)"
    echo "installed $("$venv/bin/python" -c 'from importlib import metadata as m; print("jax", m.version("jax"), "libtpu", m.version("libtpu"))')" \
         "(jax[tpu] pins $(tpu_pin "$venv/bin/python"))"
  else
    "${pip[@]}" -c "$REPO/constraints.txt" -e "$REPO" || die "installing the pinned stack failed"
  fi
  check_pins "$venv/bin/python" "$tpu_flag" || exit 2
  echo "$stamp_want" > "$stamp_file"
  lock_release "$setup_lock"
  echo "PODLAB_PYTHON=$venv/bin/python"
}

cmd_tpu_pin() {
  local python="${PYTHON:-python3}"
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --python) [[ $# -ge 2 ]] || die "tpu-pin: --python needs a value"; python="$2"; shift 2 ;;
      --python=*) python="${1#*=}"; shift ;;
      *) die "tpu-pin: unknown option '$1' (expected --python)" ;;
    esac
  done
  tpu_pin "$python" || exit 2
}

# --------------------------------------------------------------------------------------------------
# Run records: $STATE_DIR/worker-<i>.run, `key=value` lines written atomically (temp + mv):
#   run_id, attempt, pid (the supervisor; with --detach also the process group and session id) and
#   pid_start (its start time), cmd_pid and cmd_start (COMMAND's), boot_id, detached (0/1), log,
#   started (epoch s), host; once ended: rc, and stopped_by_user=1 when `stop --by-user` ended it.
# $STATE_DIR/worker-<i>.pid holds COMMAND's pid while it runs (for tools that signal it directly).

state_get() {  # FILE KEY
  local line
  [[ -f "$1" ]] || return 1
  while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" == "$2="* ]]; then printf '%s\n' "${line#*=}"; return 0; fi
  done < "$1"
  return 1
}

state_set() {  # FILE KEY VALUE: rewrite FILE with KEY=VALUE (atomic)
  local f="$1" key="$2" value="$3" tmp line
  tmp="$f.tmp.$$"
  {
    if [[ -f "$f" ]]; then
      while IFS= read -r line || [[ -n "$line" ]]; do
        [[ "$line" == "$key="* ]] || printf '%s\n' "$line"
      done < "$f"
    fi
    printf '%s=%s\n' "$key" "$value"
  } > "$tmp" && mv -f "$tmp" "$f"
}

run_worker_of() { local b="${1##*/worker-}"; echo "${b%.run}"; }  # FILE -> worker index

# A process' identity is its pid, its start time and the boot it runs in: a pid alone is reused
# (after a hard kill, an OOM-killed supervisor, a reboot that keeps the disk), and a reused pid must
# never make a run look alive, nor get a signal meant for it.

# The id of this boot: Linux's boot_id, else the boot time (sysctl kern.boottime: BSD, macOS).
boot_id() {
  if [[ -r /proc/sys/kernel/random/boot_id ]]; then cat /proc/sys/kernel/random/boot_id
  else sysctl -n kern.boottime 2>/dev/null | tr -d ' '; fi
}
BOOT_ID="$(boot_id)"

# PID's start time (Linux: field 22 of /proc/PID/stat, clock ticks since boot; else `ps -o lstart`);
# nothing (status 1) when there is no such process, or only its zombie.
proc_start() {
  local s f
  [[ "$1" =~ ^[0-9]+$ ]] || return 1
  if [[ -d /proc/self ]]; then
    s="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    s="${s##*) }"                       # after the command name, which may hold spaces and ')'
    read -r -a f <<<"$s"
    [[ -n "${f[19]:-}" && "${f[0]}" != Z ]] || return 1      # a zombie has ended
    echo "${f[19]}"
  else
    s="$(ps -o lstart= -p "$1" 2>/dev/null | tr -s ' ')" && [[ -n "$s" ]] || return 1
    echo "${s// /_}"
  fi
}

# `PID START BOOT`: the identity of PID now (for records and lock owners).
identity() { echo "$1 $(proc_start "$1") $BOOT_ID"; }

# True when PID is alive and is the process that was recorded with START in boot BOOT.
is_process() {  # PID START BOOT
  [[ -n "${2:-}" && -n "$BOOT_ID" && "${3:-}" == "$BOOT_ID" ]] || return 1
  [[ "$(proc_start "$1")" == "$2" ]]
}

# The recorded supervisor (pid) / command (cmd) of run FILE is that very process, still alive.
run_proc_alive() {  # FILE pid|cmd
  local f="$1" pid start
  if [[ "$2" == pid ]]; then pid="$(state_get "$f" pid)"; start="$(state_get "$f" pid_start)"
  else pid="$(state_get "$f" cmd_pid)"; start="$(state_get "$f" cmd_start)"; fi
  is_process "$pid" "$start" "$(state_get "$f" boot_id)"
}

# running | exited | lost (no exit code recorded and neither recorded process is alive with its
# recorded start time in this boot: the pids may now belong to other processes) | none
run_state() {
  local f="$1"
  [[ -f "$f" ]] || { echo none; return; }
  if state_get "$f" rc >/dev/null; then echo exited; return; fi
  if run_proc_alive "$f" pid || run_proc_alive "$f" cmd; then echo running; else echo lost; fi
}

# Describes the run of FILE in one phrase, e.g. "run 2025-x attempt 0 (pid 123, started ..., log ...)".
run_phrase() {
  local f="$1" started
  started="$(state_get "$f" started)"
  [[ "$started" =~ ^[0-9]+$ ]] && started="$(date -u -d "@$started" '+%Y-%m-%d %H:%M:%S UTC' 2>/dev/null || echo "$started")"
  echo "run $(state_get "$f" run_id) attempt $(state_get "$f" attempt) (pid $(state_get "$f" pid)," \
       "started $started, log $(state_get "$f" log))"
}

# Locks: a symlink whose target is its owner's identity (`PID START BOOT`), created atomically (ln
# -s fails when it exists) and taken over when its owner is no longer that process.
#   lock_acquire PATH TIMEOUT_S WHAT   waits up to TIMEOUT_S for PATH (saying once what it waits
#                                      for), then exits 2 naming the owner
lock_acquire() {
  local path="$1" limit="$2" what="$3" owner start=$SECONDS announced=0
  while ! ln -s "$(identity $$)" "$path" 2>/dev/null; do
    if ! owner="$(readlink "$path" 2>/dev/null)"; then
      [[ -d "$path" && ! -L "$path" ]] && rm -rf "$path"       # an older worker.sh's lock folder
      continue                                                  # released meanwhile: try again
    fi
    # shellcheck disable=SC2086
    if ! is_process $owner; then
      # Its owner is gone: take it over, unless another process already did.
      [[ "$(readlink "$path" 2>/dev/null)" == "$owner" ]] && rm -f "$path"
      continue
    fi
    if (( SECONDS - start >= limit )); then
      die "$what: $path is held by pid ${owner%% *} for ${limit} s; wait for it, or remove $path if \
that process is not podlab's"
    fi
    if (( ! announced && limit > 60 )); then
      echo "waiting for $path (pid ${owner%% *}): $what (up to $limit s)"
      announced=1
    fi
    sleep 0.1
  done
}
lock_release() {  # PATH: removes it when it is this process' lock
  [[ "$(readlink "$1" 2>/dev/null)" == "$(identity $$)" ]] && rm -f "$1"
  return 0
}

# Starts `setsid` COMMAND in its own session when the system can, else as is.
new_session() {
  if command -v setsid >/dev/null 2>&1; then
    exec setsid "$@"
  elif command -v python3 >/dev/null 2>&1; then
    exec python3 -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' "$@"
  fi
  exec "$@"
}

# The supervisor: runs COMMAND with its output appended to the log, records it, waits, records the
# exit code. Signals to the supervisor itself are ignored (a SIGTERM to the process group reaches
# COMMAND, which decides; the supervisor only reports).
cmd_supervise() {
  local f="$1" log="$2" run_id="$3" attempt="$4" i="$5" detached="$6"
  shift 6; [[ "${1:-}" == "--" ]] && shift
  trap 'true' TERM INT HUP
  printf 'podlab: run %s attempt %s on %s (worker %s), started %s: %s\n' "$run_id" "$attempt" \
    "$(hostname)" "$i" "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$*" >> "$log"
  PODLAB_RUN_ID="$run_id" PODLAB_RUN_ATTEMPT="$attempt" PYTHONUNBUFFERED=1 \
    "$@" >> "$log" 2>&1 < /dev/null &
  local c=$! rc c_start
  c_start="$(proc_start "$c")"
  echo "$c" > "$STATE_DIR/worker-$i.pid"
  local tmp="$f.tmp.$$"
  printf '%s\n' "run_id=$run_id" "attempt=$attempt" "pid=$$" "pid_start=$(proc_start $$)" \
    "cmd_pid=$c" "cmd_start=$c_start" "boot_id=$BOOT_ID" "detached=$detached" \
    "log=$log" "started=$(date +%s)" "host=$(hostname)" > "$tmp" && mv -f "$tmp" "$f"
  while :; do
    wait "$c"; rc=$?
    is_process "$c" "$c_start" "$BOOT_ID" || break    # a trapped signal interrupts `wait`: wait again
  done
  # The pid file goes first: once rc is recorded the run counts as ended (stop, status), and by
  # then nothing of it may be left.
  [[ "$(cat "$STATE_DIR/worker-$i.pid" 2>/dev/null)" == "$c" ]] && rm -f "$STATE_DIR/worker-$i.pid"
  state_set "$f" rc "$rc"
  return 0
}

# Parses `--from I:N,...` (pod.sh passes one list for every worker) into this worker's N.
from_for() {  # LIST I
  local item items
  IFS=',' read -r -a items <<<"$1"
  for item in "${items[@]}"; do
    [[ "$item" == "$2:"* ]] && { echo "${item#*:}"; return; }
  done
  echo 0
}

# Waits for the run of FILE to end; MODE raw|prefix|numbered also prints its log from line FROM+1
# on (as is, `[worker <i>] ` or `[worker <i> <line number>] ` before each line), MODE wait only
# waits. Then prints the exit line; returns the run's exit code (1 when lost).
attach_run() {
  local f="$1" i="$2" mode="$3" from="$4"
  local log run_id attempt watcher rc
  log="$(state_get "$f" log)"; run_id="$(state_get "$f" run_id)"; attempt="$(state_get "$f" attempt)"
  if [[ "$mode" != wait && -f "$log" ]]; then
    # tail ends once the watcher (which ends with the run) has ended, after printing the rest.
    ( while [[ "$(run_state "$f")" == running ]]; do sleep 0.5; done ) &
    watcher=$!
    local n="$from" line
    while IFS= read -r line || [[ -n "$line" ]]; do
      n=$((n + 1))
      case "$mode" in
        numbered) printf '[worker %s %d] %s\n' "$i" "$n" "$line" ;;
        prefix) printf '[worker %s] %s\n' "$i" "$line" ;;
        *) printf '%s\n' "$line" ;;
      esac
    done < <(tail -n "+$((from + 1))" -F -s 0.5 --pid="$watcher" "$log" 2>/dev/null)
    wait "$watcher" 2>/dev/null
  else
    while [[ "$(run_state "$f")" == running ]]; do sleep 0.5; done
  fi
  rc="$(state_get "$f" rc)" || rc=lost
  local stopped=""
  [[ "$(state_get "$f" stopped_by_user)" == 1 ]] && stopped=" stopped_by_user=1"
  echo "PODLAB_WORKER_EXIT worker=$i rc=$rc run=$run_id attempt=$attempt$stopped log=$log"
  [[ "$rc" =~ ^[0-9]+$ ]] && return "$rc"
  return 1
}

# The output mode of attach_run for the --follow/--numbered flags.
follow_mode() { if (( ! $1 )); then echo wait; elif (( $2 )); then echo numbered; else echo prefix; fi; }

cmd_run() {
  local run_id="" attempt=0 log_dir="" detach=0 follow=0 numbered=0 from="" from_list=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --run-id|--attempt|--log-dir|--from-line|--from)
        [[ $# -ge 2 ]] || die "run: $1 needs a value"
        case "$1" in
          --run-id) run_id="$2" ;; --attempt) attempt="$2" ;; --log-dir) log_dir="$2" ;;
          --from-line) from="$2" ;; --from) from_list="$2" ;;
        esac
        shift 2 ;;
      --run-id=*) run_id="${1#*=}"; shift ;;
      --attempt=*) attempt="${1#*=}"; shift ;;
      --log-dir=*) log_dir="${1#*=}"; shift ;;
      --from-line=*) from="${1#*=}"; shift ;;
      --from=*) from_list="${1#*=}"; shift ;;
      --detach) detach=1; shift ;;
      --follow|--stream) follow=1; shift ;;
      --numbered) numbered=1; shift ;;
      --) shift; break ;;
      *) die "run: unknown option '$1' (usage: run --run-id ID --log-dir DIR [--detach] [--follow] -- COMMAND...)" ;;
    esac
  done
  [[ -n "$log_dir" ]] || die "run: --log-dir is required"
  [[ $# -gt 0 ]] || die "run: no command given after --"
  [[ -n "$run_id" ]] || run_id="$(date -u +%Y%m%d-%H%M%S)-$$"
  [[ "$run_id" =~ $RUN_ID_RE ]] || die "run: --run-id '$run_id' is not a run id (letters, digits, '.', '_', '-')"
  [[ "$attempt" =~ ^[0-9]+$ ]] || die "run: --attempt '$attempt' is not a non-negative integer"
  local i f log st
  i="$(worker_index)"
  [[ -n "$from_list" ]] && from="$(from_for "$from_list" "$i")"
  from="${from:-0}"
  [[ "$from" =~ ^[0-9]+$ ]] || die "run: --from-line '$from' is not a line count"
  mkdir -p "$log_dir" "$STATE_DIR" || die "cannot create $log_dir or $STATE_DIR"
  log="$(cd "$log_dir" && pwd)/worker-$i.log"
  f="$STATE_DIR/worker-$i.run"

  # A lock around "look at the run record, then start": concurrent `run`s with the same run id
  # (gcloud re-running the command after an ssh failure) must not both start it.
  local lock="$STATE_DIR/worker-$i.lock"
  lock_acquire "$lock" 60 "worker $i: starting run $run_id"
  st="$(run_state "$f")"
  if [[ "$st" != none && "$(state_get "$f" run_id)" == "$run_id" && "$(state_get "$f" attempt)" == "$attempt" ]]; then
    lock_release "$lock"
    if [[ "$st" == running ]]; then
      echo "worker.sh: worker $i: $(run_phrase "$f") is already running; attaching to it instead of starting it again" >&2
    else
      echo "worker.sh: worker $i: $(run_phrase "$f") already ended (exit code $(state_get "$f" rc || echo lost)); not starting it again" >&2
    fi
    if (( detach && ! follow )); then
      echo "PODLAB_RUN_STARTED worker=$i run=$run_id attempt=$attempt pid=$(state_get "$f" pid) log=$(state_get "$f" log)"
      return 0
    fi
    attach_run "$f" "$i" "$(follow_mode "$follow" "$numbered")" "$from"
    return
  fi
  if [[ "$st" == running ]]; then
    lock_release "$lock"
    echo "PODLAB_WORKER_REFUSED worker=$i running=$(state_get "$f" run_id) attempt=$(state_get "$f" attempt) pid=$(state_get "$f" pid)"
    echo "worker.sh: error: worker $i already runs $(run_phrase "$f"); not starting run $run_id" \
         "attempt $attempt next to it. Fix: follow it (launch/pod.sh NAME attach) or stop it first" \
         "(launch/pod.sh NAME stop)" >&2
    exit 2
  fi
  # Earlier (ended) record: keep it as worker-<i>.prev.run for `status`.
  [[ -f "$f" ]] && mv -f "$f" "$STATE_DIR/worker-$i.prev.run"
  if (( detach )); then
    ( new_session bash "$SELF" _supervise "$f" "$log" "$run_id" "$attempt" "$i" 1 -- "$@" ) \
      < /dev/null > /dev/null 2>&1 &
  else
    bash "$SELF" _supervise "$f" "$log" "$run_id" "$attempt" "$i" 0 -- "$@" < /dev/null > /dev/null 2>&1 &
  fi
  local supervisor=$!
  local waited=0
  until [[ "$(state_get "$f" run_id 2>/dev/null)" == "$run_id" && "$(state_get "$f" attempt 2>/dev/null)" == "$attempt" ]]; do
    if (( waited++ > 200 )); then lock_release "$lock"; die "worker $i: the run did not start within 20 s (no record in $f)"; fi
    sleep 0.1
  done
  lock_release "$lock"
  if (( detach && ! follow )); then
    echo "PODLAB_RUN_STARTED worker=$i run=$run_id attempt=$attempt pid=$(state_get "$f" pid) log=$log"
    return 0
  fi
  local rc=0
  attach_run "$f" "$i" "$(follow_mode "$follow" "$numbered")" "$from" || rc=$?
  wait "$supervisor" 2>/dev/null       # it is our child: gone before we report
  return "$rc"
}

cmd_attach() {
  local run_id="" attempt="" follow=0 numbered=0 from="" from_list=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --run-id|--attempt|--from-line|--from)
        [[ $# -ge 2 ]] || die "attach: $1 needs a value"
        case "$1" in
          --run-id) run_id="$2" ;; --attempt) attempt="$2" ;; --from-line) from="$2" ;; --from) from_list="$2" ;;
        esac
        shift 2 ;;
      --follow) follow=1; shift ;;
      --numbered) numbered=1; shift ;;
      *) die "attach: unknown option '$1' (expected --run-id, --attempt, --follow, --numbered, --from-line, --from)" ;;
    esac
  done
  local i f
  i="$(worker_index)"
  f="$STATE_DIR/worker-$i.run"
  [[ -n "$from_list" ]] && from="$(from_for "$from_list" "$i")"
  from="${from:-0}"
  [[ "$from" =~ ^[0-9]+$ ]] || die "attach: --from-line '$from' is not a line count"
  if [[ ! -f "$f" ]]; then
    echo "PODLAB_WORKER_EXIT worker=$i rc=none run=none attempt=none log=none"
    echo "worker.sh: worker $i: no podlab run recorded in $STATE_DIR" >&2
    return 1
  fi
  if [[ -n "$run_id" && ( "$(state_get "$f" run_id)" != "$run_id" || ( -n "$attempt" && "$(state_get "$f" attempt)" != "$attempt" ) ) ]]; then
    echo "PODLAB_WORKER_EXIT worker=$i rc=other run=$(state_get "$f" run_id) attempt=$(state_get "$f" attempt) log=$(state_get "$f" log)"
    echo "worker.sh: worker $i: its current run is $(run_phrase "$f"), not run $run_id${attempt:+ attempt $attempt}" >&2
    return 1
  fi
  attach_run "$f" "$i" "$(follow_mode "$follow" "$numbered")" "$from"
}

# The last training step named in TEXT (metric lines `[12] train/...=`, `step 12`, `step 12/40`, `at
# step 12`), else -. "from step N" is where a run starts, not its progress: it does not count (a
# process other than 0 logs no progress of its own, and would otherwise stay at "step 0").
last_step() {
  local m
  m="$(sed -E 's/from step [0-9]+//g' <<<"$1" | grep -aoE '\[[0-9]+\] [A-Za-z_./]+=|\bstep [0-9]+\b' | tail -n 1)"
  m="$(grep -oE '[0-9]+' <<<"$m" | head -n 1)"
  echo "${m:--}"
}

status_line() {
  local f="$1" i="$2" st log text last
  st="$(run_state "$f")"
  if [[ "$st" == none ]]; then
    echo "PODLAB_STATUS worker=$i state=none run=- attempt=- pid=- rc=- step=- stopped=0 log=- last="
    return
  fi
  log="$(state_get "$f" log)"
  text="$(tail -c 2000000 "$log" 2>/dev/null)"        # one snapshot for the step and the last line
  # The last line, without absl's `I1123 22:18:42.514158 140312454085504 file.py:49] ` prefix and
  # without the collective library's `[Gloo] Rank 1 is connected to ...` chatter.
  last="$(grep -avE '^[[:space:]]*$|^\[Gloo\] ' <<<"$text" | tail -n 1 \
          | sed -E 's/^[IWEF][0-9]{4} [0-9:.]+ +[0-9]+ [^]]+\] //' | cut -c1-200)"
  echo "PODLAB_STATUS worker=$i state=$st run=$(state_get "$f" run_id) attempt=$(state_get "$f" attempt)" \
       "pid=$(state_get "$f" pid) rc=$(state_get "$f" rc || echo -) step=$(last_step "$text")" \
       "stopped=$(state_get "$f" stopped_by_user || echo 0) log=$log last=$last"
}

cmd_status() {
  [[ $# -eq 0 ]] || die "status: unexpected argument '$1'"
  local f any=0
  for f in "$STATE_DIR"/worker-*.run; do
    [[ -f "$f" && "$f" != *.prev.run ]] || continue
    any=1
    status_line "$f" "$(run_worker_of "$f")"
  done
  (( any )) || status_line "$STATE_DIR/worker-$(worker_index).run" "$(worker_index)"
}

cmd_logs() {
  local follow=0 lines="" prefix=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -f|--follow) follow=1; shift ;;
      -n|--lines) [[ $# -ge 2 ]] || die "logs: $1 needs a value"; lines="$2"; shift 2 ;;
      --lines=*) lines="${1#*=}"; shift ;;
      --prefix) prefix=1; shift ;;
      *) die "logs: unknown option '$1' (expected -f, -n LINES, --prefix)" ;;
    esac
  done
  [[ -z "$lines" || "$lines" =~ ^[0-9]+$ ]] || die "logs: -n '$lines' is not a line count"
  local i f log start
  i="$(worker_index)"
  f="$STATE_DIR/worker-$i.run"
  [[ -f "$f" ]] || die "worker $i: no podlab run recorded in $STATE_DIR"
  log="$(state_get "$f" log)"
  [[ -f "$log" ]] || die "worker $i: the log $log of $(run_phrase "$f") is gone"
  start=1
  if [[ -n "$lines" ]]; then
    local total; total="$(wc -l < "$log")"
    start=$(( total - lines + 1 )); (( start < 1 )) && start=1
  fi
  if (( follow )); then
    local mode=raw
    (( prefix )) && mode=prefix
    attach_run "$f" "$i" "$mode" "$((start - 1))"
    return
  fi
  if (( prefix )); then
    tail -n "+$start" "$log" | while IFS= read -r line || [[ -n "$line" ]]; do printf '[worker %s] %s\n' "$i" "$line"; done
  else
    tail -n "+$start" "$log"
  fi
}

stop_runs() {  # GRACE RUN_ID BY_USER: stop every live recorded run here (or only RUN_ID)
  local grace="$1" only="$2" by_user="$3" f files=() pid cmd_pid
  for f in "$STATE_DIR"/worker-*.run; do
    [[ -f "$f" && "$f" != *.prev.run ]] || continue
    [[ -z "$only" || "$(state_get "$f" run_id)" == "$only" ]] || continue
    [[ "$(run_state "$f")" == running ]] && files+=("$f")
  done
  for f in "$STATE_DIR"/worker-*.run; do
    [[ -f "$f" && "$f" != *.prev.run ]] || continue
    [[ -z "$only" || "$(state_get "$f" run_id)" == "$only" ]] || continue
    [[ "$(run_state "$f")" == lost ]] || continue
    echo "worker $(run_worker_of "$f"): $(run_phrase "$f") is lost: no exit code recorded and its" \
         "processes are gone (pid $(state_get "$f" pid) is not the recorded process); nothing signalled"
  done
  if [[ ${#files[@]} -eq 0 ]]; then
    echo "no podlab run to stop on $(hostname)${only:+ (run $only)}"
    return 0
  fi
  for f in "${files[@]}"; do
    pid="$(state_get "$f" pid)"; cmd_pid="$(state_get "$f" cmd_pid)"
    echo "worker $(run_worker_of "$f"): stopping $(run_phrase "$f") on $(hostname): SIGTERM, SIGKILL after ${grace} s"
    (( by_user )) && state_set "$f" stopped_by_user 1
    # Only the recorded processes themselves (run_state checked their identity): the group of a
    # live supervisor (it leads it), else COMMAND.
    if [[ "$(state_get "$f" detached)" == 1 ]] && run_proc_alive "$f" pid; then
      kill -TERM -- "-$pid" 2>/dev/null
    elif run_proc_alive "$f" cmd; then
      kill -TERM "$cmd_pid" 2>/dev/null
    fi
  done
  local t=0 any
  while (( t < grace * 10 )); do
    any=0
    for f in "${files[@]}"; do [[ "$(run_state "$f")" == running ]] && any=1; done
    (( any )) || break
    sleep 0.1; t=$((t + 1))
  done
  for f in "${files[@]}"; do
    [[ "$(run_state "$f")" == running ]] || continue
    pid="$(state_get "$f" pid)"; cmd_pid="$(state_get "$f" cmd_pid)"
    echo "worker $(run_worker_of "$f"): still running after ${grace} s: SIGKILL to $(run_phrase "$f")"
    run_proc_alive "$f" cmd && kill -KILL "$cmd_pid" 2>/dev/null   # the supervisor then records 137
    local w=0
    while [[ "$(run_state "$f")" == running ]] && (( w++ < 30 )); do sleep 0.1; done
    # What is left of its process group, while its supervisor (the group's leader) is still it.
    if [[ "$(state_get "$f" detached)" == 1 ]] && run_proc_alive "$f" pid; then
      kill -KILL -- "-$pid" 2>/dev/null
    fi
  done
  for f in "${files[@]}"; do
    echo "worker $(run_worker_of "$f"): $(run_phrase "$f") ended with exit code $(state_get "$f" rc || echo lost)"
  done
  return 0
}

cmd_stop() {
  local grace="$STOP_GRACE_S" only="" by_user=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --grace) [[ $# -ge 2 ]] || die "stop: --grace needs a value"; grace="$2"; shift 2 ;;
      --grace=*) grace="${1#*=}"; shift ;;
      --run-id) [[ $# -ge 2 ]] || die "stop: --run-id needs a value"; only="$2"; shift 2 ;;
      --run-id=*) only="${1#*=}"; shift ;;
      --by-user) by_user=1; shift ;;
      *) die "stop: unknown option '$1' (expected --grace, --run-id, --by-user)" ;;
    esac
  done
  [[ "$grace" =~ ^[0-9]+$ ]] || die "stop: --grace '$grace' is not a number of seconds"
  stop_runs "$grace" "$only" "$by_user"
}

# --------------------------------------------------------------------------------------------------
# clean: stale TPU holders and the libtpu lockfile

# Refuses (exit 2) when a recorded podlab run is alive here.
refuse_if_running() {
  local f
  for f in "$STATE_DIR"/worker-*.run; do
    [[ -f "$f" && "$f" != *.prev.run ]] || continue
    if [[ "$(run_state "$f")" == running ]]; then
      echo "PODLAB_WORKER_REFUSED worker=$(worker_index) running=$(state_get "$f" run_id) attempt=$(state_get "$f" attempt) pid=$(state_get "$f" pid)"
      die "$(hostname) still runs $(run_phrase "$f"). Fix: follow it (launch/pod.sh NAME attach) or stop \
it first (launch/pod.sh NAME stop)"
    fi
  done
}

# True when PID is podlab's own: a recorded supervisor or command of a run here (its identity, not
# its pid alone), or a process whose environment carries the PODLAB_RUN_ID of a run recorded here
# (what the run's command started, which inherits it).
is_podlab_process() {  # PID
  local pid="$1" f ids=() env
  for f in "$STATE_DIR"/worker-*.run; do
    [[ -f "$f" ]] || continue
    if is_process "$pid" "$(state_get "$f" pid_start)" "$(state_get "$f" boot_id)" \
         && [[ "$(state_get "$f" pid)" == "$pid" ]]; then return 0; fi
    if is_process "$pid" "$(state_get "$f" cmd_start)" "$(state_get "$f" boot_id)" \
         && [[ "$(state_get "$f" cmd_pid)" == "$pid" ]]; then return 0; fi
    ids+=("PODLAB_RUN_ID=$(state_get "$f" run_id)")
  done
  (( ${#ids[@]} )) || return 1
  env="$(as_root cat "/proc/$pid/environ" 2>/dev/null | tr '\0' '\n')" || return 1
  for f in "${ids[@]}"; do grep -qxF -- "$f" <<<"$env" && return 0; done
  return 1
}

# SIGTERM to PIDS (as root), SIGKILL after STOP_GRACE_S to those still there (the same processes:
# their start times are taken first).
stop_pids() {
  local pid i t=0 any starts=()
  for pid in "$@"; do starts+=("$(proc_start "$pid")"); done
  as_root kill -TERM "$@" 2>/dev/null
  while (( t < STOP_GRACE_S * 10 )); do
    any=0
    for ((i = 0; i < $#; i++)); do
      is_process "${@:i+1:1}" "${starts[i]}" "$BOOT_ID" && any=1
    done
    (( any )) || break
    sleep 0.1; t=$((t + 1))
  done
  for ((i = 0; i < $#; i++)); do
    is_process "${@:i+1:1}" "${starts[i]}" "$BOOT_ID" && as_root kill -KILL "${@:i+1:1}" 2>/dev/null
  done
  return 0
}

cmd_clean() {
  local stop_others=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --stop-others) stop_others=1; shift ;;
      *) die "clean: unknown option '$1' (expected --stop-others)" ;;
    esac
  done
  refuse_if_running
  if ! on_tpu_vm; then
    echo "no TPU devices on $(hostname) ($ACCEL_GLOB); nothing to clean"
    return 0
  fi
  if [[ -n "$SUDO" ]] && ! as_root true 2>/dev/null; then
    echo "warning: '$SUDO true' failed on $(hostname): processes of other users holding the TPU" \
         "cannot be seen" >&2
  fi
  if ! command -v "$LSOF" >/dev/null 2>&1; then
    echo "lsof missing on $(hostname); installing it with apt-get (it finds processes holding the TPU)"
    apt_get install -y -qq lsof >&2 || true
    command -v "$LSOF" >/dev/null 2>&1 || die "lsof is missing on $(hostname) and could not be \
installed (apt-get install lsof failed); without it processes holding the TPU cannot be found. Fix: \
sudo apt-get install -y lsof on that worker (or use an image that has it), then relaunch"
  fi
  local devices=() ours=() others=() pid
  while IFS= read -r pid; do devices+=("$pid"); done < <(accel_devices)
  while read -r pid; do
    [[ "$pid" =~ ^[0-9]+$ && "$pid" != "$$" ]] || continue
    if is_podlab_process "$pid"; then ours+=("$pid"); else others+=("$pid"); fi
  done < <(as_root "$LSOF" -t "${devices[@]}" 2>/dev/null | sort -u)
  if (( ${#ours[@]} )); then
    echo "stopping podlab's stale processes holding the TPU on $(hostname): ${ours[*]} (SIGTERM," \
         "SIGKILL after ${STOP_GRACE_S} s)"
    stop_pids "${ours[@]}"
  fi
  if (( ${#others[@]} )); then
    echo "other processes hold the TPU on $(hostname) (user, pid, command):"
    for pid in "${others[@]}"; do
      echo "  $(stat -c %U "/proc/$pid" 2>/dev/null || echo '?') $pid $(ps -o args= -p "$pid" 2>/dev/null | cut -c1-200)"
    done
    if (( ! stop_others )); then
      die "${#others[@]} process(es) that are not podlab's hold the TPU on $(hostname) (listed \
above); not stopped. Fix: end them, or relaunch with launch/pod.sh NAME --stop-tpu-holders to stop \
them (SIGTERM, SIGKILL after ${STOP_GRACE_S} s)"
    fi
    echo "stopping them (--stop-tpu-holders): SIGTERM, SIGKILL after ${STOP_GRACE_S} s"
    stop_pids "${others[@]}"
  fi
  (( ${#ours[@]} + ${#others[@]} )) || echo "no process holds the TPU on $(hostname)"
  if [[ -e "$LIBTPU_LOCKFILE" ]]; then
    as_root rm -f "$LIBTPU_LOCKFILE" && echo "removed the libtpu lockfile $LIBTPU_LOCKFILE"
  fi
  return 0
}

# --------------------------------------------------------------------------------------------------
# prepare: what launch/pod.sh runs right after unpacking a fresh copy of the code into <dir>.new

cmd_prepare() {
  local i rc clean_args=()
  if [[ "${1:-}" == --stop-others ]]; then clean_args=(--stop-others); shift; fi
  i="$(worker_index)"
  {
    local src="$REPO" dest
    dest="${src%.new}"
    [[ "$dest" != "$src" ]] || die "prepare: run it from the unpacked copy <dir>.new, not $src"
    refuse_if_running
    cmd_clean "${clean_args[@]+"${clean_args[@]}"}" || exit $?
    echo "installing the code in $dest on $(hostname) (the previous copy stays in $dest.old)"
    rm -rf "$dest.old"
    if [[ -d "$dest" ]]; then mv "$dest" "$dest.old" || die "cannot move $dest aside"; fi
    mv "$src" "$dest" || die "cannot move $src to $dest"
    REPO="$dest"; HERE="$dest/launch"; SELF="$HERE/worker.sh"
    cmd_setup "$@"
  } 2>&1 | while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" == PODLAB_WORKER_REFUSED* ]]; then printf '%s\n' "$line"
    else printf '[worker %s] %s\n' "$i" "$line"; fi
  done
  rc=${PIPESTATUS[0]}
  echo "PODLAB_WORKER_EXIT worker=$i rc=$rc phase=prepare"
  return "$rc"
}

case "${1:-}" in
  prepare) shift; cmd_prepare "$@" ;;
  setup) shift; cmd_setup "$@" ;;
  clean) shift; cmd_clean "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  run) shift; cmd_run "$@" ;;
  attach) shift; cmd_attach "$@" ;;
  status) shift; cmd_status "$@" ;;
  logs) shift; cmd_logs "$@" ;;
  tpu-pin) shift; cmd_tpu_pin "$@" ;;
  _supervise) shift; cmd_supervise "$@" ;;
  *) die "unknown subcommand '${1:-}': expected prepare, setup, clean, stop, run, attach, status, logs or tpu-pin (see the header of $0)" ;;
esac
