"""Wall time of the README's main command, cold and warm, with per-phase seconds and in-band counts.

  python experiments/bench_demo.py                                  # configs/coding.py:demo on 2 cores
  python experiments/bench_demo.py --config=configs/coding.py:tiny  # a quick check of the bench itself

Cold: a fresh work directory and a fresh, empty compilation cache (a first run on a new machine).
Warm: another fresh work directory with the cache the cold run filled (a second run). Each run is
`python -m compassplay_jax.main --config=CONFIG --workdir=DIR --config.compile_cache_dir=CACHE`, pinned
to --cores CPUs. Prints markdown tables (docs/demo.md) built from each run's metrics.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

PHASES = ("generate", "sandbox", "reward", "update")


def run_main(config: str, workdir: pathlib.Path, cache: pathlib.Path, cores: int, extra: list[str]) -> float:
  """Runs the main command as a user would and returns its wall time in seconds."""
  cmd = [sys.executable, "-m", "compassplay_jax.main", f"--config={config}", f"--workdir={workdir}",
         f"--config.compile_cache_dir={cache}", *extra]
  cpus = sorted(os.sched_getaffinity(0))[:cores]
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # the run's own cache
  t0 = time.time()
  proc = subprocess.run(cmd, env=env, preexec_fn=lambda: os.sched_setaffinity(0, cpus), capture_output=True,
                        text=True)
  wall = time.time() - t0
  (workdir.parent / f"{workdir.name}.log").write_text(proc.stdout + proc.stderr)
  if proc.returncode:
    sys.exit(f"error: {' '.join(cmd)} exited {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
  return wall


def read_steps(workdir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_row(label: str, wall: float, steps: list[dict]) -> str:
  in_steps = sum(s.get("time/step", 0.0) for s in steps)
  phases = " | ".join(f"{sum(s.get(f'time/{p}', 0.0) for s in steps):.0f}" for p in PHASES)
  compiles = sum(s.get("compile/count", 0) for s in steps)
  compile_s = sum(s.get("compile/seconds", 0.0) for s in steps)
  hits = sum(s.get("compile/cache_hits", 0) for s in steps)
  load_s = sum(s.get("compile/cache_load_seconds", 0.0) for s in steps)
  return (f"| {label} | {wall:.0f} | {wall - in_steps:.0f} | {phases} | {compiles:.0f} ({compile_s:.0f} s) | "
          f"{hits:.0f} ({load_s:.0f} s) |")


def step_rows(label: str, steps: list[dict]) -> list[str]:
  rows = []
  for s in steps:
    n = len(s.get("candidates", []))
    rows.append(f"| {label} | {s['step']} | {s.get('time/step', 0):.0f} | {n} | {s.get('valid_rate', 0) * n:.0f} | "
                f"{s.get('in_band_count', 0):.0f} | {s.get('cos_paid_count', 0):.0f} | {s.get('cos_share', 0):.2f} | "
                f"{s.get('reward/proposer', 0):+.3f} |")
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/coding.py:demo")
  parser.add_argument("--cores", type=int, default=2, help="CPUs the runs are pinned to")
  parser.add_argument("--dir", default="", help="where work directories and the cache go (default: a temp dir)")
  args, extra = parser.parse_known_args()
  root = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bench_demo_"))
  root.mkdir(parents=True, exist_ok=True)
  cache = root / "xla_cache"
  load_before = os.getloadavg()
  results = []
  for label in ("cold", "warm"):
    workdir = root / label
    if workdir.exists():
      sys.exit(f"error: {workdir} exists; pass an empty --dir")
    wall = run_main(args.config, workdir, cache, args.cores, extra)
    results.append((label, wall, read_steps(workdir)))
    print(f"{label}: {wall:.0f} s (load average {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
  load_after = os.getloadavg()

  print(f"`{args.config}` on {args.cores} cores, runs in {root}; load average (1/5/15 min) before "
        f"{'/'.join(f'{x:.2f}' for x in load_before)}, after {'/'.join(f'{x:.2f}' for x in load_after)}\n")
  print("| run | wall s | outside steps s (start-up, load, summary) | generate s | sandbox s | reward s | update s "
        "| XLA compiles (s) | cache loads (s) |")
  print("|---|---|---|---|---|---|---|---|---|")
  for label, wall, steps in results:
    print(run_row(label, wall, steps))
  print("\n| run | step | s | candidates | valid | in band | paid by cosine | cosine share of \\|r\\| | proposer reward |")
  print("|---|---|---|---|---|---|---|---|---|")
  for label, _, steps in results:
    print("\n".join(step_rows(label, steps)))


if __name__ == "__main__":
  main()
