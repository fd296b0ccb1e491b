"""Benchmark: per-example gradient cosines by (i) a Python loop of per-candidate jax.grad, (ii) chunked
vmap(grad) (method="direct"), (iii) the fused probe pass (method="fused") as the loop runs it (in
micro-batches of --micro-batch rows, reward.micro_batch_size) and (iii') in one pass over all N rows,
against (iv) one batched forward + backward of the same N rows; "auto" names the method
`cosines.choose_method` picks from the compiled costs of (ii) and (iii) (no timing).

Reports, per (model, N, T): compiled dot FLOPs and bytes accessed (every while body times its trip
count, `cosines.hlo_cost`) and compiled peak memory (arguments + outputs + temporaries), all compile
only and stable across machines, and, for cells whose work fits the time budget, wall time: each
program run --repeats times, the programs of a cell taking turns (so a change in load hits all of
them), median and min-max reported, with the load average before and after the cell. Weights are
random (timing and memory do not depend on them). Run it with XLA's default flags (no XLA_FLAGS:
tests/xla_env.py's test flags are not for timing).

  python3 experiments/bench_cosines.py --models 20m --ns 32,64 --ts 128 --out bench_cosines.jsonl
  python3 experiments/bench_cosines.py --table bench_cosines.jsonl  # the docs table
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rewards.cosines import CompiledCost, choose_method, compiled_cost, gradient_cosines
from compassplay_jax.rewards.cosines_direct import tree_vdot
from compassplay_jax.rewards.losses import per_sequence_loss

MODELS = {
    # A smoke-test size (compiles in seconds).
    "tiny": ModelConfig(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    # ~20M parameters, untied head.
    "20m": ModelConfig(model_type="llama", vocab_size=8192, hidden_size=384, intermediate_size=1152,
                       num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2),
    # SmolLM2-135M's shapes (tied embeddings, 30 layers).
    "smollm2": ModelConfig(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                           num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                           tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5),
}


def compiled_stats(compiled) -> dict:
  c = compiled_cost(compiled)
  return dict(flops=c.flops, bytes=c.bytes_accessed, peak_bytes=c.peak_bytes)


def load_average() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def time_programs(calls: dict, repeats: int, warmup: int = 1) -> dict:
  """{name: [seconds] * repeats}; the programs take turns, one run each per round, after `warmup`
  untimed rounds (a program's first run also touches its buffers for the first time)."""
  for _ in range(warmup):
    for call in calls.values():
      jax.block_until_ready(call())
  out = {k: [] for k in calls}
  for _ in range(repeats):
    for k, call in calls.items():
      t0 = time.perf_counter()
      jax.block_until_ready(call())
      out[k].append(time.perf_counter() - t0)
  return out


def bench_cell(name, graphdef, params, n, t, chunk, micro_batch, timed_ok, single, repeats=3, warmup=1):
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 1000, (n, t)), jnp.int32)
  mask = jnp.asarray(np.arange(t)[None, :] >= t // 4, jnp.int32).repeat(n, 0)
  attn = jnp.ones((n, t), jnp.int32)
  g_ref = params  # any params-shaped tree: cost does not depend on its values
  cos = lambda method, mb: jax.jit(functools.partial(gradient_cosines, graphdef, method=method, chunk_size=chunk,
                                                     micro_batch=mb))
  train = jax.jit(lambda p, tk, m, a: jax.grad(lambda q: jnp.mean(per_sequence_loss(graphdef, q, tk, m, a)))(p))
  row = dict(model=name, N=n, T=t, chunk=chunk, micro_batch=micro_batch, repeats=repeats, warmup=warmup)
  args = (params, g_ref, tokens, mask, attn)
  progs = {
      "direct": cos("direct", micro_batch).lower(*args).compile(),
      "fused": cos("fused", micro_batch).lower(*args).compile(),
      "fused_one_pass": cos("fused", None).lower(*args).compile(),
      "train": train.lower(params, tokens, mask, attn).compile(),
  }
  single_stats = single["stats"]
  row["loop"] = dict(flops=n * single_stats["flops"], bytes=n * single_stats["bytes"],
                     peak_bytes=single_stats["peak_bytes"])
  for key, prog in progs.items():
    row[key] = compiled_stats(prog)
  pick = lambda c: CompiledCost(flops=row[c]["flops"], bytes_accessed=row[c]["bytes"], peak_bytes=row[c]["peak_bytes"])
  row["auto"] = choose_method(pick("fused"), pick("direct"), None, jax.default_backend())
  if timed_ok:
    one = single["fn"]
    calls = {"train": lambda: progs["train"](params, tokens, mask, attn),
             "direct": lambda: progs["direct"](*args),
             "fused": lambda: progs["fused"](*args),
             "fused_one_pass": lambda: progs["fused_one_pass"](*args),
             "loop": lambda: [one(params, g_ref, tokens[i:i + 1], mask[i:i + 1], attn[i:i + 1]) for i in range(n)]}
    row["load_before"] = load_average()
    for key, secs in time_programs(calls, repeats, warmup).items():
      row[key]["runs"] = [round(x, 4) for x in secs]
      row[key]["seconds"] = statistics.median(secs)
    row["load_after"] = load_average()
  return row


def single_candidate(graphdef, params, t):
  """(i)'s body: one candidate's grad reduced to (<g, g_ref>, ||g||^2), jitted once per T."""
  def one(p, g_ref, tk, m, a):
    g = jax.grad(lambda q: per_sequence_loss(graphdef, q, tk, m, a)[0])(p)
    return tree_vdot(g, g_ref), tree_vdot(g, g)
  fn = jax.jit(one)
  spec = jax.ShapeDtypeStruct((1, t), jnp.int32)
  compiled = fn.lower(params, params, spec, spec, spec).compile()
  return dict(fn=compiled, stats=compiled_stats(compiled))


COLUMNS = (("loop", "(i) loop"), ("direct", "(ii) chunked vmap(grad)"), ("fused", "(iii) fused, micro-batched"),
           ("fused_one_pass", "(iii') fused, one pass"))


def markdown_table(rows) -> str:
  """The docs table: absolute numbers for (iv), ratios to (iv) for (i)-(iii'): FLOPs / bytes / peak
  memory / median time [min-max]; the auto pick; the load average over the timed cells."""
  head = "| model | N | T | (iv) fwd+bwd GFLOP / GB / peak MiB / s [min-max] | " + " | ".join(c for _, c in COLUMNS)
  out = [head + " | auto |", "|---" * (5 + len(COLUMNS)) + "|"]
  loads = []
  for r in rows:
    base = r["train"]
    def cell(m):
      if m not in r:
        return "-"
      parts = [f"{r[m]['flops'] / base['flops']:.3f}x", f"{r[m]['bytes'] / base['bytes']:.2f}x",
               f"{r[m]['peak_bytes'] / base['peak_bytes']:.2f}x"]
      if "seconds" in r[m] and "seconds" in base:
        runs = r[m].get("runs", [r[m]["seconds"]])
        parts.append(f"**{r[m]['seconds'] / base['seconds']:.2f}x** [{min(runs) / base['seconds']:.2f}-"
                     f"{max(runs) / base['seconds']:.2f}]")
      return " / ".join(parts)
    if "seconds" in base:
      runs = base.get("runs", [base["seconds"]])
      secs = f" / {base['seconds']:.2f} [{min(runs):.2f}-{max(runs):.2f}]"
      loads += r.get("load_before", []) + r.get("load_after", [])
    else:
      secs = " / (not timed)"
    out.append(f"| {r['model']} | {r['N']} | {r['T']} | {base['flops'] / 1e9:.0f} / {base['bytes'] / 1e9:.1f} / "
               f"{base['peak_bytes'] / 2**20:.0f}{secs} | " + " | ".join(cell(m) for m, _ in COLUMNS)
               + f" | {r.get('auto', '-')} |")
  repeats = sorted({r.get("repeats", 1) for r in rows if "seconds" in r["train"]})
  if loads:
    out.append(f"\nTimed cells: median of {', '.join(map(str, repeats))} runs each [min-max], as ratios to "
               f"(iv)'s median; load average (1, 5, 15 min) before/after the cells: {min(loads):.2f}-{max(loads):.2f}.")
  return "\n".join(out)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--models", default="20m,smollm2")
  ap.add_argument("--ns", default="8,32,64")
  ap.add_argument("--ts", default="128,512")
  ap.add_argument("--chunk", type=int, default=8, help="direct: vmap chunk; fused: reduction chunk")
  ap.add_argument("--micro-batch", type=int, default=8,
                  help="rows per pass of (ii) and (iii), as the loop's reward.micro_batch_size (iii' is one pass)")
  ap.add_argument("--repeats", type=int, default=3, help="timed runs of each program per cell (median, min-max)")
  ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each program before the timed ones")
  ap.add_argument("--max-timed-work", type=float, default=2e11,
                  help="time a cell only if params x N x T is at most this (CPU budget); others: compile only")
  ap.add_argument("--out", default="bench_cosines.jsonl")
  ap.add_argument("--table", help="print the markdown table of a results file and exit")
  args = ap.parse_args()
  if args.table:
    with open(args.table) as fh:
      print(markdown_table([json.loads(line) for line in fh if line.strip()]))
    return
  print(f"devices: {jax.devices()}; load average {load_average()}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
  rows = []
  with open(args.out, "w") as fh:
    for name in args.models.split(","):
      graphdef, params = nnx.split(init_decoder(MODELS[name], 0))
      n_params = sum(x.size for x in jax.tree.leaves(params))
      for t in map(int, args.ts.split(",")):
        single = single_candidate(graphdef, params, t)
        for n in map(int, args.ns.split(",")):
          t0 = time.perf_counter()
          row = bench_cell(name, graphdef, params, n, t, args.chunk, args.micro_batch,
                           n_params * n * t <= args.max_timed_work, single, args.repeats, args.warmup)
          row["params"] = n_params
          row["bench_seconds"] = time.perf_counter() - t0
          print(json.dumps(row), flush=True)
          fh.write(json.dumps(row) + "\n")
          fh.flush()
          rows.append(row)
  print(markdown_table(rows))


if __name__ == "__main__":
  main()
