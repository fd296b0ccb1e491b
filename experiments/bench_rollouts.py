"""Useful tokens/s on a long-tailed rollout workload: continuous batching vs static batching.

SmolLM2-135M-Instruct (embedded GGUF) on CPU. `--requests` chat prompts of varied length, each with
its own response budget drawn as

    budget = clip(round(median * 2 ** (sigma * Z)), 1, 16 * median),   Z ~ N(0, 1), seed --seed

(log-normal, sigma 1.5 octaves: the longest budgets reach 16x the median). eos is ignored, so each
row decodes exactly its budget and "useful tokens" = sum of budgets. Every mode uses the same
engine, the same number of slots and the same cache length (bucket of the longest prompt + 16 x
median), i.e. equal KV-cache memory; only the scheduling differs:

  continuous   a finished row's slot takes the next request at once (longest budget admitted first)
  cont-arrival the same, requests admitted in arrival order
  static       slots are refilled only when every slot is free (a static batch decodes until its
               longest row ends), arrival order: what the landed sampler does with such a batch
  generate     the landed sampler itself (`generate`), batches of --slots requests in arrival order,
               each decoded to its longest budget (rows cut to their own); its cache is the batch's
               prompt bucket + that budget, never more than the others'. It compiles a program per
               distinct batch budget, so it is run twice and the second run is timed.

Compilation is excluded (`ContinuousEngine.precompile`: every prompt bucket and attention window). Utilisation = decode slot-steps
that produced a kept token / all decode slot-steps (load-independent).

  python3 experiments/bench_rollouts.py --requests 200 --median 32 --slots 16 --chunk 8
  (add --modes continuous cont-arrival static generate for every mode)
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np
from flax import nnx

TOPICS = ["reverses a string", "checks whether a number is prime", "merges two sorted lists",
          "counts the vowels in a sentence", "computes a factorial", "flattens a nested list",
          "parses a date in ISO format", "finds the longest common prefix of a list of strings"]
DETAIL = " Explain each step, handle empty inputs, and give two examples of how to call it."


def workload(tok, requests: int, median: int, sigma: float, seed: int):
  """(prompt texts, budgets): prompts of varied length, log-normal budgets clipped at 16 x median."""
  from compassplay_jax.sampling import build_prompt
  rng = np.random.default_rng(seed)
  prompts = [build_prompt(tok, f"Write a Python function that {TOPICS[i % len(TOPICS)]}."
                          + DETAIL * int(rng.integers(0, 4))) for i in range(requests)]
  budgets = np.clip(np.round(median * 2.0 ** (sigma * rng.standard_normal(requests))), 1, 16 * median)
  return prompts, [int(b) for b in budgets]


MODES = {"continuous": dict(order="longest_first"), "cont-arrival": dict(order="arrival"),
         "static": dict(order="arrival", refill="static"), "generate": None}


def run_generate(graphdef, params, tok, ids, budgets, config, slots: int, seed: int):
  """Today's `generate` on batches of `slots` requests: (decode steps, useful slot-steps, slot-steps)."""
  from compassplay_jax.sampling import generate
  steps = useful = slot_steps = 0
  for start in range(0, len(ids), slots):
    batch = budgets[start:start + slots]
    cfg = config.replace(max_new_tokens=max(batch), micro_batch_size=slots)
    res = generate(graphdef, params, tok, ids[start:start + slots], cfg, jax.random.key(seed + start))
    assert all(n == max(batch) for n in res.lengths)
    steps += max(batch) - 1
    useful += sum(b - 1 for b in batch)
    slot_steps += (max(batch) - 1) * slots
  return steps, useful, slot_steps


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--requests", type=int, default=200)
  parser.add_argument("--median", type=int, default=32)
  parser.add_argument("--sigma", type=float, default=1.5, help="spread of log2(budget)")
  parser.add_argument("--slots", type=int, default=16)
  parser.add_argument("--memory-mb", type=int, default=0,
                      help="derive the slots from this KV-cache memory budget instead of --slots")
  parser.add_argument("--chunk", type=int, default=8, help="decode steps per device call")
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--top-k", type=int, default=50)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--modes", nargs="+", default=["continuous", "static", "generate"], choices=list(MODES))
  args = parser.parse_args()

  from compassplay_jax import load_model
  from compassplay_jax.sampling import SamplingConfig, batching
  from compassplay_jax.sampling import slots as slots_lib
  from compassplay_jax.sampling.continuous import ContinuousEngine
  from compassplay_jax.sampling.engine import Request
  from compassplay_jax.sampling.prompts import encode_prompts

  model, tok = load_model("smollm2-135m")
  graphdef, params = nnx.split(model)
  prompts, budgets = workload(tok, args.requests, args.median, args.sigma, args.seed)
  config = SamplingConfig(temperature=args.temperature, top_k=args.top_k, eos_ids=(),
                          max_new_tokens=16 * args.median,
                          bucket_lengths=(32, 48, 64, 80, 96, 112, 128, 192, 256))  # fine: prefill padding
  ids = encode_prompts(tok, prompts)
  buckets = sorted({batching.bucket_length(len(x), config.bucket_lengths) for x in ids})
  cache_length = buckets[-1] + 16 * args.median
  requests = [Request(p, max_new_tokens=b) for p, b in zip(ids, budgets)]
  if args.memory_mb:
    args.slots = batching.slots_for_budget(model.config, cache_length, model.config.dtype, args.memory_mb << 20,
                                           buckets[-1])
  useful = sum(budgets)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}; {args.requests} requests, budgets median "
        f"{int(np.median(budgets))} mean {np.mean(budgets):.1f} max {max(budgets)} (sum {useful}); prompt "
        f"tokens {min(map(len, ids))}..{max(map(len, ids))}; {args.slots} slots x {cache_length} cache columns; "
        f"chunk {args.chunk}; load average {os.getloadavg()[0]:.1f}", flush=True)
  results = []
  for mode in args.modes:
    if mode == "generate":
      start = time.perf_counter()
      run_generate(graphdef, params, tok, ids, budgets, config, args.slots, args.seed)  # compile
      compile_s = time.perf_counter() - start
      start = time.perf_counter()
      steps, used, slot_steps = run_generate(graphdef, params, tok, ids, budgets, config, args.slots, args.seed)
      wall = time.perf_counter() - start
      calls = -(-len(ids) // args.slots)
      results.append((mode, useful / wall, wall, used / slot_steps, steps, calls, compile_s - wall))
      print(f"{mode}: {useful / wall:.1f} useful tok/s, {wall:.1f}s, utilisation {used / slot_steps:.1%}, "
            f"{steps} decode steps, load {os.getloadavg()[0]:.1f}", flush=True)
      continue
    engine = ContinuousEngine(graphdef, tok, params, slots=args.slots, cache_length=cache_length,
                              chunk_tokens=args.chunk, **MODES[mode])
    before = slots_lib.compile_counts()
    start = time.perf_counter()
    engine.precompile(config, buckets, jax.random.key(0))  # every bucket's prefill/insert, every window
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    res = engine.generate(requests, config, jax.random.key(args.seed))
    wall = time.perf_counter() - start
    assert list(res.lengths) == budgets
    s = engine.stats
    compiled = sum(slots_lib.compile_counts().values()) - sum(before.values())
    results.append((mode, useful / wall, wall, s.utilisation, s.decode_steps, s.decode_calls, compile_s))
    print(f"{mode}: {useful / wall:.1f} useful tok/s, {wall:.1f}s, utilisation {s.utilisation:.1%}, "
          f"{s.decode_steps} decode steps in {s.decode_calls} calls, windows {s.windows}, "
          f"{compiled} programs compiled, load {os.getloadavg()[0]:.1f}", flush=True)
  base = {m: tps for m, tps, *_ in results}.get("static")
  print(f"\nload average at the end: {os.getloadavg()[0]:.1f}\n")
  print("| mode | useful tok/s | wall s | vs static | useful slot-steps | decode steps | device calls | warm-up (compile) s |")
  print("|---|---|---|---|---|---|---|---|")
  for mode, tps, wall, util, steps, calls, compile_s in results:
    ratio = f"{tps / base:.2f}x" if base else "-"
    print(f"| {mode} | {tps:.1f} | {wall:.1f} | {ratio} | {util:.1%} | {steps} | {calls} | {compile_s:.1f} |")


if __name__ == "__main__":
  main()
