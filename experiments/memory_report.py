"""Ahead-of-time per-device memory of the train and reward steps for the paper's 7B settings.

Shapes only (no weights): compiles each step for a mesh of simulated CPU devices and prints a
markdown table (docs/sharding.md has the numbers). CPU compile figures approximate GPU/TPU ones.

  python3 experiments/memory_report.py --devices 8 --mesh 1,8,1 --mesh 1,2,4 --workload sgs-lean
  python3 experiments/memory_report.py --tiny --mesh 2,2,2            # seconds; what the tests run
  PYTHONPATH=<dir with libtpu> python3 experiments/memory_report.py --topology v5p:2x2x2 --mesh 1,8,1
(--topology compiles with the real TPU compiler for that slice, no TPU needed: `pip install --target
<dir> libtpu==0.0.42.*`, the version jax 0.10.2 pins; keep it off the main environment's path.)
Flags: --remat (recompute each block in the backward pass), --compute-dtype bfloat16,
--param-dtype bfloat16 (model/reward params; the train step keeps fp32 masters unless --no-master-fp32),
--seq-len / --train-micro-batch / --reward-candidates to override the workload.

Per-function report (--functions): each device function of the paper step compiled on its own, one
row each with argument / output / temp / peak bytes per device and whether the peak fits the device
(--device-memory-gib; default 80 GiB, or the --topology's HBM), else the knob to turn:
  python3 experiments/memory_report.py --workload sgs-lean --mesh 1,8,1 --remat --attention-chunk 1024 \
      --functions sampler,g_ref,cos64,cos256,train
  python3 experiments/memory_report.py --tiny --mesh 2,2,2 --functions all   # seconds
  python3 experiments/memory_report.py --table runs/mem/*.json   # one table from earlier --json files
Functions: prefill, decode (alias sampler), g_ref, cos64, cos256 (alias cosines; any cosN), train; all.
--attention-chunk N (ModelConfig.attention_query_chunk), --micro-batch N (train and reward
micro-batch), --sampler-rows N, --reference-size N. --engine-alive D (with train): the update's peak
beside what the rollout engine would hold if it were not released before the update (its KV cache at
half of the free memory and its weight copy over D devices per host):
  python3 experiments/memory_report.py --workload azr-coding --mesh 1,2,4 --scan-layers --remat \
      --functions train --engine-alive 8
"""
import argparse
import dataclasses
import json
import os
import sys
import time


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices")
  parser.add_argument("--mesh", action="append", help="data,fsdp,tensor (repeatable; -1 = the rest)")
  parser.add_argument("--workload", action="append", help="azr-coding | sgs-lean (repeatable; default both)")
  parser.add_argument("--topology", help="a TPU slice, e.g. v5e:2x4 or v5p:2x2x2 (needs libtpu importable)")
  parser.add_argument("--tiny", action="store_true", help="the tiny test config instead of the 7B models")
  parser.add_argument("--remat", action="store_true")
  parser.add_argument("--scan-layers", action="store_true",
                      help="ModelConfig.scan_layers: the train step's blocks as one lax.scan")
  parser.add_argument("--compute-dtype", default="bfloat16")
  parser.add_argument("--param-dtype", default="bfloat16")
  parser.add_argument("--no-master-fp32", action="store_true")
  parser.add_argument("--reward-method", default="fused", choices=("fused", "direct"))
  parser.add_argument("--seq-len", type=int)
  parser.add_argument("--train-micro-batch", type=int)
  parser.add_argument("--reward-candidates", type=int)
  parser.add_argument("--functions", help="per-function report: comma list of prefill, decode, g_ref, cos64, "
                      "cos256, train, cosN, or sampler / cosines / all (default: the two-step table)")
  parser.add_argument("--attention-chunk", type=int, help="ModelConfig.attention_query_chunk (0 = plain)")
  parser.add_argument("--micro-batch", type=int, help="train and reward micro-batch (rows per fwd/bwd)")
  parser.add_argument("--sampler-rows", type=int, help="rows the sampler decodes together")
  parser.add_argument("--reference-size", type=int)
  parser.add_argument("--device-memory-gib", type=float, help="per-device memory for the fits column "
                      "(default: 80, or the --topology's HBM)")
  parser.add_argument("--engine-alive", type=int, metavar="SAMPLER_DEVICES",
                      help="with --functions train: also the update's peak with the rollout engine's KV cache "
                           "and weight copy kept (not released), the copy split over SAMPLER_DEVICES devices "
                           "per host (8 for 8 x H100, 4 for a v5p-8's hosts)")
  parser.add_argument("--json", help="also write the rows here (process 0)")
  parser.add_argument("--table", nargs="+", metavar="JSON", help="print the per-function table of rows "
                      "written by earlier --functions ... --json runs (compiles nothing)")
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  if args.table:
    from compassplay_jax.costs import memory_report as mr
    rows = []
    for path in args.table:
      try:
        rows += json.load(open(path))
      except (OSError, ValueError) as err:
        sys.exit(f"memory_report: cannot read rows from {path}: {err}")
    print(mr.format_function_table(rows))
    return
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={args.devices}").strip()
  from compassplay_jax.costs import memory_report as mr
  from compassplay_jax.infra import sharding as sh
  from compassplay_jax.rl.train_step import TrainConfig

  devices = None
  if args.topology:
    from jax.experimental import topologies
    devices = topologies.get_topology_desc(topology_name=args.topology, platform="tpu").devices
  settings = []
  if args.tiny:
    settings.append(mr.tiny_workload())
  else:
    for name in args.workload or sorted(mr.PAPER_WORKLOADS):
      work = mr.PAPER_WORKLOADS[name]
      settings.append((mr.PAPER_MODELS[work.model], work))
  overrides = {k: v for k, v in (("seq_len", args.seq_len), ("train_micro_batch", args.train_micro_batch),
                                 ("reward_candidates", args.reward_candidates),
                                 ("train_micro_batch", args.micro_batch), ("reward_micro_batch", args.micro_batch),
                                 ("sampler_rows", args.sampler_rows), ("reference_size", args.reference_size)) if v}
  train_cfg = TrainConfig(master_fp32=not args.no_master_fp32)
  functions = mr.parse_functions(args.functions) if args.functions else None
  device_bytes = mr.device_memory_bytes(args.topology, args.device_memory_gib)
  rows, engine_rows = [], []
  for cfg, work in settings:
    cfg = cfg.replace(remat=args.remat, scan_layers=args.scan_layers, dtype=args.compute_dtype,
                      param_dtype=args.param_dtype)
    if args.attention_chunk is not None:
      cfg = cfg.replace(attention_query_chunk=args.attention_chunk)
    work = dataclasses.replace(work, **overrides)
    for mesh_arg in args.mesh or ["1,-1,1"]:
      mesh = sh.make_mesh(mesh_arg, devices=devices)
      start = time.time()
      if functions is not None:
        def progress(row):
          print(f"# {row['model']} on {row['mesh']}: {row['function']} compiled in {row['compile_s']} s "
                f"(fits: {row['fits']})", file=sys.stderr, flush=True)
        these = mr.report_functions(cfg, mesh, work, functions, device_bytes=device_bytes, train_cfg=train_cfg,
                                    reward_method=args.reward_method, on_row=progress)
        for row in these:
          row.update(backend=args.topology or f"cpu x{args.devices}", workload=dataclasses.asdict(work),
                     compute_dtype=args.compute_dtype, param_dtype=args.param_dtype)
          rows.append(row)
        if args.engine_alive:
          engine_rows.extend(mr.engine_rows(these, cfg, mesh, work, sampler_devices=args.engine_alive,
                                            train_cfg=train_cfg, compute_dtype=args.compute_dtype))
        continue
      row = mr.report(cfg, mesh, work, reward_method=args.reward_method, train_cfg=train_cfg)
      row.update(backend=args.topology or f"cpu x{args.devices}", workload=dataclasses.asdict(work),
                 remat=args.remat, compute_dtype=args.compute_dtype,
                 param_dtype=args.param_dtype, compile_s=round(time.time() - start, 1))
      rows.append(row)
      print(f"# {work.model} on {row['mesh']}: compiled in {row['compile_s']} s", file=sys.stderr, flush=True)
  print(mr.format_function_table(rows) if functions is not None else mr.format_table(rows))
  if engine_rows:
    print("\nThe update with the rollout engine released (the loop) and alive:\n" + mr.format_engine_table(engine_rows))
  if args.json:
    from compassplay_jax.infra import distributed
    distributed.write_json(args.json, rows)


if __name__ == "__main__":
  main()
