"""SOAR's measurement in a self-play step (reward.name = soar_utility): the loop side of rewards/soar.py.

The candidates SOAR pays (valid ones; with RewardConfig.soar_uses_band also 0 < s < 1) are taken in
proposal order and cut into groups of config.reward.soar_group_size. For each group a copy of the
solver takes soar_inner_steps inner steps (soar_inner_optimizer: plain SGD or Adam from a fresh state)
on the group's verified tasks (each candidate's `solution`: solver prompt + verified completion, loss
on the completion; soar_inner_batch of them per step), and every member's `heldout_improvement` is the copy's held-out score minus the current
solver's: greedy accuracy on held-out problems (reward.soar_signal = "accuracy", SOAR's reward), or
the held-out gold solutions' NLL before minus after ("nll"). The held-out problems are drawn apart
from the cosine's reference set (`heldout_problems`). Device work goes through the engine; rows are
padded to one group shape and one length bucket per step, so each step compiles at most one
inner-training program per length bucket.
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Sequence

import numpy as np

from compassplay_jax.infra import distributed
from compassplay_jax.domains.coding.reference_set import (ReferenceSetError, load_reference_set, reference_problems,
                                                          resolve_path)
from compassplay_jax.evals.benchmarks import last_boxed
from compassplay_jax.evals.prompts import extract_math_answer
from compassplay_jax.models.config import ConfigError
from compassplay_jax.rewards import soar as soar_lib
from compassplay_jax.rewards.proposer_rewards import RewardConfig, in_band
from compassplay_jax.selfplay.sequences import TRAIN_BUCKETS, pack

SIGNALS = ("accuracy", "nll")


# ---- the held-out set ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HeldoutProblem:
  problem: str
  solution: str  # gold solution (the NLL signal's target)
  answer: str    # its final answer, the last \boxed{} of the solution (the accuracy signal's gold)


def _key(problem: str) -> str:
  return re.sub(r"\s+", " ", problem).strip()


def _count_records(path: str) -> int:
  resolved = resolve_path(path)
  if not resolved.is_file():
    raise ReferenceSetError(f"{path}: SOAR held-out file not found")
  with open(resolved, encoding="utf-8") as f:
    return sum(1 for line in f if line.strip())


def heldout_problems(reward) -> list[HeldoutProblem]:
  """SOAR's held-out set, disjoint from the cosine's reference set.

  reward.soar_heldout_size problems (0: reward.reference_size) of reward.soar_heldout_path ("":
  reward.reference_path), drawn with reward.reference_seed (not the run seed) from the file's
  problems that are not in the reference set (reference_path / _size / _seed; matched on the
  whitespace-normalised problem text) and, for the accuracy signal, whose solution has a \\boxed{}
  answer. Too few such problems, or no file, is a one-line error.
  """
  path = reward.soar_heldout_path or reward.reference_path
  if not path:
    raise ConfigError("config.reward.soar_heldout_path: SOAR needs held-out problems with gold solutions "
                      "(a jsonl file with problem / solution), and reward.reference_path is empty too")
  size = reward.soar_heldout_size or reward.reference_size
  everything = load_reference_set(path, _count_records(path), reward.reference_seed)  # all, shuffled by the seed
  reference = {_key(p.problem) for p in reference_problems(reward)} if reward.reference_path else set()
  pool = [p for p in everything if _key(p.problem) not in reference]
  accuracy = reward.soar_signal == "accuracy"
  if accuracy:
    pool = [p for p in pool if last_boxed(p.solution)]
  if len(pool) < size:
    what = " with a \\boxed{} answer" if accuracy else ""
    raise ReferenceSetError(f"{path}: asked for {size} SOAR held-out problems{what} outside the "
                            f"{len(reference)}-problem reference set, the file has {len(pool)}")
  chosen = pool[:size]
  overlap = reference & {_key(p.problem) for p in chosen}
  if overlap:  # the filter above makes this impossible; a cheap guard against a future change
    raise AssertionError(f"SOAR held-out set shares {len(overlap)} problems with the reference set")
  return [HeldoutProblem(p.problem, p.solution, last_boxed(p.solution) or "") for p in chosen]


@dataclasses.dataclass(frozen=True)
class HeldoutAnswers:
  """What the accuracy signal needs: held-out prompts and gold answers, and how to decode and check."""
  prompts: tuple[str, ...]
  answers: tuple[str, ...]
  tokenizer: Any
  checker: Any            # evals.math_check.MathChecker: math-verify in worker processes
  max_new_tokens: int
  batch_size: int


def heldout_correct(engine, params, heldout: HeldoutAnswers) -> np.ndarray:
  """(H,) bool: each held-out problem answered greedily at `params`, the answer extracted as AZR's
  math evaluation does (evals/prompts.extract_math_answer) and checked against the gold answer by
  math-verify outside this process."""
  return heldout_answers(engine, params, heldout)[1]


def heldout_answers(engine, params, heldout: HeldoutAnswers) -> tuple[list[str], np.ndarray]:
  """(the H greedy texts at `params`, heldout_correct's (H,) bool)."""
  texts = engine.greedy_texts(params, heldout.tokenizer, list(heldout.prompts), heldout.max_new_tokens,
                              heldout.batch_size)
  predictions = [extract_math_answer(t) for t in texts]
  return list(texts), np.asarray(heldout.checker.check_batch(list(zip(heldout.answers, predictions))), bool)


# ---- the measurement -------------------------------------------------------------------------------

def _place(engine, arrays: dict, pad_id: int, rows: int | None = None):
  """tokens / loss_mask / attention_mask padded to `rows` (or a multiple of data*fsdp), placed."""
  host = {k: np.asarray(arrays[k]) for k in ("tokens", "loss_mask", "attention_mask")}
  if rows is not None and rows > host["tokens"].shape[0]:
    extra = rows - host["tokens"].shape[0]
    host = {k: np.pad(v, ((0, extra), (0, 0)), constant_values=pad_id if k == "tokens" else 0)
            for k, v in host.items()}
  return engine.put_batch(engine.pad_rows(host, {"tokens": pad_id}))


def paid(candidates, reward_cfg: RewardConfig) -> list[int]:
  """Indices of the candidates SOAR measures: valid with a solution (and in band if reward_cfg.soar_uses_band)."""
  return [i for i, c in enumerate(candidates) if c.valid and c.solution is not None
          and (not reward_cfg.soar_uses_band or in_band(c.solve_rate, reward_cfg))]


def measure(engine, params, candidates: Sequence, options, *, pad_id: int, max_len: int,
            reward_cfg: RewardConfig) -> tuple[np.ndarray, dict]:
  """(heldout_improvement per candidate (0 where not measured), metrics). `options`: the reward
  stage's step.SoarOptions (held-out set, group size, inner steps, learning rate, batch and, when it
  has one, `optimizer` ("sgd" when absent); with `accuracy` set, the accuracy signal on those held-out
  answers, else the NLL of options.heldout).

  Metrics: soar/signal, soar/groups, soar/group_improvements (in group order), soar/improvement_mean,
  soar/distinct_rewards (distinct group values: the distinct SOAR rewards this step pays; also under
  its old name soar/distinct_values), soar/zero_groups (groups whose value is exactly 0),
  soar/heldout_accuracy or soar/heldout_loss (the current solver's); how far the copies moved, means
  over groups (rewards/soar.param_change): soar/param_change_l2, soar/param_change_rms_rel,
  soar/param_bf16_changed (fraction of weights whose bfloat16 value changed), soar/param_change_max_ulp
  (the largest over groups, in bf16 ulps of the weight); accuracy only: soar/answers_changed (fraction
  of the held-out greedy texts that differ from the current solver's, mean over groups) and
  soar/final_answers_changed (ditto for the extracted final answers); and the cost: soar/seconds (this
  measurement's wall time; also time/soar), soar/seconds_per_group, soar/inner_sgd_steps (inner steps,
  whatever the optimizer), soar/heldout_answers (greedy held-out answers decoded; accuracy) or
  soar/heldout_passes (held-out forward passes; nll)."""
  t0 = time.time()
  improvement = np.zeros((len(candidates),), np.float32)
  members = paid(candidates, reward_cfg)
  accuracy = getattr(options, "accuracy", None)
  signal = "accuracy" if accuracy is not None else "nll"
  if not members:
    return improvement, {"soar/signal": signal, "soar/groups": 0, "soar/seconds": time.time() - t0}
  inner = dict(steps=options.steps, learning_rate=options.learning_rate,
               batch_rows=getattr(options, "batch_rows", 0), optimizer=getattr(options, "optimizer", "sgd"))
  changes, answers_changed, finals_changed = [], [], []

  def record(change):
    changes.append({k: float(distributed.to_host(v)) for k, v in change.items()})

  if accuracy is None:
    held = _place(engine, options.heldout.as_dict(), pad_id)
    before = float(distributed.to_host(engine.mean_loss(params, held["tokens"], held["loss_mask"],
                                                        held["attention_mask"])))

    def gain(train):
      loss, change = engine.soar_trained_heldout_loss(params, train, held, with_change=True, **inner)
      record(change)
      return before - float(distributed.to_host(loss))
  else:
    texts0, correct0 = heldout_answers(engine, params, accuracy)
    before = float(np.mean(correct0))
    finals0 = [extract_math_answer(t) for t in texts0]

    def gain(train):
      trained = engine.soar_trained_params(params, train, **inner)
      record(engine.soar_param_change(params, trained))
      texts, correct = heldout_answers(engine, trained, accuracy)
      answers_changed.append(float(np.mean([a != b for a, b in zip(texts, texts0)])))
      finals_changed.append(float(np.mean([extract_math_answer(t) != f for t, f in zip(texts, finals0)])))
      return float(np.mean(correct)) - before

  packed = pack([candidates[i].solution[0] for i in members], [candidates[i].solution[1] for i in members],
                pad_id, max_len=max_len, buckets=TRAIN_BUCKETS)
  improvements = []
  for group in soar_lib.groups(range(len(members)), options.group_size):
    rows = {k: getattr(packed, k)[group] for k in ("tokens", "loss_mask", "attention_mask")}
    value = gain(_place(engine, rows, pad_id, rows=options.group_size))
    improvements.append(value)
    improvement[[members[j] for j in group]] = value
  n, seconds = len(improvements), time.time() - t0
  distinct = len(set(improvements))
  metrics = {"soar/signal": signal, "soar/groups": n, "soar/group_improvements": improvements,
             "soar/improvement_mean": float(np.mean(improvements)), "soar/distinct_rewards": distinct,
             "soar/distinct_values": distinct, "soar/zero_groups": sum(v == 0 for v in improvements),
             "soar/seconds": seconds, "soar/seconds_per_group": seconds / n, "soar/inner_sgd_steps": n * options.steps}
  metrics.update({"soar/param_change_l2": float(np.mean([c["l2"] for c in changes])),
                  "soar/param_change_rms_rel": float(np.mean([c["rms_rel"] for c in changes])),
                  "soar/param_bf16_changed": float(np.mean([c["bf16_changed"] for c in changes])),
                  "soar/param_change_max_ulp": float(np.max([c["max_ulp"] for c in changes]))})
  if accuracy is None:
    metrics.update({"soar/heldout_loss": before, "soar/heldout_passes": n + 1})
  else:
    metrics.update({"soar/heldout_accuracy": before, "soar/heldout_answers": len(accuracy.prompts) * (n + 1),
                    "soar/answers_changed": float(np.mean(answers_changed)),
                    "soar/final_answers_changed": float(np.mean(finals_changed))})
  return improvement, metrics
