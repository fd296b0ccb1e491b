"""SGS's conjecture filters in the Lean loop (issue 50 item 4): deduplication before proving, the
verifier's 'failed'-warning rejection, and the prompt-plus-generation cap of 8,192 tokens.

SGS = github.com/LukeBailey181/sgs at 64d2de4: sgs/pipeline/step1_data_gen.py:443-452 (dedup),
sgs/verification/prover/lean/verifier.py:147 (rejection rule), sgs/models/query_local.py:399-408 (cap).
No model is built: the loop's stages run with a scripted sampler and the stand-in REPL.
"""
import json
import pathlib
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from compassplay_jax.domains.lean.dedup import sgs_duplicates
from compassplay_jax.models.config import ConfigError
from compassplay_jax.sampling.generate import GenerationResult
from compassplay_jax.settings.lean import budget, config as lean_config, setting as lean_loop
from compassplay_jax.selfplay import step as step_lib
from compassplay_jax.selfplay.rollout import truncate_prompt
from compassplay_jax.verifiers.lean_acceptance import accept_proof
from tests.test_lean_acceptance import CLEAN, STATEMENT, reply
from tests.test_selfplay import _config

FAKE_REPL = pathlib.Path(__file__).with_name("fake_lean_repl.py")
HEADER = "import Mathlib\n"
SEED = "theorem seed_a (x y : ℕ) (h₀ : x = 2) (h₁ : y = x + 3) : y = 5 := by"
OTHER = "theorem target_b (n : ℕ) (h : n % 2 = 1) : n ≠ 0 := by"
NOVEL = "theorem novel_a (n : ℤ) (hn : 0 < n) : n ^ 2 > 0 := by"
# seed_a's conjectures, in order: a verbatim copy of the target (name included), a novel statement, the
# same novel statement again, and the seed's signature under another name (not a string match: kept).
CONJECTURES = [SEED, NOVEL, NOVEL, SEED.replace("seed_a", "copy_a")]


class CharTokenizer:
  """One token per character (what the loop's stages use of a tokenizer; a real one takes seconds to load)."""
  eos_token_id = pad_token_id = 0
  bos_token_id = None

  def encode(self, text, add_special_tokens=True):
    return [ord(c) + 1 for c in text]

  def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
    return f"<|user|>{messages[0]['content']}<|assistant|>"


@pytest.fixture(scope="module")
def tokenizer():
  return CharTokenizer()


class Scripted:
  """rollout.sample's signature: conjectures from CONJECTURES, proofs `simp` (accepted by the stand-in
  REPL); records every prompt and keyword argument it was given."""

  def __init__(self, tokenizer):
    self.tokenizer, self.prompts, self.kwargs = tokenizer, [], []

  def __call__(self, engine, params, tokenizer, prompts, config, key, *, n_samples=1, **kwargs):
    self.prompts.append(list(prompts))
    self.kwargs.append(kwargs)
    conjecturing = "Please generate a lean4 theorem" in prompts[0]
    texts = [f"```lean4\n{CONJECTURES[s]} sorry\n```" if conjecturing else "\n  simp\n```"
             for _ in prompts for s in range(n_samples)]
    ids = [np.asarray(tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id]) for t in texts]
    return GenerationResult(
        prompt_index=np.repeat(np.arange(len(prompts)), n_samples), sample_index=np.tile(np.arange(n_samples), len(prompts)),
        prompt_tokens=[np.asarray(truncate_prompt(tokenizer, p, config.sampling.max_prompt_tokens))
                       for p in prompts for _ in range(n_samples)],
        tokens=ids, logprobs=[np.zeros(len(i), np.float32) for i in ids], lengths=np.asarray([len(i) for i in ids]),
        finish_reasons=["eos"] * len(texts), texts=texts)


def _play(tmp_path, tokenizer, **overrides):
  path = tmp_path / "targets.json"
  path.write_text(json.dumps([{"header": HEADER, "theorem": t} for t in (SEED, OTHER)]))
  config = _config("lean:tiny", **{"lean.targets_path": str(path), "lean.command": f"{sys.executable} {FAKE_REPL}",
                                   "lean.conditioning": "unsolved",
                                   "lean.conjectures_per_seed": len(CONJECTURES), "lean.proofs_per_problem": 2,
                                   **overrides})
  sampler = Scripted(tokenizer)
  return lean_loop.LeanSelfPlay(config, tokenizer, sampler=sampler), sampler


def _iteration(play):
  """plan, propose, verify and rows of one iteration (no model: the rows' scores are all zero)."""
  times = step_lib.PhaseTimes(play.PHASES)
  plan = play.plan(0)
  proposals = play.propose(None, None, plan, None, times)
  verified = play.verify(None, None, plan, proposals, None, times)
  n = len(verified.candidates)
  scores = step_lib.Scores(eligible=np.zeros(n, bool), cosine=[None] * n, reward=np.zeros(n, np.float32),
                           heldout_improvement=np.zeros(n, np.float32))
  _, metrics = play.rows(None, None, plan, proposals, verified, scores, None, times)
  return plan, proposals, verified, metrics


# ---- deduplication --------------------------------------------------------------------------------

def test_sgs_duplicates_is_an_exact_string_match_against_targets_and_earlier_conjectures():
  assert sgs_duplicates(CONJECTURES, [SEED, OTHER]) == [True, False, True, False]
  assert sgs_duplicates([None, NOVEL, None, NOVEL], []) == [False, False, False, True]
  # No normalisation: another spacing, or another theorem name, is another string (SGS keeps both).
  assert sgs_duplicates([SEED.replace(" : y", "  : y"), SEED.replace("seed_a", "b")], [SEED]) == [False, False]


def test_sgs_dedup_drops_a_duplicate_conjecture_before_it_is_proved(tmp_path, tokenizer):
  play, sampler = _play(tmp_path, tokenizer)
  try:
    assert play.config.lean.dedup_conjectures  # the tiny variant keeps the paper's value
    plan, proposals, verified, metrics = _iteration(play)
  finally:
    play.close()
  # Both targets are unsolved, so each conditions the same 4 conjectures (8, in seed order): seed_a's
  # copy of its target and its second NOVEL are dropped, and every one of target_b's (a target, or a
  # string seed_a's conjectures already hold).
  assert plan.seed_names == ["seed_a", "target_b"]
  outcomes = proposals.outcomes
  dropped = [True, False, True, False] + [True] * 4
  assert [o.valid for o in outcomes] == [True] * 8
  assert [o.duplicate for o in outcomes] == dropped
  # The prover saw the two targets and the two kept conjectures, never a dropped one.
  proof_prompts = sampler.prompts[1]
  assert len(proof_prompts) == 4 and verified.record.n_problems == 4
  for r, drop in enumerate(dropped):
    assert sum(f"compassplay_conjecture_0_{r} " in p for p in proof_prompts) == (0 if drop else 1)
  # Dropped conjectures are no candidates for a reward and get no proof attempts.
  assert [c.valid for c in verified.candidates] == [not d for d in dropped]
  assert [o.solve_rate for o in verified.record.outcomes] == [0.0 if d else 1.0 for d in dropped]
  assert metrics["lean/conjectures_deduplicated"] == 6
  assert metrics["lean/conjectures"] == 8
  assert [r.fields["duplicate"] for r in metrics["candidates"]] == dropped


def test_without_dedup_every_valid_conjecture_is_proved(tmp_path, tokenizer):
  play, sampler = _play(tmp_path, tokenizer, **{"lean.dedup_conjectures": False})
  try:
    _, proposals, verified, metrics = _iteration(play)
  finally:
    play.close()
  assert not any(o.duplicate for o in proposals.outcomes)
  assert verified.record.n_problems == 2 + 8
  assert metrics["lean/conjectures_deduplicated"] == 0
  # The loop gives its sampler the paper's cap (the tiny variant keeps it), for conjectures and proofs.
  assert [k.get("max_total_tokens") for k in sampler.kwargs] == [8192, 8192]
  assert metrics["lean/generations_capped"] == 0  # tiny: 24 new tokens, far below 8192 - prompt


# ---- the verifier's rejection rule -----------------------------------------------------------------

def _warning(line, data, severity="warning"):
  return {"severity": severity, "pos": {"line": line, "column": 0}, "endPos": {"line": line, "column": 4},
          "data": data}


def test_a_warning_containing_failed_rejects_the_proof_as_sgs_does():
  assert accept_proof(STATEMENT, CLEAN, reply(CLEAN)).ok
  verdict = accept_proof(STATEMENT, CLEAN, reply(CLEAN, _warning(3, "aesop: failed to prove the goal after "
                                                                    "exhaustive search.")))
  assert not verdict.ok and "failed" in verdict.reason and not verdict.system_error


def test_the_failed_rule_reads_warnings_only_and_the_lowercase_substring():
  # SGS's test: 'failed' in warning['data'] over messages of severity "warning" (verifier.py:142, :147).
  for message in (_warning(3, "linarith failed", severity="info"), _warning(3, "Failed to synthesize"),
                  _warning(3, "unused variable `h₀`")):
    assert accept_proof(STATEMENT, CLEAN, reply(CLEAN, message)).ok, message
  assert not accept_proof(STATEMENT, CLEAN, reply(CLEAN, _warning(2, "this tactic failedX"))).ok


# ---- the prompt-plus-generation cap ----------------------------------------------------------------

def test_generation_budget_is_the_token_cap_minus_the_prompt():
  assert budget.generation_budget(500, 8192, 8192) == 7692
  assert budget.generation_budget(500, 4096, 8192) == 4096  # max_new_tokens binds first
  assert budget.generation_budget(500, 8192, 0) == 8192  # no cap


class _Engine:
  """Records the requests rollout's engine would sample (no model)."""

  def generate_shared(self, params, tokenizer, sampling, requests, cfg, key, shares, on_finish=None):
    self.requests, self.cfg = list(requests), cfg
    return "result"


def test_capped_sampler_gives_each_request_the_budget_left_by_its_prompt(tokenizer):
  config = _config("lean", **{"sampling.max_prompt_tokens": 40})
  assert config.lean.max_total_tokens == 8192 and config.sampling.max_new_tokens == 8192
  config.lean.max_total_tokens = 100
  config.sampling.max_new_tokens = 80
  prompts = ["short", "a much longer prompt " * 20]
  engine = _Engine()
  assert budget.sample_capped(engine, None, tokenizer, prompts, config, None, n_samples=3,
                                 max_total_tokens=100) == "result"
  lengths = [len(truncate_prompt(tokenizer, p, 40)) for p in prompts]
  assert lengths[1] == 40  # cut to max_prompt_tokens, as rollout.sample cuts it
  assert [list(r.prompt) for r in engine.requests] == [truncate_prompt(tokenizer, p, 40) for p in prompts]
  assert [r.max_new_tokens for r in engine.requests] == [min(80, 100 - n) for n in lengths]
  assert all(len(r.prompt) + r.max_new_tokens <= 100 for r in engine.requests)
  assert engine.cfg.n_samples == 3 and engine.cfg.max_new_tokens == 80


def test_cap_counts_capped_rows_and_rows_the_cap_ended():
  gen = SimpleNamespace(prompt_tokens=[np.zeros(30), np.zeros(30), np.zeros(5)], lengths=np.asarray([70, 12, 60]),
                        finish_reasons=["length", "eos", "length"])
  # budgets: 100 - 30 = 70, 70, min(80, 95) = 80; the first row stopped at its capped budget.
  assert budget.cap_counts(gen, 80, 100) == (2, 1)
  assert budget.cap_counts(gen, 80, 0) == (0, 0)


def test_a_cap_that_leaves_no_room_after_the_longest_prompt_is_refused(tmp_path):
  config = _config("lean:tiny", **{"lean.max_total_tokens": 512})  # tiny: max_prompt_tokens 512
  with pytest.raises(ConfigError, match="max_total_tokens"):
    lean_config.validate(config)
