"""Compiling ahead (compassplay_jax/infra/compile_ahead.py): programs compiled on the engine's background thread
are the ones the later calls run (no compilation at the call), with the same results as without it.
tests/selfplay_mesh_cases.py checks the same inside a whole coding step, on one device and on three meshes.

Which thread compiled what comes from JAX's own compile events (tests/compile_events.py): a program
the call had to compile itself shows up on the main thread.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compassplay_jax.sampling.prompts import encode_prompts
from compassplay_jax.selfplay import alignment
from compassplay_jax.selfplay.sequences import pack
from tests import compile_events
from tests.test_selfplay import _config, tiny_model
from tests.engines import one_device_engine

AHEAD = {"jit(reference_gradient)", "jit(gradient_cosines)", "jit(update)"}


@pytest.fixture(scope="module")
def tiny():
  return tiny_model()


def _engine(graphdef, params, config, ahead: bool):
  config = config.copy_and_resolve_references()
  config.compile_ahead = "on" if ahead else "off"
  return one_device_engine(graphdef, params, config)


def _reward_and_update(engine, params, tokenizer, *, ahead: bool):
  """g_ref, the cosines of three candidates and one bucketed update, with their programs compiled
  ahead first when `ahead`; returns the results and the compile events of the calls alone."""
  reference = alignment.pack_reference(tokenizer, ["What is 2 + 3?", "What is 7 * 6?"], ["5", "42"], max_len=64)
  prompts = encode_prompts(tokenizer, ["f(3) for x + 1 is", "f('ab') for s[::-1] is", "f(5) for n * n is"])
  answers = [np.asarray(tokenizer.encode(a, add_special_tokens=False), np.int32) for a in ("4", "'ba'", "25")]
  p, o = engine.init_train_state(jax.tree.map(jnp.copy, params))
  packed = pack(prompts, answers, tokenizer.pad_token_id, completion_window=True)
  micro = {**packed.as_dict(), "advantages": np.asarray([1.0, -0.5, 0.25], np.float32)}
  if ahead:
    alignment.reference_gradient_ahead(engine, p, reference)
    alignment.candidate_cosines_ahead(engine, p, prompts, answers, max_len=64, fixed_rows=True)
    engine.update_ahead(p, o)
  with compile_events.recorded() as events:
    g_ref = alignment.reference_gradient(engine, p, reference, tokenizer.pad_token_id)
    cos = alignment.candidate_cosines(engine, p, g_ref, prompts, answers, tokenizer.pad_token_id, max_len=64,
                                      fixed_rows=True)
    new_p, _, metrics = engine.bucketed_train_step(p, o, [micro], jax.random.key(0))
  return jax.device_get((g_ref, cos, new_p, metrics)), events


def test_programs_compiled_ahead_are_the_ones_the_calls_run(tiny):
  config, tokenizer, graphdef, params = tiny
  with_ahead, events = _reward_and_update(_engine(graphdef, params, config, True), params, tokenizer, ahead=True)
  without, events_off = _reward_and_update(_engine(graphdef, params, config, False), params, tokenizer, ahead=False)
  # Without it the calls compile all three on the main thread; with it, none of them.
  assert AHEAD <= compile_events.on_main(events_off), events_off
  assert not AHEAD & compile_events.on_main(events), events
  for a, b in zip(jax.tree.leaves(with_ahead), jax.tree.leaves(without)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_auto_compiles_ahead_from_eight_cores_and_a_bad_value_names_the_field(monkeypatch):
  from compassplay_jax.runtime import config_base
  from compassplay_jax.models.config import ConfigError
  config = _config("coding:tiny")
  for cores, want in ((2, False), (7, False), (8, True), (64, True)):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid, n=cores: set(range(n)))
    assert config_base.compile_ahead(config) is want, cores
  config.compile_ahead = "on"
  assert config_base.compile_ahead(config) is True
  config.compile_ahead = "yes"
  with pytest.raises(ConfigError, match="config.compile_ahead: 'yes' is not one of"):
    config_base.check_config(config)
