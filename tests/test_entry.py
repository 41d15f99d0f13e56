"""Every mistyped input to a podlab program is ONE line on stderr (the field or file, the value and
the fix) and exit code 2; programming errors keep their traceback. The real entry points run as
subprocesses, as a user types them."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(args, tmp_path, timeout=600):      # a hang guard: 121 s for one run with 0.15 of a CPU
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4 "
             + os.environ.get("PODLAB_TEST_XLA_OPT_FLAGS", ""))
  env.pop("PODLAB_VERBOSE", None)
  return subprocess.run([sys.executable, "-m"] + [str(a) for a in args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _one_line(proc) -> str:
  """The run's error line: exit code 2, exactly one `error:` line (the last one), no traceback.
  (A run that failed after it started has printed its progress lines before.)"""
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
  errors = [l for l in lines if l.startswith("error: ")]
  assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  return errors[0]


@pytest.mark.parametrize("arg, expect", [
    ("bath=6144", "did you mean 'batch'"),
    ("recipe=sudoku_mpl", "unknown recipe"),
    ("batch=abc", "expected an integer"),
])
def test_config_argument_typos(tmp_path, arg, expect):
  line = _one_line(_run(["experiments.trm.main", f"--config=configs/v4_64.py:{arg}",
                         f"--workdir={tmp_path / 'w'}"], tmp_path))
  assert expect in line and "Fix:" in line
  assert not (tmp_path / "w").exists()


def test_config_field_typo_names_the_closest_field(tmp_path):
  line = _one_line(_run(["experiments.trm.main", "--config=configs/cpu_demo.py:smoke",
                         "--config.lrr=0.1", f"--workdir={tmp_path / 'w'}"], tmp_path))
  assert "config.lrr" in line and "config.lr" in line
  assert not (tmp_path / "w").exists()


def test_the_misspelled_override_is_named_not_the_first_one(tmp_path):
  proc = _run(["experiments.trm.main", "--config=configs/cpu_demo.py:smoke",
               "--config.total_steps=9", "--config.lrr=0.1", f"--workdir={tmp_path / 'w'}"], tmp_path)
  line = _one_line(proc)
  assert [l for l in proc.stderr.splitlines() if l.strip()] == [line]
  assert line.startswith("error: --config.lrr: ") and "did you mean --config.lr?" in line, line
  assert "total_steps" not in line
  assert not (tmp_path / "w").exists()


def test_config_file_with_a_syntax_error(tmp_path):
  bad = tmp_path / "bad_config.py"
  bad.write_text("def get_config():\n  c = dict(\n  return c\n")
  line = _one_line(_run(["experiments.trm.main", f"--config={bad}"], tmp_path))
  assert f"{bad}:2:" in line and "'c = dict('" in line and "Fix:" in line


def test_a_missing_config_file(tmp_path):
  line = _one_line(_run(["experiments.trm.main", "--config=configs/nope.py"], tmp_path))
  assert "nope.py" in line and "not found" in line


@pytest.mark.slow    # make test: test_checkpointing's corrupt checkpoint, test_faults' truncated one
def test_a_corrupt_checkpoint_is_one_line_without_orbax_noise(tmp_path):
  workdir = tmp_path / "w"
  args = ["experiments.trm.main", "--config=configs/cpu_demo.py:smoke", f"--workdir={workdir}",
          f"--config.dataset.data_dir={tmp_path / 'tfds'}", "--config.total_steps=3"]
  first = _run(args, tmp_path, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  for path in (workdir / "checkpoints" / "3").rglob("*"):
    if path.is_file() and path.stat().st_size > 0 and "replicated" in str(path):
      path.write_bytes(b"\0" * path.stat().st_size)        # every replicated file zeroed
  line = _one_line(_run(args + ["--config.total_steps=6", "--config.allow_config_change=True"],
                        tmp_path, timeout=600))
  assert "checkpoint" in line and "restore_fallback" in line


def test_a_full_disk_names_the_workdir_and_the_intact_checkpoints(tmp_path):
  mount = tmp_path / "small"
  mount.mkdir()
  if shutil.which("mount") is None or subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)],
      capture_output=True).returncode != 0:
    pytest.skip("needs a small tmpfs (mount -t tmpfs: root in a namespace that allows it)")
  try:
    line = _one_line(_run(["experiments.trm.main", "--config=configs/cpu_demo.py:smoke",
                           f"--workdir={mount / 'w'}",
                           f"--config.dataset.data_dir={tmp_path / 'tfds'}"], tmp_path, timeout=600))
    assert str(mount / "w") in line and "no space left on the device" in line, line
    assert "no checkpoint was complete yet" in line and "Fix:" in line
  finally:
    subprocess.run(["umount", str(mount)], check=False)


def test_the_error_line_stays_last_when_a_background_thread_fails_after_it():
  """console.last_line: what a library's thread prints after the one-line error (orbax's async
  save failing a second time on a full disk) does not reach the console; verbose keeps it."""
  script = ("import os, sys, threading\n"
            "from experiments.common import console\n"
            "console.last_line('error: the disk is full. Fix: free space')\n"
            "t = threading.Thread(target=lambda: 1 / 0); t.start(); t.join()\n"
            "sys.stderr.write('Traceback (most recent call last): late\\n'); sys.stderr.flush()\n"
            "os.write(2, b'native late line\\n')\n"
            "sys.exit(2)\n")
  for verbose, expect_late in (("", False), ("1", True)):
    env = dict(os.environ, PODLAB_VERBOSE=verbose)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    if expect_late:
      assert "native late line" in proc.stderr and "ZeroDivisionError" in proc.stderr
    else:
      assert lines == ["error: the disk is full. Fix: free space"], proc.stderr


def test_a_programming_error_keeps_its_traceback(tmp_path):
  """Only podlab's error types become one line: a TypeError from a config keeps its traceback."""
  bad = tmp_path / "buggy_config.py"
  bad.write_text("def get_config():\n  return 1 + 'a'\n")
  proc = _run(["experiments.trm.main", f"--config={bad}"], tmp_path)
  assert proc.returncode != 0 and "Traceback" in proc.stderr and "TypeError" in proc.stderr


def test_a_run_imports_no_tools_module():
  """The entry point, the trainer, every experiment's train module and the generator load nothing
  of a tools wing (experiments/tools/, experiments/<name>/tools/); `--dry_run` loads the dry run
  on first use (entry.dry_run, a lazy module)."""
  script = ("import sys\n"
            "from experiments.common import entry, trainer\n"
            "from experiments.trm import train as t1\n"
            "from experiments.nanogpt import train as t2\n"
            "from experiments.diffucoder import train as t3, generate\n"
            "tools = lambda: sorted(m for m in sys.modules if m.startswith('experiments.') "
            "and 'tools' in m.split('.'))\n"
            "print(tools())\n"
            "entry.dry_run.resolve_target\n"
            "print(tools())\n")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                        timeout=180, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  before, after = proc.stdout.strip().splitlines()[-2:]
  assert before == "[]"
  assert after == str(["experiments.tools", "experiments.tools.dry_run"]
                      + [f"experiments.tools.tpu_{m}"
                         for m in ("compile", "cost", "fit", "report", "target")])
