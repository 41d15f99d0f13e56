"""One process of the 2-process Hub test (tests/test_hub.py launches two): resolves a name that the
loopback Hub serves and one it does not, then prints a JSON line `HUB {...}`.

Run by hand (a loopback Hub on HF_ENDPOINT, the same PODLAB_HUB_CACHE folder, two shells):

  JAX_PLATFORMS=cpu PODLAB_COORDINATOR=localhost:12355 PODLAB_NUM_PROCESSES=2 PODLAB_PROCESS_ID=0 \
    python tests/_mp_hub_worker.py          # and PODLAB_PROCESS_ID=1 in the other shell
"""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import distributed  # noqa: E402
from experiments.nanogpt import hf_gpt2  # noqa: E402
from input_pipeline import errors  # noqa: E402


def main() -> None:
  info = distributed.initialize()
  folder = hf_gpt2.resolve("gpt2")
  digests = {}
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), "rb") as f:
      digests[name] = hashlib.sha256(f.read()).hexdigest()
  try:
    hf_gpt2.resolve("nobody/missing")
    missing = ""
  except errors.DataError as e:
    missing = str(e)
  print("HUB " + json.dumps({"process": info.process_index, "folder": folder, "files": digests,
                             "missing": missing}), flush=True)
  distributed.finalize()


if __name__ == "__main__":
  main()
