"""compassplay_jax/infra/profiling.py: device traces of chosen steps and the table of where their time went.

The Session-level check (step 2 of a coding:tiny run traced, its programs named) is in
tests/test_session.py on the difficulty run; here: the table against a hand-made trace summed by a
naive loop, a real trace of two named programs, and the config errors."""
import gzip
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compassplay_jax.infra import profiling
from compassplay_jax.core.errors import InputFormatError, InputNotFound
from compassplay_jax.models.config import ConfigError


def _write_trace(path, events):
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)
  return path


def test_table_sums_each_op_of_each_program_and_leaves_out_host_events(tmp_path):
  rng = np.random.default_rng(0)
  ops = [("jit_train", "fusion.1"), ("jit_train", "dot.2"), ("jit_decode", "fusion.1"), ("", "copy.3")]
  events = [{"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "main.py"}}]
  want, counts = {}, {}
  for i in range(40):
    module, op = ops[rng.integers(len(ops))]
    dur = float(rng.integers(1, 1000))
    args = {"hlo_module": module, "hlo_op": op} if module else {}
    events.append({"ph": "X", "pid": 1, "tid": 3, "ts": 100.0 + 50 * i, "dur": dur, "name": op, "args": args})
    want[module, op] = want.get((module, op), 0) + dur
    counts[module, op] = counts.get((module, op), 0) + 1
  # Host and runtime events: never rows (the last one sets the traced wall time's end).
  for name in ("$python.py:1 f", "ThunkExecutor::Execute", "PjitFunction(train)", "end: fusion.1"):
    events.append({"ph": "X", "pid": 1, "tid": 2, "ts": 90.0, "dur": 5000.0, "name": name})
  summary = profiling.summarize(_write_trace(tmp_path / profiling.PERFETTO_FILE, events))
  assert summary["wall_us"] == 5000.0  # 90 .. 5090
  assert {(m, o): t for m, o, t, _ in summary["rows"]} == want
  assert {(m, o): c for m, o, _, c in summary["rows"]} == counts
  assert [t for _, _, t, _ in summary["rows"]] == sorted(want.values(), reverse=True)
  per_program = dict(profiling.program_totals(summary))
  assert per_program == {m: sum(t for (mm, _), t in want.items() if mm == m) for m, _ in want}
  table = profiling.format_summary(summary, top=3)
  assert "jit_train / fusion.1" in table or "jit_train / dot.2" in table
  assert profiling.latest_trace(tmp_path) == tmp_path / profiling.PERFETTO_FILE


def test_only_the_named_steps_are_traced_and_the_trace_names_their_programs(tmp_path):
  def scaled_matmul(x):  # named programs: the trace's HLO modules carry the names
    return jnp.tanh(x @ x) * 2.0

  def column_sums(x):
    return x.sum(axis=0)

  first, second = jax.jit(scaled_matmul), jax.jit(column_sums)
  x = jnp.ones((256, 256))
  jax.block_until_ready(second(first(x)))  # compiled before the trace
  profile = types.SimpleNamespace(steps="2,4", dir="")
  logged = []
  for step in (1, 2, 3):
    with profiling.step_trace(profile, step, tmp_path, log=logged.append) as directory:
      jax.block_until_ready(second(first(x)))
    assert (directory is not None) == (step == 2)
  traces = list((tmp_path / "profile").rglob(profiling.PERFETTO_FILE))
  assert len(traces) == 1 and len(logged) == 1 and "step 2" in logged[0]
  programs = dict(profiling.program_totals(profiling.summarize(traces[0])))
  assert {"jit_scaled_matmul", "jit_column_sums"} <= set(programs)
  assert programs["jit_scaled_matmul"] > 0


def test_bad_steps_and_bad_files_are_one_line_errors(tmp_path):
  assert profiling.parse_steps("") == frozenset()
  assert profiling.parse_steps("2, 3") == {2, 3}
  assert profiling.parse_steps(2) == {2}
  assert profiling.parse_steps((1, 5)) == {1, 5}
  with pytest.raises(ConfigError, match=r"config.profile.steps='2,x': 'x' is not a step number"):
    profiling.parse_steps("2,x")
  with pytest.raises(ConfigError, match="steps count from 1"):
    profiling.parse_steps("0")
  with pytest.raises(InputNotFound, match="no perfetto_trace.json.gz under it"):
    profiling.latest_trace(tmp_path)
  bad = tmp_path / profiling.PERFETTO_FILE
  bad.write_bytes(b"not gzip")
  with pytest.raises(InputFormatError, match="not a readable Perfetto trace"):
    profiling.summarize(bad)
  assert profiling.main([str(tmp_path / "nothing")]) == 2


def test_the_config_check_names_the_profile_field():
  from compassplay_jax.runtime import config_base
  from tests.shared_runs import tiny_config
  config = tiny_config()
  assert config.profile.steps == "" and config.profile.dir == ""
  config_base.check_config(config)
  config.profile.steps = "two"
  with pytest.raises(ConfigError, match="config.profile.steps"):
    config_base.check_config(config)
