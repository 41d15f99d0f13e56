"""launch/pod.sh's command line: the options, which subcommand each applies to, and their
validation (one line and exit 2 for bad input; `--help` prints the manual, launch/pod.py's
docstring).
"""
import re
import sys

from pod_common import ALL, ENV, Exit, die

SUBCOMMANDS = ("status", "logs", "attach", "stop")

VALUE_OPTS = {"--zone", "--project", "--bucket", "--workdir", "--data_dir", "--data-dir",
              "--module", "--config", "--python", "--log-dir", "--gcloud-flag", "--ssh-flag", "--include",
              "--max-relaunches", "--worker", "--grace", "-n", "--lines", "--lost-after"}
APPLIES = {"-f": ("logs",), "-n": ("logs",), "--worker": ("logs", "status"), "--grace": ("stop",),
           "--watch": ("start",), "--max-relaunches": ("start",), "--dry-run": ("start",),
           "--include": ("start",), "--stop-tpu-holders": ("start",),
           "--lost-after": ("start", "attach")}


class Options:
  """The command line, validated (bash's rules and messages); MANUAL is what --help prints."""

  def __init__(self, argv, manual):
    self.manual = manual
    self.name = self.sub = ""
    self.zone, self.project = ENV.get("PODLAB_ZONE", ""), ENV.get("PODLAB_PROJECT", "")
    self.zone_given, self.project_given = bool(self.zone), bool(self.project)
    self.bucket = ENV.get("PODLAB_BUCKET", "")
    self.workdir = self.data_dir = self.python = self.log_dir = self.worker = self.grace = ""
    self.lines = ""
    self.module, self.config = "experiments.trm.main", "configs/v4_64.py"
    self.dry_run = self.internal_ip = self.watch = self.follow = self.stop_tpu_holders = False
    self.max_relaunches = ENV.get("PODLAB_MAX_RELAUNCHES", "5")
    self.lost_after = ENV.get("PODLAB_LOST_AFTER_S", "120")
    self.gcloud_flags, self.ssh_flags, self.includes, used = [], [], [], []
    args = list(argv)
    while args:
      a = args.pop(0)
      if a in ("-h", "--help"):
        print(self.manual.rstrip())
        raise Exit(0)
      if a in ("--dry-run", "--dry_run"):
        self.dry_run = True
        used.append("--dry-run")
      elif a == "--watch":
        self.watch = True
        used.append(a)
      elif a == "--internal-ip":
        self.internal_ip = True
      elif a == "--stop-tpu-holders":
        self.stop_tpu_holders = True
        used.append(a)
      elif a in ("-f", "--follow"):
        self.follow = True
        used.append("-f")
      elif a in VALUE_OPTS:
        if not args:
          die(f"{a} needs a value")
        used += self._set(a, args.pop(0))
      elif a.startswith("--") and "=" in a:
        used += self._set(*a.split("=", 1))
      elif a == "--":
        break
      elif a.startswith("-"):
        die(f"unknown option '{a}' (see launch/pod.sh --help; experiment args go after --)")
      elif not self.name:
        self.name = a
      elif not self.sub:
        if a not in SUBCOMMANDS:
          die(f"unknown subcommand '{a}' after the TPU name '{self.name}': expected status, logs, "
              "attach or stop (nothing starts a run); experiment args go after --")
        self.sub = a
      else:
        die(f"unexpected argument '{a}' (the subcommand is already '{self.sub}'; experiment args "
            "go after --)")
    self.extra = args
    self.sub = self.sub or "start"
    self._validate(used)

  def _set(self, flag, value):
    simple = {"--zone": "zone", "--project": "project", "--bucket": "bucket",
              "--workdir": "workdir", "--data_dir": "data_dir", "--data-dir": "data_dir",
              "--module": "module", "--config": "config", "--python": "python",
              "--log-dir": "log_dir"}
    if flag in simple:
      setattr(self, simple[flag], value)
      if flag in ("--zone", "--project"):
        setattr(self, flag[2:] + "_given", True)
      return []
    if flag == "--gcloud-flag":
      self.gcloud_flags.append(value)
    elif flag == "--ssh-flag":
      self.ssh_flags.append(value)
    elif flag == "--include":
      self.includes.append(value)
    elif flag in ("--max-relaunches", "--worker", "--grace", "--lost-after"):
      setattr(self, flag[2:].replace("-", "_"), value)
    elif flag in ("-n", "--lines"):
      self.lines = value
      return ["-n"]
    else:
      die(f"unknown option '{flag}' (see launch/pod.sh --help; experiment args go after --)")
    return [flag] if flag not in ("--gcloud-flag", "--ssh-flag") else []

  def _validate(self, used):
    if not self.name:
      print(self.manual.rstrip(), file=sys.stderr)
      die("missing the TPU name, e.g. launch/pod.sh stable-1")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", self.name):
      die(f"TPU name '{self.name}' is not a valid Cloud TPU name (lowercase letters, digits, '-')")
    for opt in used:
      if self.sub not in APPLIES.get(opt, ()):
        die(f"option {opt} does not apply to `{self.sub}` (see launch/pod.sh --help)")
    if self.sub != "start" and self.extra:
      die(f"experiment args ({' '.join(self.extra)}) only apply when starting a run, not to "
          f"`{self.sub}`")
    if self.worker and self.worker != ALL and not self.worker.isdigit():
      die(f"--worker '{self.worker}' is not a worker index: pass --worker=K with K a number (0 is "
          "the first worker) or --worker=all")
    if self.grace and not self.grace.isdigit():
      die(f"--grace '{self.grace}' is not a number of seconds")
    if self.lines and not self.lines.isdigit():
      die(f"-n '{self.lines}' is not a number of lines")
    if not self.max_relaunches.isdigit():
      die(f"--max-relaunches '{self.max_relaunches}' is not a count (flag --max-relaunches or "
          "PODLAB_MAX_RELAUNCHES)")
    if not re.fullmatch(r"\d+(\.\d+)?", self.lost_after):
      die(f"--lost-after '{self.lost_after}' is not a number of seconds (flag --lost-after or "
          "PODLAB_LOST_AFTER_S)")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", self.module):
      die(f"--module '{self.module}' is not a Python module name like experiments.trm.main")
    if self.python and not self.python.startswith("/"):
      die(f"--python '{self.python}' is not an absolute path: it names an interpreter on the "
          "workers, e.g. /usr/bin/python3.11")
