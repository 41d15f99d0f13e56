#!/usr/bin/env bash
# A local pod: N processes on this machine with K fake CPU devices each, joined by
# jax.distributed.initialize through a coordinator on localhost, all running the same command.
#
#   launch/local.sh [-n N] [-d K] [--module M] [--config C] [--workdir W] [--log-dir L] [--port P]
#                   [-- EXTRA ARGS]
#
#   -n N         processes (default 2)
#   -d K         fake CPU devices per process (default 2)
#   --module M   python module to run (default experiments.trm.main)
#   --config C   its --config (default configs/cpu_demo.py; "" passes none)
#   --workdir W  its --workdir (default workdirs/local_<config name>; "" passes none)
#   --log-dir L  per-process logs L/worker-<i>.log (default logs/local/<date-time>)
#   --port P     coordinator port (default: a free one)
#   EXTRA ARGS   appended to every process' command, e.g. -- --config.total_steps=20
#
# Every process runs `python -m M --config=C --workdir=W EXTRA...` (python: $PYTHON, default
# .venv/bin/python, created with `make venv` when missing) through launch/worker.sh run, which
# appends its output to its log and records its pid and exit code in L/state (PODLAB_RUN_ID: one
# run id for all); process 0's output is also shown here. Fail-fast: when one process exits non-zero
# the others are stopped (`launch/worker.sh stop`: SIGTERM, SIGKILL after $PODLAB_STOP_GRACE_S,
# default 10 s) and this script exits 1 naming the process and its log. Exit 0 when every process
# exits 0. Unlike launch/pod.sh the processes stay in this terminal's process group: Ctrl-C or
# killing this script's group ends them too.
#
# Examples:
#   launch/local.sh                                  # the cpu_demo run as 2 processes x 2 devices
#   launch/local.sh -n 2 -d 2 --config configs/cpu_demo.py:smoke --workdir /tmp/pod2x2
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
cd "$REPO" || exit 2

die() { echo "local.sh: error: $*" >&2; exit 2; }

num=2 devices=2 module="experiments.trm.main" config="configs/cpu_demo.py" workdir=UNSET
log_dir="" port=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) num="${2:-}"; shift 2 || die "-n needs a value" ;;
    -d) devices="${2:-}"; shift 2 || die "-d needs a value" ;;
    --module|--config|--workdir|--log-dir|--port)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      case "$1" in
        --module) module="$2" ;; --config) config="$2" ;; --workdir) workdir="$2" ;;
        --log-dir) log_dir="$2" ;; --port) port="$2" ;;
      esac
      shift 2 ;;
    --module=*) module="${1#*=}"; shift ;;
    --config=*) config="${1#*=}"; shift ;;
    --workdir=*) workdir="${1#*=}"; shift ;;
    --log-dir=*) log_dir="${1#*=}"; shift ;;
    --port=*) port="${1#*=}"; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (see launch/local.sh --help; experiment args go after --)" ;;
  esac
done
[[ "$num" =~ ^[1-9][0-9]*$ ]] || die "-n '$num': the process count must be a positive integer"
[[ "$devices" =~ ^[1-9][0-9]*$ ]] || die "-d '$devices': the device count must be a positive integer"
[[ "$module" =~ ^[A-Za-z_][A-Za-z0-9_.]*$ ]] || die "--module '$module' is not a Python module name"
if [[ "$workdir" == UNSET ]]; then
  name="$(basename "${config%%:*}" .py)"
  workdir="workdirs/local_${name:-run}"
fi

PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
if [[ ! -x "$PYTHON" ]]; then
  echo "local.sh: $PYTHON missing; creating the environment with make venv" >&2
  make -s venv || die "make venv failed"
fi
if [[ -z "$port" ]]; then
  port="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')"
fi
[[ "$port" =~ ^[0-9]+$ ]] || die "--port '$port' is not a port number"
log_dir="${log_dir:-logs/local/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$log_dir" || die "cannot create --log-dir $log_dir"
log_dir="$(cd "$log_dir" && pwd)"

cmd=("$PYTHON" -m "$module")
[[ -n "$config" ]] && cmd+=("--config=$config")
[[ -n "$workdir" ]] && cmd+=("--workdir=$workdir")
cmd+=("$@")

# Drop any device-count flag the caller's XLA_FLAGS has, then give each process K devices.
xla_flags=""
for f in ${XLA_FLAGS:-}; do
  [[ "$f" == --xla_force_host_platform_device_count* ]] || xla_flags+="$f "
done
xla_flags+="--xla_force_host_platform_device_count=$devices"

echo "local.sh: $num processes x $devices CPU devices, coordinator localhost:$port, logs in $log_dir"
printf 'local.sh: command:'; printf ' %q' "${cmd[@]}"; echo

# One run id for the N processes (PODLAB_RUN_ID in their environment); each process' record (pid,
# exit code) is in $log_dir/state, where `launch/worker.sh stop` finds it.
run_id="local-$(date -u +%Y%m%d-%H%M%S)-$$"
grace="${PODLAB_STOP_GRACE_S:-10}"
pids=()
for ((i = 0; i < num; i++)); do
  stream=()
  (( i == 0 )) && stream=(--stream)
  PODLAB_COORDINATOR="localhost:$port" PODLAB_NUM_PROCESSES="$num" PODLAB_PROCESS_ID="$i" \
    PODLAB_STATE_DIR="$log_dir/state" XLA_FLAGS="$xla_flags" JAX_PLATFORMS=cpu \
    "$HERE/worker.sh" run --run-id "$run_id" --log-dir "$log_dir" "${stream[@]}" -- "${cmd[@]}" &
  pids+=($!)
done

# SIGTERM to every process still running (JAX turns it into a preemption notice), SIGKILL after the
# grace period (a process blocked in a collective never sees it); each worker.sh then reports.
stop_all() {
  PODLAB_STATE_DIR="$log_dir/state" "$HERE/worker.sh" stop --grace "$grace" >> "$log_dir/stop.log" 2>&1
}

# Ctrl-C reaches every process (one process group): they save and exit by themselves; those still
# running after the grace period are stopped.
interrupted() {
  echo "local.sh: interrupted; the processes save a checkpoint and stop" >&2
  local t=0 pid any
  while (( t < grace * 10 )); do
    any=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && any=1; done
    (( any )) || exit 130
    sleep 0.1; t=$((t + 1))
  done
  stop_all
  exit 130
}
trap interrupted INT TERM

# Poll (portable to old bash): the first non-zero exit stops the others.
done_rc=()
failed=""
while (( ${#done_rc[@]} < num )); do
  for ((i = 0; i < num; i++)); do
    [[ -n "${done_rc[$i]:-}" ]] && continue
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      wait "${pids[$i]}"; done_rc[$i]=$?
      if (( done_rc[$i] != 0 )) && [[ -z "$failed" ]]; then
        failed="$i"
        echo "local.sh: process $i exited with code ${done_rc[$i]} (log: $log_dir/worker-$i.log);" \
             "stopping the other processes" >&2
        stop_all
      fi
    fi
  done
  (( ${#done_rc[@]} < num )) && sleep 0.2
done

if [[ -n "$failed" ]]; then
  echo "local.sh: FAILED: process $failed exited with code ${done_rc[$failed]}; last lines of" \
       "$log_dir/worker-$failed.log:" >&2
  tail -n 15 "$log_dir/worker-$failed.log" | sed 's/^/    /' >&2
  exit 1
fi
echo "local.sh: all $num processes finished; logs in $log_dir"
