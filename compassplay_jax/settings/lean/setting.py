"""One iteration of Lean conjecture-and-prove self-play with CompassPlay's proposer reward.

The schedule (docs/lean.md, "The loop", with sources and every difference from SGS):
  1. conjectures: `conjectures_per_seed` for each statement the conditioning schedule picks
     (default "seeds": every target with a verified proof; domains/lean/schedule.py);
  2. k proof attempts for every target (solved ones included, as SGS samples all statements each
     iteration) and every valid conjecture -> Lean check -> solve rates;
  3. coverage update, and the seed pool keeps each target's newest verified proof (`commit`; supplied
     proofs the plan accepted join it there too);
  4. conjecture reward (default compassplay_cos_novelty) = cos(g(conjecture's first verified
     proof), g_ref) x (1 - token-Jaccard(conjecture, seed)), with g_ref the gradient of the seed's
     verified proof (the one the conjecture was conditioned on) at the current params; computed for
     every eligible conjecture (valid, 0 < s < 1, seed has a proof);
  5. proposer advantages over SGS's band (its own rule, rl.advantages.conjecture_band: 0 < s <= p70 of
     the eligible rates; recorded as `sgs_band`, beside the shared in-band rule): floored-baseline
     whitening, and every copy of its seed (novelty 0, whatever its solve rate) trained down at
     advantage <= -1; or SGS's min-max REINFORCE; SGS's DAPO length penalty on overlong trained ones;
     solver: REINFORCE-1/2 on verified proofs of problems with 0 < s <= 0.5, weight 0 for `try`,
     DAPO length penalty for overlong kept proofs (rl/advantages.sgs_solver_weights);
  6. the run loop trains on the rows in `train_batches` (one epoch at lean.train_batch_size rows
     per optimizer step, SGS's one epoch at batch 32).
Stages 1 (propose), 2 (verify), 5 (rows; metrics.py) and 3 (commit, after the rows) are this file's; stage 4's
gate, cosines and rewards are selfplay/step.py's shared reward stage (`score`); step.run_step runs them
in order: plan, propose, verify, score, rows, commit, advantages (the rows' own), update.
One model plays both roles (as in AZR); SGS trains two copies.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np

from compassplay_jax.runtime import config_base
from compassplay_jax.infra import distributed
from compassplay_jax.infra.distributed import shared_map
from compassplay_jax.domains.lean import extraction
from compassplay_jax.domains.lean.coverage import Coverage
from compassplay_jax.domains.lean.dedup import sgs_duplicates
from compassplay_jax.domains.lean.prompts import conjecturer_prompt, prover_prompt
from compassplay_jax.domains.lean.schedule import conjecture_seeds
from compassplay_jax.domains.lean.seed_pool import SeedPool
from compassplay_jax.rewards import novelty
from compassplay_jax.rewards.proposer_rewards import uses_novelty
from compassplay_jax.rl.advantages import (conjecture_band, floored_baseline_advantages, length_penalized, reinforce,
                                           sgs_solver_weights)
from compassplay_jax.selfplay import records as records_lib
from compassplay_jax.selfplay import step as step_lib
from compassplay_jax.selfplay.overlap import BackgroundChecks
from compassplay_jax.selfplay.rollout import Row, reward_config, truncate_prompt
from compassplay_jax.selfplay.sequences import pack
from compassplay_jax.settings.lean import metrics as lean_metrics
from compassplay_jax.settings.lean.budget import sample_capped
from compassplay_jax.settings.lean.config import targets as load_run_targets, validate
from compassplay_jax.verifiers.lean_acceptance import check_proofs, validate_conjecture
from compassplay_jax.verifiers.lean_checker import make_checker


@dataclasses.dataclass(frozen=True)
class ConjectureOutcome:
  """What happened to one conjecture generation (filled in stage by stage; its record() is logged)."""
  seed: str                     # the target it was conditioned on
  statement: str | None = None  # the validated statement (renamed theorem), None if invalid
  formatted: bool = False
  valid: bool = False
  solve_rate: float = 0.0
  jaccard: float = 1.0          # token-Jaccard to the seed statement
  sgs_band: bool = False        # in SGS's band (rl.advantages.conjecture_band): trained by its advantage
  advantage: float = 0.0
  copy: bool = False            # J > 0.8
  rename: bool = False          # canonically equal to the seed, not identical
  duplicate: bool = False       # dropped before proving by SGS's deduplication (lean.dedup_conjectures)

  @property
  def proved(self) -> bool:
    """Attempted by the prover: a valid statement that deduplication kept."""
    return self.valid and not self.duplicate

  def record_fields(self) -> dict[str, Any]:
    """Lean's own fields of the conjecture's candidate record (selfplay/records.py)."""
    return {"seed": self.seed, "advantage": self.advantage, "sgs_band": self.sgs_band, "copy": self.copy,
            "rename": self.rename, "duplicate": self.duplicate}


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


class LeanSelfPlay:
  """Targets, the Lean pool, coverage and the seed pool (verified proofs = local references).

  `sampler` (default rollout.sample, on the engine each stage is given) generates completions; tests
  pass a scripted one.
  """

  PHASES = ("generate", "lean", "reward")

  def __init__(self, config, tokenizer, sampler=None):
    validate(config)
    self.config, self.tokenizer = config, tokenizer
    self._sampler = sampler or sample_capped
    self.targets = load_run_targets(config)
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
    """k attempts per (header, statement) -> (generation, per-problem verdict lists, bodies, system errors
    this host saw); each problem's attempts are checked in Lean as soon as they are in, while the others
    decode."""
    k = self.config.lean.proofs_per_problem
    system_errors = []  # per problem this host checked (appended by the checking threads)
    prefills = [self._prover_prefill(h, s) for h, s in problems]
    prompts = [self._chat(prover_prompt(s, h)) + pre for (h, s), pre in zip(problems, prefills)]

    def check(problem, texts):  # one problem's k attempts, checked while other problems still decode
      prefill, header, statement = problem
      found = [extraction.extract_proof_body(prefill + t, strict=self.config.lean.strict_extraction) for t in texts]
      checkable = [b for b in found if b is not None]
      verdicts, errors = check_requeued(self.pool, header, statement, checkable) if checkable else ([], 0)
      system_errors.append(errors)
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
    return gen, [v for v, _ in checked], [b for _, bodies in checked for b in bodies], sum(system_errors)

  def _supplied_proofs(self) -> dict[str, str]:
    """Once per run (until a commit): {target: completion} of the proofs supplied with the target file that
    Lean accepts, for targets not yet in the pool. Checked here; they join the pool in `commit`."""
    if self.supplied_checked:
      return {}
    supplied = [t for t in self.targets if t.proof and t.name not in self.seeds]
    accepted = shared_map(lambda part: [check_proofs(self.pool, t.header, t.statement, [t.proof])[0].ok for t in part],
                          supplied)
    return {t.name: extraction.prover_completion(t.proof, t.header, t.statement, self.config.lean.prefill_proof)
            for t, ok in zip(supplied, accepted) if ok}

  # ---- the stages of an iteration (selfplay/step.run_step runs them in this order) -----------------

  def plan(self, step: int) -> "LeanPlan":
    """Supplied proofs checked once per run; the targets attempted and the seeds conditioned on (the
    pool as it is plus the supplied proofs accepted now, which `commit` adds to it)."""
    l = self.config.lean
    rng = random.Random(f"{self.config.seed}:{step}")
    checks_supplied = not self.supplied_checked
    supplied = self._supplied_proofs()
    pool = self.seeds.copy()
    for name, completion in supplied.items():
      pool.add(name, completion, 0, source="supplied")
    targets = (self.targets if not l.targets_per_iteration else
               [self.targets[i] for i in sorted(rng.sample(range(len(self.targets)),
                                                           min(l.targets_per_iteration, len(self.targets))))])
    seed_names = conjecture_seeds(l.conditioning, pool.names, self.coverage.unsolved, l.seeds_per_iteration, rng)
    return LeanPlan(step, targets, seed_names, {n: pool.get(n) for n in seed_names}, supplied, checks_supplied)

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
    prove_gen, verdicts, bodies, system_errors = (self._prove(engine, params, problems, key, times) if problems
                                                  else (None, [], [], 0))
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
    references, reference_tokens = self._references(plan, candidates)
    record = LeanChecks(prove_gen, verdicts, bodies, rates, len(problems), solved, checked,
                        generations=len(outcomes) + len(problems) * k, system_errors=system_errors,
                        reference_tokens=reference_tokens)
    return step_lib.Verified(candidates, record, tokens=int(np.sum(prove_gen.lengths)) if prove_gen else 0,
                             references=references)

  def _references(self, plan: "LeanPlan", candidates) -> tuple[dict, dict]:
    """Local references: each needed seed's verified proof (the one its conjectures were conditioned on),
    as the prover saw it: its prompt capped at sampling.max_prompt_tokens like the sampler caps it.
    Returns ({seed: packed sequence}, {seed: its tokens before the reward length cut})."""
    cfg, tok = self.config, self.tokenizer
    needed = {c.reference for c in candidates if c.reference is not None and c.valid}
    packed, tokens = {}, {}
    for name in plan.seed_names:
      if name in needed:
        target = self.by_name[name]
        prompt = truncate_prompt(tok, self.prover_text(target.header, target.statement), cfg.sampling.max_prompt_tokens)
        proof = tok.encode(plan.references[name].completion, add_special_tokens=False) + [tok.eos_token_id]
        tokens[name] = len(prompt) + len(proof)
        packed[name] = pack([prompt], [proof], tok.pad_token_id, max_len=config_base.reward_sequence_len(cfg))
    return packed, tokens

  def scoring(self) -> step_lib.ScoreOptions:
    cfg = self.config
    return step_lib.ScoreOptions(reward_name=cfg.reward.name, reward_cfg=reward_config(cfg.reward),
                                 pad_id=self.tokenizer.pad_token_id, max_len=config_base.reward_sequence_len(cfg))

  def rows(self, engine, params, plan: "LeanPlan", proposals: "LeanProposals", verified: step_lib.Verified,
           scores: step_lib.Scores, key, times):
    """5. conjecturer rows (SGS band, floored-baseline with copies trained down, or min-max advantages;
    SGS's length penalty) and solver rows (REINFORCE-1/2 with SGS's `try` and length rules); rows with
    advantage 0 are dropped. metrics["candidates"]: the records with Lean's own fields."""
    checks = verified.record
    outcomes, copies, n_conj_long = self._conjecture_advantages(proposals, checks, scores)
    conj_gen = proposals.gen
    rows = [Row(conj_gen.prompt_tokens[r], conj_gen.tokens[r], conj_gen.logprobs[r], float(scores.reward[r]),
                "conjecture", "proposer", advantage=o.advantage) for r, o in enumerate(outcomes)]
    solver_rows, weights, n_try = self._solver_rows(plan, checks)
    rows = [r for r in rows + solver_rows if r.advantage != 0.0]  # no gradient; SGS never puts them in the batch
    records = [r.with_fields(**o.record_fields())
               for r, o in zip(records_lib.build(verified.candidates, scores, self.scoring()), outcomes)]
    metrics = lean_metrics.iteration_metrics(self.config, plan, proposals, verified, scores, outcomes, weights,
                                             n_try=n_try, n_conj_long=n_conj_long, copies=copies)
    return rows, {**metrics, "candidates": records}

  def _conjecture_advantages(self, proposals: "LeanProposals", checks: "LeanChecks", scores: step_lib.Scores):
    """(outcomes with SGS's band and their advantages, the copies trained down, conjectures the length
    penalty changed). SGS's band is its own rule (rl.advantages.conjecture_band, 0 < s <= p70 over the
    eligible conjectures), not the shared in-band rule of the records."""
    cfg, l = self.config, self.config.lean
    eligible, raw = scores.eligible, scores.reward
    band = np.zeros_like(eligible)
    if eligible.any():
      band[eligible] = conjecture_band(np.asarray([o.solve_rate for o in checks.outcomes])[eligible])
    # Copies: conjectures whose novelty factor is 0 (J = 1 to the seed), under a reward that has it.
    copies = np.asarray([o.proved and o.jaccard >= 1.0 for o in checks.outcomes], bool)
    if not uses_novelty(cfg.reward.name):
      copies[:] = False
    if l.proposer_advantage == "floored_baseline":
      advantages = floored_baseline_advantages(raw, selected=band, copies=copies)
    else:
      advantages = reinforce(raw, selected=band)
      copies[:] = False
    n_long = 0
    if l.conjecture_length_penalty and proposals.gen is not None:  # SGS step2_train.py:304-310
      penalized = length_penalized(advantages, band | copies, proposals.gen.lengths, cfg.sampling.max_new_tokens)
      n_long = int(np.sum(penalized != advantages))
      advantages = penalized
    outcomes = [dataclasses.replace(o, sgs_band=bool(band[r]), advantage=float(advantages[r]))
                for r, o in enumerate(checks.outcomes)]
    return outcomes, copies, n_long

  def _solver_rows(self, plan: "LeanPlan", checks: "LeanChecks"):
    """(REINFORCE-1/2 rows of the verified proofs, every attempt's weight, `try` proofs zeroed): problems
    with 0 < s <= lean.solver_band_max, SGS's `try` and overlong rules (rl/advantages.sgs_solver_weights)."""
    cfg, l = self.config, self.config.lean
    k, n_t, gen = l.proofs_per_problem, len(plan.targets), checks.prove_gen
    correct = np.asarray([ok for v in checks.verdicts for ok in v], np.float32)
    if not len(correct):
      return [], np.zeros((0,), np.float32), 0
    zero = np.asarray([l.zero_weight_try and extraction.uses_try(b) for b in checks.bodies], np.float32)
    weights = sgs_solver_weights(correct, np.repeat(np.arange(checks.n_problems), k),
                                 max_solve_rate=l.solver_band_max, zero_weight=zero,
                                 lengths=np.asarray(gen.lengths) if l.overlong_penalty else None,
                                 max_tokens=cfg.sampling.max_new_tokens)
    rows = [Row(gen.prompt_tokens[j], gen.tokens[j], gen.logprobs[j], 1.0, "target" if j // k < n_t else "conjecture",
                "solver", advantage=float(weights[j])) for j in np.flatnonzero(weights)]
    return rows, weights, int(np.sum(zero * correct))

  def commit(self, plan: "LeanPlan", proposals, verified: step_lib.Verified, scores) -> dict[str, Any]:
    """3. The supplied proofs the plan accepted join the seed pool (once per run), then it keeps each
    solved target's newest verified proof; coverage records the solves."""
    checks = verified.record
    for name, completion in plan.supplied_proofs.items():
      self.seeds.add(name, completion, 0, source="supplied")
    if plan.checks_supplied:
      self.supplied_checked = True
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
class LeanPlan(step_lib.Plan):
  """The iteration's choices (selfplay/step.py's `plan` stage; no fixed references: a local reference is a
  seed's proof, known once the step has verified it)."""
  targets: list                # targets attempted this iteration
  seed_names: list[str]        # statements conjectures are conditioned on
  references: dict[str, Any]   # seed -> its verified proof (the local reference), None if none
  supplied_proofs: dict[str, str]  # supplied proofs Lean accepted now: target -> completion (commit adds them)
  checks_supplied: bool = False    # this plan checked the supplied proofs (commit records that it did)

  @property
  def supplied(self) -> int:
    """Supplied proofs that join the seed pool this iteration."""
    return len(self.supplied_proofs)


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
  reference_tokens: dict = dataclasses.field(default_factory=dict)  # seed -> its reference's tokens before the cut
