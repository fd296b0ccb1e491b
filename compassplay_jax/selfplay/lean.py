"""One iteration of Lean conjecture-and-prove self-play with CompassPlay's proposer reward.

The schedule (docs/lean.md, "The loop", with sources and every difference from SGS):
  1. conjectures: `conjectures_per_seed` for each statement the conditioning schedule picks
     (default "seeds": every target with a verified proof; domains/lean/schedule.py);
  2. k proof attempts for every target (solved ones included, as SGS samples all statements each
     iteration) and every valid conjecture -> Lean check -> solve rates;
  3. coverage update, and the seed pool keeps each target's newest verified proof (`commit`);
  4. conjecture reward (default compassplay_cos_novelty) = cos(g(conjecture's first verified
     proof), g_ref) x (1 - token-Jaccard(conjecture, seed)), with g_ref the gradient of the seed's
     verified proof (the one the conjecture was conditioned on) at the current params; computed for
     every eligible conjecture (valid, 0 < s < 1, seed has a proof);
  5. proposer advantages over SGS's band (0 < s <= p70 of eligible rates): floored-baseline
     whitening, and every copy of its seed (novelty 0, whatever its solve rate) trained down at
     advantage <= -1; or SGS's min-max REINFORCE; SGS's DAPO length penalty on overlong trained ones;
     solver: REINFORCE-1/2 on verified proofs of problems with 0 < s <= 0.5, weight 0 for `try`,
     DAPO length penalty for overlong kept proofs (rl/advantages.sgs_solver_weights);
  6. the run loop trains on the rows in `train_batches` (one epoch at lean.train_batch_size rows
     per optimizer step, SGS's one epoch at batch 32).
Stages 1 (propose), 2 (verify), 5 (rows) and 3 (commit, after the rows) are this file's; stage 4's
gate, cosines and rewards are selfplay/step.py's shared reward stage (`score`); step.run_step runs them
in order: plan, propose, verify, score, rows, commit, advantages (the rows' own), update.
One model plays both roles (as in AZR); SGS trains two copies.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np

from compassplay_jax import config_base, distributed
from compassplay_jax.distributed import shared_map
from compassplay_jax.domains.lean import extraction
from compassplay_jax.domains.lean.coverage import Coverage
from compassplay_jax.domains.lean.dedup import sgs_duplicates
from compassplay_jax.domains.lean.prompts import conjecturer_prompt, prover_prompt
from compassplay_jax.domains.lean.schedule import CONDITIONING, conjecture_seeds
from compassplay_jax.domains.lean.seed_pool import SeedPool
from compassplay_jax.domains.lean.targets import load_targets
from compassplay_jax.metrics import histogram
from compassplay_jax.rewards import novelty
from compassplay_jax.errors import InputFormatError, InputNotFound
from compassplay_jax.models.config import ConfigError
from compassplay_jax.rewards.proposer_rewards import REWARD_FNS
from compassplay_jax.rl.advantages import (conjecture_band, floored_baseline_advantages, length_penalized, reinforce,
                                           sgs_solver_weights)
from compassplay_jax.selfplay import rollout
from compassplay_jax.selfplay import step as step_lib
from compassplay_jax.selfplay.overlap import BackgroundChecks
from compassplay_jax.domains.coding.reference_set import resolve_path
from compassplay_jax.sampling.rollout_engine import Request
from compassplay_jax.selfplay.rollout import Row, reward_config, sampling_config, truncate_prompt
from compassplay_jax.selfplay.sequences import pack
from compassplay_jax.verifiers.lean_acceptance import check_proofs, validate_conjecture
from compassplay_jax.verifiers.lean_checker import check_checker_config, make_checker

PROPOSER_ADVANTAGES = ("floored_baseline", "sgs_minmax")
# The rewards with the novelty factor (1 - J): a conjecture with J = 1 to its seed (every verbatim
# copy) scores exactly 0 under them, and "floored_baseline" trains it down (docs/lean.md §9).
NOVELTY_REWARDS = ("compassplay_cos_novelty", "novelty_only")


@dataclasses.dataclass(frozen=True)
class ConjectureOutcome:
  """What happened to one conjecture generation (filled in stage by stage; its record() is logged)."""
  seed: str                     # the target it was conditioned on
  statement: str | None = None  # the validated statement (renamed theorem), None if invalid
  formatted: bool = False
  valid: bool = False
  solve_rate: float = 0.0
  jaccard: float = 1.0          # token-Jaccard to the seed statement
  cosine: float | None = None   # None when not computed (ineligible, or no reference)
  reward: float = 0.0
  in_band: bool = False
  advantage: float = 0.0
  copy: bool = False            # J > 0.8
  rename: bool = False          # canonically equal to the seed, not identical
  duplicate: bool = False       # dropped before proving by SGS's deduplication (lean.dedup_conjectures)

  @property
  def proved(self) -> bool:
    """Attempted by the prover: a valid statement that deduplication kept."""
    return self.valid and not self.duplicate

  def record(self) -> dict[str, Any]:
    """The metrics line's candidate record (the coding records' fields, plus Lean's)."""
    return {"type": "conjecture", "seed": self.seed, "solve_rate": self.solve_rate, "cosine": self.cosine,
            "reward": self.reward, "valid": self.valid, "in_band": self.in_band, "jaccard": float(self.jaccard),
            "advantage": self.advantage, "copy": self.copy, "rename": self.rename, "duplicate": self.duplicate,
            "paid_by": "cosine" if self.cosine is not None and self.in_band else "gate"}


def _targets(config):
  path = config.lean.targets_path
  if not path:
    raise ConfigError("config.lean.targets_path: empty; set it to a miniF2F / Lean Workbook jsonl or a json list")
  resolved = resolve_path(path)
  if not resolved.is_file():
    raise InputNotFound(f"{path}: target file not found (config.lean.targets_path)")
  targets = load_targets(resolved)
  if not targets:
    raise InputFormatError(f"{path}: no statements")
  limit = config.lean.targets_limit
  return targets[:limit] if limit else targets


def validate_config(config) -> None:
  """Reward name, schedule, target file and the Lean command, before any model is loaded."""
  l = config.lean
  if config.reward.name not in REWARD_FNS:
    raise ConfigError(f"config.reward.name: {config.reward.name!r} is not one of {sorted(REWARD_FNS)}")
  if config.reward.name == "soar_utility":
    raise ConfigError("config.reward.name=soar_utility is not supported by the lean setting: SOAR needs a held-out "
                      "set with gold solutions and verified task rows per group, which only the coding loop builds")
  if l.conditioning not in CONDITIONING:
    raise ConfigError(f"config.lean.conditioning: {l.conditioning!r} is not one of {CONDITIONING}")
  if l.proposer_advantage not in PROPOSER_ADVANTAGES:
    raise ConfigError(f"config.lean.proposer_advantage: {l.proposer_advantage!r} is not one of {PROPOSER_ADVANTAGES}")
  for name in ("conjectures_per_seed", "proofs_per_problem", "epochs_per_iteration"):
    if l[name] < 1:
      raise ConfigError(f"config.lean.{name}: must be >= 1, got {l[name]}")
  cap, prompt_cap = l.max_total_tokens, config.sampling.max_prompt_tokens
  if cap < 0 or (cap and cap <= prompt_cap):
    raise ConfigError(f"config.lean.max_total_tokens: {cap} leaves no token to generate after a prompt of "
                      f"sampling.max_prompt_tokens={prompt_cap}; set it above that, or 0 for no cap")
  _targets(config)
  check_checker_config(config.lean)


# A proof whose check failed on the checker's side (a system error: a crashed REPL, a server with no REPL
# free) is checked again, up to this many times, instead of counting as a failed proof (docs/lean.md §2).
SYSTEM_ERROR_REQUEUES = 3


def check_requeued(pool, header: str, statement: str, bodies: list, requeues: int = SYSTEM_ERROR_REQUEUES):
  """check_proofs, with the bodies whose check was a system error re-queued up to `requeues` times:
  (verdicts, system errors seen). A body still failing after that stays a rejected system error."""
  verdicts, seen = check_proofs(pool, header, statement, bodies), 0
  for attempt in range(requeues + 1):
    again = [j for j, v in enumerate(verdicts) if v.system_error]
    seen += len(again)
    if not again or attempt == requeues:
      break
    for j, v in zip(again, check_proofs(pool, header, statement, [bodies[j] for j in again])):
      verdicts[j] = v
  return verdicts, seen


def generation_budget(prompt_tokens: int, max_new_tokens: int, max_total_tokens: int) -> int:
  """One request's new-token budget under a prompt-plus-generation cap (0 = none): SGS's vLLM stops a
  sequence when prompt + generation reaches max_model_len = 8192 (sgs/models/query_local.py:399-408, vLLM
  0.10.1's check_stop: num_tokens >= max_model_len), with max_tokens = 8192 on the generation alone."""
  if not max_total_tokens:
    return max_new_tokens
  return min(max_new_tokens, max_total_tokens - prompt_tokens)


def sample_capped(engine, params, tokenizer, prompts, config, key, *, n_samples: int = 1, max_total_tokens: int = 0,
                  on_finish=None):
  """rollout.sample, each prompt with its own budget generation_budget(its tokens, max_new_tokens,
  max_total_tokens): the prompt (capped at sampling.max_prompt_tokens like rollout.sample caps it) plus its
  generation stays within max_total_tokens. validate_config keeps max_total_tokens above
  max_prompt_tokens, so every prompt gets a budget of at least one token; none is skipped."""
  if not max_total_tokens:
    return rollout.sample(engine, params, tokenizer, prompts, config, key, n_samples=n_samples, on_finish=on_finish)
  shares = distributed.Shares.of(len(prompts))  # as rollout.sample: each host samples its share
  ids = [truncate_prompt(tokenizer, p, config.sampling.max_prompt_tokens) for p in shares.take(list(prompts))]
  max_new = config.sampling.max_new_tokens
  requests = [Request(p, max_new_tokens=generation_budget(len(p), max_new, max_total_tokens)) for p in ids]
  cfg = sampling_config(config, n_samples=n_samples)
  return engine.generate_shared(params, tokenizer, config.sampling, requests, cfg, key, shares, on_finish=on_finish)


def cap_counts(gen, max_new_tokens: int, max_total_tokens: int) -> tuple[int, int]:
  """(rows whose budget the cap set below max_new_tokens, rows the cap ended: finish reason "length" at
  that lower budget), from a GenerationResult's prompt lengths."""
  if gen is None or not max_total_tokens:
    return 0, 0
  capped = cut = 0
  for r, reason in enumerate(gen.finish_reasons):
    budget = generation_budget(len(gen.prompt_tokens[r]), max_new_tokens, max_total_tokens)
    if budget < max_new_tokens:
      capped += 1
      cut += int(reason == "length" and int(gen.lengths[r]) >= budget)
  return capped, cut


class LeanSelfPlay:
  """Targets, the Lean pool, coverage and the seed pool (verified proofs = local references).

  `sampler` (default rollout.sample, on the engine each stage is given) generates completions; tests
  pass a scripted one.
  """

  PHASES = ("generate", "lean", "reward")

  def __init__(self, config, tokenizer, sampler=None):
    validate_config(config)
    self.config, self.tokenizer = config, tokenizer
    self._sampler = sampler or sample_capped
    self.targets = _targets(config)
    self.by_name = {t.name: t for t in self.targets}
    l = config.lean
    self.pool = make_checker(l)  # config.lean.checker: local REPL pool or kimina-lean-server
    if self.targets:  # a REPL that cannot start would fail every proof silently: one line at start-up instead
      try:
        self.pool.warm_up(self.targets[0].header)
      except BaseException:
        self.pool.close()
        raise
    names = [t.name for t in self.targets]
    self.coverage = Coverage(names)
    self.seeds = SeedPool(names)
    self.generations = 0
    self.supplied_checked = False
    self._reference_tokens: dict[str, int] = {}  # the step's reference sequences' lengths (rows() reports truncation)
    self._system_errors: list[int] = []  # per problem checked this step: system errors (appended by checking threads)

  def close(self):
    self.pool.close()

  def state_dict(self) -> dict[str, Any]:
    return {"coverage": self.coverage.to_json(), "seeds": self.seeds.to_json(), "generations": self.generations,
            "supplied_checked": self.supplied_checked}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self.coverage = Coverage.from_json(state["coverage"])
    if "seeds" in state:
      self.seeds = SeedPool.from_json(state["seeds"])
    else:  # a checkpoint from before the seed pool: its latest proofs, dated by their first solve
      self.seeds = SeedPool(self.coverage.target_names)
      for name, completion in state["proofs"].items():
        self.seeds.add(name, completion, self.coverage.history.get(name, 0))
    self.generations = int(state["generations"])
    self.supplied_checked = bool(state.get("supplied_checked", True))

  def _chat(self, text: str) -> str:
    return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True)

  def _prover_prefill(self, header: str, statement: str) -> str:
    """With lean.prefill_proof, the assistant turn starts with the code block and the fixed statement,
    so the model writes only the proof body (DeepSeek-Prover-V1.5's completion style)."""
    return f"```lean4\n{header}{statement.rstrip()}" if self.config.lean.prefill_proof else ""

  def prover_text(self, header: str, statement: str) -> str:
    """The full prover prompt text (chat-wrapped, plus any prefill) of a statement."""
    return self._chat(prover_prompt(statement, header)) + self._prover_prefill(header, statement)

  def _sample(self, engine, params, prompts, key, **kwargs):
    """The sampler on the loop's prompts; with lean.max_total_tokens, each prompt's budget leaves prompt
    plus generation within it (sample_capped; a sampler given to the constructor gets the cap too)."""
    if self.config.lean.max_total_tokens:
      kwargs["max_total_tokens"] = self.config.lean.max_total_tokens
    return self._sampler(engine, params, self.tokenizer, prompts, self.config, key, **kwargs)

  def _prove(self, engine, params, problems, key, times):
    """k attempts per (header, statement) -> (generation, per-problem verdict lists, bodies); each
    problem's attempts are checked in Lean as soon as they are in, while the others decode."""
    k = self.config.lean.proofs_per_problem
    prefills = [self._prover_prefill(h, s) for h, s in problems]
    prompts = [self._chat(prover_prompt(s, h)) + pre for (h, s), pre in zip(problems, prefills)]

    def check(problem, texts):  # one problem's k attempts, checked while other problems still decode
      prefill, header, statement = problem
      found = [extraction.extract_proof_body(prefill + t, strict=self.config.lean.strict_extraction) for t in texts]
      checkable = [b for b in found if b is not None]
      verdicts, system_errors = check_requeued(self.pool, header, statement, checkable) if checkable else ([], 0)
      self._system_errors.append(system_errors)
      results = iter(verdicts)
      return [bool(b is not None and next(results).ok) for b in found], [b or "" for b in found]

    shares = distributed.Shares.of(len(problems))  # across processes: a host checks the proofs it sampled
    items = [(pre, header, statement) for pre, (header, statement) in zip(prefills, problems)]
    with BackgroundChecks(check, items, k, workers=self.pool.num_workers) as checks:
      with times("generate", "generate: proofs"):
        gen = self._sample(engine, params, prompts, key, n_samples=k,
                           on_finish=lambda row, tokens, text, reason: checks.on_row(row, text))
      mine = list(shares.mine)
      local = checks.finish({r: gen.texts[r] for i in mine for r in range(i * k, (i + 1) * k)}, mine)
    times.add("lean", checks.busy_s)
    checked = distributed.gather_shares(local, shares)
    return gen, [v for v, _ in checked], [b for _, bodies in checked for b in bodies]

  def _check_supplied_proofs(self) -> int:
    """Once per run: proofs supplied with the target file join the pool if Lean accepts them."""
    if self.supplied_checked:
      return 0
    self.supplied_checked = True
    supplied = [t for t in self.targets if t.proof and t.name not in self.seeds]
    accepted = shared_map(lambda part: [check_proofs(self.pool, t.header, t.statement, [t.proof])[0].ok for t in part],
                          supplied)
    for t, ok in zip(supplied, accepted):
      if ok:
        completion = extraction.prover_completion(t.proof, t.header, t.statement, self.config.lean.prefill_proof)
        self.seeds.add(t.name, completion, 0, source="supplied")
    return sum(accepted)

  # ---- the stages of an iteration (selfplay/step.run_step runs them in this order) -----------------

  def plan(self, step: int) -> "LeanPlan":
    """Supplied proofs checked once per run; the targets attempted and the seeds conditioned on."""
    l = self.config.lean
    rng = random.Random(f"{self.config.seed}:{step}")
    supplied = self._check_supplied_proofs()
    targets = (self.targets if not l.targets_per_iteration else
               [self.targets[i] for i in sorted(rng.sample(range(len(self.targets)),
                                                           min(l.targets_per_iteration, len(self.targets))))])
    seed_names = conjecture_seeds(l.conditioning, self.seeds.names, self.coverage.unsolved, l.seeds_per_iteration, rng)
    return LeanPlan(step, targets, seed_names, {n: self.seeds.get(n) for n in seed_names}, supplied)

  def propose(self, engine, params, plan: "LeanPlan", key, times) -> "LeanProposals":
    """1. conjectures, conjectures_per_seed per scheduled seed, extracted and checked as statements."""
    m = self.config.lean.conjectures_per_seed
    with times("generate", "generate: conjectures"):
      gen = (self._sample(engine, params, [self._chat(conjecturer_prompt(self.by_name[n])) for n in plan.seed_names],
                          key, n_samples=m) if plan.seed_names else None)
    outcomes, keys = [], []
    for r, text in enumerate(gen.texts if gen else []):
      extracted = extraction.extract_conjecture(text)
      ok, _, statement = validate_conjecture(extracted) if extracted else (False, "", None)
      keys.append(extracted if ok else None)
      outcomes.append(ConjectureOutcome(
          seed=plan.seed_names[r // m], formatted=extracted is not None, valid=ok,
          statement=extraction.rename_theorem(statement, f"compassplay_conjecture_{plan.step}_{r}") if ok else None))
    if self.config.lean.dedup_conjectures:
      # SGS (step1_data_gen.py:443-452): a conjecture whose extracted string equals one of the iteration's
      # target statements or an earlier conjecture is dropped before proving (domains/lean/dedup.py).
      outcomes = [dataclasses.replace(o, duplicate=d)
                  for o, d in zip(outcomes, sgs_duplicates(keys, [t.statement for t in plan.targets]))]
    return LeanProposals(gen, outcomes)

  def verify(self, engine, params, plan: "LeanPlan", proposals: "LeanProposals", key, times) -> step_lib.Verified:
    """2. k proofs for every scheduled target and valid conjecture -> solve rates. One Candidate per
    conjecture (its first verified proof stands for g(x̃)); the record keeps every attempt."""
    k, targets, outcomes = self.config.lean.proofs_per_problem, plan.targets, proposals.outcomes
    valid_rows = [r for r, o in enumerate(outcomes) if o.proved]
    problems = ([(t.header, t.statement) for t in targets]
                + [(self.by_name[outcomes[r].seed].header, outcomes[r].statement) for r in valid_rows])
    self._system_errors.clear()
    prove_gen, verdicts, bodies = self._prove(engine, params, problems, key, times) if problems else (None, [], [])
    rates = np.asarray([np.mean(v) for v in verdicts], np.float32)
    solved = {target.name: prove_gen.texts[i * k + verdicts[i].index(True)]
              for i, target in enumerate(targets) if any(verdicts[i])}
    problem_of = {r: len(targets) + c for c, r in enumerate(valid_rows)}
    candidates, checked = [], []
    for r, o in enumerate(outcomes):
      solve_rate, solution, jaccard, copy, rename = 0.0, None, 1.0, False, False
      if o.proved:
        seed_statement = self.by_name[o.seed].statement
        p = problem_of[r]
        solve_rate = float(rates[p])
        jaccard = novelty.token_jaccard(o.statement, seed_statement, language="lean")
        copy = jaccard > novelty.COPY_THRESHOLD
        rename = novelty.is_rename(o.statement, seed_statement, "lean")
        if any(verdicts[p]):
          j = p * k + verdicts[p].index(True)
          solution = (prove_gen.prompt_tokens[j], prove_gen.tokens[j])
      checked.append(dataclasses.replace(o, solve_rate=solve_rate, jaccard=jaccard, copy=copy, rename=rename))
      candidates.append(step_lib.Candidate(
          group="conjecture", formatted=o.formatted, valid=o.proved, solve_rate=solve_rate, solution=solution,
          reference=o.seed if plan.references[o.seed] is not None else None, jaccard=jaccard))
    record = LeanChecks(prove_gen, verdicts, bodies, rates, len(problems), solved, checked,
                        generations=len(outcomes) + len(problems) * k, system_errors=sum(self._system_errors))
    return step_lib.Verified(candidates, record, tokens=int(np.sum(prove_gen.lengths)) if prove_gen else 0)

  def fixed_references(self, plan: "LeanPlan") -> dict:
    """None: a local reference is a seed's proof, known once the step has verified it."""
    return {}

  def references(self, plan: "LeanPlan", verified: step_lib.Verified) -> dict:
    """Local references: each seed's verified proof (the one its conjectures were conditioned on), as
    the prover saw it: its prompt capped at sampling.max_prompt_tokens like the sampler caps it."""
    cfg, tok = self.config, self.tokenizer
    needed = {c.reference for c in verified.candidates if c.reference is not None and c.valid}
    packed, self._reference_tokens = {}, {}
    for name in plan.seed_names:
      if name in needed:
        target = self.by_name[name]
        prompt = truncate_prompt(tok, self.prover_text(target.header, target.statement), cfg.sampling.max_prompt_tokens)
        proof = tok.encode(plan.references[name].completion, add_special_tokens=False) + [tok.eos_token_id]
        self._reference_tokens[name] = len(prompt) + len(proof)
        packed[name] = pack([prompt], [proof], tok.pad_token_id, max_len=config_base.reward_sequence_len(cfg))
    return packed

  def scoring(self) -> step_lib.ScoreOptions:
    cfg = self.config
    return step_lib.ScoreOptions(reward_name=cfg.reward.name, reward_cfg=reward_config(cfg.reward),
                                 pad_id=self.tokenizer.pad_token_id, max_len=config_base.reward_sequence_len(cfg))

  def rows(self, engine, params, plan: "LeanPlan", proposals: "LeanProposals", verified: step_lib.Verified,
           scores: step_lib.Scores, key, times):
    """5. conjecturer rows (SGS band, floored-baseline with copies trained down, or min-max advantages;
    SGS's length penalty) and solver rows (REINFORCE-1/2 with SGS's `try` and length rules); rows with
    advantage 0 are dropped."""
    cfg, l, checks = self.config, self.config.lean, verified.record
    k, n_t = l.proofs_per_problem, len(plan.targets)
    conj_gen, prove_gen, rates = proposals.gen, checks.prove_gen, checks.rates
    eligible, raw = scores.eligible, scores.reward
    band = np.zeros_like(eligible)
    if eligible.any():
      band[eligible] = conjecture_band(np.asarray([o.solve_rate for o in checks.outcomes])[eligible])
    # Copies: conjectures whose novelty factor is 0 (J = 1 to the seed), under a reward that has it.
    copies = np.asarray([o.proved and o.jaccard >= 1.0 for o in checks.outcomes], bool)
    if cfg.reward.name not in NOVELTY_REWARDS:
      copies[:] = False
    if l.proposer_advantage == "floored_baseline":
      conj_adv = floored_baseline_advantages(raw, selected=band, copies=copies)
    else:
      conj_adv = reinforce(raw, selected=band)
      copies[:] = False
    n_conj_long = 0
    if l.conjecture_length_penalty and conj_gen is not None:  # SGS step2_train.py:304-310
      penalized = length_penalized(conj_adv, band | copies, conj_gen.lengths, cfg.sampling.max_new_tokens)
      n_conj_long = int(np.sum(penalized != conj_adv))
      conj_adv = penalized
    rows: list[Row] = []
    outcomes = [dataclasses.replace(o, cosine=scores.cosine[r], reward=float(raw[r]), in_band=bool(band[r]),
                                    advantage=float(conj_adv[r])) for r, o in enumerate(checks.outcomes)]
    for r, o in enumerate(outcomes):
      rows.append(Row(conj_gen.prompt_tokens[r], conj_gen.tokens[r], conj_gen.logprobs[r], o.reward,
                      "conjecture", "proposer", advantage=o.advantage))

    correct = np.asarray([ok for v in checks.verdicts for ok in v], np.float32)
    weights = np.zeros((0,), np.float32)
    n_try = n_long = 0
    if len(correct):
      zero = np.asarray([l.zero_weight_try and extraction.uses_try(b) for b in checks.bodies], np.float32)
      lengths = np.asarray(prove_gen.lengths) if l.overlong_penalty else None
      weights = sgs_solver_weights(correct, np.repeat(np.arange(checks.n_problems), k),
                                   max_solve_rate=l.solver_band_max, zero_weight=zero, lengths=lengths,
                                   max_tokens=cfg.sampling.max_new_tokens)
      n_try = int(np.sum(zero * correct))
      n_long = int(np.sum(weights < 0))
      for j in np.flatnonzero(weights):
        rows.append(Row(prove_gen.prompt_tokens[j], prove_gen.tokens[j], prove_gen.logprobs[j], 1.0,
                        "target" if j // k < n_t else "conjecture", "solver", advantage=float(weights[j])))
    rows = [r for r in rows if r.advantage != 0.0]  # no gradient; SGS never puts them in the batch

    trained = [o for o in outcomes if o.in_band]
    capped = cut = 0
    for gen in (conj_gen, prove_gen):
      c, x = cap_counts(gen, cfg.sampling.max_new_tokens, l.max_total_tokens)
      capped, cut = capped + c, cut + x
    cosines = [o.cosine for o in outcomes if o.cosine is not None]
    # Reward sequences (g(x̃) of each conjecture paid by a cosine, and the g_ref they were compared
    # with) longer than the reward length lose their completion's end: counted, so it is never silent.
    reward_max = config_base.reward_sequence_len(cfg)
    paid = [c for c, cos in zip(verified.candidates, scores.cosine) if cos is not None and c.solution is not None]
    lengths = ([len(c.solution[0]) + len(c.solution[1]) for c in paid]
               + [self._reference_tokens[n] for n in {c.reference for c in paid} if n in self._reference_tokens])
    metrics = {
        "lean/seeds_supplied": plan.supplied, "lean/targets_attempted": n_t,
        "lean/conjectures": len(outcomes), "lean/conjectures_eligible": int(eligible.sum()),
        "lean/cosines_computed": len(cosines),
        "valid_rate": float(np.mean([o.valid for o in outcomes])) if outcomes else 0.0,
        "format_rate": float(np.mean([o.formatted for o in outcomes])) if outcomes else 0.0,
        "in_band_rate": float(np.mean(band)) if outcomes else 0.0,
        "reward/proposer": float(np.mean(raw)) if outcomes else 0.0,
        "reward/solver": float(np.mean(rates[:n_t])) if n_t else 0.0,
        "cos_valid_mean": float(np.mean(cosines)) if cosines else 0.0,
        "lean/conjecture_solve_rate": float(np.mean(rates[n_t:])) if len(rates) > n_t else 0.0,
        # The paper's rates: over the in-band (training) conjectures of this iteration.
        "copy_rate": float(np.mean([o.copy for o in trained])) if trained else 0.0,
        "rename_rate": float(np.mean([o.rename for o in trained])) if trained else 0.0,
        "lean/system_errors": checks.system_errors,  # checks the checker failed (re-queued), this host
        "lean/solver_rows": int(np.count_nonzero(weights)), "lean/proofs_try_zeroed": n_try,
        "lean/proofs_length_penalized": n_long, "lean/conjectures_length_penalized": n_conj_long,
        "lean/copies_trained_down": int(np.sum(copies)),
        # SGS's filters (lean.dedup_conjectures, lean.max_total_tokens): conjectures dropped before proving as
        # duplicates; sampled rows (conjectures and proofs) whose budget the prompt-plus-generation cap
        # lowered, and those it ended.
        "lean/conjectures_deduplicated": int(sum(o.duplicate for o in outcomes)),
        "lean/generations_capped": capped, "lean/generations_cut_by_cap": cut,
        "lean/reward_sequences": len(lengths), "lean/reward_truncated": int(sum(n > reward_max for n in lengths)),
        "solve_rate_histogram": histogram(rates.tolist()),
        "tokens/generated": int(sum(np.sum(g.lengths) for g in (conj_gen, prove_gen) if g is not None)),
        "candidates": [o.record() for o in outcomes],
    }
    return rows, metrics

  def commit(self, plan: "LeanPlan", proposals, verified: step_lib.Verified, scores) -> dict[str, Any]:
    """3. The seed pool keeps each solved target's newest verified proof; coverage records the solves."""
    checks = verified.record
    for name, completion in checks.solved.items():
      self.seeds.add(name, completion, plan.step)
    self.generations += checks.generations
    newly = self.coverage.record(plan.step, list(checks.solved), generations=self.generations)
    return {"coverage": self.coverage.fraction, "coverage/solved": len(self.coverage.solved),
            "coverage/newly_solved": len(newly), "lean/first_solved": {n: plan.step for n in newly},
            "lean/seeds": len(self.seeds), "generations": self.generations}

  def train_batches(self, rows: list[Row], step: int) -> list[list[Row]]:
    """The iteration's optimizer steps: `epochs_per_iteration` shuffled passes over the rows,
    `train_batch_size` rows per step (0: all rows in one step). SGS: one epoch at batch 32."""
    l = self.config.lean
    size = l.train_batch_size or len(rows)
    rng = random.Random(f"{self.config.seed}:{step}:train")
    batches = []
    for _ in range(l.epochs_per_iteration):
      order = list(range(len(rows)))
      rng.shuffle(order)
      batches += [[rows[i] for i in order[s:s + size]] for s in range(0, len(rows), size)]
    return batches


@dataclasses.dataclass
class LeanPlan:
  """The iteration's choices (selfplay/step.py's `plan` stage)."""
  step: int
  targets: list                # targets attempted this iteration
  seed_names: list[str]        # statements conjectures are conditioned on
  references: dict[str, Any]   # seed -> its verified proof (the local reference), None if none
  supplied: int                # supplied proofs that joined the seed pool this iteration


@dataclasses.dataclass(frozen=True)
class LeanProposals:
  """The conjectures (`propose`)."""
  gen: Any                                  # the conjecture GenerationResult (None when no seeds)
  outcomes: list                            # ConjectureOutcome per conjecture (statement, format, validity)


@dataclasses.dataclass(frozen=True)
class LeanChecks:
  """The verify stage's record (step.Verified.record): every proof attempt of the iteration."""
  prove_gen: Any                            # the proof GenerationResult (None when nothing was attempted)
  verdicts: list                            # per problem (targets, then valid conjectures), per attempt: verified
  bodies: list                              # per attempt: the proof body
  rates: np.ndarray                         # per problem: solve rate
  n_problems: int
  solved: dict                              # target name -> its first verified proof this iteration
  outcomes: list                            # ConjectureOutcome per conjecture, solve rate and novelty filled in
  generations: int = 0                      # sequences generated this iteration (coverage's x axis)
  system_errors: int = 0                    # proof checks that failed on the checker's side (each re-queued)
