"""Multi-host on one machine: two processes with 4 CPU devices each join through jax.distributed."""
import json
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from compassplay_jax.infra import distributed
from tests import xla_env

REPO = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_config_from_env():
  cfg = distributed.DistributedConfig.from_env({
      "COMPASSPLAY_COORDINATOR_ADDRESS": "10.0.0.1:1234", "COMPASSPLAY_NUM_PROCESSES": "4",
      "COMPASSPLAY_PROCESS_ID": "2", "COMPASSPLAY_LOCAL_DEVICE_IDS": "0,1"})
  assert (cfg.coordinator_address, cfg.num_processes, cfg.process_id, cfg.local_device_ids) == (
      "10.0.0.1:1234", 4, 2, (0, 1))
  assert cfg.enabled and not cfg.auto
  assert distributed.DistributedConfig.from_env({"COMPASSPLAY_DISTRIBUTED": "auto"}).auto
  assert not distributed.DistributedConfig.from_env({}).enabled
  assert distributed.initialize(distributed.DistributedConfig()) is False  # single process: nothing to join
  with pytest.raises(distributed.DistributedError, match="COMPASSPLAY_NUM_PROCESSES='four'"):
    distributed.DistributedConfig.from_env({"COMPASSPLAY_NUM_PROCESSES": "four"})
  with pytest.raises(distributed.DistributedError, match="process_id=4 is outside"):
    distributed.initialize({"coordinator_address": "h:1", "num_processes": 4, "process_id": 4})
  with pytest.raises(distributed.DistributedError, match="needs num_processes and process_id"):
    distributed.initialize({"coordinator_address": "h:1"})


def test_exchange_buffers_come_in_powers_of_two():
  sizes = [distributed.exchange_buffer_size(n) for n in range(1, 5000)]
  for n, size in enumerate(sizes, start=1):
    assert size >= max(n, 256) and size & (size - 1) == 0, (n, size)  # holds n; a power of two
    assert size == 256 or size < 2 * n, (n, size)  # and the smallest such
  assert sorted(set(sizes)) == [256, 512, 1024, 2048, 4096, 8192]


def test_process_zero_writes(tmp_path):
  import jax.numpy as jnp
  assert distributed.write_json(tmp_path / "a" / "s.json", {"x": 1})
  record = distributed.log_metrics(tmp_path / "m.jsonl", 3, {"loss": jnp.float32(1.5), "v": jnp.arange(2)})
  assert record == {"step": 3, "loss": 1.5, "v": [0, 1]}
  assert json.loads((tmp_path / "m.jsonl").read_text()) == record


def test_two_processes_share_a_batch_and_only_process_0_writes(tmp_path):
  port = free_port()
  procs = []
  for pid in range(2):
    env = xla_env.cpu_env(4, PYTHONPATH=str(REPO), COMPASSPLAY_COORDINATOR_ADDRESS=f"localhost:{port}",
                          COMPASSPLAY_NUM_PROCESSES="2", COMPASSPLAY_PROCESS_ID=str(pid),
                          COMPASSPLAY_DISTRIBUTED_TIMEOUT="120")
    procs.append(subprocess.Popen([sys.executable, str(REPO / "tests" / "multihost_worker.py"), str(tmp_path)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  outs = []
  try:
    for p in procs:
      outs.append(p.communicate(timeout=300)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-4000:]
  seen = [json.loads((tmp_path / f"process{i}.json").read_text()) for i in range(2)]
  # Each process loaded a disjoint half of the global batch.
  assert sorted(seen[0]["rows"] + seen[1]["rows"]) == list(range(8))
  assert [s["wrote"] for s in seen] == [True, False]
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 1  # one record: written by process 0 only
  metrics = json.loads(lines[0])
  assert json.loads((tmp_path / "summary.json").read_text()) == {"rows0": seen[0]["rows"]}

  # The same global batch on one device gives the same loss.
  import jax.numpy as jnp
  from flax import nnx
  from compassplay_jax.models.config import ModelConfig
  from compassplay_jax.models.decoder import init_decoder
  from compassplay_jax.rewards.losses import per_sequence_loss
  cfg = ModelConfig(model_type="qwen2", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, attention_bias=True)
  graphdef, params = nnx.split(init_decoder(cfg, seed=1))
  tokens = np.random.default_rng(0).integers(1, cfg.vocab_size, (8, 16)).astype(np.int32)
  want = float(jnp.mean(per_sequence_loss(graphdef, params, tokens, np.ones_like(tokens))))
  np.testing.assert_allclose(metrics["loss"], want, rtol=1e-5)
  np.testing.assert_allclose([s["loss"] for s in seen], [want, want], rtol=1e-5)

  # distributed.allgather_objects: every process gets every process's object, in process order; the 12
  # exchanges (pickles of ~300 to ~730 bytes) pad their buffers to two sizes (512, 1024 bytes), so they
  # compile the length exchange and two all-gathers, not one program per size.
  from tests.multihost_worker import EXCHANGES, exchanged_text
  want_exchanged = [[exchanged_text(i, 0), exchanged_text(i, 1)] for i in range(EXCHANGES)]
  assert [s["exchanged"] for s in seen] == [want_exchanged, want_exchanged]
  assert [s["exchange_compiles"] for s in seen] == [3, 3]
