"""One process of a 2-process run on localhost (4 CPU devices each); started by test_sharding_multihost.

argv: workdir. The environment carries COMPASSPLAY_* (see distributed.from_env).
Each process loads only its rows of the global batch, runs a sharded loss-and-grad step on the
(2, 2, 2) mesh over all 8 devices, and logs metrics; only process 0 writes files.
"""
import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")  # the test passes xla_env.cpu_env(4)

from compassplay_jax.infra import distributed  # noqa: E402


def main():
  workdir = sys.argv[1]
  assert distributed.initialize()  # from COMPASSPLAY_COORDINATOR_ADDRESS / _NUM_PROCESSES / _PROCESS_ID
  import jax
  import jax.numpy as jnp
  import numpy as np

  from compassplay_jax.infra import sharding as sh
  from compassplay_jax.models.config import ModelConfig
  from compassplay_jax.rewards.losses import per_sequence_loss

  assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
  cfg = ModelConfig(model_type="qwen2", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, attention_bias=True)
  mesh = sh.make_mesh((2, 2, 2))
  graphdef, params = sh.init_params_sharded(cfg, mesh, seed=1)
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, cfg.vocab_size, (8, 16)).astype(np.int32)  # the global batch, for the row check
  rows = distributed.process_rows(8, mesh)
  local = {"tokens": tokens[rows], "loss_mask": np.ones((len(rows), 16), np.int32)}
  batch = distributed.global_batch(local, mesh, 8)

  def loss_fn(p, b):
    return jnp.mean(per_sequence_loss(graphdef, p, b["tokens"], b["loss_mask"]))

  p_sh = sh.tree_shardings(params, mesh, cfg.head_dim)
  step = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(p_sh, sh.batch_tree_shardings(batch, mesh)),
                 out_shardings=(sh.replicated(mesh), p_sh))
  loss, grads = step(params, batch)
  grad_norm = jnp.sqrt(sum(jnp.vdot(g, g) for g in jax.tree.leaves(grads)))
  distributed.log_metrics(os.path.join(workdir, "metrics.jsonl"), 1, {"loss": loss, "grad_norm": grad_norm})
  wrote = distributed.write_json(os.path.join(workdir, "summary.json"), {"rows0": rows.tolist()})
  loss_value = float(distributed.to_host(loss))
  # Objects of 12 different sizes exchanged between the processes, counting the programs compiled meanwhile.
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda name, seconds, **_: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)
  exchanged = [distributed.allgather_objects(exchanged_text(i, jax.process_index())) for i in range(EXCHANGES)]
  # Every process reports what it saw, to its own file (the test checks the split and who wrote).
  with open(os.path.join(workdir, f"process{jax.process_index()}.json"), "w") as f:
    json.dump({"rows": rows.tolist(), "wrote": wrote, "loss": loss_value, "exchanged": exchanged,
               "exchange_compiles": len(compiles)}, f)


EXCHANGES = 12


def exchanged_text(i: int, process: int) -> str:
  """What process `process` sends in exchange i: 304 to 717 characters, a different length each time."""
  return f"{i}:{process}:" + "x" * (300 + 37 * i + 5 * process)


if __name__ == "__main__":
  main()
