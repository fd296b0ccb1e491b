"""Benchmark: validating CRUXEval programs (determinism check) with SandboxPool vs a serial baseline.

  python3 experiments/bench_sandbox.py [--data ../shared/data/cruxeval/cruxeval.jsonl]
      [--workers N] [--limit N]

The baseline runs one program at a time in a fresh interpreter
(`python3 -c <program + two calls + compare + repr>`), once with the default
interpreter start (site-packages imported, what a naive subprocess executor
pays) and once with `python3 -I -S` (the cheapest possible interpreter start).
Prints a markdown table.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from compassplay_jax.domains.coding import validation  # pylint: disable=g-import-not-at-top
from compassplay_jax.verifiers import sandbox  # pylint: disable=g-import-not-at-top

_DEFAULT_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared/data/cruxeval/cruxeval.jsonl"
_BASELINE_TEMPLATE = """{program}
_r1 = f({args})
_r2 = f({args})
if _r1 != _r2 or repr(_r1) != repr(_r2):
    raise Exception('Non-deterministic code')
print(repr(_r1))
"""


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


def run_pool(rows, workers):
  with sandbox.SandboxPool(num_workers=workers) as pool:
    pool.run(sandbox.Job(code="pass"))  # Warm-up: workers are started.
    start = time.perf_counter()
    outcomes = validation.validate_io_batch(
        pool, [("deduction", row["code"], row["input"]) for row in rows])
    elapsed = time.perf_counter() - start
    return elapsed, sum(valid for valid, _, _ in outcomes), pool.isolation_report


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", default=str(_DEFAULT_DATA))
  parser.add_argument("--workers", type=int, default=os.cpu_count())
  parser.add_argument("--limit", type=int, default=0, help="use only the first N programs")
  args = parser.parse_args()
  rows = [json.loads(line) for line in open(args.data)]
  if args.limit:
    rows = rows[:args.limit]
  n = len(rows)
  pool_s, pool_ok, report = run_pool(rows, args.workers)
  base_s, base_ok = run_baseline(rows, [])
  fast_s, fast_ok = run_baseline(rows, ["-I", "-S"])
  print(f"{n} CRUXEval programs, {os.cpu_count()} CPU cores, isolation: {report}\n")
  print("| executor | valid | wall s | ms/program | speed-up vs python3 -c |")
  print("|---|---|---|---|---|")
  for name, secs, ok in ((f"SandboxPool ({args.workers} workers)", pool_s, pool_ok),
                         ("serial fresh `python3 -c`", base_s, base_ok),
                         ("serial fresh `python3 -I -S -c`", fast_s, fast_ok)):
    print(f"| {name} | {ok}/{n} | {secs:.1f} | {1000 * secs / n:.1f} | {base_s / secs:.1f}x |")


if __name__ == "__main__":
  main()
