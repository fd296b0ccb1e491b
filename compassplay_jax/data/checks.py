"""After conversion, each written file is read back by the loader that will read it in a run."""
from __future__ import annotations

import pathlib


def check_output(relpath: str, path: pathlib.Path) -> None:
  """Loads `path` with its project loader; a file a loader rejects fails the fetch (one line)."""
  from compassplay_jax.data.fetch import FetchError
  try:
    _load(relpath, path)
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise FetchError(f"{relpath}: converted file is not readable by its loader ({first})") from None


def _load(relpath: str, path: pathlib.Path) -> None:
  from compassplay_jax.evals import benchmarks
  for name, spec in benchmarks.BENCHMARKS.items():
    if spec.relpath == relpath:
      benchmarks.load_benchmark(name, path=path)
      return
  if relpath.startswith("math/"):
    from compassplay_jax.selfplay.reference_set import load_reference_set
    load_reference_set(str(path), 1, 0)
  elif relpath.startswith("azr_seed/"):
    from compassplay_jax.domains.coding import buffers, tasks
    task_type = tasks.INDUCTION if "code_f" in path.name else tasks.DEDUCTION
    buffers.load_azr_seed_file(path, task_type, limit=10 ** 9)
  elif relpath.startswith(("minif2f/", "leanworkbook/")):
    from compassplay_jax.domains.lean.targets import load_targets
    load_targets(path)
