"""The shared writer of the docs' generated tables (experiments/tools/doc_tables.py): a block is
replaced between its markers, merged by key with each row's run kept, written atomically, refused
when a marker is missing or repeated; the provenance line names command, commit, machine and date.
"""

import os
import re
import subprocess

import pytest

from experiments.tools import doc_tables

BEGIN, END = doc_tables.markers("demo", "`python -m demo --write_docs`")
COLS = ["variant", "ms"]


def _doc(tmp_path, body="old text"):
  path = tmp_path / "bench.txt"
  path.write_text(f"# Title\n\nprose\n{BEGIN}\n{body}\n{END}\nafter\n")
  return path


def test_write_replaces_the_block_and_names_command_commit_machine_date(tmp_path):
  path = _doc(tmp_path)
  rows = [{"variant": "a", "ms": "1.0"}, {"variant": "b", "ms": "2.5"}]
  doc_tables.write_table(str(path), "demo", "`python -m demo --write_docs`",
                         command="python -m demo --x=1", columns=COLS, rows=rows, note="a note")
  text = path.read_text()
  assert text.startswith("# Title\n\nprose\n") and text.endswith(f"{END}\nafter\n")
  assert "old text" not in text
  assert doc_tables.parse_table(text, BEGIN, END) == rows
  line = doc_tables.block(text, BEGIN, END).strip().splitlines()[0]
  m = re.fullmatch(r"Written by `python -m demo --x=1` at (\S+) on (.+), (\d{4}-\d\d-\d\d)\. a note",
                   line)
  assert m, line
  assert re.fullmatch(r"([0-9a-f]{7,}(\+dirty)?|unknown)", m.group(1))
  assert "usable cores" in m.group(2) and "native bfloat16" in m.group(2)
  assert re.search(r", load \d+\.\d$", m.group(2))
  assert [p.name for p in tmp_path.iterdir()] == ["bench.txt"]        # no temporary file left


def test_merge_by_key_keeps_each_rows_run(tmp_path):
  text = f"x\n{BEGIN}\n{END}\n"
  one = doc_tables.describe_run("cmd one", date="2030-01-01")
  two = doc_tables.describe_run("cmd two", date="2030-01-02")
  text = doc_tables.update(text, BEGIN, END, COLS, [{"variant": "a", "ms": "1"},
                                                    {"variant": "b", "ms": "2"}], one, key=["variant"])
  assert "run" not in doc_tables.parse_table(text, BEGIN, END)[0]      # one run: no run column
  text = doc_tables.update(text, BEGIN, END, COLS, [{"variant": "b", "ms": "3"},
                                                    {"variant": "c", "ms": "4"}], two, key=["variant"])
  assert doc_tables.parse_table(text, BEGIN, END) == [
      {"variant": "a", "ms": "1", "run": "1"}, {"variant": "b", "ms": "3", "run": "2"},
      {"variant": "c", "ms": "4", "run": "2"}]
  content = doc_tables.block(text, BEGIN, END)
  assert "run 1: `cmd one`" in content and "run 2: `cmd two`" in content
  # a third run that replaces every row of run 1 drops its line, and the rest are renumbered
  three = doc_tables.describe_run("cmd three", date="2030-01-03")
  text = doc_tables.update(text, BEGIN, END, COLS, [{"variant": "a", "ms": "5"}], three,
                           key=["variant"])
  content = doc_tables.block(text, BEGIN, END)
  assert "cmd one" not in content and "run 1: `cmd three`" in content
  assert "run 2: `cmd two`" in content
  assert [r["run"] for r in doc_tables.parse_table(text, BEGIN, END)] == ["1", "2", "2"]
  # without a key the run replaces the whole block
  text = doc_tables.update(text, BEGIN, END, COLS, [{"variant": "z", "ms": "9"}], one)
  assert doc_tables.parse_table(text, BEGIN, END) == [{"variant": "z", "ms": "9"}]
  assert "cmd two" not in text


def test_missing_or_repeated_markers_are_refused_and_the_file_is_kept(tmp_path):
  path = tmp_path / "bench.txt"
  path.write_text("no markers here\n")
  with pytest.raises(ValueError, match="not found in .*bench.txt"):
    doc_tables.write_table(str(path), "demo", "`python -m demo --write_docs`", command="c",
                           columns=COLS, rows=[])
  path.write_text(f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n")
  with pytest.raises(ValueError, match="appears 2 times"):
    doc_tables.write_table(str(path), "demo", "`python -m demo --write_docs`", command="c",
                           columns=COLS, rows=[])
  assert path.read_text() == f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n"
  with pytest.raises(ValueError, match="comes before"):
    doc_tables.block(f"{END}\n{BEGIN}\n", BEGIN, END)


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
  path = tmp_path / "doc.txt"
  path.write_text("old")
  os.chmod(path, 0o640)

  def broken(src, dst):
    raise OSError("disk full")
  monkeypatch.setattr(os, "replace", broken)
  with pytest.raises(OSError, match="disk full"):
    doc_tables.write_atomic(str(path), "new")
  assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["doc.txt"]
  monkeypatch.undo()
  doc_tables.write_atomic(str(path), "new")
  assert path.read_text() == "new" and os.stat(path).st_mode & 0o777 == 0o640


def test_commit_is_dirty_with_uncommitted_tracked_changes(tmp_path):
  def git(*args):
    subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
  git("init", "-q")
  (tmp_path / "docs").mkdir()
  (tmp_path / "a.py").write_text("x = 1\n")
  (tmp_path / "docs" / "b.txt").write_text("doc\n")
  git("add", ".")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
  clean = doc_tables.commit(str(tmp_path))
  assert re.fullmatch(r"[0-9a-f]{7,}", clean)
  (tmp_path / "docs" / "b.txt").write_text("written by a tool\n")     # the docs do not count
  (tmp_path / "new.py").write_text("untracked\n")                     # nor untracked files
  assert doc_tables.commit(str(tmp_path)) == clean
  (tmp_path / "a.py").write_text("x = 2\n")
  assert doc_tables.commit(str(tmp_path)) == clean + "+dirty"


def test_machine_names_an_accelerator_before_the_host():
  class Gpu:
    platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"
  host = doc_tables.machine()
  assert doc_tables.machine(Gpu()) == f"NVIDIA H100 80GB HBM3; host {host}"
  assert "usable cores" in host


def test_text_table_prints_the_same_cells():
  rows = [{"variant": "podlab float32", "ms": "40.57"}, {"variant": "b", "ms": "1.0"}]
  lines = doc_tables.text_table(COLS, rows).splitlines()
  assert lines[0].split() == COLS and set(lines[1]) == {"-"}
  assert lines[2] == "podlab float32  40.57" and lines[3] == "b                 1.0"
  assert doc_tables.command_line("m.x", ["--a=1 2", "--b"]) == "python -m m.x '--a=1 2' --b"
