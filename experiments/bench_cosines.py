"""Benchmark: per-example gradient cosines by (i) a Python loop of per-candidate jax.grad, (ii) chunked
vmap(grad) (method="direct"), (iii) the fused probe pass (method="fused"), against (iv) one batched
forward + backward of the same batch.

Reports, per (model, N, T): XLA's compiled FLOPs and compiled peak memory (arguments + outputs +
temporaries; compile only, stable across machines) and, for cells whose work fits the time budget,
wall time from one run. Weights are random (timing and memory do not depend on them).

  python3 experiments/bench_cosines.py --out bench_cosines.jsonl   # 27 min on 2 busy CPU cores
  python3 experiments/bench_cosines.py --table bench_cosines.jsonl  # the docs table

FLOP notes: XLA's cost analysis counts a loop body once, so (i) and (ii) are reported as N x the
FLOPs of one candidate's grad + reduction (the same arithmetic), and (iii) as the FLOPs of the
unchunked fused program (chunking changes memory, not arithmetic).
"""
from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rewards.cosines import gradient_cosines
from compassplay_jax.rewards.cosines_direct import tree_vdot
from compassplay_jax.rewards.losses import per_sequence_loss

MODELS = {
    # ~20M parameters, untied head.
    "20m": ModelConfig(model_type="llama", vocab_size=8192, hidden_size=384, intermediate_size=1152,
                       num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2),
    # SmolLM2-135M's shapes (tied embeddings, 30 layers).
    "smollm2": ModelConfig(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                           num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                           tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5),
}


def compiled_stats(compiled):
  m = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
  return float(cost.get("flops", float("nan"))), int(peak)


def timed(fn, *args):
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - t0


def bench_cell(name, graphdef, params, n, t, chunk, timed_ok, single):
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 1000, (n, t)), jnp.int32)
  mask = jnp.asarray(np.arange(t)[None, :] >= t // 4, jnp.int32).repeat(n, 0)
  attn = jnp.ones((n, t), jnp.int32)
  g_ref = params  # any params-shaped tree: cost does not depend on its values
  cos = lambda method, chunk_size: jax.jit(functools.partial(gradient_cosines, graphdef, method=method,
                                                             chunk_size=chunk_size))
  train = jax.jit(lambda p, tk, m, a: jax.grad(lambda q: jnp.mean(per_sequence_loss(graphdef, q, tk, m, a)))(p))
  row = dict(model=name, N=n, T=t, chunk=chunk)
  progs = {
      "direct": cos("direct", chunk).lower(params, g_ref, tokens, mask, attn).compile(),
      "fused": cos("fused", chunk).lower(params, g_ref, tokens, mask, attn).compile(),
      "train": train.lower(params, tokens, mask, attn).compile(),
  }
  fused_flops, _ = compiled_stats(cos("fused", None).lower(params, g_ref, tokens, mask, attn).compile())
  single_flops, single_peak = single["stats"]
  row["loop"] = dict(flops=n * single_flops, peak_bytes=single_peak)
  for key, prog in progs.items():
    flops, peak = compiled_stats(prog)
    row[key] = dict(flops=flops, peak_bytes=peak)
  row["direct"]["flops"] = n * single_flops
  row["fused"]["flops"] = fused_flops
  if timed_ok:
    one = single["fn"]
    row["loop"]["seconds"] = timed(lambda: [one(params, g_ref, tokens[i:i + 1], mask[i:i + 1], attn[i:i + 1])
                                            for i in range(n)])
    for key in ("direct", "fused"):
      row[key]["seconds"] = timed(progs[key], params, g_ref, tokens, mask, attn)
    row["train"]["seconds"] = timed(progs["train"], params, tokens, mask, attn)
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


def markdown_table(rows) -> str:
  """The docs table: absolute numbers for (iv), ratios to (iv) for (i)-(iii)."""
  out = ["| model | N | T | (iv) fwd+bwd GFLOP / peak MiB / s | (i) loop | (ii) chunked vmap(grad) | (iii) fused |",
         "|---|---|---|---|---|---|---|"]
  for r in rows:
    base = r["train"]
    cell = lambda m: " / ".join(
        [f"{r[m]['flops'] / base['flops']:.3f}x", f"{r[m]['peak_bytes'] / base['peak_bytes']:.2f}x"]
        + ([f"{r[m]['seconds'] / base['seconds']:.2f}x"] if "seconds" in base else []))
    secs = f" / {base['seconds']:.2f}" if "seconds" in base else " / (not timed)"
    out.append(f"| {r['model']} | {r['N']} | {r['T']} | {base['flops'] / 1e9:.0f} / {base['peak_bytes'] / 2**20:.0f}"
               f"{secs} | {cell('loop')} | {cell('direct')} | {cell('fused')} |")
  return "\n".join(out)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--models", default="20m,smollm2")
  ap.add_argument("--ns", default="8,32,64")
  ap.add_argument("--ts", default="128,512")
  ap.add_argument("--chunk", type=int, default=8, help="direct: vmap chunk; fused: reduction chunk")
  ap.add_argument("--max-timed-work", type=float, default=2e11,
                  help="time a cell only if params x N x T is at most this (CPU budget); others: compile only")
  ap.add_argument("--out", default="bench_cosines.jsonl")
  ap.add_argument("--table", help="print the markdown table of a results file and exit")
  args = ap.parse_args()
  if args.table:
    with open(args.table) as fh:
      print(markdown_table([json.loads(line) for line in fh if line.strip()]))
    return
  print(f"devices: {jax.devices()}")
  with open(args.out, "w") as fh:
    for name in args.models.split(","):
      graphdef, params = nnx.split(init_decoder(MODELS[name], 0))
      n_params = sum(x.size for x in jax.tree.leaves(params))
      for t in map(int, args.ts.split(",")):
        single = single_candidate(graphdef, params, t)
        for n in map(int, args.ns.split(",")):
          t0 = time.perf_counter()
          row = bench_cell(name, graphdef, params, n, t, args.chunk, n_params * n * t <= args.max_timed_work, single)
          row["params"] = n_params
          row["bench_seconds"] = time.perf_counter() - t0
          print(json.dumps(row), flush=True)
          fh.write(json.dumps(row) + "\n")
          fh.flush()


if __name__ == "__main__":
  main()
