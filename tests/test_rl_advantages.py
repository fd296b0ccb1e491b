"""Advantage estimators against direct numpy transcriptions of the notes' formulas."""
import numpy as np
import pytest

from compassplay_jax.rl import advantages


def _verl_token_whiten(rewards, lengths, eps=1e-8):
  """AZR notes §5.2 literally: broadcast R_i over a (B, T) response mask and masked-whiten the tokens."""
  t_max = max(int(lengths.max()), 1)
  mask = (np.arange(t_max)[None, :] < lengths[:, None]).astype(np.float64)
  g = rewards[:, None] * mask
  n = mask.sum()
  mu = (g * mask).sum() / n
  var = (((g - mu) ** 2) * mask).sum() / n * n / (n - 1)
  a = (g - mu) / np.sqrt(var + eps) * mask
  return a, mask


def test_trr_plus_plus_matches_token_level_whitening_per_group():
  rng = np.random.default_rng(0)
  b = 48
  rewards = rng.choice([-1.0, -0.5, 0.125, 0.5, 1.0], size=b)
  tasks = rng.choice(["code_i", "code_o", "code_f"], size=b)
  roles = rng.choice(["propose", "solve"], size=b)
  lengths = rng.integers(1, 40, size=b)
  got = advantages.trr_plus_plus(rewards, tasks, roles, lengths)
  assert got.dtype == np.float32 and got.shape == (b,)
  for task in ("code_i", "code_o", "code_f"):
    for role in ("propose", "solve"):
      rows = (tasks == task) & (roles == role)
      if rows.sum() < 1:
        continue
      want, mask = _verl_token_whiten(rewards[rows], lengths[rows])
      # Every valid token of sequence i carries the same advantage A_i.
      np.testing.assert_allclose(np.broadcast_to(got[rows][:, None], mask.shape) * mask, want, rtol=1e-5, atol=1e-6)


def test_trr_plus_plus_is_token_weighted():
  # Two sequences: the long one dominates the mean, so the short one is far from it.
  got = advantages.trr_plus_plus([1.0, 0.0], ["t", "t"], ["r", "r"], [9, 1])
  mu = 0.9
  var = (9 * 0.1 ** 2 + 1 * 0.9 ** 2) / 9
  np.testing.assert_allclose(got, [(1 - mu) / np.sqrt(var + 1e-8), (0 - mu) / np.sqrt(var + 1e-8)], rtol=1e-6)


def test_trr_plus_plus_degenerate_groups():
  got = advantages.trr_plus_plus([0.5, 0.5, 1.0, 2.0], ["a", "a", "b", "c"], ["s"] * 4, [3, 4, 1, 0])
  np.testing.assert_array_equal(got, [0.0, 0.0, 0.0, 0.0])  # equal rewards; 1-token group; empty sequence


def test_trr_plus_plus_bad_shapes():
  with pytest.raises(ValueError, match="token_counts has length 1"):
    advantages.trr_plus_plus([1.0, 0.0], ["t", "t"], ["r", "r"], [3])


def test_reinforce_half_keeps_correct_attempts_of_hard_solved_problems():
  correct = [1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0]
  problems = ["a"] * 4 + ["b"] * 4 + ["c"] * 4 + ["d"] * 4  # solve rates .25, .75, 0, .25
  weights = np.ones(16)
  weights[12] = 0.0  # e.g. a proof containing `try`
  got = advantages.reinforce_half(correct, problems, sample_weights=weights)
  want = np.zeros(16)
  want[0] = 1.0
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(advantages.reinforce_half([1, 1, 0, 0], ["x"] * 4), [1, 1, 0, 0])  # s = .5 is in
  with pytest.raises(ValueError, match="0/1"):
    advantages.reinforce_half([0.5], ["x"])


def test_conjecture_band_and_reinforce_min_max():
  rates = np.array([0.0, 0.125, 0.25, 0.5, 0.75, 0.875, 1.0, 0.375])
  band = advantages.conjecture_band(rates)
  inside = np.sort(rates[(rates > 0) & (rates < 1)])  # 6 values; p70 = inside[4] = 0.75
  assert inside[int(0.7 * 6)] == 0.75
  np.testing.assert_array_equal(band, (rates > 0) & (rates <= 0.75))
  guide = np.array([3, 5, 8, 2, 6, 1, 4, 7], float)
  raw = guide * (1 - rates)
  got = advantages.reinforce(raw, band)
  sel = raw[band]
  want = np.where(band, (raw - sel.min()) / (sel.max() - sel.min()), 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_array_equal(advantages.reinforce([2.0, 2.0, 5.0], [True, True, False]), [1.0, 1.0, 0.0])
  assert not advantages.conjecture_band([0.0, 1.0]).any()


def test_overlong_penalty():
  got = advantages.overlong_penalty([0, 6553, 7372.8, 8192, 9000], 8192)
  np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0, -1.0], atol=1e-6)


def _floored_oracle(rewards, selected, floor=0.0):
  """A plain loop: baseline max(mean, floor) over selected rows, divided by the RMS deviation."""
  chosen = [r for r, s in zip(rewards, selected) if s]
  if not chosen:
    return [0.0] * len(rewards)
  base = max(sum(chosen) / len(chosen), floor)
  rms = (sum((r - base) ** 2 for r in chosen) / len(chosen)) ** 0.5
  return [((r - base) / rms if rms > 1e-12 else 0.0) if s else 0.0 for r, s in zip(rewards, selected)]


@pytest.mark.parametrize("rewards, selected", [
    ([0.0, -0.1, 0.2], [1, 1, 1]),          # the example
    ([0.0, 0.3, 0.6, 0.0], [1, 1, 1, 0]),
    ([0.0, -0.1, -0.2], [1, 1, 1]),         # all others below zero
    ([0.5, 0.5], [1, 1]),
    ([-0.4], [1]),
    ([0.9, 0.0], [0, 0]),
])
def test_floored_baseline_matches_a_naive_loop(rewards, selected):
  got = advantages.floored_baseline_advantages(rewards, np.asarray(selected, bool))
  np.testing.assert_allclose(got, _floored_oracle(rewards, selected), atol=1e-6)


def test_floored_baseline_pushes_copies_down_never_up():
  # SGS's min-max weights give the copy (reward 0) a positive weight when another row is below it.
  np.testing.assert_allclose(advantages.reinforce([0.0, -0.1, 0.2]), [1 / 3, 0.0, 1.0], atol=1e-6)
  adv = advantages.floored_baseline_advantages([0.0, -0.1, 0.2])
  assert adv[0] < 0 and adv[1] < adv[0] and adv[2] > 0
  np.testing.assert_allclose(adv, [-0.2673, -1.0690, 1.3363], atol=1e-4)
  # Among rewarded conjectures a copy is trained down.
  assert advantages.floored_baseline_advantages([0.0, 0.4, 0.7])[0] < 0
  # Whatever the others score, a zero-reward row never gets a positive advantage.
  rng = np.random.default_rng(0)
  for _ in range(200):
    r = rng.uniform(-1, 1, size=rng.integers(1, 8))
    r[0] = 0.0
    assert advantages.floored_baseline_advantages(r)[0] <= 0
  # Out-of-band rows stay at 0, and all-equal rows carry no signal.
  np.testing.assert_array_equal(advantages.floored_baseline_advantages([0.0, 0.0, 0.0]), [0, 0, 0])


def test_sgs_solver_weights_try_and_length():
  correct = [1, 1, 0, 0, 1, 1, 1, 1]
  groups = [0, 0, 0, 0, 1, 1, 1, 1]  # problem 0: s = 0.5 (in band); problem 1: s = 1 (out)
  base = advantages.sgs_solver_weights(correct, groups)
  np.testing.assert_array_equal(base, advantages.reinforce_half(correct, groups))
  with_try = advantages.sgs_solver_weights(correct, groups, zero_weight=[0, 1, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(with_try, [1, 0, 0, 0, 0, 0, 0, 0])
  lengths = [90, 10, 95, 10, 90, 10, 10, 10]  # max 100: penalty starts at 80
  got = advantages.sgs_solver_weights(correct, groups, lengths=lengths, max_tokens=100)
  # The overlong kept proof gets the penalty -(90-80)/20; the overlong failed one stays 0 (not kept).
  np.testing.assert_allclose(got, [-0.5, 1, 0, 0, 0, 0, 0, 0])
  with pytest.raises(ValueError, match="without max_tokens"):
    advantages.sgs_solver_weights(correct, groups, lengths=lengths)


def _copies_oracle(rewards, selected, copies):
  """A plain loop: the selected rows and the copies (at reward 0) are whitened around max(mean, 0);
  a copy gets at most -1; everything else 0."""
  trained = [(0.0 if c else r) for r, s, c in zip(rewards, selected, copies) if s or c]
  if not trained:
    return [0.0] * len(rewards)
  base = max(sum(trained) / len(trained), 0.0)
  rms = (sum((r - base) ** 2 for r in trained) / len(trained)) ** 0.5
  out = []
  for r, s, c in zip(rewards, selected, copies):
    a = ((0.0 if c else r) - base) / rms if (s or c) and rms > 1e-12 else 0.0
    out.append(min(a, -1.0) if c else a)
  return out


@pytest.mark.parametrize("rewards, selected, copies", [
    ([0.0, 0.04, 0.02], [1, 1, 1], [1, 0, 0]),              # the paper's case: others rewarded
    ([0.0, -0.1, -0.2], [1, 1, 1], [1, 0, 0]),              # band mean <= 0 (old rule: the copy got 0)
    ([-0.5, 0.03, 0.05, -0.5], [0, 1, 1, 0], [1, 0, 0, 0]),  # an s = 1 copy: out of band, gate reward
    ([0.0, 0.0], [1, 1], [1, 1]),                           # only copies
    ([0.0, 0.3], [0, 0], [1, 0]),                           # nothing in band but a copy (s = 0)
    ([0.0, 0.05], [1, 1], [1, 0]),                          # a copy and one rewarded conjecture
    ([0.0, 0.0, 0.0, 0.0, 0.05], [1] * 5, [1, 1, 1, 1, 0]),  # many copies: capped at -1
    ([0.2, -0.1, 0.0], [1, 1, 0], [0, 0, 0]),               # no copy: the floored baseline as before
])
def test_copies_are_always_trained_down(rewards, selected, copies):
  got = advantages.floored_baseline_advantages(rewards, np.asarray(selected, bool), copies=np.asarray(copies, bool))
  np.testing.assert_allclose(got, _copies_oracle(rewards, selected, copies), atol=1e-6)
  assert all(a < 0 for a, c in zip(got, copies) if c)
  # Without copies the function is the floored baseline itself.
  if not any(copies):
    np.testing.assert_allclose(got, _floored_oracle(rewards, selected), atol=1e-6)


def test_copies_negative_under_any_rewards():
  """Random rounds: every copy gets at most -1, and the old rule (copies among the selected rows at
  reward 0, no cap) leaves them at 0 whenever the round's mean reward is <= 0."""
  rng = np.random.default_rng(1)
  zeroed = 0
  for _ in range(300):
    n = int(rng.integers(1, 9))
    r = rng.uniform(-1, 1, size=n)
    selected, copies = rng.random(n) < 0.7, rng.random(n) < 0.3
    r[copies] = 0.0
    got = advantages.floored_baseline_advantages(r, selected, copies=copies)
    assert np.all(got[copies] <= -1.0)
    old = advantages.floored_baseline_advantages(r, selected | copies)
    zeroed += int(np.any(old[copies] == 0))
  assert zeroed > 0, "the old rule's hole (a copy at advantage 0) never showed: the test would not catch it"


def test_length_penalty_on_trained_conjectures_is_sgs_replacement():
  """SGS step2_train.py:304-310: a trained conjecture's weight becomes length_reward when negative.
  SGS's weights are in [0, 1], so replacing = min; a row not trained keeps its 0."""
  adv = [1.0, 0.0, -1.0, 0.5, 0.0]
  trained = [1, 1, 1, 1, 0]
  lengths = [90, 100, 95, 50, 100]  # max 100: penalty from 80, -1 at 100
  got = advantages.length_penalized(adv, trained, lengths, 100)
  np.testing.assert_allclose(got, [-0.5, -1.0, -1.0, 0.5, 0.0], atol=1e-6)
  # SGS's weights (min-max, in [0, 1]): the result is exactly SGS's replacement.
  w = advantages.reinforce([0.1, 0.4, 0.3])
  pen = advantages.overlong_penalty([99, 10, 85], 100)
  np.testing.assert_allclose(advantages.length_penalized(w, [1, 1, 1], [99, 10, 85], 100),
                             [p if p < 0 else x for x, p in zip(w, pen)], atol=1e-6)
