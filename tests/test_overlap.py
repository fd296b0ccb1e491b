"""selfplay/overlap.py: checks start while the rest still decodes, and give what a check after decoding gives."""
import threading
import time

import jax
import pytest
from flax import nnx

from compassplay_jax.selfplay import rollout
from compassplay_jax.selfplay.overlap import BackgroundChecks
from compassplay_jax.selfplay.run import build_model
from tests.test_selfplay import _config
from tests.engines import one_device_engine


def test_an_item_is_checked_once_all_its_rows_are_in_and_finish_fills_the_rest():
  started, lock = [], threading.Lock()

  def check(item, rows):
    with lock:
      started.append(item)
    return (item, tuple(rows))

  with BackgroundChecks(check, ["a", "b", "c"], rows_per_item=2, workers=2) as checks:
    checks.on_row(3, "b1")
    checks.on_row(0, "a0")
    time.sleep(0.05)
    assert started == []  # no item complete yet
    checks.on_row(2, "b0")  # b complete: its check starts now
    time.sleep(0.2)
    assert started == ["b"]
    got = checks.finish({r: f"late{r}" for r in range(6)}, [0, 1, 2])
  # Rows already reported are kept; missing ones come from the result; order is the items'.
  assert got == [("a", ("a0", "late1")), ("b", ("b0", "b1")), ("c", ("late4", "late5"))]
  assert sorted(started) == ["a", "b", "c"] and checks.busy_s > 0


@pytest.fixture(scope="module")
def tiny():
  config = _config("coding:tiny", **{"sampling.micro_batch_size": 2, "sampling.engine": "static"})
  model, tokenizer = build_model(config)
  graphdef, params = nnx.split(model)
  return config, tokenizer, one_device_engine(graphdef, params, config), params


def test_checks_run_while_the_engine_still_decodes_and_equal_checks_after_it(tiny):
  """The static engine reports each micro-batch's rows as it ends: the first rows' checks start
  before generation returns, and every result is the one a check of the final texts gives."""
  config, tok, engine, params = tiny
  prompts = [f"Count to {i}:" for i in range(8)]
  starts, lock = [], threading.Lock()

  def check(prompt, texts):
    with lock:
      starts.append(time.time())
    return prompt, tuple(texts)

  with BackgroundChecks(check, prompts, rows_per_item=2, workers=1) as checks:
    gen = rollout.sample(engine, params, tok, prompts, config, jax.random.key(0), n_samples=2, max_new_tokens=12,
                         on_finish=lambda row, tokens, text, reason: checks.on_row(row, text))
    ended = time.time()
    got = checks.finish(dict(enumerate(gen.texts)), range(len(prompts)))
  assert min(starts) < ended, "no check started before generation ended"
  assert got == [(p, tuple(gen.texts[2 * i:2 * i + 2])) for i, p in enumerate(prompts)]
