"""A setting defined entirely in this file registers itself and runs the real loop (issue 52).

`toy_sum`: the proposer writes "a+b" problems, the verifier checks them as numbers, the solver answers
(scripted texts: the tiny random model writes neither). Registered with compassplay_jax.settings, it
runs two steps of selfplay/run.run on the tiny embedded model, and its metrics, summary.json, per-step
line and report row come out without any package file naming it (docs/architecture.md, "Adding a setting").
"""
import dataclasses
import json
import random
import re

import ml_collections
import numpy as np
import pytest

from compassplay_jax import settings
from compassplay_jax.runtime import config_base
from compassplay_jax.cli import report
from compassplay_jax.models.config import ConfigError
from compassplay_jax.rewards.proposer_rewards import in_band
from compassplay_jax.sampling.generate import GenerationResult
from compassplay_jax.sampling.prompts import encode_prompts
from compassplay_jax.selfplay import alignment, run as run_lib, step as step_lib
from compassplay_jax.selfplay.rollout import Row, reward_config

NAME = "toy_sum"
PROPOSALS = ["2+3", "4+4", "x+y", "6+1"]  # in band (s = 1/2), out of band (s = 1), invalid, in band
SUM = re.compile(r"\s*(\d+)\s*\+\s*(\d+)\s*$")


def _solver_prompt(a: int, b: int) -> str:
  return f"What is {a}+{b}? Answer:"


def scripted(engine, params, tokenizer, prompts, config, key, *, n_samples=1, **_):
  """rollout.sample's signature: proposals from PROPOSALS; the solver is right on every sample of an even
  sum and on even samples of an odd one."""
  texts = []
  for i, prompt in enumerate(prompts):
    for s in range(n_samples):
      if prompt.startswith("What is"):
        a, b = map(int, re.findall(r"\d+", prompt)[:2])
        texts.append(f" {a + b if (a + b) % 2 == 0 or s % 2 == 0 else a + b + 1}")
      else:
        texts.append(PROPOSALS[i % len(PROPOSALS)])
  tokens = [np.asarray(tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id], np.int32)
            for t in texts]
  prompt_ids = [np.asarray(p, np.int32) for p in encode_prompts(tokenizer, list(prompts)) for _ in range(n_samples)]
  return GenerationResult(prompt_index=np.repeat(np.arange(len(prompts)), n_samples),
                          sample_index=np.tile(np.arange(n_samples), len(prompts)), prompt_tokens=prompt_ids,
                          tokens=tokens, logprobs=[np.full(len(t), -1.0, np.float32) for t in tokens],
                          lengths=np.asarray([len(t) for t in tokens]), finish_reasons=["stop"] * len(texts),
                          texts=texts)


@dataclasses.dataclass
class ToyPlan(step_lib.Plan):
  prompts: list[str]


class ToySum:
  """The Setting protocol (selfplay/step.py): plan, propose, verify, scoring, rows, commit, train_batches."""

  PHASES = ("generate", "reward")

  def __init__(self, config, tokenizer):
    self.config, self.tokenizer, self.checked = config, tokenizer, 0
    # The fixed reference every candidate's gradient is compared with: a sum written out right.
    self.reference = alignment.pack_reference(tokenizer, [_solver_prompt(1, 1)], [" 2"],
                                              max_len=config_base.reward_sequence_len(config))

  def plan(self, step):
    rng = random.Random(f"{self.config.seed}:{step}")
    prompts = [f"Write a sum of two digits ({rng.randint(0, 9)})." for _ in range(self.config[NAME].problems)]
    return ToyPlan(step, prompts, fixed_references={"sums": self.reference})

  def propose(self, engine, params, plan, key, times):
    with times("generate", "generate: problems"):
      return scripted(engine, params, self.tokenizer, plan.prompts, self.config, key)

  def verify(self, engine, params, plan, proposals, key, times):
    n = self.config[NAME].solve_samples
    problems = [SUM.match(t) for t in proposals.texts]
    valid = [tuple(map(int, m.groups())) for m in problems if m]
    with times("generate", "generate: answers"):
      gen = scripted(engine, params, self.tokenizer, [_solver_prompt(a, b) for a, b in valid], self.config, key,
                     n_samples=n)
    candidates, answered = [], iter(range(len(valid)))
    for text, m in zip(proposals.texts, problems):
      if not m:
        candidates.append(step_lib.Candidate("sum", formatted="+" in text, valid=False))
        continue
      i, total = next(answered), sum(map(int, m.groups()))
      right = [int(gen.texts[i * n + s]) == total for s in range(n)]
      first = i * n + right.index(True) if any(right) else None
      candidates.append(step_lib.Candidate(
          "sum", formatted=True, valid=True, solve_rate=float(np.mean(right)), reference="sums",
          solution=None if first is None else (gen.prompt_tokens[first], gen.tokens[first])))
    return step_lib.Verified(candidates, record=gen, references={"sums": self.reference})

  def scoring(self):
    return step_lib.ScoreOptions(reward_name=self.config.reward.name, reward_cfg=reward_config(self.config.reward),
                                 pad_id=self.tokenizer.pad_token_id,
                                 max_len=config_base.reward_sequence_len(self.config))

  def rows(self, engine, params, plan, proposals, verified, scores, key, times):
    rows = [Row(proposals.prompt_tokens[i], proposals.tokens[i], proposals.logprobs[i], float(r), "sum", "proposer")
            for i, r in enumerate(scores.reward)]
    gen = verified.record
    rows += [Row(gen.prompt_tokens[j], gen.tokens[j], gen.logprobs[j], float(j % 2 == 0), "sum", "solver")
             for j in range(len(gen.texts))]
    return rows, {"toy/answers": len(gen.texts)}

  def commit(self, plan, proposals, verified, scores):
    self.checked += sum(c.valid for c in verified.candidates)
    return {"toy/checked": self.checked}

  def train_batches(self, rows, step):
    return [rows]

  def state_dict(self):
    return {"checked": self.checked}

  def load_state_dict(self, state):
    self.checked = state["checked"]

  def close(self):
    pass


def _block():
  block = ml_collections.ConfigDict()
  block.problems = 4
  block.solve_samples = 2
  return block


def _validate(config):
  if config[NAME].solve_samples < 1:
    raise ConfigError(f"config.{NAME}.solve_samples: must be >= 1, got {config[NAME].solve_samples}")


SPEC = settings.register(settings.SettingSpec(
    name=NAME, config_block=_block, validate=_validate, build=lambda config, tokenizer, sampler=None: ToySum(
        config, tokenizer),
    summary_keys=(("checked", "toy/checked"),), summary=lambda config: {"toy": {"problems": config[NAME].problems}},
    reference_set=lambda setting: setting.reference))


def toy_config():
  config = config_base.base_config(NAME, "test")
  config.model.path = "tiny"
  config.steps = 2
  config.sampling.max_new_tokens = 8
  config.sampling.max_prompt_tokens = 64
  config.reward.max_completion_tokens = 8
  config.train.learning_rate = 1e-3
  config.train.micro_batch_size = 4
  config.eval.every_steps = 0
  config.checkpoint.every_steps = 1
  config.checkpoint.async_save = False
  return config


def test_the_registry_names_the_plug_in_and_its_config_block():
  assert NAME in settings.names() and settings.get(NAME) is SPEC
  assert {"coding", "lean"} <= set(settings.names())
  config = toy_config()
  assert config[NAME].problems == 4 and "coding" not in config and "lean" not in config
  config[NAME].solve_samples = 0
  with pytest.raises(ConfigError, match=f"config.{NAME}.solve_samples"):
    SPEC.validate(config)
  with pytest.raises(ConfigError, match="'chess' is not one of"):
    settings.get("chess")


def test_a_plug_in_setting_runs_two_steps_with_metrics_and_a_report_row(tmp_path, capsys):
  config = toy_config()
  workdir = tmp_path / "run"
  run_lib.run(config, workdir)
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [line["step"] for line in lines] == [1, 2]
  band = reward_config(config.reward)
  for line in lines:
    records = line["candidates"]
    assert [r["valid"] for r in records] == [True, True, False, True]
    # In band by the shared band function under the run's reward config: 2+3 and 6+1 (s = 1/2).
    want = [r["valid"] and r["formatted"] and in_band(r["solve_rate"], band) for r in records]
    assert [r["in_band"] for r in records] == want == [True, False, False, True]
    assert line["in_band_rate"] == 0.5 and line["in_band_count"] == 2 and line["valid_rate"] == 0.75
    # Paid by their cosine against the fixed reference; the rest by the gate.
    assert [r["paid_by"] for r in records] == ["cosine", "gate", "gate", "cosine"] and line["cos_paid_count"] == 2
    assert all(r["reward"] == pytest.approx(r["cosine"]) for r in records if r["paid_by"] == "cosine")
    assert line["toy/answers"] == 6 and np.isfinite(line["train/loss"])
  assert lines[-1]["toy/checked"] == 6  # commit's state, two steps of three valid problems
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["steps"] == 2 and summary["toy"] == {"problems": 4}
  out = capsys.readouterr().out
  assert "step 2/2 |" in out and "| checked 6 |" in out and "in-band 0.5" in out
  lines = report.write_report([workdir], tmp_path / "report", baseline="compassplay_cos", log=lambda _: None)
  assert f"## {NAME}" in lines
  cost = json.loads((tmp_path / "report" / NAME / "cost.json").read_text())
  assert [(row["arm"], row["seeds"], row["steps"]["mean"]) for row in cost["rows"]] == [("compassplay_cos", 1, 2.0)]
