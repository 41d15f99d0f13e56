#!/usr/bin/env bash
# One worker of a podlab run: set up its environment, stop stale runs, run the command with a log.
#
# launch/pod.sh runs this on every TPU VM worker (through `gcloud ... ssh --worker=all`) and
# launch/local.sh runs it once per local process, so a pod and a local pod share this code path.
#
#   launch/worker.sh setup [--python PATH] [--venv DIR] [--jax tpu|cpu]
#       Idempotent. Without --python: create DIR (default ~/podlab-venv) with Python 3.11 and install
#       the pinned stack (constraints.txt; jax[tpu] on TPU) unless DIR's stamp says it is current.
#       With --python: use that interpreter as is, only check that the pinned versions are installed.
#       Prints `PODLAB_PYTHON=<interpreter>` last.
#   launch/worker.sh prepare [setup options]
#       Run from a freshly unpacked <dir>.new (launch/pod.sh): moves it to <dir> (the old copy to
#       <dir>.old), then `stop` and `setup`, output prefixed `[worker <i>] `, and the
#       `PODLAB_WORKER_EXIT` line below.
#   launch/worker.sh stop
#       Stops this machine's earlier podlab runs (their pid files under $PODLAB_STATE_DIR, default
#       ~/.podlab) and, on a TPU VM, any process still holding a TPU device: SIGTERM, then SIGKILL
#       after $PODLAB_STOP_GRACE_S (default 10) seconds.
#   launch/worker.sh run --log-dir DIR [--stream] -- COMMAND [ARGS...]
#       Runs COMMAND (argv, never re-parsed by a shell) with stdout+stderr in DIR/worker-<i>.log,
#       records its pid for `stop`, with --stream also prints the output prefixed `[worker <i>] `, and
#       ends with the line `PODLAB_WORKER_EXIT worker=<i> rc=<exit code> log=<log file>`.
#       Exits with COMMAND's exit code.
#
# The worker index <i> is $PODLAB_PROCESS_ID when set (local runs, tests), else the TPU VM's
# `agent-worker-number` from the metadata server, else the `-w-<i>` suffix of the hostname.
set -uo pipefail

STATE_DIR="${PODLAB_STATE_DIR:-$HOME/.podlab}"
STOP_GRACE_S="${PODLAB_STOP_GRACE_S:-10}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
METADATA_URL="http://metadata.google.internal/computeMetadata/v1/instance/attributes"
JAX_VERSION="0.10.2"
LIBTPU_FIND_LINKS="https://storage.googleapis.com/jax-releases/libtpu_releases.html"

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

on_tpu_vm() { compgen -G "/dev/accel*" >/dev/null || compgen -G "/dev/vfio/[0-9]*" >/dev/null; }

# --------------------------------------------------------------------------------------------------
# setup

find_python311() {
  local p
  for p in python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11; do
    if command -v "$p" >/dev/null 2>&1; then command -v "$p"; return 0; fi
  done
  return 1
}

# Checks that PYTHON has the versions pinned in constraints.txt for the packages pyproject.toml
# depends on; names every mismatch.
check_pins() {
  local python="$1"
  "$python" - "$REPO/constraints.txt" "$REPO/pyproject.toml" <<'EOF'
import re, sys, tomllib
from importlib import metadata
constraints, pyproject = sys.argv[1], sys.argv[2]
pins = {}
for line in open(constraints):
  m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line.strip())
  if m:
    pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
deps = tomllib.load(open(pyproject, "rb"))["project"]["dependencies"]
names = [re.sub(r"[-_.]+", "-", re.match(r"^[A-Za-z0-9_.\-]+", d).group(0)).lower() for d in deps]
bad = []
for name in names:
  want = pins.get(name)
  try:
    have = metadata.version(name)
  except metadata.PackageNotFoundError:
    have = None
  if want is not None and have != want:
    bad.append(f"{name}: installed {have or 'nothing'}, pinned {want}")
if bad:
  sys.exit(f"{sys.executable} does not have the pinned stack:\n  " + "\n  ".join(bad)
           + "\nFix: pip install -c constraints.txt -e . with that interpreter, or drop --python so "
             "that launch/worker.sh setup creates the environment.")
print(f"pinned stack present in {sys.executable} ({len(names)} packages checked)")
EOF
}

cmd_setup() {
  local python="" venv="$HOME/podlab-venv" jax=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --python) python="$2"; shift 2 ;;
      --python=*) python="${1#*=}"; shift ;;
      --venv) venv="$2"; shift 2 ;;
      --venv=*) venv="${1#*=}"; shift ;;
      --jax) jax="$2"; shift 2 ;;
      --jax=*) jax="${1#*=}"; shift ;;
      *) die "setup: unknown option '$1' (expected --python, --venv, --jax)" ;;
    esac
  done
  if [[ -n "$python" ]]; then
    [[ -x "$python" ]] || die "setup: --python '$python' is not an executable interpreter on $(hostname)"
    check_pins "$python" || exit 2
    echo "PODLAB_PYTHON=$python"
    return 0
  fi
  if [[ -z "$jax" ]]; then if on_tpu_vm; then jax=tpu; else jax=cpu; fi; fi
  [[ "$jax" == tpu || "$jax" == cpu ]] || die "setup: --jax '$jax' must be tpu or cpu"
  local stamp_want stamp_file="$venv/.podlab-stamp"
  stamp_want="$(cat "$REPO/pyproject.toml" "$REPO/constraints.txt" | sha256sum | cut -c1-16)-$jax"
  if [[ -x "$venv/bin/python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp_want" ]]; then
    echo "environment $venv is current ($stamp_want); nothing to install"
    echo "PODLAB_PYTHON=$venv/bin/python"
    return 0
  fi
  local base
  if ! base="$(find_python311)"; then
    echo "Python 3.11 not found; installing it with apt-get" >&2
    sudo apt-get update -qq && sudo apt-get install -y -qq python3.11 python3.11-venv \
      || die "could not install Python 3.11. Fix: use a TPU VM image that has it, or pass --python"
    base="$(find_python311)" || die "python3.11 still missing after apt-get install"
  fi
  [[ -x "$venv/bin/python" ]] || "$base" -m venv "$venv" || die "could not create the venv $venv"
  local pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" -U pip || die "pip upgrade failed in $venv"
  if [[ "$jax" == tpu ]]; then
    "${pip[@]}" -c "$REPO/constraints.txt" -e "$REPO" "jax[tpu]==$JAX_VERSION" -f "$LIBTPU_FIND_LINKS" \
      || die "installing the pinned stack with jax[tpu] failed (see pip's output above)"
  else
    "${pip[@]}" -c "$REPO/constraints.txt" -e "$REPO" || die "installing the pinned stack failed"
  fi
  check_pins "$venv/bin/python" || exit 2
  echo "$stamp_want" > "$stamp_file"
  echo "PODLAB_PYTHON=$venv/bin/python"
}

# --------------------------------------------------------------------------------------------------
# stop

alive() { kill -0 "$1" 2>/dev/null; }

cmd_stop() {
  local pids=() f pid
  if [[ -d "$STATE_DIR" ]]; then
    for f in "$STATE_DIR"/worker-*.pid; do
      [[ -f "$f" ]] || continue
      pid="$(cat "$f")"
      if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid"; then pids+=("$pid"); fi
      rm -f "$f"
    done
  fi
  if on_tpu_vm && command -v lsof >/dev/null 2>&1; then
    # Anything of ours still holding a TPU device (e.g. started by hand) blocks the next run.
    while read -r pid; do
      [[ "$pid" =~ ^[0-9]+$ && "$pid" != "$$" ]] && pids+=("$pid")
    done < <(lsof -t /dev/accel* /dev/vfio/[0-9]* 2>/dev/null | sort -u)
  fi
  if [[ ${#pids[@]} -eq 0 ]]; then
    echo "no stale podlab processes on $(hostname)"
  else
    echo "stopping stale processes on $(hostname): ${pids[*]}"
    kill -TERM "${pids[@]}" 2>/dev/null
    local waited=0
    while (( waited < STOP_GRACE_S * 10 )); do
      local any=0
      for pid in "${pids[@]}"; do alive "$pid" && any=1; done
      (( any )) || break
      sleep 0.1; waited=$((waited + 1))
    done
    for pid in "${pids[@]}"; do alive "$pid" && kill -KILL "$pid" 2>/dev/null; done
  fi
  if on_tpu_vm; then rm -f /tmp/libtpu_lockfile 2>/dev/null; fi
  return 0
}

# --------------------------------------------------------------------------------------------------
# run

cmd_run() {
  local log_dir="" stream=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --log-dir) log_dir="$2"; shift 2 ;;
      --log-dir=*) log_dir="${1#*=}"; shift ;;
      --stream) stream=1; shift ;;
      --) shift; break ;;
      *) die "run: unknown option '$1' (usage: run --log-dir DIR [--stream] -- COMMAND...)" ;;
    esac
  done
  [[ -n "$log_dir" ]] || die "run: --log-dir is required"
  [[ $# -gt 0 ]] || die "run: no command given after --"
  local i log pid_file rc tail_pid=""
  i="$(worker_index)"
  mkdir -p "$log_dir" "$STATE_DIR" || die "cannot create $log_dir or $STATE_DIR"
  log="$(cd "$log_dir" && pwd)/worker-$i.log"
  pid_file="$STATE_DIR/worker-$i.pid"
  : > "$log"
  # Unbuffered Python output, so that the log and the stream show a failure's last lines.
  PYTHONUNBUFFERED=1 "$@" > "$log" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid" > "$pid_file"
  if (( stream )); then
    # `tail --pid` exits once the command has exited and its output has been printed.
    tail -n +1 -F --pid="$pid" "$log" 2>/dev/null | sed -u "s/^/[worker $i] /" &
    tail_pid=$!
  fi
  # SIGTERM/SIGINT to this script (pod.sh stopping a run) are forwarded to the command.
  trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
  while :; do
    wait "$pid"; rc=$?
    alive "$pid" || break        # a trapped signal interrupts `wait`: wait again while it runs
  done
  wait "$pid" 2>/dev/null; rc=$?  # bash keeps the exit status: the command's, not the signal's
  trap - TERM INT
  [[ -n "$tail_pid" ]] && wait "$tail_pid" 2>/dev/null
  rm -f "$pid_file"
  echo "PODLAB_WORKER_EXIT worker=$i rc=$rc log=$log"
  return "$rc"
}

# --------------------------------------------------------------------------------------------------
# prepare: what launch/pod.sh runs right after unpacking a fresh copy of the code into <dir>.new

cmd_prepare() {
  local i rc
  i="$(worker_index)"
  {
    local src="$REPO" dest
    dest="${src%.new}"
    [[ "$dest" != "$src" ]] || die "prepare: run it from the unpacked copy <dir>.new, not $src"
    echo "installing the code in $dest on $(hostname) (the previous copy stays in $dest.old)"
    rm -rf "$dest.old"
    if [[ -d "$dest" ]]; then mv "$dest" "$dest.old" || die "cannot move $dest aside"; fi
    mv "$src" "$dest" || die "cannot move $src to $dest"
    REPO="$dest"
    cmd_stop
    cmd_setup "$@"
  } 2>&1 | sed -u "s/^/[worker $i] /"
  rc=${PIPESTATUS[0]}
  echo "PODLAB_WORKER_EXIT worker=$i rc=$rc phase=prepare"
  return "$rc"
}

case "${1:-}" in
  prepare) shift; cmd_prepare "$@" ;;
  setup) shift; cmd_setup "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  run) shift; cmd_run "$@" ;;
  *) die "usage: launch/worker.sh prepare|setup|stop|run ... (see the header of $0)" ;;
esac
