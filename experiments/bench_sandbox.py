"""Benchmark: validating CRUXEval programs (determinism check) with SandboxPool vs a serial baseline,
the per-job cost of each isolation layer, and where each job's CPU time goes.

  python3 experiments/bench_sandbox.py [--data DATA_DIR/cruxeval/cruxeval.jsonl]
      [--workers N] [--limit N] [--repeats N] [--no-baseline] [--no-layers] [--no-profile]

The baseline runs one program at a time in a fresh interpreter
(`python3 -c <program + two calls + compare + repr>`), once with the default
interpreter start (site-packages imported, what a naive subprocess executor
pays) and once with `python3 -I -S` (the cheapest possible interpreter start).
The layer table runs the same validation with every layer on, then with one
layer switched off at a time (`SandboxPool(disabled_layers=...)`); a layer's
per-job overhead is (wall with it - wall without it) * workers / programs.
The profile table runs the validation on one worker and reads, from /proc, the CPU
time (user, system) and minor page faults of each process per job: the trainer
(this process), the worker, the call-job zygote and the job processes; and the
floor: a fork and exit of a process of the zygote's size, measured here.
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
# ipcns and jobns are per-job namespaces of generic jobs only: call jobs (validation) have no
# writable path and no IPC syscall, so those two cost them nothing.
_LAYERS = ("seccomp", "pidns", "uid")
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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


def _proc_stat(pid):
  """(user s, system s, children user s, children system s, minor faults, children minor faults)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) / _HZ, int(fields[12]) / _HZ, int(fields[13]) / _HZ,
          int(fields[14]) / _HZ, int(fields[7]), int(fields[8]))


def _children(pid):
  found = []
  for task in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{task}/children") as f:
        found += [int(x) for x in f.read().split()]
    except OSError:
      pass
  return found


def _cmdline(pid):
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return ""


def fork_floor(repeats=200):
  """CPU ms of fork + exit (parent and child) of a process holding the call-job runtime."""
  import gc  # pylint: disable=g-import-not-at-top
  import resource  # pylint: disable=g-import-not-at-top
  verifiers = str(pathlib.Path(sandbox.__file__).parent)
  code = ("import sys, gc, os, resource\n"
          f"sys.path.insert(0, {verifiers!r})\n"
          "import sandbox_runtime, sandbox_isolation, sandbox_seccomp\n"
          "rt = sandbox_runtime.Runtime(); gc.collect(); gc.freeze()\n"
          "def cpu():\n"
          "  a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)\n"
          "  return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime\n"
          "best = 1e9\n"
          "for _ in range(5):\n"
          "  c = cpu()\n"
          f"  for _ in range({repeats}):\n"
          "    pid = os.fork()\n"
          "    if pid == 0: os._exit(0)\n"
          "    os.waitpid(pid, 0)\n"
          f"  best = min(best, (cpu() - c) / {repeats})\n"
          "print(best * 1000)\n")
  del gc, resource
  done = subprocess.run([sys.executable, "-S", "-s", "-c", code], capture_output=True, text=True,
                        check=True)
  return float(done.stdout)


def profile(rows):
  """Per-job CPU ms (user, system) and minor page faults of each process, on one worker."""
  with sandbox.SandboxPool(num_workers=1) as pool:
    pool.run(sandbox.Job(code="pass"))
    worker = _children(os.getpid())[0]
    # The main call-job zygote, not "calls2" (the second interpreter of the cross-job determinism check,
    # the same profile with another hash seed).
    zygote = next(p for p in _children(worker) if "sandbox_zygote.py calls" in _cmdline(p)
                  and b"PYTHONHASHSEED=0\0" in pathlib.Path(f"/proc/{p}/environ").read_bytes())
    items = [("deduction", row["code"], row["input"]) for row in rows]
    validation.validate_io_batch(pool, items[:20])
    me0, w0, z0 = os.times(), _proc_stat(worker), _proc_stat(zygote)
    import resource  # pylint: disable=g-import-not-at-top
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    validation.validate_io_batch(pool, items)
    wall = time.perf_counter() - start
    me1, w1, z1 = os.times(), _proc_stat(worker), _proc_stat(zygote)
    faults1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  n = len(rows)
  per = lambda x: 1000 * x / n
  table = [("trainer (validation, pool threads)", per(me1.user - me0.user),
            per(me1.system - me0.system), (faults1 - faults0) / n),
           ("worker (prepare: rules + compile; collect, check the frame)", per(w1[0] - w0[0]),
            per(w1[1] - w0[1]), (w1[4] - w0[4]) / n),
           ("zygote (fork, PID namespace, wait)", per(z1[0] - z0[0]), per(z1[1] - z0[1]),
            (z1[4] - z0[4]) / n),
           ("job process (setup, run f twice, encode; exit)", per(z1[2] - z0[2]),
            per(z1[3] - z0[3]), (z1[5] - z0[5]) / n)]
  return wall / n * 1000, table


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", default=str(_DEFAULT_DATA))
  parser.add_argument("--workers", type=int, default=os.cpu_count())
  parser.add_argument("--limit", type=int, default=0, help="use only the first N programs")
  parser.add_argument("--repeats", type=int, default=3, help="pool runs per configuration (best)")
  parser.add_argument("--no-baseline", action="store_true", help="skip the serial baselines")
  parser.add_argument("--no-layers", action="store_true", help="skip the per-layer table")
  parser.add_argument("--no-profile", action="store_true", help="skip the per-process table")
  args = parser.parse_args()
  if not pathlib.Path(args.data).is_file():
    sys.exit(f"bench_sandbox: CRUXEval file not found: {args.data} "
             f"(python -m compassplay_jax.cli.data fetch cruxeval, or pass --data)")
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
  if not args.no_profile:
    wall_ms, table = profile(rows)
    total = sum(user + system for _, user, system, _ in table)
    print(f"\nOne worker, per job (wall {wall_ms:.2f} ms; CPU {total:.2f} ms in all):\n")
    print("| process | user ms | system ms | minor page faults |")
    print("|---|---|---|---|")
    for name, user, system, faults in table:
      print(f"| {name} | {user:.2f} | {system:.2f} | {faults:.0f} |")
    print(f"| floor: fork + exit of a process of the zygote's size | {fork_floor():.2f} (both) | | |")
  print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
