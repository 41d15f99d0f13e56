#!/usr/bin/env bash
# Start a podlab run on every worker of a Cloud TPU pod slice.
#
#   launch/pod.sh NAME [options] [-- EXPERIMENT ARGS]
#
#   launch/pod.sh stable-1 --bucket my-bucket                    # TRM v4_64 on the v4-64 "stable-1"
#   launch/pod.sh stable-1 --bucket my-bucket -- --config.lr=3e-4
#   launch/pod.sh stable-1 --bucket my-bucket --dry-run          # print the gcloud commands only
#
# Options (flag, or environment variable, default):
#   --zone Z        $PODLAB_ZONE     us-central2-b (the zone of v4 slices)
#   --project P     $PODLAB_PROJECT  gcloud's configured project (`gcloud config get-value project`)
#   --bucket B      $PODLAB_BUCKET   none; needed unless --workdir and --data_dir are both given
#   --workdir W     gs://B/podlab/NAME/<config name>: checkpoints, TensorBoard, results. The same
#                   command resumes from it, so relaunching continues a preempted run.
#   --data_dir D    gs://B/podlab/tfds: the TFDS data dir (TFDS_DATA_DIR on the workers). Prepare
#                   the dataset into it once from any machine: python -m input_pipeline.prepare ...
#   --module M      experiments.trm.main
#   --config C      configs/v4_64.py (resolved inside the experiment's folder)
#   --python PATH   an interpreter already on the workers with the pinned stack; setup then only
#                   checks the versions instead of creating ~/podlab-venv
#   --log-dir L     logs/pod/NAME/<date-time> here: worker-<i>.log per worker, the code archive
#   --dry-run       print the gcloud commands (one per line, shell-quoted) and run nothing
#   EXPERIMENT ARGS appended to the command on every worker (after --config and --workdir)
#
# What it does, in order (each a `gcloud compute tpus tpu-vm` command):
#   1. describe NAME: the slice must exist and be READY; gives the accelerator type and worker count.
#   2. packs the code (git's tracked and untracked-but-not-ignored files, so uncommitted edits go
#      too) and copies it to every worker (`scp --worker=all`).
#   3. on every worker (`ssh --worker=all`): unpacks it into ~/podlab (the previous copy is kept as
#      ~/podlab.old), stops stale podlab/TPU processes, sets up the pinned environment idempotently
#      (launch/worker.sh setup: a venv with jax[tpu], reinstalled only when pyproject.toml or
#      constraints.txt change).
#   4. on every worker (`ssh --worker=all`): `python -m M --config=C --workdir=W ARGS` through
#      launch/worker.sh run, which logs to ~/podlab-logs/<run>/worker-<i>.log there; the output
#      streams here prefixed `[worker <i>]` and is split into the local per-worker logs.
# Fail-fast: when a worker's command exits non-zero, every worker's run is stopped
# (launch/worker.sh stop) and this script exits 1 naming the worker and its log. Ctrl-C stops the
# run on every worker too. Exit 0 when every worker finished with exit code 0.
#
# Arguments are passed to the workers single-quoted: spaces, quotes, `$(...)` or `;` in names or
# arguments reach the experiment literally and never run as commands. Names are validated.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
GCLOUD="${GCLOUD:-gcloud}"

die() { echo "pod.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,45p' "$0"; }

# POSIX single-quoting: the remote shell sees exactly one word with this content.
q() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }

name="" zone="${PODLAB_ZONE:-us-central2-b}" project="${PODLAB_PROJECT:-}" bucket="${PODLAB_BUCKET:-}"
workdir="" data_dir="" module="experiments.trm.main" config="configs/v4_64.py" python=""
log_dir="" dry_run=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run|--dry_run) dry_run=1; shift ;;
    --zone|--project|--bucket|--workdir|--data_dir|--data-dir|--module|--config|--python|--log-dir)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      case "$1" in
        --zone) zone="$2" ;; --project) project="$2" ;; --bucket) bucket="$2" ;;
        --workdir) workdir="$2" ;; --data_dir|--data-dir) data_dir="$2" ;; --module) module="$2" ;;
        --config) config="$2" ;; --python) python="$2" ;; --log-dir) log_dir="$2" ;;
      esac
      shift 2 ;;
    --zone=*) zone="${1#*=}"; shift ;;
    --project=*) project="${1#*=}"; shift ;;
    --bucket=*) bucket="${1#*=}"; shift ;;
    --workdir=*) workdir="${1#*=}"; shift ;;
    --data_dir=*|--data-dir=*) data_dir="${1#*=}"; shift ;;
    --module=*) module="${1#*=}"; shift ;;
    --config=*) config="${1#*=}"; shift ;;
    --python=*) python="${1#*=}"; shift ;;
    --log-dir=*) log_dir="${1#*=}"; shift ;;
    --) shift; break ;;
    -*) die "unknown option '$1' (see launch/pod.sh --help; experiment args go after --)" ;;
    *) [[ -z "$name" ]] || die "unexpected argument '$1' (the TPU name is already '$name'; \
experiment args go after --)"
       name="$1"; shift ;;
  esac
done
extra_args=("$@")

[[ -n "$name" ]] || { usage >&2; die "missing the TPU name, e.g. launch/pod.sh stable-1"; }
[[ "$name" =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] \
  || die "TPU name '$name' is not a valid Cloud TPU name (lowercase letters, digits, '-')"
[[ "$zone" =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] \
  || die "--zone '$zone' is not a zone name like us-central2-b (flag --zone or PODLAB_ZONE)"
[[ -z "$project" || "$project" =~ ^([a-z0-9.-]+:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$ ]] \
  || die "--project '$project' is not a project id (flag --project or PODLAB_PROJECT)"
[[ "$module" =~ ^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$ ]] \
  || die "--module '$module' is not a Python module name like experiments.trm.main"
config_name="$(basename "${config%%:*}" .py)"
if [[ -z "$workdir" || -z "$data_dir" ]]; then
  [[ -n "$bucket" ]] || die "no bucket: pass --bucket B (or set PODLAB_BUCKET) for the default \
gs://B/podlab/... workdir and data dir, or give both --workdir and --data_dir"
  bucket="${bucket#gs://}"; bucket="${bucket%/}"
  [[ "$bucket" =~ ^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$ ]] \
    || die "--bucket '$bucket' is not a bucket name (lowercase letters, digits, '-', '_', '.')"
  workdir="${workdir:-gs://$bucket/podlab/$name/$config_name}"
  data_dir="${data_dir:-gs://$bucket/podlab/tfds}"
fi

run_id="$(date +%Y%m%d-%H%M%S)"
log_dir="${log_dir:-$REPO/logs/pod/$name/$run_id}"
remote_log_dir="podlab-logs/$run_id"

tpu_args=(--zone="$zone")
[[ -n "$project" ]] && tpu_args+=(--project="$project")

# The worker's interpreter: --python, else the venv launch/worker.sh setup creates.
if [[ -n "$python" ]]; then
  remote_python="$(q "$python")"; setup_args=" --python $(q "$python")"
else
  remote_python='"$HOME"/podlab-venv/bin/python'; setup_args=""
fi

prepare_cmd="set -e; cd; rm -rf podlab.new; mkdir podlab.new; tar -xzf podlab-code.tgz -C podlab.new; \
exec bash podlab.new/launch/worker.sh prepare$setup_args"
run_cmd="cd ~/podlab && exec bash launch/worker.sh run --log-dir ~/$remote_log_dir --stream -- \
env TFDS_DATA_DIR=$(q "$data_dir") $remote_python -m $module $(q "--config=$config") \
$(q "--workdir=$workdir")"
for a in "${extra_args[@]+"${extra_args[@]}"}"; do run_cmd+=" $(q "$a")"; done
stop_cmd="if [ -f podlab/launch/worker.sh ]; then bash podlab/launch/worker.sh stop; fi"

ssh_all() { "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker=all "${tpu_args[@]}" --command="$1"; }

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

if (( dry_run )); then
  echo "# launch/pod.sh --dry-run: the commands it would run (TensorBoard: tensorboard --logdir $workdir)"
  show "$GCLOUD" compute tpus tpu-vm describe "$name" "${tpu_args[@]}" \
    --format="value(state,acceleratorType,networkEndpoints.len())"
  echo "(cd $(q "$REPO") && git ls-files -z -co --exclude-standard | tar --null -T - -czf $(q "$log_dir/podlab-code.tgz"))"
  show "$GCLOUD" compute tpus tpu-vm scp "$log_dir/podlab-code.tgz" "$name:podlab-code.tgz" \
    --worker=all "${tpu_args[@]}"
  show "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker=all "${tpu_args[@]}" --command="$prepare_cmd"
  show "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker=all "${tpu_args[@]}" --command="$run_cmd"
  echo "# on failure or Ctrl-C:"
  show "$GCLOUD" compute tpus tpu-vm ssh "$name" --worker=all "${tpu_args[@]}" --command="$stop_cmd"
  exit 0
fi

command -v "$GCLOUD" >/dev/null 2>&1 \
  || die "'$GCLOUD' not found: install the Google Cloud SDK (https://cloud.google.com/sdk) and log in"
mkdir -p "$log_dir" || die "cannot create the log dir $log_dir"
log_dir="$(cd "$log_dir" && pwd)"
exits="$log_dir/exits"
: > "$exits"

# 1. The slice.
if ! info="$("$GCLOUD" compute tpus tpu-vm describe "$name" "${tpu_args[@]}" \
               --format="value(state,acceleratorType,networkEndpoints.len())" 2>"$log_dir/describe.err")"; then
  cat "$log_dir/describe.err" >&2
  die "cannot describe TPU '$name' in zone $zone${project:+ of project $project}; check the name, \
--zone and --project (gcloud compute tpus tpu-vm list --zone=$zone)"
fi
read -r state accel num_workers <<<"$info"
[[ "$state" == READY ]] || die "TPU '$name' is $state, not READY; wait for it or recreate it"
[[ "$num_workers" =~ ^[1-9][0-9]*$ ]] || die "could not read the worker count of '$name' from '$info'"
echo "pod.sh: $name: $accel, $num_workers workers, zone $zone; run $run_id; logs in $log_dir"
echo "pod.sh: workdir $workdir, TFDS data $data_dir"
echo "pod.sh: TensorBoard: tensorboard --logdir $workdir"

# Reads gcloud's merged output: shows it, splits `[worker <i>] ` lines into per-worker logs, records
# `PODLAB_WORKER_EXIT` lines in $exits, and on the first failure of the run phase stops every worker.
monitor() {
  local phase="$1" line w stopped=0
  while IFS= read -r line; do
    if [[ "$line" =~ ^\[worker\ ([0-9]+)\]\ ?(.*)$ ]]; then
      printf '%s\n' "${BASH_REMATCH[2]}" >> "$log_dir/worker-${BASH_REMATCH[1]}.log"
    fi
    printf '%s\n' "$line"
    if [[ "$line" =~ PODLAB_WORKER_EXIT\ worker=([0-9]+)\ rc=([0-9]+) ]]; then
      w="${BASH_REMATCH[1]}"
      echo "$phase $w ${BASH_REMATCH[2]}" >> "$exits"
      if [[ "${BASH_REMATCH[2]}" != 0 && "$phase" == run && $stopped == 0 ]]; then
        stopped=1
        echo "pod.sh: worker $w failed (exit ${BASH_REMATCH[2]}); stopping the run on every worker" >&2
        ssh_all "$stop_cmd" > "$log_dir/stop.log" 2>&1 &
      fi
    fi
  done
  wait
}

interrupted() {
  echo "pod.sh: interrupted; stopping the run on every worker" >&2
  ssh_all "$stop_cmd" > "$log_dir/stop.log" 2>&1
  exit 130
}

# Checks that every worker reported exit code 0 for the phase; names the failed or silent ones.
check_phase() {
  local phase="$1" gcloud_rc="$2" i rc first_bad="" missing=()
  while read -r p i rc; do
    [[ "$p" == "$phase" && "$rc" != 0 && -z "$first_bad" ]] && first_bad="$i $rc"
  done < "$exits"
  for ((i = 0; i < num_workers; i++)); do
    grep -q "^$phase $i " "$exits" || missing+=("$i")
  done
  if [[ -n "$first_bad" ]]; then
    read -r i rc <<<"$first_bad"
    if [[ "$phase" == run ]]; then
      echo "pod.sh: FAILED (run): worker $i exited with code $rc; the other workers were stopped." >&2
    else
      echo "pod.sh: FAILED ($phase): worker $i exited with code $rc; the run was not started." >&2
    fi
    echo "pod.sh: its log: $log_dir/worker-$i.log (on the worker: ~/$remote_log_dir/worker-$i.log)" >&2
    [[ -f "$log_dir/worker-$i.log" ]] && tail -n 15 "$log_dir/worker-$i.log" | sed 's/^/    /' >&2
    exit 1
  fi
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "pod.sh: FAILED ($phase): no exit report from worker(s) ${missing[*]} (gcloud exit code \
$gcloud_rc): the ssh connection or the VM failed; see $log_dir" >&2
    ssh_all "$stop_cmd" > "$log_dir/stop.log" 2>&1
    exit 1
  fi
}

# 2. The code.
if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$REPO" && git ls-files -z -co --exclude-standard | tar --null -T - -czf "$log_dir/podlab-code.tgz") \
    || die "packing the code failed"
else
  tar -C "$REPO" --exclude=./.venv --exclude=./data --exclude=./workdirs --exclude=./logs \
    -czf "$log_dir/podlab-code.tgz" . || die "packing the code failed"
fi
echo "pod.sh: copying the code ($(du -h "$log_dir/podlab-code.tgz" | cut -f1)) to every worker"
"$GCLOUD" compute tpus tpu-vm scp "$log_dir/podlab-code.tgz" "$name:podlab-code.tgz" --worker=all \
  "${tpu_args[@]}" || die "copying the code to the workers failed (gcloud scp exit $?)"

trap interrupted INT TERM

# 3. Unpack, stop stale runs, set up the environment.
echo "pod.sh: preparing every worker (unpack, stop stale processes, environment)"
ssh_all "$prepare_cmd" 2>&1 | monitor prepare
check_phase prepare "${PIPESTATUS[0]}"

# 4. Run.
echo "pod.sh: starting on every worker: python -m $module --config=$config --workdir=$workdir ${extra_args[*]+${extra_args[*]}}"
ssh_all "$run_cmd" 2>&1 | monitor run
check_phase run "${PIPESTATUS[0]}"
echo "pod.sh: all $num_workers workers finished; logs in $log_dir"
echo "pod.sh: TensorBoard: tensorboard --logdir $workdir"
