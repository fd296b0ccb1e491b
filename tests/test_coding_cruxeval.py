"""Real data: every CRUXEval program validates; its recorded output / input are judged correct.

Known exceptions: none on the 800 programs of ../shared/data/cruxeval (all validate, all recorded
outputs pass deduction, all recorded inputs pass abduction, including the 14 inputs that are
expressions rather than literals, e.g. "''.join(['A'] * 20)", "range(100, 120)", lambdas, and
sample_135 whose input is empty, i.e. f()). The test allows up to 1% and lists any failure.
"""
import json

import pytest

from compassplay_jax.domains.coding import checking, tasks, validation
from compassplay_jax.verifiers.sandbox import SandboxPool


@pytest.fixture(scope="module")
def pool():
  with SandboxPool() as p:
    yield p


def test_cruxeval_programs_validate_and_recorded_answers_are_correct(shared_data, pool):
  path = shared_data / "cruxeval" / "cruxeval.jsonl"
  if not path.exists():
    pytest.skip(f"{path} not present")
  rows = [json.loads(line) for line in path.open() if line.strip()]
  outcomes = validation.validate_io_batch(
      pool, [(tasks.DEDUCTION, r["code"], r["input"]) for r in rows])
  invalid = [(r["id"], why) for r, (ok, why, _) in zip(rows, outcomes) if not ok]
  items, ids = [], []
  for row, (ok, _, task) in zip(rows, outcomes):
    if not ok:
      continue
    items.append((task, [row["output"]]))
    abduction = tasks.CodingTask(type=tasks.ABDUCTION, program=task.program, input=task.input,
                                 output=row["output"])
    items.append((abduction, [row["input"]]))
    ids += [(row["id"], "deduction"), (row["id"], "abduction")]
  verdicts = checking.check_many(pool, items)
  wrong = [key for key, verdict in zip(ids, verdicts) if not verdict[0]]
  assert len(invalid) <= len(rows) // 100, invalid
  assert len(wrong) <= len(rows) // 100, wrong
  assert not invalid and not wrong, (invalid, wrong)  # Currently exact; see module docstring.
