"""A process of a multi-process run that dies: tests of fail-fast and of bounded hangs launch it.

Every process initialises the distributed runtime (experiments.common.distributed, settings from the
PODLAB_* environment), runs one cross-process psum, then process $DIE_PROCESS (default 1) prints
`DYING <time>` and exits with code 3 while the others keep running psums, which block forever once a peer is
gone: only the launcher's fail-fast or the runtime's heartbeat timeout can end them.

DIE_MODE=exit (default) dies like a crash (os._exit); DIE_MODE=raise raises an exception inside
`distributed.fail_fast()`, as the experiment mains do, which must end the process just as quickly.

  python tests/_mp_die_worker.py [ignored flags...]
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments.common import distributed  # noqa: E402


def main() -> None:
  info = distributed.initialize()
  psum = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")
  total = psum(np.ones((info.local_device_count,), np.float32))
  total = float(np.asarray(total.addressable_shards[0].data).reshape(-1)[0])
  assert total == info.device_count, (total, info)
  print(f"READY {info.process_index}/{info.process_count} psum={total:g}", flush=True)
  if info.process_index == int(os.environ.get("DIE_PROCESS", "1")):
    print(f"DYING {time.time():.3f}", flush=True)           # tests bound the time from here
    if os.environ.get("DIE_MODE", "exit") == "raise":
      with distributed.fail_fast():
        raise RuntimeError("this process fails on purpose")
    os._exit(3)
  while True:                                   # blocks in the collective once the peer is gone
    jax.block_until_ready(psum(np.ones((info.local_device_count,), np.float32)))
    time.sleep(0.05)


if __name__ == "__main__":
  main()
