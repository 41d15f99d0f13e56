"""What every part of launch/pod.py shares: its settings from the environment, its output (each line
`pod.sh: ...`), how it ends (Exit, Interrupted), and shell quoting. Standard library only.
"""
import getpass
import os
import re
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ENV = os.environ
GCLOUD = ENV.get("GCLOUD", "gcloud")
SSH_TIMEOUT_S = int(ENV.get("PODLAB_SSH_TIMEOUT_S", "300"))        # status, logs, short commands
SCP_TIMEOUT_S = int(ENV.get("PODLAB_SCP_TIMEOUT_S", "900"))
PREPARE_TIMEOUT_S = int(ENV.get("PODLAB_PREPARE_TIMEOUT_S", "3600"))  # a first setup installs jax
KEEPALIVE_S = ENV.get("PODLAB_SSH_KEEPALIVE_S", "30")
CONNECT_TIMEOUT_S = ENV.get("PODLAB_SSH_CONNECT_TIMEOUT_S", "30")
RECONNECT_TRIES = int(ENV.get("PODLAB_RECONNECT_TRIES", "5"))
RECONNECT_DELAY_S = float(ENV.get("PODLAB_RECONNECT_DELAY_S", "30"))
REATTACH_MAX = int(ENV.get("PODLAB_REATTACH_MAX", "20"))
WATCH_POLL_S = float(ENV.get("PODLAB_WATCH_POLL_S", "60"))
WATCH_MAX_WAIT_S = float(ENV.get("PODLAB_WATCH_MAX_WAIT_S", "86400"))
FAILFAST_GRACE_S = int(ENV.get("PODLAB_STOP_GRACE_S", "10"))
GCLOUD_TRIES = int(ENV.get("PODLAB_GCLOUD_TRIES", "3"))
GCLOUD_RETRY_S = float(ENV.get("PODLAB_GCLOUD_RETRY_S", "10"))
FORMAT = "value(state,acceleratorType,networkEndpoints.len())"
BAD_INPUT = re.compile(r"NOT_FOUND|was not found|PERMISSION_DENIED|INVALID_ARGUMENT")
CONNECTION_FAILED = re.compile(r"^##### Command execution on worker (\d+) failed with exit status")
ALL = "all"


class Exit(Exception):
  """Ends pod.sh with `code` (the message is printed already)."""

  def __init__(self, code):
    super().__init__(code)
    self.code = code


class Interrupted(BaseException):
  """Ctrl-C or SIGTERM."""


def emit(stream, text):
  """TEXT and a newline on STREAM (undecodable bytes as they came), flushed."""
  stream.buffer.write(text.encode(errors="surrogateescape") + b"\n")
  stream.flush()


def say(text):
  emit(sys.stdout, f"pod.sh: {text}")


def warn(text):
  emit(sys.stderr, f"pod.sh: {text}")


def die(text, code=2):
  warn(f"error: {text}")
  raise Exit(code)


def q(s):
  """POSIX single-quoting: the remote shell sees exactly one word with this content."""
  return "'" + str(s).replace("'", "'\\''") + "'"


def show(args):
  """One command line, each argument shell-quoted only when it needs it (copy-pasteable)."""
  out = []
  for a in map(str, args):
    m = re.fullmatch(r"(--[a-z-]+=)(.*)", a, re.S)
    if re.fullmatch(r"[-A-Za-z0-9_./:=,@%+]+", a):
      out.append(a)
    elif m:
      out.append(m.group(1) + q(m.group(2)))
    else:
      out.append(q(a))
  return " ".join(out)


def shell_rc(rc):
  """A child's exit status as a shell reports it (a signal N: 128 + N)."""
  return 128 - rc if rc is not None and rc < 0 else rc


def who():
  user = re.sub(r"[^A-Za-z0-9._-]", "_", getpass.getuser() or "user")
  return f"{user}@{re.sub(r'[^A-Za-z0-9._-]', '_', socket.gethostname())}"
