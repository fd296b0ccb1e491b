"""One process of a two-process run that is preempted (tests/test_preemption.py):

  python tests/preemption_worker.py PORT PROCESS_ID DIR

Joins jax.distributed (CPU) and steps (a sleep each) asking preemption.Watcher at every step boundary,
as selfplay/run.py does, with a CheckpointManager's reached_preemption (Orbax's sync point). Process 1
sends itself SIGTERM at step 3; both print `STOP <step>` where the watcher says stop and exit 0, or
`NOSTOP` after STEPS steps.
"""
import os
import signal
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top

STEPS = 100


def main(argv) -> int:
  port, process_id, directory = argv[0], int(argv[1]), argv[2]
  jax.distributed.initialize(f"localhost:{port}", 2, process_id, initialization_timeout=120)
  from compassplay_jax.infra import preemption
  from compassplay_jax.infra.checkpoint import CheckpointManager
  manager = CheckpointManager(directory, save_every=STEPS)
  with preemption.Watcher(manager.reached_preemption) as watch:
    assert watch.multi_process
    for step in range(1, STEPS + 1):
      time.sleep(0.1)
      if process_id == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGTERM)  # caught by jax.distributed's preemption service
      if watch.should_stop(step):
        print(f"STOP {step}", flush=True)
        break
    else:
      print("NOSTOP", flush=True)
  manager.close()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
