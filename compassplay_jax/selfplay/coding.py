"""One step of coding self-play, AZR's schedule (../shared/notes/azr-coding-selfplay.md §5.1, §10).

For each task type (abduction, deduction, induction):
  1. the solver batch is drawn from the buffer first (AZR: solvers train on tasks proposed earlier);
  2. proposer prompts with K references -> generate -> validate in the sandbox;
  3. n solver samples per valid proposal -> solve rates;
  4. proposer rewards (default compassplay_cos: cosine between the solver's loss gradient on the
     candidate and the external reference gradient; difficulty, novelty_only, plain cos selectable);
  5. valid proposals join the buffer;
  6. solver rollouts on the solver batch -> verified in the sandbox -> AZR's solver rewards.
The rows of all (type, role) groups then get TRR++ advantages and make one policy update.

g(x̃) is taken on the FIRST correct sample (lowest sample index) among the n solve-rate samples of
x̃: the sequence (solver prompt, that completion), loss on the completion tokens.
"""
from __future__ import annotations

import random
import time
from typing import Any

import numpy as np

from compassplay_jax.domains.coding import buffers as buffers_lib
from compassplay_jax.domains.coding import checking, parsing, prompts, tasks, validation
from compassplay_jax.domains.coding.rewards_table import TABLES
from compassplay_jax.metrics import histogram
from compassplay_jax.rewards import novelty
from compassplay_jax.rewards.proposer_rewards import proposer_rewards
from compassplay_jax.selfplay import alignment
from compassplay_jax.selfplay.reference_set import load_reference_set
from compassplay_jax.sampling import generate
from compassplay_jax.selfplay import rollout
from compassplay_jax.selfplay.rollout import Row, reward_config, sample, sampling_config, split_key

STOP = ("</answer>",)
FENCE = "```"
COS_REWARDS = ("compassplay_cos", "compassplay_cos_novelty", "cos")
_CHAT_SUFFIX = "\nAssistant: <think>"


def render(tokenizer, unwrapped: str, style: str) -> str:
  """AZR's plain R1 wrapper (ends in "Assistant: <think>"), or the same text as a chat user turn."""
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


def validate_config(config) -> None:
  """Checks that need no model: task types, reward name, reference file (raises one-line errors)."""
  from compassplay_jax.rewards.proposer_rewards import REWARD_FNS
  types = [t.strip() for t in config.coding.task_types.split(",") if t.strip()]
  unknown = [t for t in types if t not in tasks.TASK_TYPES]
  if unknown or not types:
    raise ValueError(f"config.coding.task_types: unknown task type(s) {unknown} (known: {tasks.TASK_TYPES})")
  if config.reward.name not in REWARD_FNS:
    raise ValueError(f"config.reward.name: {config.reward.name!r} is not one of {sorted(REWARD_FNS)}")
  if config.reward.name in COS_REWARDS:
    load_reference_set(config.reward.reference_path, config.reward.reference_size, config.seed)


class CodingSelfPlay:
  """Holds the task buffers and the reference set; `collect` runs one step's rollouts and rewards."""

  def __init__(self, config, tokenizer, pool):
    validate_config(config)
    self.config, self.tokenizer, self.pool = config, tokenizer, pool
    self.task_types = [t.strip() for t in config.coding.task_types.split(",") if t.strip()]
    c = config.coding
    if c.seed_dir:
      from compassplay_jax.selfplay.reference_set import resolve_path
      self.buffers = buffers_lib.load_azr_seed_dir(resolve_path(c.seed_dir), cap=c.buffer_cap, limit=c.seed_limit)
    else:
      self.buffers = buffers_lib.seeded_buffers(cap=c.buffer_cap)
    self.style = config.coding.prompt_style
    self.table = TABLES["azr_code"]
    self.reference = None
    if config.reward.name in COS_REWARDS:
      problems = load_reference_set(config.reward.reference_path, config.reward.reference_size, config.seed)
      self.reference = alignment.pack_reference(
          tokenizer, [render(tokenizer, p.problem, self.style) for p in problems],
          [p.solution for p in problems], max_len=config.sampling.max_prompt_tokens + config.reward.max_completion_tokens)

  def close(self):
    self.pool.close()

  # ---- state for checkpoints -----------------------------------------------------------------

  def state_dict(self) -> dict[str, Any]:
    return {t: [[_task_to_json(task), step] for task, step in zip(b._items, b._steps)]
            for t, b in self.buffers.items()}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    for t, items in state.items():
      buf = buffers_lib.TaskBuffer(t, self.config.coding.buffer_cap)
      for task, step in items:
        buf.add(_task_from_json(task), step)
      self.buffers[t] = buf

  # ---- one step --------------------------------------------------------------------------------

  def _proposer_prompts(self, task_type, rng):
    c = self.config.coding
    texts, programs, references = [], [], []
    for _ in range(c.proposals_per_type):
      if task_type == tasks.INDUCTION:
        program = buffers_lib.sample_induction_program(
            [self.buffers[tasks.DEDUCTION], self.buffers[tasks.ABDUCTION]], rng)
        texts.append(prompts.proposer_prompt(task_type, program=program, num_inputs=c.induction_inputs))
        programs.append(program)
        references.append([program])
      else:
        refs = self.buffers[task_type].sample(c.num_references, rng)
        texts.append(prompts.proposer_prompt(task_type, refs))
        programs.append(None)
        references.append([r.program for r in refs])
    return [render(self.tokenizer, t, self.style) for t in texts], programs, references

  def _propose(self, graphdef, params, task_type, prompts_text, key):
    """Proposer responses -> (full response texts, per-response list of (prompt, tokens, logprobs) segments).

    With coding.input_scaffold (small models), decoding runs in two segments: the program after
    coding.proposer_prefix up to its closing fence, then the scaffold (e.g. an ```input fence) and the
    input. Each segment is a sampled continuation of its own context and trains as its own row.
    """
    c, cfg = self.config.coding, self.config
    scaffolded = bool(c.input_scaffold) and task_type != tasks.INDUCTION  # induction writes inputs, not code
    prefix = c.proposer_prefix if scaffolded or task_type != tasks.INDUCTION else ""
    if not scaffolded:
      gen = sample(graphdef, params, self.tokenizer, [p + prefix for p in prompts_text], cfg, key, stop_strings=STOP)
      segments = [[(gen.prompt_tokens[j], gen.tokens[j], gen.logprobs[j], None)] for j in range(len(prompts_text))]
      return [prefix + t for t in gen.texts], segments, int(np.sum(gen.lengths))
    k1, k2 = split_key(key, 2)
    first = sample(graphdef, params, self.tokenizer, [p + prefix for p in prompts_text], cfg, k1, stop_strings=(FENCE,))
    scaffold = self.tokenizer.encode(c.input_scaffold, add_special_tokens=False)
    # The second segment continues the exact token sequence (prompt, first segment, scaffold).
    contexts = [list(first.prompt_tokens[j]) + list(first.tokens[j]) + scaffold for j in range(len(prompts_text))]
    second = generate(graphdef, params, self.tokenizer, contexts,
                      sampling_config(cfg, stop_strings=(FENCE,)), k2, device_fns=rollout.DEVICE_FNS)
    texts = [prefix + t1 + c.input_scaffold + t2 + "\n</answer>" for t1, t2 in zip(first.texts, second.texts)]
    # One training row per response: both sampled segments are targets, the scaffold between is not.
    segments = []
    for j in range(len(prompts_text)):
      completion = np.concatenate([first.tokens[j], np.asarray(scaffold, np.int32), second.tokens[j]])
      logprobs = np.concatenate([first.logprobs[j], np.zeros(len(scaffold), np.float32), second.logprobs[j]])
      mask = np.concatenate([np.ones(len(first.tokens[j])), np.zeros(len(scaffold)), np.ones(len(second.tokens[j]))])
      segments.append([(first.prompt_tokens[j], completion, logprobs, mask)])
    return texts, segments, int(np.sum(first.lengths) + np.sum(second.lengths))

  def _solver_prefix(self, task) -> str:
    """coding.solver_prefix with {block} = the answer fence the task type expects."""
    block = {tasks.DEDUCTION: "output", tasks.ABDUCTION: "input", tasks.INDUCTION: "python"}[task.type]
    return self.config.coding.solver_prefix.format(block=block)

  def _gold_completion(self, task) -> np.ndarray:
    """Token ids of the task's gold answer written as a solver response (after the solver prefix)."""
    answer = {tasks.DEDUCTION: task.output, tasks.ABDUCTION: task.input, tasks.INDUCTION: task.program}[task.type]
    if self.config.coding.solver_prefix:
      text = f"{answer}\n```\n</answer>"
    else:
      block = {tasks.DEDUCTION: "output", tasks.ABDUCTION: "input", tasks.INDUCTION: "python"}[task.type]
      text = f"</think>\n<answer>\n```{block}\n{answer}\n```\n</answer>"
    ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
    return np.asarray(ids, np.int32)

  def _solve(self, graphdef, params, task_list, key, n_samples):
    """Solver responses (n_samples per task, task-major): (generation, full response texts)."""
    prefixes = [self._solver_prefix(t) for t in task_list]
    prompts_text = [render(self.tokenizer, prompts.solver_prompt(t), self.style) + pre
                    for t, pre in zip(task_list, prefixes)]
    stops = (FENCE,) if self.config.coding.solver_prefix else STOP
    gen = sample(graphdef, params, self.tokenizer, prompts_text, self.config, key, n_samples=n_samples,
                 stop_strings=stops)
    suffix = "\n</answer>" if self.config.coding.solver_prefix else ""
    texts = [prefixes[r // n_samples] + t + suffix for r, t in enumerate(gen.texts)]
    return gen, texts

  def collect(self, graphdef, params, step: int, key) -> tuple[list[Row], dict[str, float]]:
    cfg, c = self.config, self.config.coding
    rng = random.Random(f"{cfg.seed}:{step}")
    opens_think = self.style == "plain"
    metrics: dict[str, Any] = {}
    timings = {"generate": 0.0, "sandbox": 0.0, "reward": 0.0}
    rows: list[Row] = []
    g_ref = None
    if self.reference is not None:
      t0 = time.time()
      g_ref = alignment.reference_gradient(graphdef, params, self.reference, cfg.reward.micro_batch_size)
      timings["reward"] += time.time() - t0
    keys = split_key(key, 3 * len(self.task_types))
    all_rates, gen_tokens = [], 0
    for i, task_type in enumerate(self.task_types):
      k_prop, k_solve, k_pred = keys[3 * i:3 * i + 3]
      solver_tasks = self.buffers[task_type].solver_batch(c.solver_tasks_per_type, rng, since_step=step - 1)

      # 2. proposals
      prop_prompts, programs, references = self._proposer_prompts(task_type, rng)
      t0 = time.time()
      responses, segments, n_tokens = self._propose(graphdef, params, task_type, prop_prompts, k_prop)
      timings["generate"] += time.time() - t0
      gen_tokens += n_tokens
      t0 = time.time()
      outcomes = [validation.validate_proposal(self.pool, task_type, text, source_program=prog,
                                               num_inputs=c.induction_inputs)
                  for text, prog in zip(responses, programs)]
      formats = [parsing.format_ok(text, opens_think) for text in responses]
      timings["sandbox"] += time.time() - t0
      valid_idx = [j for j, (ok, _, _) in enumerate(outcomes) if ok]

      # 3. solve rates from n solver samples per valid proposal
      rates = np.zeros(len(outcomes), np.float32)
      first_correct: dict[int, int] = {}
      solve_gen = None
      if valid_idx:
        t0 = time.time()
        solve_gen, solve_texts = self._solve(graphdef, params, [outcomes[j][2] for j in valid_idx], k_solve,
                                             c.solve_samples)
        timings["generate"] += time.time() - t0
        gen_tokens += int(np.sum(solve_gen.lengths))
        t0 = time.time()
        items = []
        for v, j in enumerate(valid_idx):
          task = outcomes[j][2]
          texts = solve_texts[v * c.solve_samples:(v + 1) * c.solve_samples]
          items.append((task, [checking.extract_solver_answer(task, t) for t in texts]))
        verdicts = checking.check_many(self.pool, items)
        timings["sandbox"] += time.time() - t0
        for v, j in enumerate(valid_idx):
          rates[j] = float(np.mean(verdicts[v]))
          if any(verdicts[v]):
            first_correct[j] = v * c.solve_samples + verdicts[v].index(True)
      all_rates += [float(rates[j]) for j in valid_idx]

      # 4. proposer rewards
      t0 = time.time()
      valid = np.asarray([ok for ok, _, _ in outcomes])
      eligible = [j for j in valid_idx if 0.0 < rates[j] < 1.0]
      cosines = np.zeros(len(outcomes), np.float32)
      # Every valid candidate gets g(x) from a solution: its first correct solver sample, or, when no
      # sample is correct (s = 0, never rewarded), the gold answer written in the solver's format.
      # Only eligible candidates' cosines enter rewards; the rest are reported (cos_valid_mean).
      if g_ref is not None and valid_idx:
        sol_prompts, sol_tokens = [], []
        for v, j in enumerate(valid_idx):
          if j in first_correct:
            sol_prompts.append(solve_gen.prompt_tokens[first_correct[j]])
            sol_tokens.append(solve_gen.tokens[first_correct[j]])
          else:
            sol_prompts.append(solve_gen.prompt_tokens[v * c.solve_samples])
            sol_tokens.append(self._gold_completion(outcomes[j][2]))
        cos = alignment.candidate_cosines(
            graphdef, params, g_ref, sol_prompts, sol_tokens, self.tokenizer.pad_token_id,
            method=cfg.reward.method, chunk_size=cfg.reward.chunk_size, micro_batch=cfg.reward.micro_batch_size,
            max_len=cfg.sampling.max_prompt_tokens + cfg.reward.max_completion_tokens)
        cosines[valid_idx] = cos["cosines"]
        metrics[f"{task_type}/cos_valid_mean"] = float(np.mean(cos["cosines"]))
        if eligible:
          metrics[f"{task_type}/cos_eligible_mean"] = float(np.mean(cosines[eligible]))
      candidates = [outcomes[j][2].program if outcomes[j][2] else parsing.extract_answer(t)
                    for j, t in enumerate(responses)]
      jaccard = np.asarray([max((novelty.token_jaccard(cand, ref, language="python") for ref in refs), default=0.0)
                            for cand, refs in zip(candidates, references)], np.float32)
      rewards = np.asarray(proposer_rewards(
          cfg.reward.name, cosines=cosines, solve_rates=rates, valid=valid, well_formatted=np.asarray(formats),
          jaccard_to_seed=jaccard, config=reward_config(cfg.reward)), np.float32)
      timings["reward"] += time.time() - t0
      for j in range(len(outcomes)):
        for prompt_ids, tokens, logprobs, mask in segments[j]:
          rows.append(Row(prompt_ids, tokens, logprobs, float(rewards[j]), task_type, "proposer",
                          completion_mask=mask))

      # 5. buffers
      for j in valid_idx:
        task = outcomes[j][2]
        self.buffers[task_type].add(task, step)
        if task_type in (tasks.DEDUCTION, tasks.ABDUCTION):  # AZR: code_i/code_o share programs
          other = tasks.ABDUCTION if task_type == tasks.DEDUCTION else tasks.DEDUCTION
          if other not in self.task_types:
            self.buffers[other].add(tasks.CodingTask(**{**task.__dict__, "type": other}), step)

      # 6. solver rollouts
      solver_rewards = []
      if solver_tasks:
        t0 = time.time()
        pred, pred_texts = self._solve(graphdef, params, solver_tasks, k_pred, 1)
        timings["generate"] += time.time() - t0
        gen_tokens += int(np.sum(pred.lengths))
        t0 = time.time()
        verdicts = checking.check_many(self.pool, [(t, [checking.extract_solver_answer(t, text)])
                                                   for t, text in zip(solver_tasks, pred_texts)])
        timings["sandbox"] += time.time() - t0
        for r, (t, text) in enumerate(zip(solver_tasks, pred_texts)):
          reward = self.table.solver(parsing.format_ok(text, opens_think), verdicts[r][0])
          solver_rewards.append(reward)
          rows.append(Row(pred.prompt_tokens[r], pred.tokens[r], pred.logprobs[r], reward, task_type, "solver"))

      n = len(outcomes)
      metrics[f"{task_type}/valid_rate"] = len(valid_idx) / max(n, 1)
      metrics[f"{task_type}/format_rate"] = float(np.mean(formats)) if formats else 0.0
      metrics[f"{task_type}/in_band_rate"] = len(eligible) / max(n, 1)
      metrics[f"{task_type}/reward_proposer"] = float(np.mean(rewards)) if n else 0.0
      metrics[f"{task_type}/reward_solver"] = float(np.mean(solver_rewards)) if solver_rewards else 0.0
      metrics[f"{task_type}/solver_accuracy"] = float(np.mean([r == self.table.solver_right for r in solver_rewards])) \
          if solver_rewards else 0.0
      metrics[f"{task_type}/buffer_size"] = len(self.buffers[task_type])
      novelty_stats = novelty.batch_novelty_metrics(
          [candidates[j] for j in valid_idx], [references[j][0] if references[j] else "" for j in valid_idx], "python")
      metrics[f"{task_type}/copy_rate"] = novelty_stats["copy_rate"]
      metrics[f"{task_type}/rename_rate"] = novelty_stats["rename_rate"]

    metrics["valid_rate"] = float(np.mean([metrics[f"{t}/valid_rate"] for t in self.task_types]))
    metrics["in_band_rate"] = float(np.mean([metrics[f"{t}/in_band_rate"] for t in self.task_types]))
    metrics["reward/proposer"] = float(np.mean([metrics[f"{t}/reward_proposer"] for t in self.task_types]))
    metrics["reward/solver"] = float(np.mean([metrics[f"{t}/reward_solver"] for t in self.task_types]))
    metrics["copy_rate"] = float(np.mean([metrics[f"{t}/copy_rate"] for t in self.task_types]))
    metrics["rename_rate"] = float(np.mean([metrics[f"{t}/rename_rate"] for t in self.task_types]))
    cos_means = [metrics[f"{t}/cos_valid_mean"] for t in self.task_types if f"{t}/cos_valid_mean" in metrics]
    if cos_means:
      metrics["cos_valid_mean"] = float(np.mean(cos_means))
    metrics["solve_rate_histogram"] = histogram(all_rates)
    metrics["tokens/generated"] = gen_tokens
    for name, seconds in timings.items():
      metrics[f"time/{name}"] = seconds
    metrics["tokens_per_s"] = gen_tokens / max(timings["generate"], 1e-9)
    return rows, metrics
