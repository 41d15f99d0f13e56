"""The shell one-liners pod.sh sends to the workers (RemoteCommands, a part of launch/pod.py's
Pod): claim and release in worker 0's journal, launch/worker.sh's prepare, run, attach, status and
stop, every argument single-quoted.
"""

from pod_common import q, who


class RemoteCommands:
  """The commands run on the workers, a part of pod.Pod (uses o, run_id, claimed_at, config_sent,
  alive_every)."""

  def with_worker(self, args):
    """WORKER.SH ARGS from ~/podlab (a link to the current run's code) when the code is there."""
    return ("if [ -f podlab/launch/worker.sh ]; then cd podlab && exec bash launch/worker.sh "
            f"{args}; else echo \"PODLAB_STATUS worker=? state=nocode host=$(hostname)\"; "
            "echo \"no podlab code in ~/podlab on $(hostname)\" >&2; exit 1; fi")

  def remote_python(self):
    return q(self.o.python) if self.o.python else '"$HOME"/podlab-venv/bin/python'

  def claim_cmd(self, attempt):
    return ("cd && mkdir -p .podlab && printf 'claim %s %s %s %s\\n' "
            f"{self.run_id} {attempt} \"$(date +%s.%N)\" {who()} >> .podlab/journal && "
            "if [ -f podlab/launch/worker.py ]; then exec bash podlab/launch/worker.sh claim "
            f"--run-id {self.run_id}; else echo PODLAB_JOURNAL; cat .podlab/journal; fi")

  def release_cmd(self, attempt):
    return ("cd && printf 'release %s %s %s\\n' "
            f"{self.run_id} {attempt} \"$(date +%s.%N)\" >> .podlab/journal")

  def prepare_cmd(self, attempt):
    setup = f" --python {q(self.o.python)}" if self.o.python else ""
    holders = " --stop-others" if self.o.stop_tpu_holders else ""
    new = f"podlab-runs/{self.run_id}.new"
    return (f"set -e; cd; mkdir -p podlab-runs; rm -rf {new}; mkdir {new}; tar -xzf "
            f"podlab-code-{self.run_id}.tgz -C {new}; exec bash {new}/launch/worker.sh prepare "
            f"--run-id {self.run_id} --attempt {attempt} --claimed-at {self.claimed_at_arg()}"
            f"{setup}{holders}")

  def claimed_at_arg(self):
    return f"{self.claimed_at:.6f}" if self.claimed_at is not None else "CLAIMED_AT"

  def run_cmd(self, attempt, rdir):
    o = self.o
    cmd = (f"cd ~/podlab-runs/{self.run_id} && exec bash launch/worker.sh run --run-id "
           f"{self.run_id} --attempt {attempt} --claimed-at {self.claimed_at_arg()} --log-dir "
           f"~/{rdir} --detach --follow --numbered --alive-every {self.alive_every:g} -- env "
           f"TFDS_DATA_DIR={q(o.data_dir)} {self.remote_python()} -m {o.module} "
           f"{q('--config=' + self.config_sent)} {q('--workdir=' + o.workdir)}")
    return cmd + "".join(" " + q(a) for a in o.extra)

  def attach_cmd(self, attempt, from_list):
    return self.with_worker(f"attach --run-id {self.run_id} --attempt {attempt} --follow "
                            f"--numbered --from {from_list} --alive-every {self.alive_every:g}")

  def stop_cmd(self, grace, run_id="", attempt=None, by_user=False):
    args = f"stop --grace {grace} --by {who()}"
    if run_id:
      args += f" --run-id {q(run_id)} --attempt {attempt}"
    if by_user:
      args += " --by-user"
    if not by_user:
      return self.with_worker(args)
    # A slice that never had podlab code: the stop request still goes into the journal.
    return ("cd && if [ -f podlab/launch/worker.sh ]; then cd podlab && exec bash launch/worker.sh "
            f"{args}; else mkdir -p .podlab && printf 'stop %s %s\\n' \"$(date +%s.%N)\" {who()} "
            ">> .podlab/journal && echo \"no podlab code in ~/podlab on $(hostname): nothing to "
            "stop; the stop request is recorded (a launch being shipped now will not start)\"; fi")
