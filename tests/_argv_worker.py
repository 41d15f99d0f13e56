"""Records how a launcher's command line arrived: tests of launch/pod.sh quoting run it as the module.

Writes {"argv": sys.argv[1:], "TFDS_DATA_DIR": ..., "cwd": ...} as JSON to
$HOME/argv-<PODLAB_PROCESS_ID>.json and exits 0. Never interprets its arguments.

  python -m tests._argv_worker --config=x 'a b'
"""
import json
import os
import sys


def main() -> None:
  path = os.path.join(os.environ["HOME"], f"argv-{os.environ.get('PODLAB_PROCESS_ID', '0')}.json")
  with open(path, "w") as f:
    json.dump({"argv": sys.argv[1:], "TFDS_DATA_DIR": os.environ.get("TFDS_DATA_DIR"),
               "cwd": os.getcwd()}, f)
  print(f"ARGV_OK {path}", flush=True)


if __name__ == "__main__":
  main()
