"""Benchmark: validating CRUXEval programs (determinism check) with SandboxPool vs a serial baseline,
and the per-job cost of each isolation layer.

  python3 experiments/bench_sandbox.py [--data DATA_DIR/cruxeval/cruxeval.jsonl]
      [--workers N] [--limit N] [--repeats N] [--no-baseline] [--no-layers]

The baseline runs one program at a time in a fresh interpreter
(`python3 -c <program + two calls + compare + repr>`), once with the default
interpreter start (site-packages imported, what a naive subprocess executor
pays) and once with `python3 -I -S` (the cheapest possible interpreter start).
The layer table runs the same validation with every layer on, then with one
layer switched off at a time (`SandboxPool(disabled_layers=...)`); a layer's
per-job overhead is (wall with it - wall without it) * workers / programs.
Prints markdown tables and the load average (timings are only comparable on a
quiet machine).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from compassplay_jax.data import paths  # pylint: disable=g-import-not-at-top
from compassplay_jax.domains.coding import validation  # pylint: disable=g-import-not-at-top
from compassplay_jax.verifiers import sandbox  # pylint: disable=g-import-not-at-top

# The data directory (config.data_dir / $COMPASSPLAY_DATA / per-user cache; docs/data.md), else the
# development machines' ../shared/data.
_RELPATH = "cruxeval/cruxeval.jsonl"
_DEFAULT_DATA = next((p for p in (paths.data_dir() / _RELPATH,
                                  pathlib.Path(__file__).resolve().parents[2] / "shared/data" / _RELPATH)
                      if p.is_file()), paths.data_dir() / _RELPATH)
_BASELINE_TEMPLATE = """{program}
_r1 = f({args})
_r2 = f({args})
if _r1 != _r2 or repr(_r1) != repr(_r2):
    raise Exception('Non-deterministic code')
print(repr(_r1))
"""
# Layers that can be switched off one at a time (the zygote, i.e. a fresh process per job, cannot).
_LAYERS = ("seccomp", "ipcns", "jobns", "pidns", "uid")


def run_baseline(rows, flags):
  start = time.perf_counter()
  ok = 0
  for row in rows:
    script = _BASELINE_TEMPLATE.format(program=row["code"], args=row["input"])
    try:
      done = subprocess.run([sys.executable, *flags, "-c", script], capture_output=True,
                            timeout=10, cwd="/tmp", check=False)
      ok += done.returncode == 0
    except subprocess.TimeoutExpired:
      pass
  return time.perf_counter() - start, ok


def run_pool(rows, workers, disabled=(), repeats=1):
  """Best wall time of `repeats` validations of all rows on one pool."""
  with sandbox.SandboxPool(num_workers=workers, disabled_layers=disabled) as pool:
    pool.run_batch([sandbox.Job(code="pass")] * workers)  # Warm-up: workers are started.
    best, valid = float("inf"), 0
    for _ in range(repeats):
      start = time.perf_counter()
      outcomes = validation.validate_io_batch(
          pool, [("deduction", row["code"], row["input"]) for row in rows])
      best = min(best, time.perf_counter() - start)
      valid = sum(ok for ok, _, _ in outcomes)
    return best, valid, pool.isolation_report


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", default=str(_DEFAULT_DATA))
  parser.add_argument("--workers", type=int, default=os.cpu_count())
  parser.add_argument("--limit", type=int, default=0, help="use only the first N programs")
  parser.add_argument("--repeats", type=int, default=3, help="pool runs per configuration (best)")
  parser.add_argument("--no-baseline", action="store_true", help="skip the serial baselines")
  parser.add_argument("--no-layers", action="store_true", help="skip the per-layer table")
  args = parser.parse_args()
  if not pathlib.Path(args.data).is_file():
    sys.exit(f"bench_sandbox: CRUXEval file not found: {args.data} "
             f"(python -m compassplay_jax.data fetch cruxeval, or pass --data)")
  rows = [json.loads(line) for line in open(args.data)]
  if args.limit:
    rows = rows[:args.limit]
  n = len(rows)
  load_before = os.getloadavg()
  pool_s, pool_ok, report = run_pool(rows, args.workers, repeats=args.repeats)
  print(f"{n} CRUXEval programs, {os.cpu_count()} CPU cores, {args.workers} workers; "
        f"load average before: {load_before[0]:.2f}")
  print(f"isolation: {report}\n")
  table = [(f"SandboxPool ({args.workers} workers, all layers)", pool_s, pool_ok)]
  base_s = None
  if not args.no_baseline:
    base_s, base_ok = run_baseline(rows, [])
    fast_s, fast_ok = run_baseline(rows, ["-I", "-S"])
    table += [("serial fresh `python3 -c`", base_s, base_ok),
              ("serial fresh `python3 -I -S -c`", fast_s, fast_ok)]
  print("| executor | valid | wall s | ms/program | programs/s | speed-up vs python3 -c |")
  print("|---|---|---|---|---|---|")
  for name, secs, ok in table:
    speed = f"{base_s / secs:.1f}x" if base_s else "-"
    print(f"| {name} | {ok}/{n} | {secs:.2f} | {1000 * secs / n:.2f} | {n / secs:.0f} | {speed} |")
  if not args.no_layers:
    print("\n| layer switched off | wall s | per-job cost of the layer (ms) |")
    print("|---|---|---|")
    for layer in _LAYERS:
      secs, _, _ = run_pool(rows, args.workers, disabled=(layer,), repeats=args.repeats)
      cost = (pool_s - secs) * args.workers * 1000 / n
      print(f"| {layer} | {secs:.2f} | {cost:+.2f} |")
  print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
