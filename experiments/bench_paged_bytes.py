"""Decode-step bytes, paged vs dense KV cache, from XLA's cost analysis (nothing is allocated).

Lowers one decode step of the paged engine (paged_slots.paged_forward over a page bucket of the live
rows' pages) and of the dense engine (slots.decode_chunk's step over its attention window) on
ShapeDtypeStructs at the paper shapes and prints "bytes accessed" at several fills. `fill`: every
live row has filled that fraction of the cache's columns except the longest live row, which has
filled `--longest` of them (1.0: a long tail's longest row, which sets the dense window). "cache
part" = step bytes minus the step's bytes with nothing to attend to (weights, activations, logits).

  python experiments/bench_paged_bytes.py --model qwen2.5-coder-7b --slots 32 --columns 16384
"""
from __future__ import annotations

import argparse
import json
import time

from compassplay_jax.memory_report import PAPER_MODELS
from compassplay_jax.sampling.paged_slots import decode_step_bytes


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="qwen2.5-coder-7b", choices=sorted(PAPER_MODELS))
  ap.add_argument("--slots", type=int, default=32, help="decode slots on one device")
  ap.add_argument("--columns", type=int, default=16384, help="cache columns per row (the dense cache length)")
  ap.add_argument("--fills", type=float, nargs="+", default=[0.1, 0.5, 1.0])
  ap.add_argument("--longest", type=float, default=1.0, help="the longest live row's fill (sets the dense window)")
  ap.add_argument("--page-size", type=int, default=16)
  ap.add_argument("--dtype", default="bfloat16", help="compute and cache dtype")
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  cfg = PAPER_MODELS[args.model].replace(dtype=args.dtype)
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
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
  main()
