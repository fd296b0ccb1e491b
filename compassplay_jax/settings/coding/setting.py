"""One step of coding self-play, AZR's schedule (docs/paper_settings.md §5.1, §10).

For the task types (abduction, deduction, induction), each phase one batch over all of them:
  1. the solver batch is drawn from the buffer first (AZR: solvers train on tasks proposed earlier);
  2. proposer prompts with K references -> generate -> validate in the sandbox;
  3. n solver samples per valid proposal -> solve rates;
  4. proposer rewards (default compassplay_cos: cosine between the solver's loss gradient on the
     candidate and the external reference gradient; difficulty, novelty_only, plain cos selectable);
  5. valid proposals join the buffer;
  6. solver rollouts on the solver batch -> verified in the sandbox -> AZR's solver rewards.
The stages (plan, propose, verify, rows, commit) plug into selfplay/step.py, which runs them in that
order with the shared reward stage (gate, g_ref, cosines, proposer rewards) between verify and rows; the
rows of all (type, role) groups then get TRR++ advantages and make one policy update (step.update).

g(x̃) is taken on the FIRST correct sample (lowest sample index) among the n solve-rate samples of
x̃: the sequence (solver prompt, that completion), loss on the completion tokens.
"""
from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any

import jax
import numpy as np

from compassplay_jax.runtime import config_base
from compassplay_jax.infra import distributed
from compassplay_jax.infra.distributed import shared_map
from compassplay_jax.domains.coding import buffers as buffers_lib
from compassplay_jax.domains.coding import checking, parsing, prompts, tasks, validation, verdict_stats
from compassplay_jax.domains.coding.reference_set import reference_problems
from compassplay_jax.domains.coding.rewards_table import TABLES
from compassplay_jax.rewards import novelty
from compassplay_jax.rewards.proposer_rewards import SOAR_UTILITY, uses_cosine
from compassplay_jax.selfplay import alignment, rollout, sequences, soar_measure
from compassplay_jax.selfplay import step as step_lib
from compassplay_jax.selfplay.overlap import BackgroundChecks
from compassplay_jax.selfplay.rollout import Row, reward_config, split_key, truncate_prompt
from compassplay_jax.settings.coding import compact_prompts, local_reference, metrics as coding_metrics
from compassplay_jax.settings.coding.config import seed_dir_path, task_types, validate

FENCE = "```"
_CHAT_SUFFIX = "\nAssistant: <think>"


def render(tokenizer, unwrapped: str, style: str) -> str:
  """AZR's plain R1 wrapper (ends in "Assistant: <think>"), the same text as a chat user turn, or
  (compact) the bare text as a chat user turn."""
  if style == "compact":
    return tokenizer.apply_chat_template([{"role": "user", "content": unwrapped}], tokenize=False,
                                         add_generation_prompt=True)
  wrapped = prompts.wrap(unwrapped)
  if style == "plain":
    return wrapped
  user = wrapped[:-len(_CHAT_SUFFIX)] if wrapped.endswith(_CHAT_SUFFIX) else wrapped
  return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                       add_generation_prompt=True)


def _task_to_json(task: tasks.CodingTask) -> dict:
  return {k: list(v) if isinstance(v, tuple) else v for k, v in task.__dict__.items()}


def _task_from_json(d: dict) -> tasks.CodingTask:
  return tasks.CodingTask(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


class CodingSelfPlay:
  """Holds the task buffers and the reference set, and supplies the coding stages of a step.

  sampler: rollout.sample's signature (default: rollout.sample, on the engine each stage is given);
  tests pass a scripted one.
  """

  PHASES = ("generate", "sandbox", "reward")

  def __init__(self, config, tokenizer, pool, *, sampler=None):
    validate(config)
    self.config, self.tokenizer, self.pool = config, tokenizer, pool
    self._sampler = sampler
    self.task_types = task_types(config)
    c = config.coding
    if c.seed_dir:
      self.buffers = buffers_lib.load_azr_seed_dir(seed_dir_path(c.seed_dir), cap=c.buffer_cap, limit=c.seed_limit)
    else:
      self.buffers = buffers_lib.seeded_buffers(cap=c.buffer_cap)
    self.style = config.coding.prompt_style
    self.table = TABLES["azr_code"]
    self.reference = None  # the packed reference set a cosine reward compares with (external)
    self._loss_reference = None  # the same set packed for reference_set() when no cosine needs it
    # reward.reference = "local": g_ref per seed program (settings/coding/local_reference.py), no reference set.
    self.local = config.reward.reference == local_reference.LOCAL
    if uses_cosine(config.reward.name) and not self.local:
      self.reference = self._pack(reference_problems(config.reward))
    self.soar_heldout = self.soar_answers = None
    if config.reward.name == SOAR_UTILITY:  # SOAR's held-out set (docs/rewards.md, soar_utility)
      problems = soar_measure.heldout_problems(config.reward)
      if config.reward.soar_signal == "accuracy":  # greedy answers, checked by math-verify in workers
        from compassplay_jax.evals import benchmarks, math_check, prompts as eval_prompts
        self.soar_answers = soar_measure.HeldoutAnswers(
            prompts=tuple(eval_prompts.build_prompt(
                benchmarks.EvalItem("soar_heldout", str(i), "math", question=p.problem, answer=p.answer),
                config.eval.prompt_style, tokenizer) for i, p in enumerate(problems)),
            answers=tuple(p.answer for p in problems), tokenizer=tokenizer,
            checker=math_check.MathChecker(num_workers=config.eval.num_workers or None,
                                           timeout_s=config.eval.math_timeout_s),
            max_new_tokens=config.reward.soar_answer_tokens, batch_size=config.eval.batch_size)
      else:  # gold solutions, loss on them
        self.soar_heldout = self._pack(problems)

  def close(self):
    self.pool.close()
    if self.soar_answers is not None:
      self.soar_answers.checker.close()

  def reference_set(self):
    """The packed reference set (Session.reference_loss): the one cosines compare with, or, for a run
    whose reward uses none (difficulty, ...), the same problems packed the same way, kept apart from
    `reference` so that no cosine is scored against it."""
    if self.reference is not None:
      return self.reference
    if self._loss_reference is None:
      self._loss_reference = self._pack(reference_problems(self.config.reward))
    return self._loss_reference

  def _pack(self, problems):
    """Problems with gold solutions as reward sequences: the rendered problem, the solution as completion."""
    return alignment.pack_reference(
        self.tokenizer, [render(self.tokenizer, p.problem, self.style) for p in problems],
        [p.solution for p in problems], max_len=config_base.reward_sequence_len(self.config))

  # ---- state for checkpoints -----------------------------------------------------------------

  def state_dict(self) -> dict[str, Any]:
    return {t: [[_task_to_json(task), step] for task, step in b.entries()] for t, b in self.buffers.items()}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    for t, items in state.items():
      buf = buffers_lib.TaskBuffer(t, self.config.coding.buffer_cap)
      for task, step in items:
        buf.add(_task_from_json(task), step)
      self.buffers[t] = buf

  # ---- helpers of the stages ---------------------------------------------------------------------

  def _proposer_prompts(self, task_type, rng):
    c = self.config.coding
    texts, programs, references, seeds = [], [], [], []
    for _ in range(c.proposals_per_type):
      if task_type == tasks.INDUCTION:
        program = buffers_lib.sample_induction_program(
            [self.buffers[tasks.DEDUCTION], self.buffers[tasks.ABDUCTION]], rng)
        texts.append(prompts.proposer_prompt(task_type, program=program, num_inputs=c.induction_inputs))
        programs.append(program)
        references.append([program])
        seeds.append(next((s for b in (self.buffers[tasks.DEDUCTION], self.buffers[tasks.ABDUCTION]) for s in b
                           if s.program == program), None))
      else:
        refs = self.buffers[task_type].sample(c.num_references, rng)
        texts.append(compact_prompts.proposer_prompt(task_type, refs) if self.style == "compact"
                     else prompts.proposer_prompt(task_type, refs))
        programs.append(None)
        references.append([r.program for r in refs])
        seeds.append(refs[0] if refs else None)  # the local reference's seed: the first shown program
    return [render(self.tokenizer, t, self.style) for t in texts], programs, references, seeds

  def _propose(self, engine, params, task_type, prompts_text, key):
    """Proposer responses -> (full response texts, per-response list of (prompt, tokens, logprobs) segments).

    With coding.input_scaffold (small models), decoding runs in two segments: the program after
    coding.proposer_prefix up to coding.segment_stop (its closing fence by default), then the scaffold (e.g. an ```input fence) and the
    input. Each segment is a sampled continuation of its own context and trains as its own row.
    """
    c = self.config.coding
    scaffolded = bool(c.input_scaffold) and task_type != tasks.INDUCTION  # induction writes inputs, not code
    prefix = c.proposer_prefix if scaffolded or task_type != tasks.INDUCTION else ""
    if not scaffolded:
      gen = self._sample(engine, params, [p + prefix for p in prompts_text], key, stop_strings=self.answer_stops)
      segments = [[(gen.prompt_tokens[j], gen.tokens[j], gen.logprobs[j], None)] for j in range(len(prompts_text))]
      return [prefix + t for t in gen.texts], segments, int(np.sum(gen.lengths))
    k1, k2 = split_key(key, 2)
    stop = (c.segment_stop,)
    first = self._sample(engine, params, [p + prefix for p in prompts_text], k1, stop_strings=stop)
    scaffold = self.tokenizer.encode(c.input_scaffold, add_special_tokens=False)
    # The second segment continues the exact token sequence (prompt, first segment, scaffold).
    contexts = [list(first.prompt_tokens[j]) + list(first.tokens[j]) + scaffold for j in range(len(prompts_text))]
    second = self._sample(engine, params, contexts, k2, stop_strings=stop)
    # A segment that stopped elsewhere than at a fence (coding.segment_stop) gets its block closed here.
    texts = [prefix + t1 + c.input_scaffold + t2 + ("" if t2.endswith(FENCE) else FENCE) + "\n</answer>"
             for t1, t2 in zip(first.texts, second.texts)]
    # One training row per response: both sampled segments are targets, the scaffold between is not.
    segments = []
    for j in range(len(prompts_text)):
      completion = np.concatenate([first.tokens[j], np.asarray(scaffold, np.int32), second.tokens[j]])
      logprobs = np.concatenate([first.logprobs[j], np.zeros(len(scaffold), np.float32), second.logprobs[j]])
      mask = np.concatenate([np.ones(len(first.tokens[j])), np.zeros(len(scaffold)), np.ones(len(second.tokens[j]))])
      segments.append([(first.prompt_tokens[j], completion, logprobs, mask)])
    return texts, segments, int(np.sum(first.lengths) + np.sum(second.lengths))

  @property
  def answer_stops(self) -> tuple[str, ...]:
    """Stop strings of unscaffolded responses (coding.answer_stop): none by default, as AZR samples."""
    stop = self.config.coding.answer_stop
    return (stop,) if stop else ()

  def _solver_prefix(self, task) -> str:
    """coding.solver_prefix with {block} = the answer fence the task type expects."""
    block = {tasks.DEDUCTION: "output", tasks.ABDUCTION: "input", tasks.INDUCTION: "python"}[task.type]
    return self.config.coding.solver_prefix.format(block=block)

  def gold_completion(self, task) -> np.ndarray:
    """Token ids of the task's gold answer written as a solver response (after the solver prefix)."""
    answer = {tasks.DEDUCTION: task.output, tasks.ABDUCTION: task.input, tasks.INDUCTION: task.program}[task.type]
    c = self.config.coding
    if c.solver_prefix and c.segment_stop != FENCE:  # a one-line answer, as the solver samples it
      ids = self.tokenizer.encode(f"{answer}{c.segment_stop}", add_special_tokens=False)
      return np.asarray(ids, np.int32)
    if c.solver_prefix:
      text = f"{answer}\n```\n</answer>"
    else:
      block = {tasks.DEDUCTION: "output", tasks.ABDUCTION: "input", tasks.INDUCTION: "python"}[task.type]
      text = f"</think>\n<answer>\n```{block}\n{answer}\n```\n</answer>"
    ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
    return np.asarray(ids, np.int32)

  def solver_prompts(self, task_list) -> list[str]:
    """The solver prompt texts of tasks, each ending in its solver prefix (the response scaffold)."""
    prefixes = [self._solver_prefix(t) for t in task_list]
    if self.style == "compact":  # plain few-shot text, continued by the scaffold
      return [compact_prompts.solver_prompt(t, self.config.coding.solver_prefix) + pre
              for t, pre in zip(task_list, prefixes)]
    return [render(self.tokenizer, prompts.solver_prompt(t), self.style) + pre for t, pre in zip(task_list, prefixes)]

  def _solver_response(self, task, text: str) -> str:
    """A sampled solver completion as the full response (a scaffolded answer block closed again)."""
    if not self.config.coding.solver_prefix:
      return text
    return self._solver_prefix(task) + text + ("" if text.endswith(FENCE) else FENCE) + "\n</answer>"

  def _solve(self, engine, params, task_list, key, n_samples, checks: BackgroundChecks | None = None):
    """Solver responses (n_samples per task, task-major): (generation, full response texts). With
    `checks`, each finished response goes to it while the others decode (selfplay/overlap.py)."""
    prompts_text = self.solver_prompts(task_list)
    scaffolded = bool(self.config.coding.solver_prefix)  # the answer block is open: stop where it ends
    stops = (self.config.coding.segment_stop,) if scaffolded else self.answer_stops
    on_finish = None if checks is None else (
        lambda row, tokens, text, reason: checks.on_row(row, self._solver_response(task_list[row // n_samples], text)))
    gen = self._sample(engine, params, prompts_text, key, n_samples=n_samples, stop_strings=stops, on_finish=on_finish)
    texts = [self._solver_response(task_list[r // n_samples], t) for r, t in enumerate(gen.texts)]
    return gen, texts

  def _overlapped_checks(self, engine, params, task_list, key, n_samples, times, label):
    """The solver's n_samples responses per task, each task checked in the sandbox as soon as its
    responses are in, while the device decodes the rest: (generation, texts, per task (verdicts,
    reasons)). Across processes a host samples and checks its share of the tasks."""
    def check(task, responses):
      verdicts, reasons = checking.check_many_reasons(
          self.pool, [(task, [checking.extract_solver_answer(task, x) for x in responses])])
      return verdicts[0], reasons[0]

    shares = distributed.Shares.of(len(task_list))
    with BackgroundChecks(check, task_list, n_samples, workers=self.pool.num_workers) as checks:
      with times("generate", f"generate: {label}"):
        gen, texts = self._solve(engine, params, task_list, key, n_samples, checks)
      mine = list(shares.mine)
      local = checks.finish({r: texts[r] for i in mine for r in range(i * n_samples, (i + 1) * n_samples)}, mine)
    times.add("sandbox", checks.busy_s)
    return gen, texts, distributed.gather_shares(local, shares)

  def _propose_all(self, engine, params, prompts_by_type: dict, key):
    """_propose for every task type with as few generate calls as possible: types that decode the same
    way (scaffold or not, same prefix) share one call. Returns {type: (responses, segments)}, tokens."""
    c = self.config.coding
    modes: dict[tuple, list[str]] = {}
    for t in prompts_by_type:
      scaffolded = bool(c.input_scaffold) and t != tasks.INDUCTION
      modes.setdefault((scaffolded, scaffolded or t != tasks.INDUCTION), []).append(t)
    out, n_tokens = {}, 0
    for i, types in enumerate(modes.values()):
      prompts_text = [p for t in types for p in prompts_by_type[t]]
      responses, segments, n = self._propose(engine, params, types[0], prompts_text, jax.random.fold_in(key, i))
      n_tokens += n
      start = 0
      for t in types:
        end = start + len(prompts_by_type[t])
        out[t] = (responses[start:end], segments[start:end])
        start = end
    return out, n_tokens

  # ---- the stages of a step (selfplay/step.run_step runs them in this order) ----------------------

  def _sample(self, engine, params, prompts_in, key, **kwargs):
    sampler = self._sampler or rollout.sample
    return sampler(engine, params, self.tokenizer, prompts_in, self.config, key, **kwargs)

  def plan(self, step: int) -> "CodingPlan":
    """Host-side choices of the step, from random.Random(f"{seed}:{step}"): the solver batches (drawn
    from the buffers as they were before this step's proposals, as AZR does) and the proposer prompts."""
    c = self.config.coding
    rng = random.Random(f"{self.config.seed}:{step}")
    solver_tasks = {t: self.buffers[t].solver_batch(c.solver_tasks_per_type, rng, since_step=step - 1)
                    for t in self.task_types}
    prompted = {t: self._proposer_prompts(t, rng) for t in self.task_types}
    # The external reference set: its g_ref compiles while the step generates (none when local).
    fixed = {local_reference.EXTERNAL: self.reference} if self.reference is not None else {}
    return CodingPlan(step, solver_tasks, {t: p[0] for t, p in prompted.items()}, {t: p[1] for t, p in prompted.items()},
                      {t: p[2] for t, p in prompted.items()}, {t: p[3] for t, p in prompted.items()},
                      fixed_references=fixed)

  def propose(self, engine, params, plan: "CodingPlan", key, times) -> "CodingProposals":
    with times("generate", "generate: proposals"):
      proposed, n_tokens = self._propose_all(engine, params, plan.prompts, key)
    return CodingProposals({t: p[0] for t, p in proposed.items()}, {t: p[1] for t, p in proposed.items()}, n_tokens)

  def verify(self, engine, params, plan: "CodingPlan", proposals: "CodingProposals", key, times) -> step_lib.Verified:
    """Each proposal validated in the sandbox; n solver samples per valid one -> its solve rate and the
    solution standing for g(x̃) (the first correct sample; the gold answer when none is, s = 0). The
    references: the external set, or with reward.reference = "local" each needed seed's verified
    solution (settings/coding/local_reference.py)."""
    c = self.config.coding
    opens_think = self.style == "plain"
    candidates, checked = [], CodingChecks()
    items = [(t, j, text, program) for t in self.task_types
             for j, (text, program) in enumerate(zip(proposals.texts[t], plan.programs[t]))]
    with times("sandbox", "verify: proposals"):  # each process validates its share in its own sandbox
      validated = shared_map(lambda part: [validation.validate_proposal(self.pool, t, text, source_program=program,
                                                                    num_inputs=c.induction_inputs)
                                       for t, _, text, program in part], items)
      checked.verdicts.update(verdict_stats.tally("validation", [reason for _, reason, _ in validated]))
      for (t, j, text, _), (ok, _, task) in zip(items, validated):
        # Jaccard to the nearest shown reference (novelty rewards): the program when valid, else the answer.
        program_text = task.program if task else parsing.extract_answer(text)
        jaccard = max((novelty.token_jaccard(program_text, ref, language="python")
                       for ref in plan.references[t][j]), default=0.0)
        reference = local_reference.EXTERNAL if self.reference is not None else None
        seed = plan.seeds[t][j] if self.local else None
        if seed is not None:  # local reference: compared with (and novel against) its own seed
          reference = local_reference.seed_key(seed)
          jaccard = novelty.token_jaccard(program_text or "", seed.program, language="python")
        # local: cosines of eligible candidates only (each seed's g_ref costs a backward pass)
        candidates.append(step_lib.Candidate(group=t, formatted=parsing.format_ok(text, opens_think), valid=ok,
                                             reference=reference, jaccard=jaccard, report_cosine=not self.local))
        checked.slots.append((t, j))
        checked.tasks.append(task)
        checked.program_texts.append(program_text)
    valid = [i for i, cand in enumerate(candidates) if cand.valid]
    if not valid:
      return step_lib.Verified(candidates, checked, references=self._references(plan, candidates))
    tasks_of, n = checked.tasks, c.solve_samples
    # The cosine pass (its shape guessed from the gold answers) compiles while the solver samples.
    if engine.ahead.enabled and not self.local:
      solving = [tasks_of[i] for i in valid]
      step_lib.cosines_ahead(engine, params, self.scoring(),
                             [truncate_prompt(self.tokenizer, p, self.config.sampling.max_prompt_tokens)
                              for p in self.solver_prompts(solving)],
                             [self.gold_completion(t) for t in solving])
    gen, _, checks = self._overlapped_checks(engine, params, [tasks_of[i] for i in valid], key, n, times,
                                             "solve rates")
    verdicts = [v for v, _ in checks]
    checked.verdicts.update(verdict_stats.tally("checking", [r for _, reasons in checks for r in reasons]))
    for v, i in enumerate(valid):
      sample = v * n + verdicts[v].index(True) if any(verdicts[v]) else None
      solution = ((gen.prompt_tokens[v * n], self.gold_completion(tasks_of[i])) if sample is None
                  else (gen.prompt_tokens[sample], gen.tokens[sample]))
      candidates[i] = dataclasses.replace(candidates[i], solve_rate=float(np.mean(verdicts[v])), solution=solution)
    return step_lib.Verified(candidates, checked, tokens=int(np.sum(gen.lengths)),
                             references=self._references(plan, candidates))

  def _references(self, plan: "CodingPlan", candidates) -> dict:
    """The plan's external reference set (one g_ref for every candidate); when local, one per seed
    some valid candidate needs: its verified solution."""
    if not self.local:
      return dict(plan.fixed_references)
    seeds = {local_reference.seed_key(s): s for per_type in plan.seeds.values() for s in per_type if s is not None}
    return local_reference.seed_references(self, seeds, candidates, config_base.reward_sequence_len(self.config))

  def scoring(self) -> step_lib.ScoreOptions:
    r = self.config.reward
    soar = (step_lib.SoarOptions(self.soar_heldout, group_size=r.soar_group_size, steps=r.soar_inner_steps,
                                 learning_rate=r.soar_inner_lr, batch_rows=r.soar_inner_batch,
                                 accuracy=self.soar_answers, optimizer=r.soar_inner_optimizer)
            if r.name == SOAR_UTILITY else None)
    return step_lib.ScoreOptions(
        reward_name=r.name, reward_cfg=reward_config(r), pad_id=self.tokenizer.pad_token_id,
        max_len=config_base.reward_sequence_len(self.config), buckets=sequences.TRAIN_BUCKETS,
        # local: a seed has few candidates, so pad to a power of two, not to the micro-batch
        fixed_rows=not self.local, soar=soar)

  def rows(self, engine, params, plan: "CodingPlan", proposals: "CodingProposals", verified: step_lib.Verified,
           scores: step_lib.Scores, key, times):
    """Proposer rows (one per proposal segment, its reward), then solver rollouts on the plan's solver
    batches -> AZR's solver rewards."""
    opens_think = self.style == "plain"
    rows: list[Row] = []
    for (t, j), reward in zip(verified.record.slots, scores.reward):
      for prompt_ids, tokens, logprobs, mask in proposals.segments[t][j]:
        rows.append(Row(prompt_ids, tokens, logprobs, float(reward), t, "proposer", completion_mask=mask))
    batch = [(t, task) for t in self.task_types for task in plan.solver_tasks[t]]
    solver_rewards = {t: [] for t in self.task_types}
    rollout_tokens, rollout_verdicts = 0, collections.Counter()
    if batch:
      pred, pred_texts, checks = self._overlapped_checks(engine, params, [task for _, task in batch], key, 1, times,
                                                         "solver rollouts")
      rollout_tokens = int(np.sum(pred.lengths))
      verdicts = [v for v, _ in checks]
      rollout_verdicts = verdict_stats.tally("checking", [r for _, reasons in checks for r in reasons])
      for r, ((t, _), text) in enumerate(zip(batch, pred_texts)):
        reward = self.table.solver(parsing.format_ok(text, opens_think), verdicts[r][0])
        solver_rewards[t].append(reward)
        rows.append(Row(pred.prompt_tokens[r], pred.tokens[r], pred.logprobs[r], reward, t, "solver"))
    tokens = proposals.tokens + verified.tokens + rollout_tokens
    verdicts = verified.record.verdicts + rollout_verdicts
    return rows, coding_metrics.step_metrics(self, plan, verified, scores, solver_rewards, verdicts, tokens, times)

  def commit(self, plan: "CodingPlan", proposals, verified: step_lib.Verified, scores) -> dict[str, Any]:
    """Valid proposals join the task buffers (AZR: deduction and abduction share programs)."""
    for (t, _), cand, task in zip(verified.record.slots, verified.candidates, verified.record.tasks):
      if not cand.valid:
        continue
      self.buffers[t].add(task, plan.step)
      if t in (tasks.DEDUCTION, tasks.ABDUCTION):
        other = tasks.ABDUCTION if t == tasks.DEDUCTION else tasks.DEDUCTION
        if other not in self.task_types:
          self.buffers[other].add(tasks.CodingTask(**{**task.__dict__, "type": other}), plan.step)
    return {f"{t}/buffer_size": len(self.buffers[t]) for t in self.task_types}

  def train_batches(self, rows: list[Row], step: int) -> list[list[Row]]:
    """The rows as train.ppo_mini_batches optimizer steps (AZR: 1, all rows in one step)."""
    return ppo_mini_batches(rows, self.task_types, self.config.train.ppo_mini_batches)


def ppo_mini_batches(rows: list[Row], task_types, count: int) -> list[list[Row]]:
  """Rows in AZR's order, cut into `count` contiguous mini-batches (sizes differ by at most one row).

  AZR concatenates its (task, role) batches as gen/pred of code_i, code_o, code_f
  (azr_ray_trainer.py L1685) and veRL's update_policy takes mini-batches by contiguous
  `batch.split`, unshuffled (dp_actor.py L216; actor.shuffle False, azr_ppo_trainer.yaml L38): here
  rows of each task type in `task_types` order, proposer rows before solver rows, each kept in its
  order. Advantages stay those computed over the whole step, as veRL computes them before the update.
  count = 1 returns the rows as they are.
  """
  if count < 1:
    raise ValueError(f"ppo_mini_batches: count must be >= 1, got {count}")
  if count == 1:
    return [list(rows)]
  order = {t: i for i, t in enumerate(task_types)}
  ordered = sorted(rows, key=lambda r: (order.get(r.group, len(order)), r.role != "proposer"))
  bounds = np.linspace(0, len(ordered), min(count, len(ordered)) + 1).round().astype(int)
  return [ordered[a:b] for a, b in zip(bounds[:-1], bounds[1:])] or [ordered]


@dataclasses.dataclass
class CodingPlan(step_lib.Plan):
  """The step's host-side choices (selfplay/step.py's `plan` stage)."""
  solver_tasks: dict[str, list]          # type -> tasks the solver answers this step
  prompts: dict[str, list[str]]          # type -> proposer prompts (rendered)
  programs: dict[str, list]              # type -> the source program shown (induction) or None
  references: dict[str, list[list[str]]]  # type -> per prompt, the reference programs it shows
  seeds: dict[str, list] = dataclasses.field(default_factory=dict)  # type -> per prompt, its seed task or None


@dataclasses.dataclass(frozen=True)
class CodingProposals:
  """What the proposer wrote (the `propose` stage)."""
  texts: dict[str, list[str]]            # type -> full response texts
  segments: dict[str, list]              # type -> per response, its training segments
  tokens: int                            # tokens generated for the proposals


@dataclasses.dataclass
class CodingChecks:
  """The verify stage's record (step.Verified.record), per candidate in candidate order."""
  slots: list = dataclasses.field(default_factory=list)          # (type, index of the proposal in its type)
  tasks: list = dataclasses.field(default_factory=list)          # the validated task or None
  program_texts: list = dataclasses.field(default_factory=list)  # program (or answer) text
  verdicts: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # reason counts
