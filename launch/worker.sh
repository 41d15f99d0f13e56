#!/usr/bin/env bash
# One worker of a podlab run (setup, prepare, run, attach, status, logs, stop, clean, tpu-pin):
# launch/worker.py, run with this machine's python3 (a TPU VM's own, before any venv exists). Its
# docstring is the manual; `exec` keeps this pid for the process that does the work, and worker.py
# puts back the PATH given here (an interpreter's shim, e.g. pyenv's, may change it).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for py in "${PODLAB_WORKER_PYTHON:-}" python3 /usr/bin/python3; do
  if [[ -n "$py" ]] && command -v "$py" >/dev/null 2>&1; then
    PODLAB_CALLER_PATH="$PATH" exec "$py" "$here/worker.py" "$@"
  fi
done
echo "worker.sh: error: no python3 on $(hostname): worker.py needs one (PODLAB_WORKER_PYTHON)" >&2
exit 2
