"""AZR's coding loop as AZR runs it (issue 50): no stop string AZR lacks in the paper config's sampling,
and veRL's loss aggregation (each micro-batch of consecutive rows weighs the same, whatever its token
count) against a hand computation: the mean of per-micro-batch PPO losses, value and gradient."""
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compassplay_jax.rl import aggregation, losses
from compassplay_jax.selfplay import step as step_lib
from compassplay_jax.selfplay.rollout import Row
from compassplay_jax.sampling.generate import GenerationResult

REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(variant: str):
  spec = importlib.util.spec_from_file_location("coding_config", REPO / "configs" / "coding.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def test_paper_config_samples_with_no_stop_string_azr_lacks():
  from compassplay_jax.settings.coding.setting import CodingSelfPlay
  config = _config("paper")
  assert config.coding.answer_stop == "" and not config.coding.proposer_prefix and not config.coding.solver_prefix
  play = object.__new__(CodingSelfPlay)  # only the sampling calls are exercised: no model, no pool
  play.config, play.tokenizer, seen = config, None, []

  def recording_sampler(engine, params, tokenizer, prompts, cfg, key, **kwargs):
    seen.append(kwargs.get("stop_strings"))
    rows = len(prompts) * kwargs.get("n_samples", 1)
    return GenerationResult(np.arange(rows), np.zeros(rows, int), [np.array([1])] * rows, [np.array([2])] * rows,
                            [np.zeros(1, np.float32)] * rows, np.ones(rows, int), ["eos"] * rows, ["x"] * rows)
  play._sampler = recording_sampler  # pylint: disable=protected-access
  play._propose(None, None, "deduction", ["proposer prompt"], jax.random.key(0))  # pylint: disable=protected-access
  play.solver_prompts = lambda tasks: ["solver prompt"] * len(tasks)
  play._solve(None, None, [object()], jax.random.key(1), 2)  # pylint: disable=protected-access
  assert seen == [(), ()]  # the proposer's and the solver's calls: eos and the budget end them, as in AZR
  play.config.coding.answer_stop = "</answer>"  # the option a small model may want
  assert play.answer_stops == ("</answer>",)


def test_verl_weights_by_hand():
  # Two micro-batches of 2 rows: 2 + 4 tokens, then 10 + 0 tokens. N = 16, M = 2.
  w = aggregation.verl_row_weights([2, 4, 10, 0], 2)
  np.testing.assert_allclose(w, [16 / (2 * 6), 16 / (2 * 6), 16 / (2 * 10), 1.0], rtol=1e-6)
  # A partial last micro-batch counts in M like a whole one (veRL splits rows, not tokens).
  np.testing.assert_allclose(aggregation.verl_row_weights([3, 3, 3], 2), [9 / (2 * 6)] * 2 + [9 / (2 * 3)], rtol=1e-6)
  with pytest.raises(ValueError, match="micro_batch_rows=0"):
    aggregation.verl_row_weights([1], 0)


def test_verl_aggregation_weighs_groups_as_verl_does():
  """A two-group batch, short responses then long ones, veRL micro-batches of 2 rows (one group each):
  the update's weighted token mean over the whole batch equals the mean of the two groups' own token
  means (loss and gradient), and differs from the plain token mean, which weighs the long group 4x."""
  rng = np.random.default_rng(0)
  vocab, width = 11, 12
  lengths = [2, 3, 9, 10]  # completion tokens per row: group "short" then group "long"
  rows = [Row(prompt_ids=np.array([1, 2]), completion_ids=rng.integers(1, vocab, n).astype(np.int32),
              logprobs=np.full(n, -2.0, np.float32), reward=0.0, group=g, role="solver", advantage=a)
          for n, g, a in zip(lengths, ["short", "short", "long", "long"], [1.0, -0.5, 0.7, -1.2])]
  options = step_lib.UpdateOptions(pad_id=0, max_len=None, loss_aggregation="verl", verl_micro_batch_rows=2)
  weighted = step_lib.verl_weighted(rows, options)
  masks = [np.asarray(r.completion_mask) for r in weighted]
  assert [m.sum() for m in masks] == pytest.approx([24 / 2 * 2 / 5, 24 / 2 * 3 / 5, 24 / 2 * 9 / 19, 24 / 2 * 10 / 19])

  # One batch (B, T): completions left-aligned after a 1-column offset (index 0 is never a loss token).
  def arrays(chosen):
    tokens = np.zeros((len(chosen), width), np.int32)
    mask, old = np.zeros((len(chosen), width), np.float32), np.zeros((len(chosen), width), np.float32)
    for b, (r, m) in enumerate(chosen):
      n = len(r.completion_ids)
      tokens[b, 1:1 + n], mask[b, 1:1 + n], old[b, 1:1 + n] = r.completion_ids, m, r.logprobs
    return jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(old), jnp.asarray([r.advantage for r, _ in chosen])

  logits = jnp.asarray(rng.normal(size=(4, width, vocab)), jnp.float32)
  kwargs = dict(entropy_coef=0.001)

  def batch_loss(lg, chosen):
    tokens, mask, old, adv = arrays(chosen)
    return losses.policy_gradient_loss(lg, tokens, mask, adv, old, **kwargs)[0]

  ones = [np.ones(len(r.completion_ids), np.float32) for r in rows]
  ours = lambda lg: batch_loss(lg, list(zip(rows, masks)))  # noqa: E731
  # veRL, by hand: each micro-batch's own token mean (its rows only), then the mean of the two.
  verl = lambda lg: 0.5 * (batch_loss(lg[:2], list(zip(rows[:2], ones[:2]))) +  # noqa: E731
                           batch_loss(lg[2:], list(zip(rows[2:], ones[2:]))))
  plain = lambda lg: batch_loss(lg, list(zip(rows, ones)))  # noqa: E731
  np.testing.assert_allclose(ours(logits), verl(logits), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(verl)(logits), rtol=1e-5, atol=1e-7)
  assert abs(float(plain(logits)) - float(verl(logits))) > 1e-3  # the plain token mean is another loss


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_soar_inner_optimizer_reaches_the_measurement(optimizer):
  """reward.soar_inner_optimizer is what the loop's SOAR measurement trains its copies with (the
  setting's ScoreOptions carry it to soar_measure)."""
  from types import SimpleNamespace
  from compassplay_jax.settings.coding.setting import CodingSelfPlay
  config = _config("demo")
  config.reward.name, config.reward.soar_inner_optimizer = "soar_utility", optimizer
  play = object.__new__(CodingSelfPlay)
  play.config, play.tokenizer, play.local = config, SimpleNamespace(pad_token_id=0), False
  play.soar_heldout = play.soar_answers = None
  assert play.scoring().soar.optimizer == optimizer
