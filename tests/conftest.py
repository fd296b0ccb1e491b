"""Shared pytest fixtures: the development data directory, and CPU-only JAX."""
import os
import pathlib

import pytest

from compassplay_jax.infra import gc_policy
from tests import xla_env

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A persistent compilation cache shared by the test processes (and their subprocesses): the same
# small programs are compiled by many tests.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO_ROOT / ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
# The suite's programs are tiny: XLA's optimisation passes cost more than they save (measured: 40% less
# CPU for test_step + test_rl_train_step). Tests of compiled memory or speed opt back in.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# XLA:CPU's classic emitters: half the suite's CPU time went to compiling with the default (MLIR) ones
# (tests/xla_env.py has the measurement). Processes that tests start get the same flags (xla_env.cpu_env).
os.environ["XLA_FLAGS"] = xla_env.xla_flags(base=os.environ.get("XLA_FLAGS", ""))
# Full garbage collections 100x rarer, as in the main command: in a full cold suite they took ~70 of
# ~920 logged CPU-s, most of it in the pytest workers and the 8-device child (docs/testing.md).
gc_policy.defer_full_collections()
# The public data sets (docs/data.md). Tests set the data directory explicitly: $COMPASSPLAY_DATA if set,
# else $COMPASSPLAY_SHARED_DATA, else the development machines' copy in ../shared/data beside the checkout.
SHARED_DATA = pathlib.Path(os.environ.get("COMPASSPLAY_DATA") or os.environ.get("COMPASSPLAY_SHARED_DATA")
                           or REPO_ROOT.parent / "shared" / "data")
os.environ["COMPASSPLAY_DATA"] = str(SHARED_DATA)  # the package and the subprocesses tests start read it


@pytest.fixture
def shared_data():
  """The data directory; tests that need a file there skip cleanly when it is absent."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"data directory not found at {SHARED_DATA} (set COMPASSPLAY_DATA, or fetch: "
                f"python -m compassplay_jax.cli.data fetch --all --dir {SHARED_DATA})")
  return SHARED_DATA


def shared_file(relpath):
  """Returns <data directory>/relpath or skips the calling test with the reason."""
  path = SHARED_DATA / relpath
  if not path.exists():
    pytest.skip(f"{path} not present")
  return path


@pytest.fixture(scope="session")
def smollm2():
  """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, loaded once per test session."""
  from compassplay_jax.models.gguf_io import embedded_gguf_path
  try:
    embedded_gguf_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  from compassplay_jax import load_model
  return load_model("smollm2-135m")


def _torch_one_thread():
  """torch, on one intra-op thread: pytest -n 2 keeps both cores busy, and torch's two spinning threads
  then made transformers' generate 4-6x slower (40 greedy tokens: 16 s vs 3 s at load ~11)."""
  torch = pytest.importorskip("torch")
  torch.set_num_threads(1)
  return torch


@pytest.fixture(scope="session")
def smollm2_torch():
  """transformers' own load of the same GGUF file: the oracle for our GGUF reader (~20 s: needs torch and
  accelerate, test-only). Tests that need transformers' computation on our weights use smollm2_torch_copy."""
  torch = _torch_one_thread()
  transformers = pytest.importorskip("transformers")
  from compassplay_jax.models.gguf_io import embedded_gguf_path
  path = embedded_gguf_path()
  return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2_torch_tokenizer():
  """transformers' own tokenizer from the same GGUF file."""
  transformers = pytest.importorskip("transformers")
  from compassplay_jax.models.gguf_io import embedded_gguf_path
  path = embedded_gguf_path()
  return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="session")
def smollm2_torch_copy(smollm2, tmp_path_factory):
  """transformers' model class holding our loaded SmolLM2 weights (written by hf_io.save_hf, read back by
  from_pretrained: seconds): the oracle for what is computed from given weights (generation). That these
  weights are transformers' own GGUF reading is tests/test_gguf.py's check, against smollm2_torch."""
  torch = _torch_one_thread()
  transformers = pytest.importorskip("transformers")
  from compassplay_jax.models import hf_io
  model, _ = smollm2
  directory = tmp_path_factory.mktemp("smollm2_hf")
  hf_io.save_hf(model, model.config, directory)
  return transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def coding_tiny_runs(tmp_path_factory):
  """coding:tiny run straight through a Session, and the same config killed and resumed as a sweep cell:
  made once per test session (across xdist workers) for the tests that assert on them (tests/shared_runs.py).
  Attributes: straight, sweep (directories), session, sweep_record (what was printed and recorded)."""
  import types
  from tests import shared_runs
  directory, record = shared_runs.coding_tiny_runs(tmp_path_factory)
  return types.SimpleNamespace(straight=directory / "straight", sweep=directory / "sweep",
                               session=record["session"], sweep_record=record["sweep"])
