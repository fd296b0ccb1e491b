"""Device traces of chosen steps (config.profile) and a table of where their time went.

`--config.profile.steps=2` wraps step 2 in `jax.profiler.trace`: the trace lands in
<workdir>/profile/plugins/profile/<time>/ (or config.profile.dir), readable by TensorBoard's profile
plugin, XProf and Perfetto (`perfetto_trace.json.gz`, ui.perfetto.dev). Profile a step after the
first: step 1 compiles, and a trace of it is mostly compilation.

    python -m compassplay_jax.infra.profiling runs/coding_demo/profile     # the 20 slowest programs and XLA ops

The table reads the Perfetto trace that JAX writes beside the XProf files (plain gzipped JSON), so it
needs no profiler plugin: total time per compiled program and per XLA op (fusions, dots, copies on
CPU; kernels on GPU), its share of the traced wall time, and how often it ran. In a multi-process
run each process traces into <dir>/process_<i>.
"""
from __future__ import annotations

import collections
import contextlib
import gzip
import json
import pathlib
import sys

import jax

from compassplay_jax.core.errors import InputFormatError, InputNotFound
from compassplay_jax.models.config import ConfigError

PERFETTO_FILE = "perfetto_trace.json.gz"


def parse_steps(text) -> frozenset[int]:
  """config.profile.steps ("2", "2,3", "" = none; an int or a tuple of ints also) -> step numbers."""
  items = text if isinstance(text, (tuple, list)) else str(text).replace(" ", "").split(",")
  steps = set()
  for item in items:
    if item == "":
      continue
    try:
      step = int(item)
    except (TypeError, ValueError):
      raise ConfigError(f"config.profile.steps={text!r}: {item!r} is not a step number") from None
    if step < 1:
      raise ConfigError(f"config.profile.steps={text!r}: steps count from 1")
    steps.add(step)
  return frozenset(steps)


def trace_dir(profile_config, workdir) -> pathlib.Path:
  """Where traces go: config.profile.dir, or <workdir>/profile."""
  return pathlib.Path(profile_config.dir).expanduser() if profile_config.dir else pathlib.Path(workdir) / "profile"


@contextlib.contextmanager
def step_trace(profile_config, step: int, workdir, log=print):
  """jax.profiler.trace around the body when `step` is one of config.profile.steps; else nothing."""
  if step not in parse_steps(profile_config.steps):
    yield None
    return
  directory = trace_dir(profile_config, workdir)
  if jax.process_count() > 1:  # each process writes its own files (host-named ones would collide on one host)
    directory = directory / f"process_{jax.process_index()}"
  directory.mkdir(parents=True, exist_ok=True)
  options = jax.profiler.ProfileOptions()
  # No Python frames: they are py-spy's job, and a step's worth of them fills the trace buffer
  # (a demo step's trace kept 10 of its 94 s of device ops with them).
  options.python_tracer_level = 0
  with jax.profiler.trace(str(directory), create_perfetto_trace=True, profiler_options=options):
    yield directory
  log(f"[compassplay] profile of step {step} -> {directory} "
      f"(python -m compassplay_jax.infra.profiling {directory}; or TensorBoard / XProf / ui.perfetto.dev)")


def latest_trace(directory) -> pathlib.Path:
  """The newest Perfetto trace under `directory` (a profile dir, a run's dir or the file itself)."""
  path = pathlib.Path(directory)
  if path.is_file():
    return path
  found = sorted(path.rglob(PERFETTO_FILE), key=lambda p: p.stat().st_mtime)
  if not found:
    raise InputNotFound(f"{path}: no {PERFETTO_FILE} under it (profile a step with --config.profile.steps=N)")
  return found[-1]


def _events(trace_file: pathlib.Path) -> list[dict]:
  try:
    with gzip.open(trace_file, "rt") as f:
      data = json.load(f)
  except (OSError, EOFError, json.JSONDecodeError) as e:
    raise InputFormatError(f"{trace_file}: not a readable Perfetto trace ({e})") from None
  return data["traceEvents"] if isinstance(data, dict) else data


# Host and runtime bookkeeping in a trace (Python frames are "$..."); what is left is the XLA ops
# (fusions, dots, copies, collectives on CPU; kernels on GPU).
_RUNTIME_PREFIXES = ("$", "end: ", "ThreadpoolListener::", "ThunkExecutor::", "CommonPjRtLoadedExecutable",
                     "PjitFunction(", "np.asarray", "DevicePut", "SlinkyThreadPool", "PjRt", "TfrtCpu")


def summarize(trace_file) -> dict:
  """{"wall_us": traced wall time, "rows": [(program, op, total_us, count)] slowest first}.

  Host Python frames and the runtime's own events are left out: the rows are the XLA ops the step
  executed (program: the HLO module, e.g. jit_gradient_cosines; "" where the trace names none),
  summed over threads (on several cores their total can exceed the wall time)."""
  events = _events(pathlib.Path(trace_file))
  complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
  if not complete:
    raise InputFormatError(f"{trace_file}: the trace holds no timed events")
  start = min(e["ts"] for e in complete)
  end = max(e["ts"] + e["dur"] for e in complete)
  totals, counts = collections.Counter(), collections.Counter()
  for e in complete:
    if not e["name"].startswith(_RUNTIME_PREFIXES):
      key = (e.get("args", {}).get("hlo_module", ""), e["name"])
      totals[key] += e["dur"]
      counts[key] += 1
  return {"wall_us": end - start, "rows": [(m, n, t, counts[m, n]) for (m, n), t in totals.most_common()]}


def program_totals(summary: dict) -> list[tuple[str, float]]:
  """[(program, total_us)] slowest first: the rows summed per HLO module."""
  totals = collections.Counter()
  for program, _, total, _ in summary["rows"]:
    totals[program] += total
  return totals.most_common()


def format_summary(summary: dict, top: int = 20) -> str:
  wall = summary["wall_us"]
  lines = [f"traced wall time {wall / 1e6:.2f} s", "", f"{'total s':>9} {'% wall':>7}  program"]
  lines += [f"{total / 1e6:9.3f} {100 * total / wall:7.1f}  {program or '-'}"
            for program, total in program_totals(summary)[:top]]
  lines += ["", f"{'total s':>9} {'% wall':>7} {'count':>7}  program / op"]
  lines += [f"{total / 1e6:9.3f} {100 * total / wall:7.1f} {count:7d}  {program or '-'} / {op[:80]}"
            for program, op, total, count in summary["rows"][:top]]
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  if len(argv) not in (1, 2):
    print("usage: python -m compassplay_jax.infra.profiling <profile dir | perfetto_trace.json.gz> [top]", file=sys.stderr)
    return 2
  try:
    trace_file = latest_trace(argv[0])
    print(trace_file)
    print(format_summary(summarize(trace_file), int(argv[1]) if len(argv) > 1 else 20))
  except (InputNotFound, InputFormatError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
