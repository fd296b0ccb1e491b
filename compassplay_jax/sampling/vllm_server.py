"""The vLLM side of `sampling.engine = "vllm"` (vllm_engine.py): a process in vLLM's own venv.

Run as a file by `VLLMEngine` (`<vllm venv python> .../vllm_server.py`), never imported by the
package: it needs only the standard library and vLLM (its torch, its transformers), so vLLM's pins
never meet ours (docs/sampling.md, "vLLM"). It connects back to the engine over
`multiprocessing.connection` on 127.0.0.1 (address and authkey from the environment) and answers one
request at a time; every message is a dict of plain Python values (pickled by each side's own Python).

  {"op": "init", "model": DIR, "dtype": ..., "max_model_len": ..., "seed": ..., "options": {...}}
  {"op": "load_weights", "path": FILE}   weights from a safetensors file (HF names), prefix cache reset
  {"op": "generate", "prompts": [[ids]], "params": [{SamplingParams kwargs}]}
      -> {"outputs": [{"token_ids", "logprobs", "finish_reason", "stop_reason"}]}
  {"op": "sleep"} / {"op": "wake"} / {"op": "close"}
Errors come back as {"error": traceback}; the engine raises them.
"""
import os
import sys
import traceback

# Run as a file, this folder is sys.path[0]: its modules (config.py, engine.py, ...) must not shadow
# top-level modules of vLLM's environment.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
  sys.path.pop(0)


def _load_weights(worker, path):
  """Runs inside vLLM's worker (collective_rpc): the safetensors file's tensors into the live model.

  On CPU vLLM packs each linear layer's weight for oneDNN after loading and drops the plain one (its
  `weight` is then empty), so the model's own load_weights cannot write them, and vLLM's in-place
  reload (reload_weights) was measured to leave the model computing with stale packed weights. Here
  each packed layer gets a plain weight back, the model's load_weights fills every parameter (its
  loaders stack q/k/v and gate/up), and the layers are packed again (the tied embedding's lm_head
  product too)."""
  import torch
  from safetensors.torch import load_file
  from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
  model = worker.model_runner.get_model()
  tensors = load_file(path)
  packed = []  # stays empty on GPU: load_weights writes the weights in place there
  for module in model.modules():
    if not hasattr(module, "cpu_linear"):
      continue
    weight = module.weight
    if weight.numel() == 0:  # dropped after packing: a plain one to load into
      shape = (module.output_size_per_partition, module.input_size_per_partition)
      fresh = torch.nn.Parameter(torch.empty(shape, dtype=weight.dtype), requires_grad=False)
      fresh.weight_loader, fresh.input_dim, fresh.output_dim = module.weight_loader, 1, 0  # vLLM's weight attrs
      module.weight = fresh
      packed.append((module, True))
    else:
      packed.append((module, False))
  model.load_weights(iter(tensors.items()))
  for module, remove in packed:
    dispatch_cpu_unquantized_gemm(module, remove_weight=remove)
  return len(tensors)


class Server:

  def __init__(self):
    self.llm = None
    self.sleeping = False

  def init(self, msg):
    from vllm import LLM
    options = dict(msg.get("options") or {})
    self.sleep_mode = bool(options.pop("enable_sleep_mode", False))
    kwargs = dict(model=msg["model"], dtype=msg["dtype"], max_model_len=msg["max_model_len"],
                  seed=msg.get("seed", 0), enforce_eager=True, logprobs_mode="processed_logprobs",
                  enable_prefix_caching=True, max_logprobs=1)
    if self.sleep_mode:
      kwargs["enable_sleep_mode"] = True
    kwargs.update(options)
    self.llm = LLM(**kwargs)
    import vllm
    return {"vllm_version": vllm.__version__, "sleep_mode": self.sleep_mode}

  def load_weights(self, msg):
    self._wake()
    counts = self.llm.collective_rpc(_load_weights, args=(msg["path"],))
    self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
    return {"tensors": counts}

  def generate(self, msg):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    self._wake()
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in msg["prompts"]]
    params = [SamplingParams(**p) for p in msg["params"]]
    outs = self.llm.generate(prompts, params, use_tqdm=False)
    result = []
    for out in outs:
      (c,) = out.outputs
      lps = []
      for tok, entry in zip(c.token_ids, c.logprobs or []):
        lps.append(float(entry[tok].logprob))
      result.append({"token_ids": [int(t) for t in c.token_ids], "logprobs": lps,
                     "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
    return {"outputs": result}

  def sleep(self, msg):
    """Level 2: the weights and the KV cache go (the next load_weights brings new weights anyway)."""
    if not self.sleep_mode or self.sleeping:
      return {"released_bytes": 0}
    import torch
    free_before = torch.cuda.mem_get_info()[0]
    self.llm.sleep(level=2)
    self.sleeping = True
    return {"released_bytes": max(0, int(torch.cuda.mem_get_info()[0] - free_before))}

  def _wake(self):
    if self.sleeping:
      self.llm.wake_up()
      self.sleeping = False

  def wake(self, msg):
    self._wake()
    return {}


def main():
  from multiprocessing.connection import Client
  host, port = os.environ["COMPASSPLAY_VLLM_ADDRESS"].rsplit(":", 1)
  conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ.pop("COMPASSPLAY_VLLM_AUTHKEY")))
  server = Server()
  while True:
    try:
      msg = conn.recv()
    except EOFError:
      break
    op = msg.get("op")
    if op == "close":
      conn.send({})
      break
    try:
      conn.send(getattr(server, op)(msg))
    except Exception:  # noqa: BLE001 - every failure goes back to the engine, which raises it
      conn.send({"error": traceback.format_exc()})
  conn.close()


if __name__ == "__main__":
  main()
