#!/usr/bin/env bash
# Runs podlab on every worker of a Cloud TPU pod slice. The run is detached from this terminal: it
# outlives Ctrl-C, a lost connection or a sleeping laptop; re-attach, watch or stop it from anywhere.
#
#   launch/pod.sh NAME [options] [-- EXPERIMENT ARGS]   start a run, then follow its logs until it ends
#   launch/pod.sh NAME --watch [options] [-- ARGS]      ... and relaunch it after a preemption
#   launch/pod.sh NAME status                           per worker: run id, pid, alive, exit code, step,
#                                                       last log line
#   launch/pod.sh NAME logs [-f] [-n N] [--worker=K]    the current run's log (every worker, or K)
#   launch/pod.sh NAME attach                           follow the current run again until it ends
#   launch/pod.sh NAME stop [--grace S]                 SIGTERM (the trainer saves a checkpoint and
#                                                       exits 143), SIGKILL after S s (default 120)
#
#   launch/pod.sh stable-1 --bucket my-bucket                    # TRM v4_64 on the v4-64 "stable-1"
#   launch/pod.sh stable-1 --bucket my-bucket -- --config.lr=3e-4
#   launch/pod.sh stable-1 --bucket my-bucket --dry-run          # print the gcloud commands only
#
# First (docs/pod.md): `gcloud auth login`; the slice exists and is READY (`gcloud compute tpus
# tpu-vm list`); `ssh-add ~/.ssh/google_compute_engine`: gcloud's --worker=all needs the key in
# ssh-agent; --zone/--project or `gcloud config set compute/zone Z` / `core/project P`.
#
# Options (flag, or environment variable, default):
#   --zone Z            $PODLAB_ZONE     gcloud's default (`gcloud config get compute/zone`)
#   --project P         $PODLAB_PROJECT  gcloud's default (`gcloud config get core/project`)
#   --bucket B          $PODLAB_BUCKET   none; needed unless --workdir and --data_dir are both given
#   --workdir W         gs://B/podlab/NAME/<config name>, plus `-<hash>` of the EXPERIMENT ARGS when
#                       there are any: checkpoints, TensorBoard, results. The same command resumes
#                       from it (a relaunch continues a preempted run); other args, other workdir.
#   --data_dir D        gs://B/podlab/tfds: the TFDS data dir (TFDS_DATA_DIR on the workers)
#   --module M          experiments.trm.main
#   --config C          configs/v4_64.py (resolved inside the experiment's folder)
#   --python PATH       an interpreter already on the workers with the pinned stack; setup then only
#                       checks the versions instead of creating ~/podlab-venv
#   --log-dir L         logs/pod/NAME/<run id> here: a copy of every worker's log, the code archive
#   --internal-ip       reach the workers by their internal IPs (from a VM in the same network)
#   --gcloud-flag F     added to every `gcloud ... ssh` and `scp` (repeatable), e.g.
#                       --gcloud-flag=--tunnel-through-iap
#   --ssh-flag F        added to ssh (repeatable). Always: -oServerAliveInterval=$PODLAB_SSH_KEEPALIVE_S
#                       (30) -oServerAliveCountMax=4 -oConnectTimeout=$PODLAB_SSH_CONNECT_TIMEOUT_S (30)
#   --watch             when the slice was preempted or went through maintenance (or the run died
#                       another way than exit 2 or 3), wait until it is READY and relaunch: the run
#                       resumes from its last checkpoint
#   --max-relaunches N  $PODLAB_MAX_RELAUNCHES (5): --watch gives up after N relaunches
#   --include PATH      also ship PATH (a file or folder of the checkout that git does not track;
#                       repeatable): only what git tracks is shipped otherwise
#   --stop-tpu-holders  stop the processes that are not podlab's but hold the TPU on a worker (they
#                       are listed, and the launch stops before starting, without it)
#   --dry-run           run the checks of step 0, then print the gcloud commands (one per line,
#                       shell-quoted) and run nothing
#   EXPERIMENT ARGS     appended to the command on every worker (after --config and --workdir)
#
# Local python: $PYTHON, default .venv/bin/python (`make venv`), for the checks of step 0.
#
# What starting does, in order (steps 1-4 each a `gcloud compute tpus tpu-vm` command):
#   0. checks here, before any gcloud TPU call: the module's file exists; for a podlab program
#      (experiments/common/entry.py) `python -m M --check_only --config=C --workdir=W ARGS`: the config
#      loads with its overrides and passes the experiment's checks; the module's and the config's
#      files are shipped. A failure: one line naming the fix, exit 2, nothing copied or started.
#      The code is packed (launch/pack.py): the files git tracks, as they are in the work tree now
#      (deleted ones left out), plus each --include PATH; it prints what it ships that git does not
#      track; symlinks are never followed, and one pointing out of the checkout is not shipped.
#   1. describe NAME: the slice must be READY (--watch waits for it); its worker count.
#   2. copies the code to every worker (`scp --worker=all`).
#   3. `ssh --worker=all`: refusing while a podlab run is alive there, stops podlab's own stale
#      processes holding the TPU (sudo lsof; other holders are listed and stop the launch unless
#      --stop-tpu-holders); unpacks the code into ~/podlab (the previous copy: ~/podlab.old); sets up
#      the pinned environment (launch/worker.sh setup; only when pyproject.toml or constraints.txt
#      changed; one setup at a time).
#   4. `ssh --worker=all`: starts `python -m M --config=C --workdir=W ARGS` on every worker through
#      launch/worker.sh run: its own session and process group, run id, pid file, log on the worker
#      (~/podlab-logs/<run id>/worker-<i>.log), so ssh dying does not touch it. The same connection
#      then streams the logs here (`[worker <i>]`, copied to the local log dir) until the run ends.
#      A gcloud retry of that command (gcloud re-runs it after an ssh failure) attaches to the run.
# Ctrl-C detaches (the run goes on) and prints how to re-attach. A lost connection triggers a status
# check on the workers, then a re-attach: never a stop. Fail-fast: when a worker's run exits with an
# error (not 0, 130 or 143), every worker's run is stopped and this script exits 1 naming the worker
# and its log. Exit 0 when every worker finished with exit code 0; 2 for bad input; 130 after Ctrl-C.
#
# Arguments are passed to the workers single-quoted: spaces, quotes, `$(...)` or `;` in names or
# arguments reach the experiment literally and never run as commands. Names are validated.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
GCLOUD="${GCLOUD:-gcloud}"
SSH_TIMEOUT_S="${PODLAB_SSH_TIMEOUT_S:-300}"            # status, logs and other short commands
SCP_TIMEOUT_S="${PODLAB_SCP_TIMEOUT_S:-900}"
PREPARE_TIMEOUT_S="${PODLAB_PREPARE_TIMEOUT_S:-3600}"   # a first setup installs jax[tpu]
KEEPALIVE_S="${PODLAB_SSH_KEEPALIVE_S:-30}"
CONNECT_TIMEOUT_S="${PODLAB_SSH_CONNECT_TIMEOUT_S:-30}"
RECONNECT_TRIES="${PODLAB_RECONNECT_TRIES:-5}"
RECONNECT_DELAY_S="${PODLAB_RECONNECT_DELAY_S:-30}"
REATTACH_MAX="${PODLAB_REATTACH_MAX:-20}"
WATCH_POLL_S="${PODLAB_WATCH_POLL_S:-60}"
WATCH_MAX_WAIT_S="${PODLAB_WATCH_MAX_WAIT_S:-86400}"
FAILFAST_GRACE_S="${PODLAB_STOP_GRACE_S:-10}"
FORMAT="value(state,acceleratorType,networkEndpoints.len())"

die() { echo "pod.sh: error: $*" >&2; exit 2; }
say() { echo "pod.sh: $*"; }
warn() { echo "pod.sh: $*" >&2; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

# POSIX single-quoting: the remote shell sees exactly one word with this content.
q() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }

# One command line, each argument shell-quoted only when it needs it (copy-pasteable).
show() {
  local a out=""
  for a in "$@"; do
    if [[ "$a" =~ ^[-A-Za-z0-9_./:=,@%+]+$ ]]; then out+="$a "
    elif [[ "$a" =~ ^(--[a-z-]+=)(.*)$ ]]; then out+="${BASH_REMATCH[1]}$(q "${BASH_REMATCH[2]}") "
    else out+="$(q "$a") "; fi
  done
  echo "${out% }"
}

# --------------------------------------------------------------------------------------------------
# Arguments

SUBCOMMANDS=" status logs attach stop "
name="" sub="" zone="${PODLAB_ZONE:-}" project="${PODLAB_PROJECT:-}" bucket="${PODLAB_BUCKET:-}"
workdir="" data_dir="" module="experiments.trm.main" config="configs/v4_64.py" python=""
log_dir="" dry_run=0 internal_ip=0 watch=0 max_relaunches="${PODLAB_MAX_RELAUNCHES:-5}"
follow=0 lines="" worker="" grace="" gcloud_flags=() user_ssh_flags=() used=() includes=()
stop_tpu_holders=0
zone_given=0 project_given=0
[[ -n "$zone" ]] && zone_given=1
[[ -n "$project" ]] && project_given=1

set_opt() {  # FLAG VALUE
  case "$1" in
    --zone) zone="$2"; zone_given=1 ;;
    --project) project="$2"; project_given=1 ;;
    --bucket) bucket="$2" ;;
    --workdir) workdir="$2" ;;
    --data_dir|--data-dir) data_dir="$2" ;;
    --module) module="$2" ;;
    --config) config="$2" ;;
    --python) python="$2" ;;
    --log-dir) log_dir="$2" ;;
    --gcloud-flag) gcloud_flags+=("$2") ;;
    --ssh-flag) user_ssh_flags+=("$2") ;;
    --include) includes+=(--include "$2"); used+=(--include) ;;
    --max-relaunches) max_relaunches="$2"; used+=(--max-relaunches) ;;
    --worker) worker="$2"; used+=(--worker) ;;
    --grace) grace="$2"; used+=(--grace) ;;
    -n|--lines) lines="$2"; used+=(-n) ;;
    *) die "unknown option '$1' (see launch/pod.sh --help; experiment args go after --)" ;;
  esac
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run|--dry_run) dry_run=1; used+=(--dry-run); shift ;;
    --watch) watch=1; used+=(--watch); shift ;;
    --internal-ip) internal_ip=1; shift ;;
    --stop-tpu-holders) stop_tpu_holders=1; used+=(--stop-tpu-holders); shift ;;
    -f|--follow) follow=1; used+=(-f); shift ;;
    --zone|--project|--bucket|--workdir|--data_dir|--data-dir|--module|--config|--python|--log-dir|\
--gcloud-flag|--ssh-flag|--include|--max-relaunches|--worker|--grace|-n|--lines)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      set_opt "$1" "$2"; shift 2 ;;
    --*=*) set_opt "${1%%=*}" "${1#*=}"; shift ;;
    --) shift; break ;;
    -*) die "unknown option '$1' (see launch/pod.sh --help; experiment args go after --)" ;;
    *)
      if [[ -z "$name" ]]; then
        name="$1"
      elif [[ -z "$sub" ]]; then
        [[ "$SUBCOMMANDS" == *" $1 "* ]] || die "unknown subcommand '$1' after the TPU name '$name': \
expected status, logs, attach or stop (nothing starts a run); experiment args go after --"
        sub="$1"
      else
        die "unexpected argument '$1' (the subcommand is already '$sub'; experiment args go after --)"
      fi
      shift ;;
  esac
done
extra_args=("$@")
sub="${sub:-start}"

[[ -n "$name" ]] || { usage >&2; die "missing the TPU name, e.g. launch/pod.sh stable-1"; }
[[ "$name" =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] \
  || die "TPU name '$name' is not a valid Cloud TPU name (lowercase letters, digits, '-')"
for opt in "${used[@]+"${used[@]}"}"; do
  case "$opt:$sub" in
    -f:logs|-n:logs|--worker:logs|--worker:status|--grace:stop|--watch:start|--max-relaunches:start|\
--dry-run:start|--include:start|--stop-tpu-holders:start) ;;
    *) die "option $opt does not apply to \`${sub}\` (see launch/pod.sh --help)" ;;
  esac
done
[[ "$sub" == start || ${#extra_args[@]} -eq 0 ]] \
  || die "experiment args (${extra_args[*]}) only apply when starting a run, not to \`$sub\`"
[[ -z "$worker" || "$worker" == all || "$worker" =~ ^[0-9]+$ ]] \
  || die "--worker '$worker' is not a worker index: pass --worker=K with K a number (0 is the first worker) or --worker=all"
[[ -z "$grace" || "$grace" =~ ^[0-9]+$ ]] || die "--grace '$grace' is not a number of seconds"
[[ -z "$lines" || "$lines" =~ ^[0-9]+$ ]] || die "-n '$lines' is not a number of lines"
[[ "$max_relaunches" =~ ^[0-9]+$ ]] \
  || die "--max-relaunches '$max_relaunches' is not a count (flag --max-relaunches or PODLAB_MAX_RELAUNCHES)"
[[ "$module" =~ ^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$ ]] \
  || die "--module '$module' is not a Python module name like experiments.trm.main"
[[ -z "$python" || "$python" == /* ]] \
  || die "--python '$python' is not an absolute path: it names an interpreter on the workers, e.g. /usr/bin/python3.11"

have_gcloud() { command -v "$GCLOUD" >/dev/null 2>&1; }
require_gcloud() {
  have_gcloud || die "'$GCLOUD' not found: install the Google Cloud SDK (https://cloud.google.com/sdk/docs/install), \
then run gcloud auth login (or set GCLOUD to its path)"
}
gcloud_config() {  # KEY: gcloud's configured value, empty when unset
  local v
  v="$("$GCLOUD" config get "$1" 2>/dev/null)" || v="$("$GCLOUD" config get-value "$1" 2>/dev/null)"
  printf '%s' "$v" | tail -n 1
}
if [[ -z "$zone" ]]; then
  have_gcloud || die "no zone: pass --zone Z or set PODLAB_ZONE ('$GCLOUD', whose default zone \
would be used, is not installed)"
  zone="$(gcloud_config compute/zone)"
  [[ -n "$zone" ]] || die "no zone: pass --zone Z, set PODLAB_ZONE, or set gcloud's default zone \
(gcloud config set compute/zone us-central2-b)"
fi
if [[ -z "$project" ]] && have_gcloud; then project="$(gcloud_config core/project)"; fi
[[ "$zone" =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] \
  || die "--zone '$zone' is not a zone name like us-central2-b (flag --zone, PODLAB_ZONE or gcloud's compute/zone)"
[[ -z "$project" || "$project" =~ ^([a-z0-9.-]+:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$ ]] \
  || die "--project '$project' is not a project id (flag --project, PODLAB_PROJECT or gcloud's core/project)"

tpu_args=(--zone="$zone")
[[ -n "$project" ]] && tpu_args+=(--project="$project")
conn_args=("${tpu_args[@]}")
(( internal_ip )) && conn_args+=(--internal-ip)
conn_args+=("${gcloud_flags[@]+"${gcloud_flags[@]}"}")
ssh_opts=("-oServerAliveInterval=$KEEPALIVE_S" "-oServerAliveCountMax=4" "-oConnectTimeout=$CONNECT_TIMEOUT_S")
ssh_args=() scp_args=()
for o in "${ssh_opts[@]}" "${user_ssh_flags[@]+"${user_ssh_flags[@]}"}"; do ssh_args+=(--ssh-flag="$o"); done
for o in "${ssh_opts[@]}"; do scp_args+=(--scp-flag="$o"); done

# The flags a copy-pasted follow-up command needs (what gcloud's defaults do not give).
again=""
(( zone_given )) && again+=" --zone=$zone"
(( project_given )) && again+=" --project=$project"
(( internal_ip )) && again+=" --internal-ip"
for o in "${gcloud_flags[@]+"${gcloud_flags[@]}"}"; do again+=" --gcloud-flag=$(q "$o")"; done
later() { echo "launch/pod.sh $name $1$again"; }

# --------------------------------------------------------------------------------------------------
# gcloud

# Runs CMD...; after T seconds (0: no limit) SIGTERM, 10 s later SIGKILL. Returns CMD's status, 124
# when it timed out.
run_with_timeout() {
  local t="$1"; shift
  if (( t <= 0 )); then "$@"; return; fi
  local start=$SECONDS pid rc
  "$@" &
  pid=$!
  echo "$pid" >> "$scratch/pids"     # a background command ignores Ctrl-C: on_interrupt ends it
  ( n=0
    while kill -0 "$pid" 2>/dev/null; do
      if (( n >= t * 5 )); then kill -TERM "$pid"; sleep 10; kill -KILL "$pid"; exit 0; fi
      sleep 0.2; n=$((n + 1))
    done ) >/dev/null 2>&1 &
  wait "$pid"; rc=$?
  if (( rc > 128 && SECONDS - start >= t )); then
    warn "'$(show "${@:1:6}") ...' timed out after $t s"
    rc=124
  fi
  return "$rc"
}

gc_ssh() {  # WORKER TIMEOUT COMMAND
  run_with_timeout "$2" "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker="$1" "${conn_args[@]}" \
    "${ssh_args[@]}" --command="$3"
}

state="" accel="" num_workers=""
describe() {  # sets state, accel, num_workers; 1 when describe failed ($describe_err has why)
  local info
  describe_err=""
  if ! info="$(run_with_timeout 120 "$GCLOUD" compute tpus tpu-vm describe "$name" "${tpu_args[@]}" \
                 --format="$FORMAT" 2>&1 >"$scratch/describe.out")"; then
    describe_err="$info"
    return 1
  fi
  read -r state accel num_workers < "$scratch/describe.out"
  [[ "$num_workers" =~ ^[1-9][0-9]*$ ]] || { describe_err="unexpected describe output: $(cat "$scratch/describe.out")"; return 1; }
}

describe_or_die() {
  describe || { printf '%s\n' "$describe_err" >&2; die "cannot describe TPU '$name' in zone $zone\
${project:+ of project $project}; check the name, --zone and --project (gcloud compute tpus tpu-vm list --zone=$zone)"; }
}

check_worker_flag() {
  [[ -z "$worker" || "$worker" == all ]] && return 0
  (( worker < num_workers )) || die "--worker '$worker': TPU '$name' has workers 0..$((num_workers - 1)); \
pass --worker=K with K in 0..$((num_workers - 1)), or --worker=all"
}

require_ready() {
  [[ "$state" == READY ]] || { echo "pod.sh: TPU '$name' is $state, not READY: its workers cannot be reached" >&2; exit 1; }
}

scratch="$(mktemp -d "${TMPDIR:-/tmp}/podlab-pod.XXXXXX")" || die "cannot create a temporary folder"
trap 'rm -rf "$scratch"' EXIT

# --------------------------------------------------------------------------------------------------
# The commands run on the workers

if [[ -n "$python" ]]; then
  remote_python="$(q "$python")"; setup_args=" --python $(q "$python")"
else
  remote_python='"$HOME"/podlab-venv/bin/python'; setup_args=""
fi
with_worker() {  # WORKER.SH ARGS: run ~/podlab/launch/worker.sh when the code is there
  echo "if [ -f podlab/launch/worker.sh ]; then cd podlab && exec bash launch/worker.sh $1; \
else echo \"PODLAB_STATUS worker=? state=nocode host=\$(hostname)\"; echo \"no podlab code in ~/podlab on \$(hostname)\" >&2; exit 1; fi"
}
prepare_flags=""
(( stop_tpu_holders )) && prepare_flags=" --stop-others"
prepare_cmd="set -e; cd; rm -rf podlab.new; mkdir podlab.new; tar -xzf podlab-code.tgz -C podlab.new; \
exec bash podlab.new/launch/worker.sh prepare$prepare_flags$setup_args"
status_cmd="$(with_worker status)"
stop_cmd() {  # GRACE [RUN_ID] [--by-user]
  with_worker "stop --grace $1${2:+ --run-id $(q "$2")}${3:+ $3}"
}
run_cmd() {  # ATTEMPT REMOTE_LOG_DIR
  local c="cd ~/podlab && exec bash launch/worker.sh run --run-id $run_id --attempt $1 --log-dir ~/$2 \
--detach --follow --numbered -- env TFDS_DATA_DIR=$(q "$data_dir") $remote_python -m $module \
$(q "--config=$config") $(q "--workdir=$workdir")" a
  for a in "${extra_args[@]+"${extra_args[@]}"}"; do c+=" $(q "$a")"; done
  echo "$c"
}
attach_cmd() {  # ATTEMPT FROM_LIST
  with_worker "attach --run-id $run_id --attempt $1 --follow --numbered --from $2"
}

# --------------------------------------------------------------------------------------------------
# Following a run: the merged output of `gcloud ssh --worker=all`

exits=""     # the exit records of this invocation: "<phase> <attempt> <worker> <rc> [stopped]"

count_lines() { if [[ -f "$1" ]]; then wc -l < "$1" | tr -d ' '; else echo 0; fi; }

# Reads gcloud's merged output: `[worker <i> <n>] line` is line n of worker i's run log: shown once
# (a re-attach or a gcloud retry repeats lines) and appended to MIRROR/worker-<i>.log; `[worker <i>]`
# lines (setup) go to MIRROR/<phase>-worker-<i>.log; exit lines are recorded in $exits. The first
# failure of a run (exit code not 0, 130 or 143) stops every worker's run (fail-fast).
monitor() {
  local phase="$1" attempt="$2" mirror="$3" line w n text rc got=() stopped=0
  for ((w = 0; w < num_workers; w++)); do got[w]="$(count_lines "$mirror/worker-$w.log")"; done
  while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" =~ ^\[worker\ ([0-9]+)\ ([0-9]+)\]\ ?(.*)$ ]]; then
      w="${BASH_REMATCH[1]}"; n="${BASH_REMATCH[2]}"; text="${BASH_REMATCH[3]}"
      if (( n > ${got[w]:-0} )); then
        printf '%s\n' "$text" >> "$mirror/worker-$w.log"
        got[w]="$n"
        printf '[worker %s] %s\n' "$w" "$text"
      fi
      continue
    fi
    if [[ "$line" =~ ^\[worker\ ([0-9]+)\]\ ?(.*)$ ]]; then
      printf '%s\n' "${BASH_REMATCH[2]}" >> "$mirror/$phase-worker-${BASH_REMATCH[1]}.log"
    elif [[ "$line" =~ PODLAB_WORKER_EXIT\ worker=([0-9]+)\ rc=([^ ]+) ]]; then
      w="${BASH_REMATCH[1]}"; rc="${BASH_REMATCH[2]}"
      if ! grep -q "^$phase $attempt $w " "$exits"; then
        echo "$phase $attempt $w $rc$([[ "$line" == *stopped_by_user=1* ]] && echo " stopped")" >> "$exits"
        if [[ "$phase" == run && "$rc" != 0 && "$rc" != 130 && "$rc" != 143 && $stopped == 0 ]]; then
          stopped=1
          warn "worker $w failed (exit $rc); stopping the run on every worker"
          gc_ssh all $((FAILFAST_GRACE_S + SSH_TIMEOUT_S)) "$(stop_cmd "$FAILFAST_GRACE_S" "$run_id")" \
            >> "$mirror/stop.log" 2>&1 &
        fi
      fi
    elif [[ "$line" =~ PODLAB_WORKER_REFUSED\ worker=([0-9]+)\ running=([^ ]+)\ attempt=([^ ]+) ]]; then
      grep -q "^$phase $attempt ${BASH_REMATCH[1]} " "$exits" \
        || echo "$phase $attempt ${BASH_REMATCH[1]} refused:${BASH_REMATCH[2]}:${BASH_REMATCH[3]}" >> "$exits"
    fi
    printf '%s\n' "$line"
  done
  wait
}

exit_of() {  # PHASE ATTEMPT WORKER: "<rc> [stopped]" or nothing
  awk -v p="$1" -v a="$2" -v w="$3" '$1 == p && $2 == a && $3 == w { $1 = $2 = $3 = ""; sub(/^ +/, ""); print; exit }' "$exits"
}
missing_workers() {  # PHASE ATTEMPT
  local w
  for ((w = 0; w < num_workers; w++)); do [[ -n "$(exit_of "$1" "$2" "$w")" ]] || echo "$w"; done
}

# Asks every worker for its run's status; fills st_state/st_run/st_attempt/st_rc/st_pid/st_step/
# st_last (arrays by worker). Returns 1 unless every worker answered.
query_status() {
  local line w i
  st_state=() st_run=() st_attempt=() st_rc=() st_pid=() st_step=() st_last=() st_stopped=()
  gc_ssh "${1:-all}" "$SSH_TIMEOUT_S" "$status_cmd" > "$scratch/status.out" 2>&1
  while IFS= read -r line; do
    [[ "$line" =~ ^PODLAB_STATUS\ worker=([0-9]+)\ state=([^ ]+)\ run=([^ ]+)\ attempt=([^ ]+)\ pid=([^ ]+)\ rc=([^ ]+)\ step=([^ ]+)\ stopped=([^ ]+)\ log=([^ ]*)\ last=(.*)$ ]] || continue
    w="${BASH_REMATCH[1]}"
    st_state[w]="${BASH_REMATCH[2]}"; st_run[w]="${BASH_REMATCH[3]}"; st_attempt[w]="${BASH_REMATCH[4]}"
    st_pid[w]="${BASH_REMATCH[5]}"; st_rc[w]="${BASH_REMATCH[6]}"; st_step[w]="${BASH_REMATCH[7]}"
    st_stopped[w]="${BASH_REMATCH[8]}"; st_last[w]="${BASH_REMATCH[10]}"
  done < "$scratch/status.out"
  if [[ "${1:-all}" == all ]]; then
    for ((i = 0; i < num_workers; i++)); do [[ -n "${st_state[i]:-}" ]] || return 1; done
  else
    [[ -n "${st_state[$1]:-}" ]] || return 1
  fi
  return 0
}

print_status() {  # the table of query_status' answers
  local w from=0 to=$((num_workers - 1)) alive rc quiet=()
  if [[ -n "$worker" && "$worker" != all ]]; then from="$worker"; to="$worker"; fi
  printf '%-6s  %-24s  %-7s  %-8s  %-5s  %-12s  %-6s  %s\n' worker run attempt pid alive exit step "last log line"
  for ((w = from; w <= to; w++)); do
    if [[ -z "${st_state[w]:-}" ]]; then
      printf '%-6s  %s\n' "$w" "no answer (ssh failed: see below)"
      continue
    fi
    case "${st_state[w]}" in running) alive=yes ;; none) alive=- ;; *) alive=no ;; esac
    [[ "${st_state[w]}" == none ]] && st_last[w]="(no podlab run recorded on this worker)"
    rc="${st_rc[w]}"
    [[ "${st_state[w]}" == lost ]] && rc="lost"
    [[ "${st_stopped[w]}" == 1 ]] && rc+=" (stop)"
    printf '%-6s  %-24s  %-7s  %-8s  %-5s  %-12s  %-6s  %s\n' "$w" "${st_run[w]}" "${st_attempt[w]}" \
      "${st_pid[w]}" "$alive" "$rc" "${st_step[w]}" "${st_last[w]:0:100}"
    if (( w > 0 )) && [[ "${st_step[w]}" == - && "${st_step[0]:--}" != - && "${st_run[w]}" == "${st_run[0]}" \
          && "${st_attempt[w]}" == "${st_attempt[0]}" ]]; then
      quiet+=("$w")
    fi
  done
  if (( ${#quiet[@]} )); then
    echo "(step -: worker(s) ${quiet[*]} log no training progress of their own; process 0 logs it for the whole run)"
  fi
}

# The line counts of the local copies of the workers' logs, as `--from 0:N0,1:N1,...`.
from_list() {
  local w out=""
  for ((w = 0; w < num_workers; w++)); do out+="${out:+,}$w:$(count_lines "$1/worker-$w.log")"; done
  echo "$out"
}

outcome="" bad_worker="" bad_rc="" bad_stopped=""
# Follows run attempt A (KIND start: starts it first) until every worker reported its exit, with
# status checks and re-attaches when the connection is lost. Sets outcome: ok | failed (bad_worker,
# bad_rc) | refused | preempted (the slice is not READY) | unreachable.
follow_run() {  # KIND ATTEMPT MIRROR REMOTE_LOG_DIR
  local kind="$1" a="$2" mirror="$3" rdir="$4" rc tries=0 reattaches=0 w missing running
  local cmd
  if [[ "$kind" == start ]]; then cmd="$(run_cmd "$a" "$rdir")"; else cmd="$(attach_cmd "$a" "$(from_list "$mirror")")"; fi
  gc_ssh all 0 "$cmd" 2>&1 | monitor run "$a" "$mirror"
  rc=${PIPESTATUS[0]}
  while :; do
    missing=($(missing_workers run "$a"))
    (( ${#missing[@]} == 0 )) && break
    warn "no exit report from worker(s) ${missing[*]} (gcloud exit code $rc): the connection was lost;" \
         "checking the run's status on the workers (the run is not stopped)"
    if query_status; then
      tries=0 running=()
      for w in "${missing[@]}"; do
        if [[ "${st_run[w]}" != "$run_id" || "${st_attempt[w]}" != "$a" ]]; then
          warn "worker $w: its current run is ${st_run[w]} attempt ${st_attempt[w]}, not $run_id attempt $a"
          echo "run $a $w lost" >> "$exits"
        elif [[ "${st_state[w]}" == running ]]; then
          running+=("$w")
        else
          local r="${st_rc[w]}"
          [[ "${st_state[w]}" == lost || "$r" == - ]] && r=lost
          warn "worker $w: run $run_id attempt $a ended while disconnected (exit code $r)"
          echo "run $a $w $r$([[ "${st_stopped[w]}" == 1 ]] && echo " stopped")" >> "$exits"
        fi
      done
      (( ${#running[@]} == 0 )) && continue
      if (( reattaches++ >= REATTACH_MAX )); then outcome=unreachable; return; fi
      say "run $run_id attempt $a is still running on worker(s) ${running[*]}; re-attaching"
      gc_ssh all 0 "$(attach_cmd "$a" "$(from_list "$mirror")")" 2>&1 | monitor run "$a" "$mirror"
      rc=${PIPESTATUS[0]}
    else
      if describe && [[ "$state" == READY ]]; then
        if (( tries++ >= RECONNECT_TRIES )); then outcome=unreachable; return; fi
        warn "could not reach every worker; asking again in $RECONNECT_DELAY_S s ($tries of $RECONNECT_TRIES)"
        sleep "$RECONNECT_DELAY_S"
      else
        outcome=preempted
        [[ -n "$describe_err" ]] && state="not found"
        return
      fi
    fi
  done
  outcome=ok bad_worker="" bad_rc="" bad_stopped=""
  local line p at rest
  while read -r p at w rest; do        # the first failure in arrival order is the cause
    [[ "$p" == run && "$at" == "$a" ]] || continue
    rc="${rest%% *}"
    [[ "$rc" == 0 ]] && continue
    if [[ "$rc" == refused:* ]]; then outcome=refused; bad_worker="$w"; bad_rc="$rc"; return; fi
    if [[ -z "$bad_worker" ]]; then
      outcome=failed bad_worker="$w" bad_rc="$rc"
      [[ "$rest" == *stopped* ]] && bad_stopped=1
    fi
  done < "$exits"
}

# The highest checkpoint step that the local copies of the workers' logs in MIRROR name (the
# trainer's "checkpoint N saved" at a preemption, "checkpointing: saving step N"), or nothing.
last_checkpoint() {  # MIRROR
  cat "$1"/worker-*.log 2>/dev/null | grep -aoE 'checkpoint [0-9]+ saved|checkpointing: saving step [0-9]+' \
    | grep -oE '[0-9]+' | sort -n | tail -n 1
}
checkpoint_phrase() {  # MIRROR
  local step
  step="$(last_checkpoint "$1")"
  if [[ -n "$step" ]]; then
    echo "its last checkpoint is step $step (the last one its logs name), in $workdir"
  else
    echo "its logs here name no checkpoint of this attempt; $workdir holds any it saved"
  fi
}

# The rest of attempt A's worker logs into MIRROR, after the connection dropped before their end
# (a preemption): their lines after those copied here, as `attach` gives them.
fetch_tail() {  # ATTEMPT MIRROR
  say "fetching the rest of run $run_id attempt $1's worker logs (the connection dropped before their end)"
  gc_ssh all "$SSH_TIMEOUT_S" "$(attach_cmd "$1" "$(from_list "$2")")" 2>&1 | monitor tail "$1" "$2" \
    | grep -v '^PODLAB_WORKER_EXIT'
  return 0
}

report_failure() {  # MIRROR REMOTE_LOG_DIR
  local mirror="$1" rdir="$2"
  case "$outcome" in
    refused)
      local other="${bad_rc#refused:}"
      warn "FAILED (run): worker $bad_worker already runs run ${other%%:*} attempt ${other##*:};" \
           "nothing was started. Fix: follow it ($(later attach)) or stop it ($(later stop))" ;;
    failed)
      if [[ -n "$bad_stopped" ]]; then
        warn "run $run_id was stopped by its user (exit $bad_rc on worker $bad_worker)"
      else
        warn "FAILED (run): worker $bad_worker exited with code $bad_rc; the other workers were stopped."
      fi
      warn "its log: $mirror/worker-$bad_worker.log (on the worker: ~/$rdir/worker-$bad_worker.log)"
      [[ -f "$mirror/worker-$bad_worker.log" ]] && tail -n 15 "$mirror/worker-$bad_worker.log" | sed 's/^/    /' >&2 ;;
    preempted)
      warn "the slice $name is ${state:-unreachable} (preempted or in maintenance): run $run_id ended" \
           "with it; $(checkpoint_phrase "$mirror")" ;;
    unreachable)
      warn "could not reach the workers of $name: run $run_id may still be going." \
           "Check with $(later status); follow with $(later attach)" ;;
  esac
}

phase_now=""
on_interrupt() {
  trap - INT TERM
  local p
  if [[ -f "$scratch/pids" ]]; then
    while read -r p; do kill -TERM "$p" 2>/dev/null; done < "$scratch/pids"
  fi
  echo >&2
  case "$phase_now" in
    run|watch)
      warn "detached: run $run_id goes on on the workers (Ctrl-C does not stop it)."
      warn "  follow it again: $(later attach)"
      warn "  its status:      $(later status)"
      warn "  stop it:         $(later stop)"
      (( watch )) && warn "  (the --watch relaunching ended with this pod.sh)" ;;
    attach|logs)
      warn "detached; the run goes on on the workers. Stop it with $(later stop)" ;;
    *)
      warn "interrupted before the run started; nothing was started on the workers" ;;
  esac
  exit 130
}
trap on_interrupt INT TERM

# --------------------------------------------------------------------------------------------------
# Subcommands

cmd_status() {
  require_gcloud
  describe_or_die
  check_worker_flag
  echo "TPU $name: $state, $accel, $num_workers workers, zone $zone"
  require_ready
  local ok=0
  query_status "${worker:-all}" || ok=1
  print_status
  if (( ok )); then
    grep -v '^PODLAB_STATUS' "$scratch/status.out" | tail -n 20 >&2
  fi
  return "$ok"
}

cmd_logs() {
  require_gcloud
  describe_or_die
  check_worker_flag
  require_ready
  local w="${worker:-all}" args=""
  (( follow )) && args+=" -f"
  [[ -n "$lines" ]] && args+=" -n $lines"
  [[ "$w" == all ]] && args+=" --prefix"
  phase_now=logs
  local t="$SSH_TIMEOUT_S"
  (( follow )) && t=0
  gc_ssh "$w" "$t" "$(with_worker "logs$args")"
}

# The run on the workers now (from worker 0's status): sets run_id and cur_attempt.
current_run() {
  query_status || { grep -v '^PODLAB_STATUS' "$scratch/status.out" | tail -n 20 >&2; print_status >&2; \
    echo "pod.sh: could not ask every worker of $name for its run" >&2; exit 1; }
  local w
  for ((w = 0; w < num_workers; w++)); do
    if [[ "${st_state[w]}" != "${st_state[0]}" || "${st_run[w]}" != "${st_run[0]}" || "${st_attempt[w]}" != "${st_attempt[0]}" ]]; then
      warn "the workers disagree (worker $w: run ${st_run[w]} attempt ${st_attempt[w]}, worker 0: run" \
           "${st_run[0]} attempt ${st_attempt[0]}); following worker 0's"
      break
    fi
  done
  [[ "${st_state[0]}" != none ]] || { echo "pod.sh: no podlab run recorded on $name" >&2; exit 1; }
  run_id="${st_run[0]}" cur_attempt="${st_attempt[0]}"
}

cmd_attach() {
  require_gcloud
  describe_or_die
  require_ready
  current_run
  local base="${log_dir:-$REPO/logs/pod/$name/$run_id}" mirror rdir
  mirror="$base"; rdir="podlab-logs/$run_id"
  if (( cur_attempt > 0 )); then mirror="$base/relaunch-$cur_attempt"; rdir+="/relaunch-$cur_attempt"; fi
  mkdir -p "$mirror" || die "cannot create the log dir $mirror"
  exits="$scratch/exits"; : > "$exits"
  say "following run $run_id attempt $cur_attempt on $name ($num_workers workers); log copies in $mirror"
  phase_now=attach
  follow_run attach "$cur_attempt" "$mirror" "$rdir"
  if [[ "$outcome" == ok ]]; then
    say "run $run_id attempt $cur_attempt finished on all $num_workers workers (exit code 0)"
    return 0
  fi
  report_failure "$mirror" "$rdir"
  return 1
}

cmd_stop() {
  require_gcloud
  describe_or_die
  require_ready
  local g="${grace:-120}"
  say "stopping the podlab run on every worker of $name: SIGTERM (the trainer saves a checkpoint and exits), SIGKILL after $g s"
  phase_now=stop
  gc_ssh all $((g + SSH_TIMEOUT_S)) "$(stop_cmd "$g" "" --by-user)" 2>&1 | grep -v '^PODLAB_STATUS'
  local rc=${PIPESTATUS[0]}
  query_status && print_status
  return "$rc"
}

# Waits until the slice is READY (polling describe); gives up on states it does not leave by itself.
wait_ready() {
  local start=$SECONDS last=""
  while :; do
    if describe; then
      [[ "$state" == READY ]] && return 0
      case "$state" in
        STOPPING|STOPPED|DELETING|TERMINATED|HIDDEN)
          warn "FAILED: the slice $name is $state: it does not come back by itself; start or recreate it, then rerun"
          exit 1 ;;
      esac
    else
      state="not found"
    fi
    [[ "$state" != "$last" ]] && say "the slice $name is $state; waiting until it is READY (every $WATCH_POLL_S s, up to $WATCH_MAX_WAIT_S s)"
    last="$state"
    if (( SECONDS - start >= WATCH_MAX_WAIT_S )); then
      warn "FAILED: $name was not READY within $WATCH_MAX_WAIT_S s (PODLAB_WATCH_MAX_WAIT_S)"
      exit 1
    fi
    sleep "$WATCH_POLL_S"
  done
}

# Step 0 (see the header): everything that can be checked here, before any gcloud TPU call; packs
# the code into OUT (nothing written without OUT: the dry run). Dies (exit 2) with one line.
preship() {  # [OUT]
  local py="${PYTHON:-$REPO/.venv/bin/python}" mod_file="" cand out rc line requires=() pack_out
  for cand in "${module//.//}.py" "${module//.//}/__main__.py"; do
    if [[ -f "$REPO/$cand" ]]; then mod_file="$cand"; break; fi
  done
  [[ -n "$mod_file" ]] || die "--module '$module': there is no ${module//.//}.py (nor \
${module//.//}/__main__.py) in $REPO. Fix: pass the module that runs the experiment, e.g. experiments.trm.main"
  requires=(--require "$mod_file")
  if grep -qE '\bentry\.run(_program)?\(' "$REPO/$mod_file"; then
    [[ -x "$py" ]] || die "the config is checked here before anything is shipped, with $py, which is \
missing. Fix: make venv (or set PYTHON to an interpreter with the pinned stack)"
    out="$(cd "$REPO" && JAX_PLATFORMS=cpu "$py" -m "$module" --check_only "--config=$config" \
             "--workdir=$workdir" "${extra_args[@]+"${extra_args[@]}"}" 2>&1)"; rc=$?
    if (( rc != 0 )); then
      line="$(grep -a '^error: ' <<<"$out" | tail -n 1)"
      [[ -n "$line" ]] || line="$(grep -av '^[[:space:]]*$' <<<"$out" | tail -n 1)"
      (( rc == 2 )) && die "checked before shipping (nothing was copied or started): ${line#error: }"
      die "checking the config here failed (exit $rc; nothing was copied or started): $line. Fix: \
run \`cd $REPO && $py -m $module --check_only --config=$config\` to see why; a local environment \
without the pinned stack: make venv, or set PYTHON"
    fi
    line="$(sed -n 's/^config ok: //p' <<<"$out" | tail -n 1)"
    [[ -n "$line" ]] && requires+=(--require "$line")
    say "checked here: --config=$config loads with the experiment args and passes $module's checks"
  else
    say "--module $module does not run through experiments/common/entry.py: its arguments are not checked here"
  fi
  local pack_py=("$py")
  [[ -x "$py" ]] || pack_py=(python3)
  if ! pack_out="$("${pack_py[@]}" "$REPO/launch/pack.py" "$REPO" ${1:+--out "$1"} \
                   "${includes[@]+"${includes[@]}"}" "${requires[@]}" 2>&1)"; then
    die "$(tail -n 1 <<<"$pack_out")"
  fi
  sed 's/^/pod.sh: code: /' <<<"$pack_out"
}

cmd_start() {
  local config_name
  config_name="$(basename "${config%%:*}" .py)"
  if [[ -z "$workdir" || -z "$data_dir" ]]; then
    [[ -n "$bucket" ]] || die "no bucket: pass --bucket B (or set PODLAB_BUCKET) for the default \
gs://B/podlab/... workdir and data dir, or give both --workdir and --data_dir"
    bucket="${bucket#gs://}"; bucket="${bucket%/}"
    [[ "$bucket" =~ ^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$ ]] \
      || die "--bucket '$bucket' is not a bucket name (lowercase letters, digits, '-', '_', '.')"
    if [[ -z "$workdir" ]]; then
      workdir="gs://$bucket/podlab/$name/$config_name"
      # Other experiment args, another run: its own workdir (the same args resume the same one).
      if (( ${#extra_args[@]} )); then
        local h
        h="$(printf '%s\0' "${extra_args[@]}" | { sha256sum 2>/dev/null || shasum -a 256; } | cut -c1-8)"
        workdir+="-$h"
      fi
    fi
    data_dir="${data_dir:-gs://$bucket/podlab/tfds}"
  fi
  run_id="$(date -u +%Y%m%d-%H%M%S)-$(printf '%04x' $((RANDOM % 65536)))"
  log_dir="${log_dir:-$REPO/logs/pod/$name/$run_id}"

  # 0. The checks here, and the code packed, before any gcloud TPU call.
  phase_now=check
  if (( dry_run )); then
    preship
    echo "# launch/pod.sh --dry-run: the commands it would run (TensorBoard: tensorboard --logdir $workdir)"
    show "$GCLOUD" compute tpus tpu-vm describe "$name" "${tpu_args[@]}" --format="$FORMAT"
    echo "# packs the code above (launch/pack.py $(q "$REPO")${includes[*]+ ${includes[*]}}) into $(q "$log_dir/podlab-code.tgz")"
    show "$GCLOUD" compute tpus tpu-vm scp "$log_dir/podlab-code.tgz" "$name:podlab-code.tgz" \
      --worker=all "${conn_args[@]}" "${scp_args[@]}"
    show "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker=all "${conn_args[@]}" "${ssh_args[@]}" --command="$prepare_cmd"
    show "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker=all "${conn_args[@]}" "${ssh_args[@]}" \
      --command="$(run_cmd 0 "podlab-logs/$run_id")"
    echo "# $(later status), $(later attach), $(later stop) run:"
    show "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker=all "${conn_args[@]}" "${ssh_args[@]}" --command="$status_cmd"
    show "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker=all "${conn_args[@]}" "${ssh_args[@]}" \
      --command="$(attach_cmd 0 "0:0")"
    show "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker=all "${conn_args[@]}" "${ssh_args[@]}" \
      --command="$(stop_cmd 120 "" --by-user)"
    exit 0
  fi

  preship "$scratch/podlab-code.tgz"
  require_gcloud

  # 1. The slice.
  phase_now=describe
  describe_or_die
  if [[ "$state" != READY ]]; then
    (( watch )) || die "TPU '$name' is $state, not READY; wait for it or recreate it (--watch waits)"
    wait_ready
  fi
  mkdir -p "$log_dir" || die "cannot create the log dir $log_dir"
  log_dir="$(cd "$log_dir" && pwd)"
  exits="$log_dir/exits"
  : > "$exits"
  echo "pod.sh: $name: $accel, $num_workers workers, zone $zone; run $run_id; logs in $log_dir"
  echo "pod.sh: workdir $workdir, TFDS data $data_dir"
  echo "pod.sh: TensorBoard: tensorboard --logdir $workdir"

  # 2. The code, packed once (step 0): every relaunch runs the same code.
  mv -f "$scratch/podlab-code.tgz" "$log_dir/podlab-code.tgz" || die "cannot write $log_dir/podlab-code.tgz"

  local attempt=0 relaunches=0 mirror rdir
  while :; do
    mirror="$log_dir" rdir="podlab-logs/$run_id"
    if (( attempt > 0 )); then mirror="$log_dir/relaunch-$attempt"; rdir+="/relaunch-$attempt"; fi
    mkdir -p "$mirror"
    outcome=""
    phase_now=copy
    echo "pod.sh: copying the code ($(du -h "$log_dir/podlab-code.tgz" | cut -f1)) to every worker"
    if ! run_with_timeout "$SCP_TIMEOUT_S" "$GCLOUD" compute tpus tpu-vm scp "$log_dir/podlab-code.tgz" \
         "$name:podlab-code.tgz" --worker=all "${conn_args[@]}" "${scp_args[@]}"; then
      if (( watch )) && describe && [[ "$state" != READY ]]; then outcome=preempted
      else die "copying the code to the workers failed (gcloud scp); nothing was started"; fi
    fi

    # 3. Unpack, stop stale TPU holders, set up the environment.
    if [[ -z "$outcome" ]]; then
      phase_now=prepare
      echo "pod.sh: preparing every worker (unpack, stop stale TPU processes, environment)"
      gc_ssh all "$PREPARE_TIMEOUT_S" "$prepare_cmd" 2>&1 | monitor prepare "$attempt" "$mirror"
      local prc=${PIPESTATUS[0]} w bad="" missing=()
      for ((w = 0; w < num_workers; w++)); do
        local e; e="$(exit_of prepare "$attempt" "$w")"
        if [[ -z "$e" ]]; then missing+=("$w")
        elif [[ "${e%% *}" != 0 && -z "$bad" ]]; then bad="$w ${e%% *}"; fi
      done
      if [[ -n "$bad" ]]; then
        read -r w prc <<<"$bad"
        if [[ "$prc" == refused:* ]]; then
          local other="${prc#refused:}"
          warn "FAILED (prepare): worker $w still runs run ${other%%:*} attempt ${other##*:}; nothing was" \
               "started. Fix: follow it ($(later attach)) or stop it ($(later stop)), then relaunch"
        else
          warn "FAILED (prepare): worker $w exited with code $prc; the run was not started."
          warn "its output: $mirror/prepare-worker-$w.log"
          [[ -f "$mirror/prepare-worker-$w.log" ]] && tail -n 15 "$mirror/prepare-worker-$w.log" | sed 's/^/    /' >&2
        fi
        exit 1
      fi
      if (( ${#missing[@]} )); then
        if (( watch )) && describe && [[ "$state" != READY ]]; then outcome=preempted
        else
          warn "FAILED (prepare): no exit report from worker(s) ${missing[*]} (gcloud exit code $prc):" \
               "the ssh connection or the VM failed; nothing was started; see $mirror"
          exit 1
        fi
      fi
    fi

    # 4. Run, detached, and follow it.
    if [[ -z "$outcome" ]]; then
      phase_now=run
      echo "pod.sh: starting run $run_id attempt $attempt on every worker (detached: Ctrl-C leaves it" \
           "running): python -m $module --config=$config --workdir=$workdir ${extra_args[*]+${extra_args[*]}}"
      follow_run start "$attempt" "$mirror" "$rdir"
    fi
    phase_now=watch
    case "$outcome" in
      ok)
        echo "pod.sh: all $num_workers workers finished run $run_id (attempt $attempt); logs in $log_dir"
        echo "pod.sh: TensorBoard: tensorboard --logdir $workdir"
        exit 0 ;;
      refused|unreachable)
        report_failure "$mirror" "$rdir"; exit 1 ;;
      failed)
        report_failure "$mirror" "$rdir"
        (( watch )) || exit 1
        if [[ -n "$bad_stopped" ]]; then warn "stopped by its user: --watch does not relaunch it"; exit 1; fi
        if [[ "$bad_rc" == 2 || "$bad_rc" == 3 ]]; then
          warn "exit $bad_rc is not a preemption (2: bad input, 3: non-finite training): --watch does not relaunch it"
          exit 1
        fi ;;
      preempted)
        report_failure "$mirror" "$rdir"
        if (( ! watch )); then
          warn "when it is READY again, rerun this command to resume from that checkpoint (--watch does it by itself)"
          exit 1
        fi ;;
    esac
    if (( relaunches >= max_relaunches )); then
      warn "FAILED: --watch gave up after $relaunches relaunches (--max-relaunches $max_relaunches)"
      exit 1
    fi
    relaunches=$((relaunches + 1)) attempt=$((attempt + 1))
    say "relaunch $relaunches of at most $max_relaunches: once $name is READY, run $run_id resumes from its last checkpoint"
    wait_ready
    if [[ "$outcome" == preempted ]]; then
      fetch_tail "$((attempt - 1))" "$mirror"
      say "run $run_id attempt $((attempt - 1)): $(checkpoint_phrase "$mirror")"
    fi
  done
}

case "$sub" in
  start) cmd_start ;;
  status) cmd_status ;;
  logs) cmd_logs ;;
  attach) cmd_attach ;;
  stop) cmd_stop ;;
esac
