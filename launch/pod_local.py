"""The launcher's state on this machine (LocalState, a part of launch/pod.py's Pod): the stop
requests a --watch here honours, and the --watch launches running here.
"""
import glob
import os
import time

from pod_common import ENV, who
from worker_common import identity, is_process


class LocalState:
  """Stop requests and --watch registrations under $PODLAB_STATE_HOME (default
  ~/.local/state/podlab), a part of pod.Pod."""

  def local_dir(self):
    base = ENV.get("PODLAB_STATE_HOME") or os.path.join(
        ENV.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"),
        "podlab")
    return os.path.join(base, "pod", self.o.project or "-", self.o.zone, self.o.name)

  def record_local_stop(self):
    os.makedirs(self.local_dir(), exist_ok=True)
    path = os.path.join(self.local_dir(), "stop-request")
    with open(path + ".tmp", "w") as f:
      f.write(f"{time.time():.6f} {who()}\n")
    os.replace(path + ".tmp", path)

  def local_stop_after(self, t0):
    """The local stop request (time, by) when it is newer than t0, else None."""
    try:
      with open(os.path.join(self.local_dir(), "stop-request")) as f:
        at, by = f.read().split()[:2]
    except (OSError, ValueError):
      return None
    return (float(at), by) if float(at) > t0 else None

  def register_watch(self):
    os.makedirs(self.local_dir(), exist_ok=True)
    self.watch_file = os.path.join(self.local_dir(), f"watch-{os.getpid()}")
    with open(self.watch_file, "w") as f:
      f.write(f"{self.run_id} {identity(os.getpid())}\n")

  def local_watches(self):
    """[(run id, pid)] of the --watch launches of this slice alive on this machine."""
    found = []
    for path in glob.glob(os.path.join(self.local_dir(), "watch-*")):
      try:
        run_id, pid, start, boot = open(path).read().split()
      except (OSError, ValueError):
        continue
      if is_process(pid, start, boot):
        found.append((run_id, pid))
    return found
