"""One iteration of Lean conjecture-and-prove self-play, SGS's schedule
(../shared/notes/lean-selfplay-and-checking.md §1.3), with CompassPlay's proposer reward.

  1. one conjecture per unsolved target in this iteration's batch (the conjecturer sees only the
     target statement: SGS's TARGET_STATEMENT_ONLY_UNSOLVED);
  2. k proof attempts for every batch target and every valid conjecture -> Lean check -> solve rates;
  3. coverage update (a target is solved once any verified proof exists);
  4. local reference per seed = the gradient of the solver's loss on its verified proof of that seed
     (the most recent one we have, from this or an earlier iteration);
  5. conjecture reward (default compassplay_cos_novelty): cos(g(conjecture), g_ref(seed)) x
     (1 - token-Jaccard(conjecture, seed)), REINFORCE over SGS's band (0 < s <= 70th percentile),
     min-max normalised; solver: REINFORCE-1/2 on verified proofs of problems with 0 < s <= 0.5.

Eligible seeds: targets with a verified proof. A conjecture whose seed has no verified proof yet has
no reference direction; it gets reward 0 (no gradient), and counts in `lean/conjectures_no_reference`.
One model plays both roles (as in AZR); SGS trains two copies.
g(conjecture) is the solver's loss on the conjecture's FIRST verified proof (lowest sample index).
"""
from __future__ import annotations

import random
import time
from typing import Any

import numpy as np

from compassplay_jax.domains.lean import extraction
from compassplay_jax.domains.lean.coverage import Coverage
from compassplay_jax.domains.lean.prompts import conjecturer_prompt, prover_prompt
from compassplay_jax.domains.lean.targets import load_targets
from compassplay_jax.metrics import histogram
from compassplay_jax.rewards import novelty
from compassplay_jax.rewards.proposer_rewards import REWARD_FNS, proposer_rewards
from compassplay_jax.rl.advantages import conjecture_band, reinforce
from compassplay_jax.selfplay import alignment
from compassplay_jax.selfplay.reference_set import resolve_path
from compassplay_jax.selfplay.rollout import Row, reward_config, sample, split_key
from compassplay_jax.verifiers.lean_acceptance import check_proofs, validate_conjecture
from compassplay_jax.verifiers.lean_repl import check_repl_command

COS_REWARDS = ("compassplay_cos", "compassplay_cos_novelty", "cos")


def _targets(config):
  path = config.lean.targets_path
  if not path:
    raise ValueError("config.lean.targets_path: empty; set it to a miniF2F / Lean Workbook jsonl or a json list")
  resolved = resolve_path(path)
  if not resolved.is_file():
    raise FileNotFoundError(f"{path}: target file not found (config.lean.targets_path)")
  targets = load_targets(resolved)
  if not targets:
    raise ValueError(f"{path}: no statements")
  limit = config.lean.targets_limit
  return targets[:limit] if limit else targets


def validate_config(config) -> None:
  """Reward name, target file and the Lean command, before any model is loaded."""
  if config.reward.name not in REWARD_FNS:
    raise ValueError(f"config.reward.name: {config.reward.name!r} is not one of {sorted(REWARD_FNS)}")
  _targets(config)
  check_repl_command(config.lean.command.split(), config.lean.cwd or None)


class LeanSelfPlay:
  """Holds the targets, the Lean pool, coverage and the verified proofs used as local references."""

  def __init__(self, config, tokenizer):
    from compassplay_jax.verifiers.lean_pool import LeanReplPool
    self.config, self.tokenizer = config, tokenizer
    self.targets = _targets(config)
    self.by_name = {t.name: t for t in self.targets}
    l = config.lean
    self.pool = LeanReplPool(command=l.command.split(), cwd=l.cwd or None, num_workers=l.num_workers,
                             timeout_s=l.timeout_s, memory_limit_mb=l.memory_limit_mb,
                             max_checks_per_process=l.max_checks_per_process)
    self.coverage = Coverage([t.name for t in self.targets])
    self.proofs: dict[str, str] = {}  # target name -> completion text of its latest verified proof
    self.generations = 0

  def close(self):
    self.pool.close()

  def state_dict(self) -> dict[str, Any]:
    return {"coverage": self.coverage.to_json(), "proofs": self.proofs, "generations": self.generations}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self.coverage = Coverage.from_json(state["coverage"])
    self.proofs = dict(state["proofs"])
    self.generations = int(state["generations"])

  def _chat(self, text: str) -> str:
    return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True)

  def _prover_prefill(self, header: str, statement: str) -> str:
    """With lean.prefill_proof, the assistant turn starts with the code block and the fixed statement,
    so the model writes only the proof body (DeepSeek-Prover-V1.5's completion style)."""
    return f"```lean4\n{header}{statement.rstrip()}" if self.config.lean.prefill_proof else ""

  def _prove(self, graphdef, params, problems, key):
    """k attempts per (header, statement) problem -> (generation, per-problem verdict lists)."""
    k = self.config.lean.proofs_per_problem
    prefills = [self._prover_prefill(h, s) for h, s in problems]
    prompts = [self._chat(prover_prompt(s, h)) + pre for (h, s), pre in zip(problems, prefills)]
    gen = sample(graphdef, params, self.tokenizer, prompts, self.config, key, n_samples=k)
    verdicts = []
    for i, (header, statement) in enumerate(problems):
      texts = gen.texts[i * k:(i + 1) * k]
      bodies = [extraction.extract_proof_body(prefills[i] + t) for t in texts]
      checkable = [b for b in bodies if b is not None]
      results = iter(check_proofs(self.pool, header, statement, checkable) if checkable else [])
      verdicts.append([bool(b is not None and next(results).ok) for b in bodies])
    return gen, verdicts

  def collect(self, graphdef, params, step: int, key) -> tuple[list[Row], dict[str, float]]:
    cfg, l = self.config, self.config.lean
    rng = random.Random(f"{cfg.seed}:{step}")
    k = l.proofs_per_problem
    k_conj, k_prove = split_key(key, 2)
    timings = {"generate": 0.0, "lean": 0.0, "reward": 0.0}
    unsolved = [self.by_name[n] for n in self.coverage.target_names if n not in self.coverage.solved]
    batch = unsolved if not l.targets_per_iteration else rng.sample(unsolved, min(l.targets_per_iteration, len(unsolved)))

    # 1. conjectures
    t0 = time.time()
    conj_gen = sample(graphdef, params, self.tokenizer, [self._chat(conjecturer_prompt(t)) for t in batch], cfg,
                      k_conj) if batch else None
    timings["generate"] += time.time() - t0
    conjectures = []  # (batch index, statement)
    formats = []
    for i, text in enumerate(conj_gen.texts if conj_gen else []):
      extracted = extraction.extract_conjecture(text)
      ok, _, statement = validate_conjecture(extracted) if extracted else (False, "", None)
      formats.append(extracted is not None)
      if ok:
        conjectures.append((i, extraction.rename_theorem(statement, f"compassplay_conjecture_{step}_{i}")))

    # 2. proofs for batch targets and valid conjectures
    problems = [(t.header, t.statement) for t in batch] + [(batch[i].header, s) for i, s in conjectures]
    rows: list[Row] = []
    rates = np.zeros((len(problems),), np.float32)
    prove_gen, verdicts = None, []
    if problems:
      t0 = time.time()
      prove_gen, verdicts = self._prove(graphdef, params, problems, k_prove)
      timings["lean"] += time.time() - t0
      rates = np.asarray([np.mean(v) for v in verdicts], np.float32)
    self.generations += len(batch) + len(problems) * k

    # 3. coverage, and the verified proofs that become local references
    solved_now = []
    for i, target in enumerate(batch):
      if any(verdicts[i]):
        j = i * k + verdicts[i].index(True)
        self.proofs[target.name] = prove_gen.texts[j]  # the completion (after any prefill)
        solved_now.append(target.name)
    newly = self.coverage.record(step, solved_now, generations=self.generations)

    # 4-5. conjecture rewards
    t0 = time.time()
    n_t = len(batch)
    conj_rates = rates[n_t:]
    valid = np.zeros((len(batch),), bool)
    conj_rate_by_target = np.zeros((len(batch),), np.float32)
    cosines = np.zeros((len(batch),), np.float32)
    jaccard = np.ones((len(batch),), np.float32)
    no_reference = 0
    for c, (i, statement) in enumerate(conjectures):
      valid[i] = True
      conj_rate_by_target[i] = conj_rates[c]
      jaccard[i] = novelty.token_jaccard(statement, batch[i].statement, language="lean")
      seed_proof = self.proofs.get(batch[i].name)
      if seed_proof is None:
        no_reference += 1
        continue
      if cfg.reward.name in COS_REWARDS and 0 < conj_rates[c] < 1:
        cosines[i] = self._conjecture_cosine(graphdef, params, batch[i], seed_proof, statement,
                                             prove_gen, n_t + c, verdicts[n_t + c])
    has_reference = np.asarray([self.proofs.get(t.name) is not None for t in batch], bool)
    raw = np.asarray(proposer_rewards(cfg.reward.name, cosines=cosines, solve_rates=conj_rate_by_target, valid=valid,
                                      well_formatted=np.asarray(formats, bool), jaccard_to_seed=jaccard,
                                      config=reward_config(cfg.reward)), np.float32) if len(batch) else np.zeros((0,), np.float32)
    eligible = valid & (conj_rate_by_target > 0) & (conj_rate_by_target < 1)
    if cfg.reward.name in COS_REWARDS:
      eligible &= has_reference
    band = np.zeros_like(eligible)
    if eligible.any():
      band[eligible] = conjecture_band(conj_rate_by_target[eligible])
    conj_adv = reinforce(raw, selected=band) if len(batch) else raw
    for i in range(len(batch)):
      rows.append(Row(conj_gen.prompt_tokens[i], conj_gen.tokens[i], conj_gen.logprobs[i], float(raw[i]),
                      "conjecture", "proposer", advantage=float(conj_adv[i])))
    timings["reward"] += time.time() - t0

    # Solver: REINFORCE-1/2 on verified proofs of problems with 0 < s <= solver_band_max.
    for p in range(len(problems)):
      if 0 < rates[p] <= l.solver_band_max:
        for j, ok in enumerate(verdicts[p]):
          if ok:
            r = p * k + j
            rows.append(Row(prove_gen.prompt_tokens[r], prove_gen.tokens[r], prove_gen.logprobs[r], 1.0,
                            "target" if p < n_t else "conjecture", "solver", advantage=1.0))
    rows = [r for r in rows if r.advantage != 0.0]  # SGS trains only on rows with weight

    statements = [s for _, s in conjectures]
    seeds = [batch[i].statement for i, _ in conjectures]
    nov = novelty.batch_novelty_metrics(statements, seeds, "lean") if statements else {"copy_rate": 0.0,
                                                                                        "rename_rate": 0.0}
    metrics = {
        "coverage": self.coverage.fraction, "coverage/solved": len(self.coverage.solved),
        "coverage/newly_solved": len(newly), "lean/targets_in_batch": n_t,
        "valid_rate": float(np.mean(valid)) if n_t else 0.0,
        "format_rate": float(np.mean(formats)) if formats else 0.0,
        "in_band_rate": float(np.mean(band)) if n_t else 0.0,
        "reward/proposer": float(np.mean(raw)) if n_t else 0.0,
        "reward/solver": float(np.mean(rates[:n_t])) if n_t else 0.0,
        "lean/conjecture_solve_rate": float(np.mean(conj_rates)) if len(conj_rates) else 0.0,
        "lean/conjectures_no_reference": no_reference,
        "copy_rate": nov["copy_rate"], "rename_rate": nov["rename_rate"],
        "solve_rate_histogram": histogram(rates.tolist()), "generations": self.generations,
        "tokens/generated": int(sum(np.sum(g.lengths) for g in (conj_gen, prove_gen) if g is not None)),
    }
    for name, seconds in timings.items():
      metrics[f"time/{name}"] = seconds
    return rows, metrics

  def _conjecture_cosine(self, graphdef, params, seed, seed_proof, statement, prove_gen, problem, verdict):
    """cos(g(conjecture's first verified proof), g_ref = g(seed's verified proof))."""
    tok, cfg = self.tokenizer, self.config
    max_len = cfg.sampling.max_prompt_tokens + cfg.reward.max_completion_tokens
    seed_prompt = self._chat(prover_prompt(seed.statement, seed.header)) + self._prover_prefill(seed.header,
                                                                                               seed.statement)
    seed_ref = alignment.pack_reference(tok, [seed_prompt], [seed_proof], max_len=max_len)
    g_ref = alignment.reference_gradient(graphdef, params, seed_ref, 1)
    j = problem * cfg.lean.proofs_per_problem + verdict.index(True)
    cos = alignment.candidate_cosines(graphdef, params, g_ref, [prove_gen.prompt_tokens[j]], [prove_gen.tokens[j]],
                                      tok.pad_token_id, method=cfg.reward.method, chunk_size=cfg.reward.chunk_size,
                                      micro_batch=cfg.reward.micro_batch_size, max_len=max_len)
    return float(cos["cosines"][0])
