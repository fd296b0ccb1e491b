"""Runs N RL train steps of a tiny random decoder on fake batches, checkpointing every step.

Used by tests/test_checkpoint_resume.py in a subprocess so it can be killed with SIGKILL:
  python3 tests/resume_driver.py --dir D --steps 4 [--pause-after S] [--crash-in-save S] [--async-save]
It resumes from the latest checkpoint in D when there is one. Everything a step needs (the batch,
the buffers' new entry) is derived from the checkpointed PRNG key, params and JSON buffers, as the
real loop must, so a resumed run repeats a straight one bit for bit.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compassplay_jax.infra.checkpoint import CheckpointManager
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rl import advantages, train_step

MODEL = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
TRAIN = train_step.TrainConfig(learning_rate=1e-2, micro_batch_size=2, entropy_coef=1e-3)
BATCH, SEQ, PROMPT = 4, 8, 3
SEED_KEY = 1234


def initial_state():
  """(graphdef, params, opt_state, key, extra) of a fresh run."""
  graphdef, params = nnx.split(init_decoder(MODEL, seed=0))
  params, opt_state = train_step.init_train_state(params, TRAIN)
  extra = {"buffers": {"code_o": [{"snippet": "def f(x): return x", "step": 0}]}, "metrics": []}
  return graphdef, params, opt_state, jax.random.key(SEED_KEY), extra


def fake_batch(key, step: int) -> dict:
  """A deterministic batch: random tokens, completion mask after the prompt, TRR++ advantages."""
  k_tok, k_rew = jax.random.split(key)
  tokens = jax.random.randint(k_tok, (BATCH, SEQ), 0, MODEL.vocab_size, jnp.int32)
  loss_mask = jnp.broadcast_to(jnp.arange(SEQ) >= PROMPT, (BATCH, SEQ)).astype(jnp.int32)
  rewards = np.asarray(jax.random.choice(k_rew, jnp.array([-1.0, -0.5, 1.0]), (BATCH,)))
  adv = advantages.trr_plus_plus(rewards, ["code_o"] * BATCH, ["solve", "solve", "propose", "propose"],
                                 np.asarray(loss_mask.sum(1)))
  return {"tokens": tokens, "attention_mask": jnp.ones((BATCH, SEQ), jnp.int32), "loss_mask": loss_mask,
          "advantages": jnp.asarray(adv), "old_logprobs": jnp.full((BATCH, SEQ), -3.4 - 0.01 * step, jnp.float32)}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("--dir", required=True)
  parser.add_argument("--steps", type=int, required=True)
  parser.add_argument("--pause-after", type=int, default=0, help="after this step's checkpoint is committed, print and sleep")
  parser.add_argument("--crash-in-save", type=int, default=0, help="SIGKILL itself right after starting this step's save")
  parser.add_argument("--async-save", action="store_true")
  args = parser.parse_args(argv)

  graphdef, params, opt_state, key, extra = initial_state()
  manager = CheckpointManager(args.dir, keep=3, save_every=1, async_save=args.async_save)
  start = 0
  if manager.latest_step() is not None:
    start, params, opt_state, key, extra = manager.restore(params=params, opt_state=opt_state)
    print(f"RESUMED {start}", flush=True)
  step_fn = train_step.make_train_step(graphdef, TRAIN)
  for step in range(start + 1, args.steps + 1):
    key, batch_key = jax.random.split(key)
    params, opt_state, metrics = step_fn(params, opt_state, fake_batch(batch_key, step), batch_key)
    extra["metrics"].append({"step": step, "loss": float(metrics["loss"])})
    extra["buffers"]["code_o"].append({"snippet": f"def f(x): return x + {step}", "step": step,
                                       "seen_loss": float(metrics["pg_loss"])})
    manager.save(step, params, opt_state, key, extra, force=step == args.steps)
    if step == args.crash_in_save:
      os.kill(os.getpid(), signal.SIGKILL)
    if step == args.pause_after:
      manager.wait_until_finished()
      print(f"CHECKPOINTED {step}", flush=True)
      time.sleep(600)
  manager.wait_until_finished()
  manager.close()
  print(f"DONE {args.steps}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
