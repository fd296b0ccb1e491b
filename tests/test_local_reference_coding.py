"""Coding with Lean's local reference (config.reward.reference = "local", settings/coding/local_reference.py).

One step of the tiny coding config (deduction, one seed shown per proposal, cos x novelty) through
step.run_step with the real sandbox and the real reward stage; the texts are scripted (a
random tiny model writes no valid programs): even proposals copy their seed's program, odd ones write
a new one, and the solver is right on even samples only, so every proposal is valid and in band.
Checked against independent computations: g_ref of each seed = jax.grad of the plain loss on
(the seed's solver prompt, its verified answer), each candidate's cosine against its own seed's g_ref.
"""
import jax
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.rewards import novelty
from compassplay_jax.sampling.generate import GenerationResult
from compassplay_jax.sampling.prompts import encode_prompts
from compassplay_jax.selfplay import alignment
from compassplay_jax.settings.coding import compact_prompts, local_reference
from compassplay_jax.selfplay import step as step_lib
from compassplay_jax.settings.coding.setting import CodingSelfPlay
from compassplay_jax.selfplay.run import build_model
from compassplay_jax.verifiers.sandbox import SandboxPool
from tests.test_coding_plumbing import _flat_grad
from tests.test_selfplay import _config
from tests.engines import one_device_engine

NOVEL = ["max(x, 9) * 4", "min(x, 2) - 11", "abs(x) % 7 - 3", "x // 3 + 8"]  # new one-line bodies, none a seed's


def _body(text):
  """The body of the last `return ...` line."""
  return text.rsplit("return ", 1)[1].split("\n")[0]


class ScriptedCoder:
  """rollout.sample's signature, no model call: proposal i copies its seed's body when i is even,
  writes NOVEL[i // 2] when odd, input 5; the solver is right on even samples only."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  def answer(self, prompt, sample, i):
    if not isinstance(prompt, str):  # a proposal's second segment: its input
      return "5\n"
    if prompt.endswith("return "):  # a proposal's first segment: the body
      seed = prompt[:prompt.index("<think>")] if "<think>" in prompt else prompt
      return (_body(seed) if i % 2 == 0 else NOVEL[(i // 2) % len(NOVEL)]) + "\n"
    task = prompt[prompt.rindex("```python\n"):]  # a deduction solver prompt: program, then input
    x = task.split("```input\n")[1].split("\n")[0]
    right = repr(eval(_body(task.split("```")[1]), {"x": eval(x)}))
    return f"{right}\n" if sample % 2 == 0 else "-1000\n"

  def __call__(self, engine, params, tokenizer, prompts, config, key, *, n_samples=1, **kwargs):
    texts = [self.answer(p, s, i) for i, p in enumerate(prompts) for s in range(n_samples)]
    tokens = [np.asarray(tokenizer.encode(t, add_special_tokens=False), np.int32) for t in texts]
    prompt_ids = [np.asarray(p, np.int32) for p in encode_prompts(tokenizer, prompts) for _ in range(n_samples)]
    return GenerationResult(prompt_index=np.repeat(np.arange(len(prompts)), n_samples),
                            sample_index=np.tile(np.arange(n_samples), len(prompts)), prompt_tokens=prompt_ids,
                            tokens=tokens, logprobs=[np.full(len(t), -1.0, np.float32) for t in tokens],
                            lengths=np.asarray([len(t) for t in tokens]), finish_reasons=["stop"] * len(texts),
                            texts=texts)


class Recording(CodingSelfPlay):
  """Keeps the reward stage's inputs: the plan, the candidates and the reference batches."""

  def verify(self, engine, params, plan, proposals, key, times):
    verified = super().verify(engine, params, plan, proposals, key, times)
    self.seen = (plan, verified.candidates, verified.references)
    return verified


@pytest.fixture(scope="module")
def stepped():
  config = _config("coding:tiny", **{"reward.reference": "local", "reward.name": "compassplay_cos_novelty",
                                     "coding.task_types": "deduction", "coding.num_references": 1,
                                     "coding.proposals_per_type": 4})
  model, tokenizer = build_model(config)
  graphdef, params = nnx.split(model)
  pool = SandboxPool(num_workers=2)
  try:
    setting = Recording(config, tokenizer, pool, sampler=ScriptedCoder(tokenizer))
    assert setting.reference is None  # no reference set is loaded in local mode
    engine = one_device_engine(graphdef, params, config)
    result = step_lib.run_step(setting, engine, params, None, 1, jax.random.key(3), update=None)
    yield config, tokenizer, graphdef, params, setting, engine, result
  finally:
    pool.close()


def test_each_candidate_is_compared_with_its_own_seeds_verified_solution(stepped):
  config, tok, graphdef, params, setting, engine, result = stepped
  plan, candidates, references = setting.seen
  seeds = plan.seeds["deduction"]
  assert len(candidates) == len(seeds) == 4 and all(c.valid and c.solve_rate == 0.5 for c in candidates)
  assert [c.reference for c in candidates] == [local_reference.seed_key(s) for s in seeds]
  assert set(references) == {c.reference for c in candidates}
  assert len(references) >= 2, "the step's seeds should differ (pick another key if the buffer sampling changed)"
  prefix = config.coding.solver_prefix.format(block="output")
  oracle = {}
  for seed in seeds:  # the seed's solver prompt + its verified output as the one-line answer
    prompt_ids = np.asarray(encode_prompts(tok, [compact_prompts.solver_prompt(seed, config.coding.solver_prefix)
                                                 + prefix])[0])
    answer = np.asarray(tok.encode(f"{seed.output}\n", add_special_tokens=False))
    oracle[local_reference.seed_key(seed)] = _flat_grad(graphdef, params, prompt_ids, answer)
  for key, packed in references.items():
    g_ref = alignment.reference_gradient(engine, params, packed, tok.pad_token_id)
    got = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(g_ref)])
    np.testing.assert_allclose(got, oracle[key], rtol=1e-4, atol=1e-6)
  a, b = sorted(oracle)[:2]
  assert not np.allclose(oracle[a], oracle[b])  # different seeds, different references
  for c, cosine in zip(candidates, result.scores.cosine):  # every cosine is against the candidate's own seed
    g = _flat_grad(graphdef, params, np.asarray(c.solution[0]), np.asarray(c.solution[1]))
    ref = oracle[c.reference]
    assert cosine == pytest.approx(g @ ref / (np.linalg.norm(g) * np.linalg.norm(ref)), abs=1e-4)


def test_an_exact_copy_of_the_seed_is_paid_zero_and_kept_in_the_batch(stepped):
  _, tok, _, _, setting, _, result = stepped
  rows, metrics, scores = result.rows, result.metrics, result.scores
  plan, candidates, _ = setting.seen
  for c, reward, cosine in zip(candidates, scores.reward, scores.cosine):  # novelty = 1 - J(program, seed)
    assert reward == pytest.approx(cosine * (1.0 - c.jaccard), abs=1e-6)
  for i in range(0, len(candidates), 2):  # the copies
    assert candidates[i].jaccard == 1.0 and scores.reward[i] == 0.0 and scores.eligible[i]
    assert scores.cosine[i] is not None
  assert all(c.jaccard < novelty.COPY_THRESHOLD for c in candidates[1::2])
  # Lean's copy metrics over the in-band candidates: half are exact copies of their seed.
  assert metrics["copy_rate"] == metrics["exact_copy_rate"] == 0.5 and metrics["rename_rate"] == 0.0
  # The per-candidate records carry J too (docs/experiments.md reads cosines of copies vs the rest).
  assert [r["jaccard"] for r in metrics["candidates"]] == pytest.approx([c.jaccard for c in candidates])
  # Every proposal keeps its row (reward 0 for the copies); its weight is its TRR++ advantage.
  proposer = [r for r in rows if r.role == "proposer"]
  assert [r.reward for r in proposer] == pytest.approx(scores.reward.tolist())
  adv = np.asarray([r.advantage for r in proposer])  # run_step's TRR++ advantages over all the rows
  rewards = np.asarray(scores.reward)
  for i in range(len(candidates)):
    for j in range(len(candidates)):
      if rewards[i] > rewards[j]:
        assert adv[i] > adv[j]
  if np.ptp(rewards) > 0:  # the copies' rows carry a nonzero (token-whitened) advantage
    assert np.all(adv[0::2] != 0.0)


def test_one_step_pays_by_the_cosine_against_local_references(stepped):
  config, tok, graphdef, params, setting, engine, result = stepped
  rows, metrics = result.rows, result.metrics
  n_seeds = len(setting.seen[2])
  assert metrics["local/seed_references"] == n_seeds >= 2
  assert metrics["local/cosines_computed"] == 4 == metrics["cos_paid_count"]
  assert {"copy_rate", "rename_rate", "exact_copy_rate", "copy_rate_valid", "local/in_band_with_seed"} <= set(metrics)
  assert metrics["local/in_band_with_seed"] == 4
  # ... and the rows train: one engine update over them changes the params.
  before = jax.tree.map(np.array, params)
  p, o = engine.init_train_state(jax.tree.map(np.asarray, params))
  new_p, _, train = step_lib.update_params(engine, p, o, [rows], jax.random.key(0),
                                           step_lib.UpdateOptions.from_config(config, tok.pad_token_id))
  assert train["rows"] == len(rows) and np.isfinite(train["train/loss"])
  assert any(not np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(new_p)))


def test_reference_field_is_checked():
  from compassplay_jax.models.config import ConfigError
  from compassplay_jax.settings.coding.config import validate as validate_config
  with pytest.raises(ConfigError, match="config.reward.reference: 'seed' is not one of"):
    validate_config(_config("coding:tiny", **{"reward.reference": "seed"}))
  validate_config(_config("coding:local_demo"))
