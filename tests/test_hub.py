"""Loading a model by Hugging Face Hub id, offline, from a Hub-layout cache built in a temp directory.

The cache has the layout huggingface_hub itself reads (models--owner--name/refs/<ref> holding a
commit hash, snapshots/<commit>/<files>), so these tests exercise huggingface_hub's own resolution.
Oracle: the same checkpoint loaded from the directory it was saved to.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from compassplay_jax import load_model
from compassplay_jax.models import hub
from tests.hf_fixtures import save_tiny_hf_model

REPO = pathlib.Path(__file__).resolve().parents[1]
REPO_ID = "tiny-org/tiny-qwen2"
COMMIT_MAIN = "a" * 40
COMMIT_OLD = "b" * 40


def _add_snapshot(cache: pathlib.Path, repo_id: str, commit: str, source: pathlib.Path, refs=()):
  repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
  shutil.copytree(source, repo_dir / "snapshots" / commit)
  (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
  for ref in refs:
    (repo_dir / "refs" / ref).write_text(commit)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, smollm2):
  """(cache dir, dir of the main snapshot's source, dir of the old snapshot's source)."""
  tmp = tmp_path_factory.mktemp("hub")
  main_dir, _ = save_tiny_hf_model(tmp, "qwen2", seed=0)
  old_dir, _ = save_tiny_hf_model(tmp, "qwen2", seed=1)
  smollm2[1].save_pretrained(main_dir)  # any tokenizer: the loader must find and load one
  cache = tmp / "hf_home" / "hub"
  _add_snapshot(cache, REPO_ID, COMMIT_MAIN, main_dir, refs=("main",))
  _add_snapshot(cache, REPO_ID, COMMIT_OLD, old_dir, refs=("v0",))
  return cache, main_dir, old_dir


def _params(model):
  return jax.tree.leaves(nnx.state(model, nnx.Param))


def _assert_same_weights(a, b):
  la, lb = _params(a), _params(b)
  assert len(la) == len(lb) > 0
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_parse_hub_id():
  assert hub.parse_hub_id("Qwen/Qwen2.5-Coder-7B") == ("Qwen/Qwen2.5-Coder-7B", None)
  assert hub.parse_hub_id("Qwen/Qwen2.5-Coder-7B@v1.0") == ("Qwen/Qwen2.5-Coder-7B", "v1.0")
  assert hub.parse_hub_id("deepseek-ai/DeepSeek-Prover-V2-7B@" + "c" * 40)[1] == "c" * 40
  for not_an_id in ("smollm2-135m", "tiny", "/models/qwen", "./models/qwen", "model.gguf", "a/b/c", "~/x/y"):
    assert hub.parse_hub_id(not_an_id) is None, not_an_id


def test_existing_local_directory_is_not_a_hub_id(tmp_path, monkeypatch):
  (tmp_path / "org" / "name").mkdir(parents=True)
  monkeypatch.chdir(tmp_path)
  assert hub.parse_hub_id("org/name") is None
  assert hub.resolve_checkpoint("org/name") == "org/name"


def test_load_by_repo_id_matches_directory(hub_cache):
  cache, main_dir, _ = hub_cache
  by_id, tok = load_model(REPO_ID, cache_dir=cache, local_files_only=True)
  by_dir, _ = load_model(main_dir, with_tokenizer=False)
  _assert_same_weights(by_id, by_dir)
  assert tok is not None and tok.encode("def f(x):")


def test_revision_pin_picks_its_snapshot(hub_cache):
  cache, main_dir, old_dir = hub_cache
  old_from_dir, _ = load_model(old_dir, with_tokenizer=False)
  for pin in (COMMIT_OLD, "v0"):
    folder = hub.resolve_checkpoint(f"{REPO_ID}@{pin}", cache_dir=cache, local_files_only=True)
    assert pathlib.Path(folder).name == COMMIT_OLD
    pinned, _ = load_model(f"{REPO_ID}@{pin}", with_tokenizer=False, cache_dir=cache, local_files_only=True)
    _assert_same_weights(pinned, old_from_dir)
  main, _ = load_model(REPO_ID, with_tokenizer=False, cache_dir=cache, local_files_only=True)
  with pytest.raises(AssertionError):  # the two snapshots really differ
    _assert_same_weights(main, old_from_dir)


def test_missing_repo_and_revision_are_one_line_errors(hub_cache):
  cache = hub_cache[0]
  with pytest.raises(hub.HubModelError) as e:
    hub.resolve_checkpoint("nobody/missing-model", cache_dir=cache, local_files_only=True)
  assert "nobody/missing-model" in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(hub.HubModelError) as e:
    hub.resolve_checkpoint(f"{REPO_ID}@no-such-branch", cache_dir=cache, local_files_only=True)
  assert f"{REPO_ID}@no-such-branch" in str(e.value) and "\n" not in str(e.value)


def test_env_offline_and_hf_home_are_honoured(hub_cache, tmp_path):
  """A fresh process with HF_HOME and HF_HUB_OFFLINE=1 finds the repo by id (huggingface_hub reads them)."""
  cache, main_dir, _ = hub_cache
  script = ("import json, sys, numpy as np, jax\n"
            "from flax import nnx\n"
            "from compassplay_jax import load_model\n"
            f"m, _ = load_model({REPO_ID!r}, with_tokenizer=False)\n"
            "leaves = jax.tree.leaves(nnx.state(m, nnx.Param))\n"
            "print(json.dumps([float(np.asarray(x, np.float64).sum()) for x in leaves]))\n"
            "try:\n  load_model('nobody/missing-model')\nexcept FileNotFoundError as e:\n  print(e)\n")
  env = dict(os.environ, HF_HOME=str(cache.parent), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
  env.pop("HF_HUB_CACHE", None)
  out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  sums_line, error_line = out.stdout.strip().splitlines()[-2:]
  by_dir, _ = load_model(main_dir, with_tokenizer=False)
  expected = [float(np.asarray(x, np.float64).sum()) for x in _params(by_dir)]
  np.testing.assert_allclose(json.loads(sums_line), expected, rtol=0, atol=0)
  assert "nobody/missing-model" in error_line and "HF_HUB_OFFLINE" in error_line


def test_multi_process_only_process_0_downloads(tmp_path):
  """Two jax.distributed processes share HF_HOME; process 1's endpoint is dead, so it can only succeed
  by waiting for process 0's download and reading the same snapshot. Each file is fetched once, and
  only the files the loader reads."""
  from tests.fake_hub import FakeHub
  from tests.test_sharding_multihost import free_port
  source, _ = save_tiny_hf_model(tmp_path, "qwen2", seed=3)
  files = {p.name: p.read_bytes() for p in source.iterdir()}
  files.update({"README.md": b"# tiny\n", "pytorch_model.bin": b"not read", "onnx/model.onnx": b"not read",
                "original/model.safetensors": b"not read"})
  port = free_port()
  with FakeHub() as server:
    server.models[REPO_ID] = files
    procs = []
    for pid, endpoint in ((0, server.url), (1, "http://127.0.0.1:9")):
      env = dict(os.environ, PYTHONPATH=str(REPO), COMPASSPLAY_COORDINATOR_ADDRESS=f"localhost:{port}",
                 COMPASSPLAY_NUM_PROCESSES="2", COMPASSPLAY_PROCESS_ID=str(pid), COMPASSPLAY_DISTRIBUTED_TIMEOUT="120",
                 HF_HOME=str(tmp_path / "shared_hf_home"), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1")
      for name in ("HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        env.pop(name, None)
      procs.append(subprocess.Popen([sys.executable, str(REPO / "tests" / "hub_multihost_worker.py"), REPO_ID],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
      for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
    downloads = [path for method, path in server.requests if method == "GET" and "/resolve/" in path]
  by_dir, _ = load_model(source, with_tokenizer=False)
  expected = [float(np.asarray(x, np.float64).sum()) for x in _params(by_dir)]
  assert [r["process"] for r in results] == [0, 1]
  assert results[0]["folder"] == results[1]["folder"]
  for r in results:
    np.testing.assert_allclose(r["sums"], expected, rtol=0, atol=0)
  fetched = sorted(path.rsplit("/", 1)[1] for path in downloads)
  assert fetched == sorted(n for n in files if n in ("config.json", "model.safetensors", "generation_config.json"))
