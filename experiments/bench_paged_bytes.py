"""Decode-step bytes, paged vs dense KV cache, from XLA's cost analysis (nothing is allocated).

Lowers one decode step of the paged engine (paged_slots.paged_forward over a page bucket of the live
rows' pages) and of the dense engine (slots.decode_chunk's step over its attention window) on
ShapeDtypeStructs at the paper shapes and prints "bytes accessed" at several fills. `fill`: every
live row has filled that fraction of the cache's columns except the longest live row, which has
filled `--longest` of them (1.0: a long tail's longest row, which sets the dense window). "cache
part" = step bytes minus the step's bytes with nothing to attend to (weights, activations, logits).

  python experiments/bench_paged_bytes.py --model qwen2.5-coder-7b --slots 32 --columns 16384

--cpu-step: instead, time one decode chunk (8 steps) of each layout on this machine at SmolLM2-135M's
shapes (random weights, fp32): 32 live rows of 100..1000 columns and one of 1900 (the long tail's
longest, which sets the dense window: 2048), interleaved, 3 repeats.

  python experiments/bench_paged_bytes.py --cpu-step
"""
from __future__ import annotations

import argparse
import json
import time

from compassplay_jax.costs.memory_report import PAPER_MODELS
from compassplay_jax.sampling.paged_slots import decode_step_bytes


def cpu_step(repeats: int = 3, slots: int = 32, columns: int = 2048, chunk: int = 8, page_size: int = 16):
  import os

  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from compassplay_jax.models.config import ModelConfig
  from compassplay_jax.models.decoder import init_decoder
  from compassplay_jax.sampling import paged_slots, slots as slots_lib
  from compassplay_jax.sampling.config import SamplingConfig
  from compassplay_jax.sampling.paged_kernels import blocks_for, flat_blocks
  cfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
  graphdef, params = nnx.split(init_decoder(cfg, seed=0))
  lens = np.random.default_rng(0).integers(100, 1000, slots)
  lens[0] = columns - columns // 16
  sampler = SamplingConfig(temperature=1.0, top_k=50).sampler
  key = jax.random.key(0)

  def arm(st, field):
    return st._replace(**{field: jnp.array(lens, jnp.int32)}, positions=jnp.array(lens, jnp.int32),
                       done=jnp.zeros(slots, bool), budget=jnp.full(slots, 10 ** 6, jnp.int32),
                       count=jnp.ones(slots, jnp.int32))
  dense = arm(jax.jit(lambda k: slots_lib.init_slots(k, cfg=cfg, slots=slots, length=columns, chunk=chunk,
                                                     cache_dtype="float32"))(key), "write_at")
  dense_fn = jax.jit(lambda p, s, h, r: slots_lib.decode_chunk(graphdef, p, s, h, r, sampler=sampler, eos_ids=(),
                                                               window=columns), donate_argnums=(1,))
  row_pages = -(-columns // page_size)
  paged = arm(jax.jit(lambda k: paged_slots.init_paged(k, cfg=cfg, slots=slots, num_pages=slots * row_pages + 1,
                                                       page_size=page_size, chunk=chunk, cache_dtype="float32"))(key),
              "length")
  table = (1 + np.arange(slots * row_pages).reshape(slots, row_pages)).astype(np.int32)
  counts = -(-(lens + chunk) // page_size)
  block = max(1, 64 // page_size)
  flat = flat_blocks(table, counts, paged_slots.page_bucket(blocks_for(counts, block)), page_size, block)
  base = (lens // page_size).astype(np.int32)
  write = np.stack([table[b, base[b]:base[b] + paged_slots.write_columns(chunk, page_size)] for b in range(slots)])
  paged_fn = jax.jit(lambda p, s, *r: paged_slots.decode_paged(graphdef, p, s, *r, sampler=sampler, eos_ids=()),
                     donate_argnums=(1,))
  host_done, refill = np.zeros(slots, bool), np.int32(slots + 1)
  print(f"SmolLM2-135M shapes, {slots} rows of {lens.min()}..{lens.max()} columns, dense window {columns}, "
        f"pages of {page_size}, {chunk}-step chunks")
  for rep in range(repeats + 1):
    dense = dense._replace(write_at=jnp.array(lens, jnp.int32))
    paged = paged._replace(length=jnp.array(lens, jnp.int32))
    t = time.perf_counter()
    dense = jax.block_until_ready(dense_fn(params, dense, host_done, refill)[0])
    t_dense = time.perf_counter() - t
    t = time.perf_counter()
    paged = jax.block_until_ready(paged_fn(params, paged, host_done, refill, write, base, *flat)[0])
    t_paged = time.perf_counter() - t
    what = "compile + run" if rep == 0 else f"repeat {rep}"
    print(f"{what}: dense {t_dense / chunk * 1e3:.0f} ms/step, paged {t_paged / chunk * 1e3:.0f} ms/step "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="qwen2.5-coder-7b", choices=sorted(PAPER_MODELS))
  ap.add_argument("--slots", type=int, default=32, help="decode slots on one device")
  ap.add_argument("--columns", type=int, default=16384, help="cache columns per row (the dense cache length)")
  ap.add_argument("--fills", type=float, nargs="+", default=[0.1, 0.5, 1.0])
  ap.add_argument("--longest", type=float, default=1.0, help="the longest live row's fill (sets the dense window)")
  ap.add_argument("--page-size", type=int, default=16)
  ap.add_argument("--dtype", default="bfloat16", help="compute and cache dtype")
  ap.add_argument("--tensor-shard", type=int, default=1,
                  help="price one device of a tensor-parallel mesh: query heads, KV heads (where they divide) and "
                       "the MLP split this many ways (the hidden size and vocabulary whole: an upper bound)")
  ap.add_argument("--analytic", action="store_true",
                  help="also print step_time_model's analytic bytes for the same held pages (paged_step_figures)")
  ap.add_argument("--json", default=None)
  ap.add_argument("--cpu-step", action="store_true", help="time a decode chunk of each layout instead (see above)")
  args = ap.parse_args(argv)
  if args.cpu_step:
    return cpu_step()
  cfg = PAPER_MODELS[args.model].replace(dtype=args.dtype)
  t = args.tensor_shard
  if t > 1:  # one device's share of the heads and the MLP (models/layout.py's tensor split)
    kv = cfg.num_key_value_heads
    cfg = cfg.replace(num_attention_heads=cfg.num_attention_heads // t, intermediate_size=cfg.intermediate_size // t,
                      num_key_value_heads=kv // t if kv % t == 0 else kv)
  rows = []
  print("| fill | dense window | live pages (bucket) | dense step GB | paged step GB | paged / dense | "
        "dense cache part GB | paged cache part GB | paged / dense (cache part) |")
  print("|---|---|---|---|---|---|---|---|---|")
  for fill in args.fills:
    t = time.time()
    r = decode_step_bytes(cfg, slots=args.slots, columns=args.columns, fill=fill, page_size=args.page_size,
                          cache_dtype=args.dtype, longest=args.longest)
    r.update(fill=fill, seconds=time.time() - t)
    rows.append(r)
    d, p = r["dense"] - r["base"], r["paged"] - r["base"]
    print(f"| {fill:.0%} | {r['window']} | {r['live_pages']} ({r['pages']}) | {r['dense'] / 1e9:.2f} | "
          f"{r['paged'] / 1e9:.2f} | {r['paged'] / r['dense']:.2f} | {d / 1e9:.2f} | {p / 1e9:.2f} | {p / d:.2f} |",
          flush=True)
    if args.analytic:  # the step-time model's KV bytes for the same held pages and the same dense window
      from compassplay_jax.costs import step_time_model as stm
      import numpy as np
      one = stm.Mesh(devices=1, batch_divisor=1, tensor=1)
      entry = stm.kv_entry_bytes(cfg, one, np.dtype(args.dtype).itemsize)
      held, window = r["live_pages"] * args.page_size * entry, args.slots * r["window"] * entry
      print(f"|   analytic (step_time_model) | | {r['live_pages']} held | | | | {window / 1e9:.2f} | {held / 1e9:.2f} | "
            f"{held / window:.2f} |   XLA / analytic: dense {d / window:.2f}x, paged {p / held:.2f}x", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
  main()
