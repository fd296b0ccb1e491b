"""The Lean loop on the stand-in REPL with a scripted prover and conjecturer (issue 13's acceptance).

The sampler is scripted (passed to LeanSelfPlay, no patching): target `seed_a` is proved 2 of 4
times every iteration, the other targets never; for seed_a the conjecturer writes a verbatim copy,
a renamed copy and a novel statement, each proved 1-2 of 4 times. Lean is the stand-in REPL: a proof
body carrying `-- fake: error …` fails, a plain one passes. The model is the tiny random decoder, so
rewards, cosines and advantages are the loop's real computations; the cosine is checked against an
independent jax.grad of the per-sequence loss.
"""
import functools
import json
import pathlib
import sys
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.rewards import novelty
from compassplay_jax.sampling.generate import GenerationResult
from compassplay_jax.selfplay import step as step_lib
from compassplay_jax.settings.lean.setting import LeanSelfPlay
from compassplay_jax.selfplay.rollout import truncate_prompt
from compassplay_jax.selfplay.run import build_model
from compassplay_jax.selfplay.sequences import pack
from tests.test_selfplay import _config
from tests.engines import one_device_engine

FAKE_REPL = pathlib.Path(__file__).with_name("fake_lean_repl.py")
HEADER = "import Mathlib\n"
SEED = "theorem seed_a (x y : ℕ) (h₀ : x = 2) (h₁ : y = x + 3) : y = 5 := by"
TARGETS = [SEED, "theorem target_b (n : ℕ) (h : n % 2 = 1) : n ≠ 0 := by",
           "theorem target_c (a : ℤ) : a ^ 2 ≥ 0 := by"]
COPY = "theorem copy_a (x y : ℕ) (h₀ : x = 2) (h₁ : y = x + 3) : y = 5 := by sorry"
RENAMED = "theorem ren_a (a b : ℕ) (ha : a = 2) (hb : b = a + 3) : b = 5 := by sorry"
NOVEL = "theorem novel_a (n : ℤ) (hn : 0 < n) : n ^ 2 > 0 := by sorry"
GOOD, BAD = "\n  simp\n```", "\n  simp -- fake: error unsolved goals\n```"
# Proof outcomes per statement, keyed by a fragment of its signature (4 attempts each).
PROOFS = {"(h₁ : y = x + 3)": [GOOD, GOOD, BAD, BAD],       # seed_a (and the copy): s = 0.5
          "(hb : b = a + 3)": [GOOD, GOOD, BAD, BAD],       # the rename: s = 0.5
          "(hn : 0 < n)": [GOOD, BAD, BAD, BAD],            # the novel conjecture: s = 0.25
          "(h : n % 2 = 1)": [BAD] * 4, "(a : ℤ) : a ^ 2": [BAD] * 4}


class ScriptedSampler:
  """rollout.sample's signature; answers from the script above and records what it produced."""

  def __init__(self, tokenizer, copy_proofs, proofs=None):
    self.tokenizer, self.log = tokenizer, []
    self.copy_proofs = copy_proofs  # the copy's outcomes (its signature is the seed's)
    self.proofs = proofs or PROOFS

  def completion(self, prompt, sample):
    if "Please generate a lean4 theorem" in prompt:
      return f"```lean4\n{[COPY, RENAMED, NOVEL][sample]}\n```"
    if "compassplay_conjecture" in prompt and "(h₁ : y = x + 3)" in prompt:
      return self.copy_proofs[sample]
    return next(p for key, p in self.proofs.items() if key in prompt)[sample]

  def __call__(self, engine, params, tokenizer, prompts, config, key, *, n_samples=1, **_):
    rows = [(p, self.completion(p, s)) for p in prompts for s in range(n_samples)]
    eos = tokenizer.eos_token_id
    result = GenerationResult(
        prompt_index=np.repeat(np.arange(len(prompts)), n_samples), sample_index=np.tile(np.arange(n_samples), len(prompts)),
        prompt_tokens=[np.asarray(truncate_prompt(tokenizer, p, config.sampling.max_prompt_tokens)) for p, _ in rows],
        tokens=[np.asarray(tokenizer.encode(c, add_special_tokens=False) + [eos]) for _, c in rows],
        logprobs=[np.zeros(len(tokenizer.encode(c, add_special_tokens=False)) + 1, np.float32) for _, c in rows],
        lengths=np.asarray([len(tokenizer.encode(c, add_special_tokens=False)) + 1 for _, c in rows]),
        finish_reasons=["eos"] * len(rows), texts=[c for _, c in rows])
    self.log.append(result)
    return result


class PolicySampler(ScriptedSampler):
  """The script's texts with the policy's own log-probs of their tokens at the params it is given
  (engine.logprobs: the train step's log-probs at the sampling temperature, what rollout.sample
  reports for tokens it samples), so the update's first PPO ratio is exactly 1. ScriptedSampler's
  log-probs are 0, and under PPO's clip a row with ratio exp(log p - 0) < 0.8 and A < 0 has no gradient.
  `active` False: the script's zeros (an iteration without an update needs no log-probs)."""

  active = True

  def __call__(self, engine, params, tokenizer, prompts, config, key, *, n_samples=1, **kwargs):
    result = super().__call__(engine, params, tokenizer, prompts, config, key, n_samples=n_samples, **kwargs)
    if not self.active:
      return result
    packed = pack(result.prompt_tokens, result.tokens, tokenizer.pad_token_id, row_multiple=8)
    lp = np.asarray(engine.logprobs(params, jnp.asarray(packed.tokens), jnp.asarray(packed.attention_mask)))
    result.logprobs = [lp[r, len(p):len(p) + len(c)] for r, (p, c) in enumerate(zip(result.prompt_tokens,
                                                                                     result.tokens))]
    return result


# The oracle: a plain forward of the model on one sequence and the mean token cross-entropy of its
# completion, written here (independent of the engine's packing, loss and fused cosine pass). Jitted,
# with each sequence padded at its end to a multiple of ORACLE_WIDTH tokens: every sequence of these
# tests is then one compiled shape (op-by-op jax.grad compiled every primitive for every length:
# about half of this file's time). The model is causal, so the padding changes none of the logits
# the loss reads.
ORACLE_WIDTH = 128


def _padded(prompt_ids, completion_ids):
  """(tokens, target mask): the sequence padded to a multiple of ORACLE_WIDTH, and 1 at the positions
  whose next token is a completion token."""
  ids = np.concatenate([prompt_ids, completion_ids]).astype(np.int32)
  tokens = np.zeros((-(-len(ids) // ORACLE_WIDTH) * ORACLE_WIDTH,), np.int32)
  tokens[:len(ids)] = ids
  targets = np.zeros((len(tokens) - 1,), np.float32)
  targets[len(prompt_ids) - 1:len(ids) - 1] = 1.0
  return jnp.asarray(tokens), jnp.asarray(targets)


def _loss(model, tokens, targets):
  """Mean token cross-entropy of the completion given the prompt (the per-sequence solver loss)."""
  ids = tokens[None]
  logits = model(ids, attention_mask=jnp.ones_like(ids)).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits[0, :-1], axis=-1)
  token_logp = jnp.take_along_axis(logp, ids[0, 1:, None], axis=-1)[:, 0]
  return -jnp.sum(token_logp * targets) / jnp.sum(targets)


@functools.partial(jax.jit, static_argnums=0)
def _loss_jit(graphdef, params, tokens, targets):
  return _loss(nnx.merge(graphdef, params), tokens, targets)


@functools.partial(jax.jit, static_argnums=0)
def _grad_jit(graphdef, params, tokens, targets):
  return jax.grad(lambda p: _loss(nnx.merge(graphdef, p), tokens, targets))(params)


def _sequence_logprob(graphdef, params, prompt_ids, completion_ids):
  """log p(completion | prompt) by a plain forward of the model (independent of the engine)."""
  return -float(_loss_jit(graphdef, params, *_padded(prompt_ids, completion_ids))) * len(completion_ids)


def _grad(graphdef, params, prompt_ids, completion_ids):
  g = _grad_jit(graphdef, params, *_padded(prompt_ids, completion_ids))
  return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(g)])


def _cos(a, b):
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  path = tmp_path_factory.mktemp("lean") / "targets.json"
  path.write_text(json.dumps([{"header": HEADER, "theorem": t} for t in TARGETS]))
  # max_new_tokens 64: the scripted conjectures (about 40 tokens) stay below SGS's length penalty (0.8 x 64).
  config = _config("lean:tiny", **{"lean.targets_path": str(path), "lean.command": f"{sys.executable} {FAKE_REPL}",
                                   "lean.conjectures_per_seed": 3, "sampling.max_new_tokens": 64})
  model, tokenizer = build_model(config)
  graphdef, params = nnx.split(model)
  return config, tokenizer, graphdef, params


_ENGINES = {}


def _engine(graphdef, params, config):
  """One engine per model: its compiled functions are reused across tests."""
  return _ENGINES.setdefault(id(graphdef), one_device_engine(graphdef, params, config))


def _collect(play, graphdef, params, step, key):
  """One iteration through step.run_step without the update: (rows, metrics)."""
  result = step_lib.run_step(play, _engine(graphdef, params, play.config), params, None, step, key, update=None)
  return result.rows, result.metrics


def _play(setup, copy_proofs=(GOOD, GOOD, BAD, BAD), proofs=None):
  config, tokenizer, graphdef, params = setup
  sampler = ScriptedSampler(tokenizer, list(copy_proofs), proofs)
  return LeanSelfPlay(config, tokenizer, sampler=sampler), sampler


def _proof_tokens(sampler, iteration_calls, needle):
  """(prompt ids, completion ids) of the first verified proof for the prompt containing `needle`."""
  gen = iteration_calls
  for r, text in enumerate(gen.texts):
    prompt = sampler.tokenizer.decode(gen.prompt_tokens[r].tolist())
    if needle in prompt and text == GOOD:
      return gen.prompt_tokens[r], gen.tokens[r]
  raise AssertionError(f"no verified proof for {needle}")


@pytest.fixture(scope="module")
def loop(setup):
  """Three iterations of the loop on the script, shared by the two tests below (each asserts on the
  iterations it needs): 1, no update (seed_a joins the pool); 2, one real update (step.run_step with
  its update, all rows in one optimizer step, the sampler's true log-probs as PPO's old log-probs);
  3, no update, at the updated params. Iteration 2's rewards are computed at the params before its
  update (`before`), iteration 3's at the updated ones (`updated`)."""
  config, tokenizer, graphdef, params = setup
  config = config.copy_and_resolve_references()
  config.lean.train_batch_size = 0  # all rows in one optimizer step
  sampler = PolicySampler(tokenizer, [GOOD, GOOD, BAD, BAD])
  play = LeanSelfPlay(config, tokenizer, sampler=sampler)
  engine = _engine(graphdef, params, config)
  key = jax.random.key(0)
  try:
    sampler.active = False
    first = step_lib.run_step(play, engine, params, None, 1, key, update=None)
    after_first = SimpleNamespace(seeds=list(play.seeds.names), coverage=dict(play.coverage.history))
    proofs_1 = sampler.log[-1]
    sampler.active = True
    start, opt_state = engine.init_train_state(jax.tree.map(jnp.copy, params))
    before = jax.tree.map(np.array, start)  # the train step donates `start`
    second = step_lib.run_step(play, engine, start, opt_state, 2, key,
                               update=step_lib.UpdateOptions.from_config(config, tokenizer.pad_token_id))
    conjectures_2, proofs_2 = sampler.log[-2:]  # iteration 2: the conjectures, then their proofs
    sampler.active = False
    third = step_lib.run_step(play, engine, second.params, None, 3, key, update=None)
  finally:
    play.close()
  return SimpleNamespace(sampler=sampler, iterations={1: first, 2: second, 3: third}, after_first=after_first,
                         proofs_1=proofs_1, conjectures_2=conjectures_2, proofs_2=proofs_2, before=before,
                         updated=second.params)


# The tests on `loop` run on one xdist worker (--dist loadgroup), so the module-scoped run is made once.
@pytest.mark.xdist_group("lean_selfplay_loop")
def test_cos_novelty_for_every_eligible_conjecture_and_copies_pushed_down(setup, loop):
  config, tokenizer, graphdef, params = setup
  sampler, m1 = loop.sampler, loop.iterations[1].metrics
  # Iteration 1: no seed yet, so no conjecture; the solved target joins the pool and coverage.
  assert m1["lean/conjectures"] == 0 and loop.after_first.seeds == ["seed_a"]
  assert loop.after_first.coverage == {"seed_a": 1} and m1["coverage"] == pytest.approx(1 / 3)
  seed_proof_1 = _proof_tokens(sampler, loop.proofs_1, "(h₁ : y = x + 3)")

  for step in (2, 3):
    metrics = loop.iterations[step].metrics
    outcomes = [SimpleNamespace(**o) for o in metrics["candidates"]]  # one record per conjecture
    # Every solved or unsolved target is attempted again (SGS), conjectures only for the seed.
    assert metrics["lean/targets_attempted"] == 3 and [o.seed for o in outcomes] == ["seed_a"] * 3
    assert metrics["lean/conjectures_eligible"] == metrics["lean/cosines_computed"] == 3
    assert all(o.valid and 0 < o.solve_rate < 1 and o.in_band and o.cosine is not None for o in outcomes)

  # Iteration 2 (its rewards at the params before its update; its reference: iteration 1's proof).
  rows, metrics = loop.iterations[2].rows, loop.iterations[2].metrics
  copy, renamed, novel = [SimpleNamespace(**o) for o in metrics["candidates"]]
  # The cosine is cos(g(conjecture's first verified proof), g(seed's verified proof)) at these params.
  g_seed = _grad(graphdef, loop.before, *seed_proof_1)
  for outcome, needle in ((copy, "compassplay_conjecture_2_0"), (renamed, "compassplay_conjecture_2_1"),
                          (novel, "compassplay_conjecture_2_2")):
    g_conj = _grad(graphdef, loop.before, *_proof_tokens(sampler, loop.proofs_2, needle))
    assert outcome.cosine == pytest.approx(_cos(g_conj, g_seed), abs=1e-5)
    assert outcome.reward == pytest.approx(outcome.cosine * (1 - outcome.jaccard), abs=1e-6)

  # The copy: J = 1, reward 0, a negative advantage; the novel conjecture: positive.
  assert novel.cosine > 0, "precondition: the novel conjecture's proof aligns with the seed's"
  assert copy.jaccard == 1.0 and copy.reward == 0.0 and copy.copy and not copy.rename
  assert copy.advantage < 0 < novel.advantage
  # The renamed copy: not a copy by J, a rename, novelty exactly 1 - J (here about 0.47).
  assert renamed.rename and not renamed.copy
  assert 1 - renamed.jaccard == pytest.approx(1 - novelty.token_jaccard(RENAMED, SEED, "lean"))
  assert 0.4 < 1 - renamed.jaccard < 0.6
  # g(x̃) of the three conjectures and the seed's g_ref, none cut (reward length = the whole proof).
  assert metrics["lean/reward_sequences"] == 4 and metrics["lean/reward_truncated"] == 0
  assert metrics["lean/copies_trained_down"] == 1
  # Copy and rename rates over the in-band (training) conjectures.
  assert metrics["copy_rate"] == pytest.approx(1 / 3) and metrics["rename_rate"] == pytest.approx(1 / 3)
  # The rows carry those advantages: the copy's row stays in the batch with its negative advantage.
  outcomes = (copy, renamed, novel)
  proposer = [r for r in rows if r.role == "proposer"]
  assert sorted(r.advantage for r in proposer) == pytest.approx(sorted(o.advantage for o in outcomes))
  # Solver rows: REINFORCE-1/2 on verified proofs of problems with 0 < s <= 0.5.
  solver = [r for r in rows if r.role == "solver"]
  assert len(solver) == 2 + 2 + 2 + 1 and all(r.advantage == 1.0 for r in solver)


def test_state_round_trip_keeps_seed_pool_and_coverage(setup):
  config, tokenizer, graphdef, params = setup
  play, _ = _play(setup)
  try:
    _collect(play, graphdef, params, 1, jax.random.key(0))
    state = json.loads(json.dumps(play.state_dict()))  # what the checkpoint stores
  finally:
    play.close()
  other, _ = _play(setup)
  try:
    other.load_state_dict(state)
    assert other.seeds.to_json() == play.seeds.to_json() and other.coverage.to_json() == play.coverage.to_json()
    assert other.seeds.get("seed_a").completion == GOOD and other.seeds.get("seed_a").iteration == 1
  finally:
    other.close()


def test_supplied_proofs_seed_from_the_first_iteration(setup, tmp_path):
  config, tokenizer, graphdef, params = setup
  path = tmp_path / "targets.json"
  path.write_text(json.dumps([{"header": HEADER, "theorem": TARGETS[1], "proof": "\n  omega"},
                              {"header": HEADER, "theorem": TARGETS[2], "proof": "\n  sorry"}]))
  config = _config("lean:tiny", **{"lean.targets_path": str(path), "lean.command": f"{sys.executable} {FAKE_REPL}",
                                   "lean.conjectures_per_seed": 3})
  play = LeanSelfPlay(config, tokenizer, sampler=ScriptedSampler(tokenizer, [BAD] * 4))
  try:
    _, metrics = _collect(play, graphdef, params, 1, jax.random.key(0))
    # The verified supplied proof seeds (the sorry one does not), but counts for no coverage.
    assert play.seeds.names == ["target_b"] and play.seeds.get("target_b").source == "supplied"
    assert metrics["lean/seeds_supplied"] == 1 and metrics["coverage"] == 0.0
    assert metrics["lean/conjectures"] == 3  # conditioned on the supplied seed in iteration 1
  finally:
    play.close()


def test_try_proofs_get_zero_weight_and_train_batches_cover_one_epoch(setup):
  config, tokenizer, graphdef, params = setup
  play, _ = _play(setup, proofs={**PROOFS, "(h₁ : y = x + 3)": ["\n  try simp\n```", GOOD, BAD, BAD]})
  try:
    rows, metrics = _collect(play, graphdef, params, 1, jax.random.key(0))
    # seed_a: attempts [try, GOOD, BAD, BAD] -> s = 0.5, the `try` proof gets weight 0.
    assert metrics["lean/proofs_try_zeroed"] == 1 and metrics["lean/solver_rows"] == 1
    batches = play.train_batches(rows * 5, 1)
    assert [len(b) for b in batches] == [5]  # tiny: train_batch_size 16 >= 5 rows
    play.config = play.config.copy_and_resolve_references()  # not the module fixture's config
    play.config.lean.train_batch_size = 2
    batches = play.train_batches(rows * 5, 1)
    assert [len(b) for b in batches] == [2, 2, 1] and sum(batches, []) != []
  finally:
    play.close()


@pytest.mark.parametrize("field, value, message", [
    ("lean.conditioning", "targets", "config.lean.conditioning: 'targets' is not one of"),
    ("lean.proposer_advantage", "grpo", "config.lean.proposer_advantage: 'grpo' is not one of"),
    ("lean.conjectures_per_seed", 0, "config.lean.conjectures_per_seed: must be >= 1, got 0"),
])
def test_bad_schedule_settings_are_one_line_errors(field, value, message):
  from compassplay_jax.settings.lean.config import validate as validate_config
  config = _config("lean:tiny", **{"lean.targets_path": str(pathlib.Path(__file__).parent / "fixtures/lean/tiny_targets.json"),
                                   "lean.command": f"{sys.executable} {FAKE_REPL}", field: value})
  with pytest.raises(ValueError, match=message):
    validate_config(config)


def test_checkpoint_from_before_the_seed_pool_resumes(setup):
  """Old checkpoints stored {target: latest proof} as "proofs"; they load into the pool."""
  from compassplay_jax.domains.lean.coverage import Coverage
  play, _ = _play(setup)
  try:
    coverage = Coverage(["seed_a", "target_b", "target_c"])
    coverage.record(2, ["seed_a"])
    play.load_state_dict({"coverage": coverage.to_json(), "proofs": {"seed_a": GOOD}, "generations": 7})
    assert play.seeds.names == ["seed_a"] and play.seeds.get("seed_a").iteration == 2
    assert play.generations == 7 and play.supplied_checked
  finally:
    play.close()


def test_copy_solved_every_time_is_trained_down(setup):
  """A verbatim copy of a solved seed is usually solved 8 of 8 times: out of the band, its gate reward
  would leave it untrained (advantage 0, row dropped). It stays in the batch at advantage <= -1."""
  config, tokenizer, graphdef, params = setup
  play, _ = _play(setup, copy_proofs=[GOOD] * 4)
  try:
    for step in (1, 2):
      rows, metrics = _collect(play, graphdef, params, step, jax.random.key(0))
    copy, renamed, novel = [SimpleNamespace(**o) for o in metrics["candidates"]]
    assert copy.solve_rate == 1.0 and not copy.in_band and copy.jaccard == 1.0
    assert copy.advantage <= -1.0 and renamed.in_band and novel.in_band
    proposer = sorted(r.advantage for r in rows if r.role == "proposer")
    assert proposer == pytest.approx(sorted([copy.advantage, renamed.advantage, novel.advantage]))
    assert metrics["lean/copies_trained_down"] == 1
  finally:
    play.close()


def test_reward_truncation_is_counted(setup):
  """With a reward length (max_prompt_tokens + reward.max_completion_tokens) below prompt + proof every
  reward sequence is cut, and the metrics say so. With max_new_tokens 24 the scripted conjectures
  (about 40 tokens) pass SGS's length limit: their advantages become the length penalty (-1 at the
  limit); a copy's stays at its own, <= -1."""
  config, tokenizer, graphdef, params = setup
  short = config.copy_and_resolve_references()
  short.reward.max_completion_tokens = 2  # proofs are 4-6 tokens; prompts are cut to 64 by the sampler
  short.sampling.max_prompt_tokens = 64
  short.sampling.max_new_tokens = 24
  play = LeanSelfPlay(short, tokenizer, sampler=ScriptedSampler(tokenizer, [GOOD, GOOD, BAD, BAD]))
  try:
    for step in (1, 2):
      _, metrics = _collect(play, graphdef, params, step, jax.random.key(0))
    assert metrics["lean/reward_sequences"] == 4 and metrics["lean/reward_truncated"] == 4
    outcomes = [SimpleNamespace(**o) for o in metrics["candidates"]]
    assert all(o.in_band for o in outcomes) and outcomes[0].jaccard == 1.0
    assert outcomes[0].advantage <= -1.0 and [o.advantage for o in outcomes[1:]] == [-1.0, -1.0]
    assert metrics["lean/conjectures_length_penalized"] >= 2  # the two that were not copies
  finally:
    play.close()


def test_strict_extraction_rejects_text_after_the_block(setup):
  """SGS's strict extractor (lean.strict_extraction, the paper config's): a proof followed by text
  after its closing fence is not checked; the non-strict extractor takes it."""
  config, tokenizer, graphdef, params = setup
  chatty = {**PROOFS, "(h₁ : y = x + 3)": [GOOD, GOOD + "\nDone.", BAD, BAD]}
  rates = {}
  for strict in (False, True):
    play, _ = _play(setup, proofs=chatty)
    play.config = play.config.copy_and_resolve_references()
    play.config.lean.strict_extraction = strict
    try:
      _, metrics = _collect(play, graphdef, params, 1, jax.random.key(0))
      rates[strict] = metrics["reward/solver"] * 3  # seed_a's solve rate (the other targets: 0)
    finally:
      play.close()
  assert rates == pytest.approx({False: 0.5, True: 0.25})


@pytest.mark.xdist_group("lean_selfplay_loop")
def test_one_update_lowers_a_copy_and_raises_a_novel_conjecture(setup, loop):
  """Issue 27 item 5: one real update of the loop (iteration 2 of `loop`: step.run_step with its
  update, the sampler's true log-probs as PPO's old log-probs) lowers log p(copy | prompt) and raises
  log p(novel | prompt), measured by a plain forward of the model before and after."""
  config, tokenizer, graphdef, params = setup
  result = loop.iterations[2]
  copy, _, novel = [SimpleNamespace(**o) for o in result.metrics["candidates"]]
  assert copy.jaccard == 1.0 and copy.advantage <= -1.0 and novel.in_band and novel.advantage > 0
  assert result.metrics["train/optimizer_steps"] == 1
  # The old log-probs are the policy's own: the first (and only) step's ratio is 1.
  assert result.metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
  conjectures = loop.conjectures_2
  assert conjectures.texts[0].find("copy_a") > 0 and conjectures.texts[2].find("novel_a") > 0
  change = {}
  for name, r in (("copy", 0), ("novel", 2)):
    ids = conjectures.prompt_tokens[r], conjectures.tokens[r]
    change[name] = (_sequence_logprob(graphdef, loop.updated, *ids) - _sequence_logprob(graphdef, loop.before, *ids))
  assert change["copy"] < 0 < change["novel"], change


def test_system_errors_are_re_queued_and_counted(setup):
  # A check the checker failed (a crash, a server with no REPL free) is checked again, not counted as a
  # failed proof; lean/system_errors counts every such check.
  from compassplay_jax.verifiers.lean_repl import CRASH, LeanCheckResult
  config, tokenizer, graphdef, params = setup
  summaries = []
  for inject in (0, 3):
    play, _ = _play(setup)
    play.supplied_checked = True  # only the prover's proofs go through the checker
    check_batch, left = play.pool.check_batch, [inject]

    def flaky(items, check_batch=check_batch, left=left):
      results = check_batch(items)
      n = min(left[0], len(results))
      left[0] -= n
      return [LeanCheckResult(status=CRASH, error="injected") for _ in range(n)] + results[n:]

    play.pool.check_batch = flaky
    try:
      _, metrics = _collect(play, graphdef, params, 1, jax.random.key(0))
    finally:
      play.close()
    summaries.append((metrics["lean/system_errors"], metrics["reward/solver"], metrics["lean/solver_rows"]))
  assert summaries[0][0] == 0 and summaries[1][0] == 3
  assert summaries[1][1:] == summaries[0][1:]
