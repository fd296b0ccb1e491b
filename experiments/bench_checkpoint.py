"""How long a checkpoint save blocks the training loop: synchronous vs Orbax's async save.

  python experiments/bench_checkpoint.py                 # the demo's state: 135M params + AdamW moments
  python experiments/bench_checkpoint.py --params-m 10   # a quick check of the script

The state is params plus two moment trees of the same size, fp32, in 30 leaves (SmolLM2-135M's
1.6 GB). Each mode saves steps 1 and 2 through compassplay_jax.infra.checkpoint.CheckpointManager and
reports the time `save` took to return (what the loop waits for) and the time until the write was
committed. Run it on a quiet machine; the load average is printed with the table.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from compassplay_jax.infra.checkpoint import CheckpointManager

LEAVES = 30


def state(params_millions: float):
  n = int(params_millions * 1e6) // LEAVES
  rng = np.random.default_rng(0)
  params = {f"layer_{i}": jnp.asarray(rng.random(n, dtype=np.float32)) for i in range(LEAVES)}
  opt_state = {"mu": jax.tree.map(jnp.copy, params), "nu": jax.tree.map(jnp.copy, params)}
  return params, opt_state


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--params-m", type=float, default=135.0, help="millions of parameters (default: 135)")
  args = parser.parse_args()
  params, opt_state = state(args.params_m)
  gb = sum(x.nbytes for x in jax.tree.leaves((params, opt_state))) / 1e9
  load_before = os.getloadavg()
  rows = []
  with tempfile.TemporaryDirectory() as root:
    for async_save in (False, True):
      with CheckpointManager(pathlib.Path(root) / f"async_{async_save}", keep=3, async_save=async_save) as manager:
        for step in (1, 2):
          t0, c0 = time.time(), time.process_time()
          manager.save(step, params, opt_state, jax.random.key(0), {"step": step})
          returned = time.time() - t0
          manager.wait_until_finished()
          rows.append((("async" if async_save else "sync"), step, returned, time.time() - t0,
                       time.process_time() - c0))
  print(f"state {gb:.2f} GB; load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load_before)}, "
        f"after {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
  print("| mode | step | save() returned after s | committed after s | CPU s |")
  print("|---|---|---|---|---|")
  for mode, step, returned, committed, cpu in rows:
    print(f"| {mode} | {step} | {returned:.2f} | {committed:.2f} | {cpu:.1f} |")


if __name__ == "__main__":
  main()
