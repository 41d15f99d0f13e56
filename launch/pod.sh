#!/usr/bin/env bash
# Runs podlab on every worker of a Cloud TPU pod slice: `launch/pod.sh NAME [options] [-- ARGS]`,
# `launch/pod.sh NAME status|logs|attach|stop`. The launcher is launch/pod.py (standard library
# only); `launch/pod.sh --help` prints its manual (docs/pod.md). Its Python: $PYTHON, else the
# checkout's .venv/bin/python (`make venv`), else python3.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-$here/../.venv/bin/python}"
[[ -x "$py" ]] || py="$(command -v python3)" \
  || { echo "pod.sh: error: no Python: make venv (or set PYTHON)" >&2; exit 2; }
exec "$py" "$here/pod.py" "$@"
