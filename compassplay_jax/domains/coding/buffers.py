"""Per-type task buffers: seeds, AZR seed files, K-reference sampling and the cap policy.

Cap policy (AZR's `max_programs` with `truncate_datasets`): a buffer holds at
most `cap` tasks (16384) and KEEPS THE OLDEST; once full, new tasks are
dropped and `add` returns False. Pass keep="newest" to evict the oldest instead.
"""
import dataclasses
import json
import pathlib
import random
from typing import List, Optional, Sequence

from compassplay_jax.domains.coding import tasks
from compassplay_jax.domains.coding import validation

DEFAULT_CAP = 16384
IDENTITY_PROGRAM = "def f(a):\n    return a"
IDENTITY_SEED = tasks.CodingTask(type=tasks.DEDUCTION, program=IDENTITY_PROGRAM,
                                 input='"Hello world"', output='"Hello world"')
_IDENTITY_IO = ('"Hello world"', "1", "dict(a=1, b=2)", "(1.1, 1.2, 1.3)",
                '"[[1, 0, 0], [0, 0, 0], [0, 0, 0]]"', "1001101100010001")
IDENTITY_INDUCTION_SEED = tasks.CodingTask(
    type=tasks.INDUCTION, program=IDENTITY_PROGRAM, inputs=_IDENTITY_IO, outputs=_IDENTITY_IO,
    message="Write a function that returns whatever you input", num_visible=3)


class TaskBuffer:
  """Tasks of one type in insertion order, with the step each was added at."""

  def __init__(self, task_type: str, cap: int = DEFAULT_CAP, keep: str = "oldest"):
    if task_type not in tasks.TASK_TYPES:
      raise ValueError(f"task_type must be one of {tasks.TASK_TYPES}, got {task_type!r}")
    if keep not in ("oldest", "newest"):
      raise ValueError(f"keep must be 'oldest' or 'newest', got {keep!r}")
    if cap < 1:
      raise ValueError(f"cap must be >= 1, got {cap}")
    self.task_type, self.cap, self.keep = task_type, cap, keep
    self._items: List[tasks.CodingTask] = []
    self._steps: List[int] = []

  def __len__(self):
    return len(self._items)

  def __iter__(self):
    return iter(self._items)

  def entries(self) -> List[tuple]:
    """(task, step added) pairs in insertion order (what a checkpoint saves)."""
    return list(zip(self._items, self._steps))

  def add(self, task: tasks.CodingTask, step: int = 0) -> bool:
    """Adds a task (deduction and abduction buffers accept each other's tasks)."""
    if len(self._items) >= self.cap:
      if self.keep == "oldest":
        return False
      del self._items[0], self._steps[0]
    self._items.append(task)
    self._steps.append(step)
    return True

  def sample(self, k: int, rng: random.Random) -> List[tasks.CodingTask]:
    """Up to k tasks uniformly WITHOUT replacement (AZR's K = 6 proposer references)."""
    return rng.sample(self._items, min(k, len(self._items)))

  def solver_batch(self, n: int, rng: random.Random, since_step: int) -> List[tasks.CodingTask]:
    """AZR's max_new mix: up to n tasks added at step >= since_step, the rest uniform (with repeats)."""
    recent = [t for t, s in zip(self._items, self._steps) if s >= since_step]
    chosen = rng.sample(recent, min(n, len(recent)))
    while len(chosen) < n and self._items:
      chosen.append(rng.choice(self._items))
    return chosen


def sample_induction_program(buffers: Sequence[TaskBuffer], rng: random.Random) -> Optional[str]:
  """Induction proposers see one program drawn uniformly from the union of the given buffers."""
  pool = [t.program for b in buffers for t in b]
  return rng.choice(pool) if pool else None


def seeded_buffers(cap: int = DEFAULT_CAP, keep: str = "oldest"):
  """{type: buffer}; deduction and abduction share the identity seed, induction its own."""
  out = {t: TaskBuffer(t, cap, keep) for t in tasks.TASK_TYPES}
  out[tasks.DEDUCTION].add(IDENTITY_SEED)
  out[tasks.ABDUCTION].add(dataclasses.replace(IDENTITY_SEED, type=tasks.ABDUCTION))
  out[tasks.INDUCTION].add(IDENTITY_INDUCTION_SEED)
  return out


def load_azr_seed_file(path, task_type: str, limit: int = 256) -> List[tasks.CodingTask]:
  """Reads AZR's *_seed_io.jsonl (snippet/input/output) or *_code_f_seed_io.jsonl files.

  The records are trusted data from the AZR release; they are not re-run here
  (validate them with `validation.validate_io_batch` if needed).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"AZR seed file not found: {path}")
  loaded = []
  with path.open() as f:
    for line_no, line in enumerate(f, 1):
      if len(loaded) >= limit:
        break
      if not line.strip():
        continue
      row = json.loads(line)
      program = row.get("snippet")
      if not isinstance(program, str):
        raise ValueError(f"{path}:{line_no}: record has no 'snippet'")
      imports = tuple(row.get("imports") or validation.import_lines(program))
      if task_type == tasks.INDUCTION:
        inputs, outputs = tuple(row["inputs"]), tuple(row["outputs"])
        loaded.append(tasks.CodingTask(type=task_type, program=program, inputs=inputs,
                                       outputs=outputs, message=row.get("message", ""),
                                       imports=imports, num_visible=len(inputs) // 2))
      else:
        loaded.append(tasks.CodingTask(type=task_type, program=program, input=row["input"],
                                       output=row["output"], imports=imports))
  return loaded


def load_azr_seed_dir(directory, cap: int = DEFAULT_CAP, keep: str = "oldest", limit: int = 256):
  """Buffers from an azr_seed folder (`python -m compassplay_jax.cli.data fetch azr_seed`): the I/O file fills
  both deduction and abduction, the code_f file fills induction."""
  directory = pathlib.Path(directory)
  io_files = sorted(p for p in directory.glob("*_seed_io.jsonl") if "code_f" not in p.name)
  f_files = sorted(directory.glob("*code_f_seed_io.jsonl"))
  if not io_files or not f_files:
    raise FileNotFoundError(f"no AZR seed files (*_seed_io.jsonl, *_code_f_seed_io.jsonl) in {directory}")
  out = {t: TaskBuffer(t, cap, keep) for t in tasks.TASK_TYPES}
  for task in load_azr_seed_file(io_files[0], tasks.DEDUCTION, limit):
    out[tasks.DEDUCTION].add(task)
    out[tasks.ABDUCTION].add(dataclasses.replace(task, type=tasks.ABDUCTION))
  for task in load_azr_seed_file(f_files[0], tasks.INDUCTION, limit):
    out[tasks.INDUCTION].add(task)
  return out
