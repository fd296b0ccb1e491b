"""The evaluation library call: prompts -> greedy generation -> checking -> report.

The training loop loads the benchmarks once and calls `evaluate` when due (`due`):

  items = load_items(config.eval)
  summary = evaluate(None, tokenizer, items, eval_config=config.eval, step=step,
                     workdir=config.workdir, generate_queue=queue_fn)

`generate_queue(prompts, budgets)` gets every benchmark's prompts in one call, each with its own
token budget (`budgets_for`): the run's rollout engine decodes them as one queue. A plain
`generate_fn(prompts)` (tests, tools) is called on length-sorted batches of eval.batch_size instead.
"""
from typing import Callable, Sequence

import ml_collections
import tqdm

from compassplay_jax.runtime.config_base import DEFAULT_BENCHMARKS, eval_config  # noqa: F401
from compassplay_jax.evals import benchmarks as benchmarks_lib
from compassplay_jax.evals import code_check
from compassplay_jax.evals import prompts
from compassplay_jax.evals import report
from compassplay_jax.evals.math_check import MathChecker

GenerateFn = Callable[[list[str]], list[str]]
GenerateQueue = Callable[[list[str], list[int]], list[str]]  # (prompts, budgets) -> completions

# The eval block's defaults live with the other config defaults (config_base); re-exported here.
default_eval_config = eval_config


def with_defaults(eval_config) -> ml_collections.ConfigDict:
  """A copy of eval_config (ConfigDict or dict) with missing fields filled from the defaults."""
  merged = default_eval_config().to_dict()
  for key, value in (dict(eval_config) if eval_config is not None else {}).items():
    if key not in merged:
      raise ValueError(f"config.eval: unknown key {key!r} (known: {', '.join(merged)})")
    merged[key] = value
  return ml_collections.ConfigDict(merged)


def _path_overrides(paths: str) -> dict[str, str]:
  overrides = {}
  for entry in filter(None, (p.strip() for p in (paths or "").split(","))):
    name, sep, path = entry.partition("=")
    if not sep or name.strip() not in benchmarks_lib.BENCHMARKS:
      raise ValueError(f"config.eval.paths: bad entry {entry!r} (want name=path with a known name)")
    overrides[name.strip()] = path.strip()
  return overrides


def _budget_overrides(budgets: str) -> dict[str, int]:
  """eval.budgets "math=16000,cruxeval_o=2048": a benchmark name or a kind (math, cruxeval_o,
  cruxeval_i, lcb) -> max new tokens."""
  kinds = ("math", "cruxeval_o", "cruxeval_i", "lcb")
  overrides = {}
  for entry in filter(None, (p.strip() for p in (budgets or "").split(","))):
    name, sep, value = entry.partition("=")
    name = name.strip()
    if not sep or (name not in benchmarks_lib.BENCHMARKS and name not in kinds) or not value.strip().isdigit() \
        or int(value) < 1:
      raise ValueError(f"config.eval.budgets: bad entry {entry!r} (want name=tokens, a benchmark or one of "
                       f"{kinds}, tokens >= 1)")
    overrides[name] = int(value)
  return overrides


EVAL_ENGINES = ("rollout", "static")


def check_eval_config(eval_config) -> None:
  """Start-up checks of config.eval's generation and cadence fields (ValueError names the field)."""
  cfg = with_defaults(eval_config)
  if cfg.engine not in EVAL_ENGINES:
    raise ValueError(f"config.eval.engine: {cfg.engine!r} is not one of {EVAL_ENGINES}")
  _budget_overrides(cfg.budgets)
  if cfg.equality not in code_check.EQUALITIES:
    raise ValueError(f"config.eval.equality: {cfg.equality!r} is not one of {code_check.EQUALITIES}")
  for name in ("every_steps", "dense_every_steps", "dense_from_step", "max_new_tokens", "batch_size"):
    if int(cfg[name]) < (1 if name in ("max_new_tokens", "batch_size") else 0):
      raise ValueError(f"config.eval.{name}={cfg[name]} is out of range")


def budgets_for(items_by_benchmark, eval_config=None) -> list[int]:
  """Each item's max new tokens, in the flat order `evaluate` builds prompts: eval.budgets' entry for
  its benchmark, else for its kind, else eval.max_new_tokens."""
  cfg = with_defaults(eval_config)
  overrides = _budget_overrides(cfg.budgets)
  return [overrides.get(name, overrides.get(item.kind, int(cfg.max_new_tokens)))
          for name, items in items_by_benchmark.items() for item in items]


def due(step: int, eval_config=None) -> bool:
  """Whether the loop evaluates after step `step` (step 0: the base model, with eval.at_start).

  Every eval.every_steps steps, and every eval.dense_every_steps from step eval.dense_from_step on
  (the final stretch a paper's numbers average); 0 turns either off."""
  cfg = with_defaults(eval_config)
  if step == 0:
    return bool(cfg.at_start) and bool(cfg.every_steps or cfg.dense_every_steps)
  sparse = cfg.every_steps and step % cfg.every_steps == 0
  dense = cfg.dense_every_steps and step >= cfg.dense_from_step and step % cfg.dense_every_steps == 0
  return bool(sparse or dense)


def load_items(eval_config=None, names=None) -> dict[str, list[benchmarks_lib.EvalItem]]:
  """Loads (and subsamples) every benchmark named in `names` or eval_config.benchmarks."""
  cfg = with_defaults(eval_config)
  overrides = _path_overrides(cfg.paths)
  names = benchmarks_lib.parse_benchmark_names(names if names is not None else cfg.benchmarks)
  return {name: benchmarks_lib.load_benchmark(name, cfg.data_dir, overrides.get(name), cfg.limit, cfg.seed)
          for name in names}


def generate_all(generate_fn: GenerateFn, prompt_texts: Sequence[str], batch_size: int,
                 progress: bool = True) -> list[str]:
  """Runs generate_fn over batches of similar-length prompts (less padding); returns in input order."""
  order = sorted(range(len(prompt_texts)), key=lambda i: len(prompt_texts[i]))
  completions = [""] * len(prompt_texts)
  batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
  for batch in tqdm.tqdm(batches, desc="eval generate", unit="batch", disable=not progress):
    outputs = generate_fn([prompt_texts[i] for i in batch])
    if len(outputs) != len(batch):
      raise ValueError(f"harness.py: generate_fn returned {len(outputs)} completions for {len(batch)} prompts")
    for i, text in zip(batch, outputs):
      completions[i] = text
  return completions


def _extract(item, completion: str, style: str) -> str:
  if item.kind in ("cruxeval_o", "cruxeval_i"):
    return prompts.extract_cruxeval(completion, item.kind, style)
  if item.kind == "lcb":
    return prompts.extract_program(completion)
  return prompts.extract_math_answer(completion)


def _gold(item) -> str:
  return {"cruxeval_o": item.output, "cruxeval_i": item.output, "lcb": "", "math": item.answer}[item.kind]


def check_answers(items_by_benchmark, answers_by_benchmark, cfg, sandbox_pool=None, math_checker=None):
  """{name: [(correct, detail)]} for extracted answers; opens the sandbox/math pools it needs."""
  cfg = with_defaults(cfg)
  workers = cfg.num_workers or None
  kinds = {items[0].kind for items in items_by_benchmark.values() if items}
  own_pool = own_checker = None
  if sandbox_pool is None and kinds & {"cruxeval_o", "cruxeval_i", "lcb"}:
    from compassplay_jax.verifiers.sandbox import SandboxPool  # pylint: disable=g-import-not-at-top
    sandbox_pool = own_pool = SandboxPool(num_workers=workers).__enter__()
  if math_checker is None and "math" in kinds:
    math_checker = own_checker = MathChecker(num_workers=workers, timeout_s=cfg.math_timeout_s)
  try:
    verdicts = {}
    for name, items in items_by_benchmark.items():
      answers = answers_by_benchmark[name]
      if not items:
        verdicts[name] = []
      elif items[0].kind == "lcb":
        verdicts[name] = [(v.correct, v.detail) for v in
                          code_check.check_livecodebench(items, answers, sandbox_pool, cfg.lcb_timeout_s)]
      elif items[0].kind == "math":
        results = math_checker.verdicts([(item.answer, answer) for item, answer in zip(items, answers)])
        verdicts[name] = [(v == "correct", v) for v in results]
      else:
        verdicts[name] = [(v.correct, v.detail) for v in
                          code_check.check_cruxeval(items, answers, sandbox_pool, cfg.code_timeout_s,
                                                    cfg.equality)]
    return verdicts
  finally:
    if own_pool is not None:
      own_pool.__exit__(None, None, None)
    if own_checker is not None:
      own_checker.close()


def evaluate(generate_fn: GenerateFn | None, tokenizer, benchmarks=None, *, eval_config=None, step: int = 0,
             workdir=None, sandbox_pool=None, math_checker=None, generate_queue: GenerateQueue | None = None) -> dict:
  """Evaluates a policy on the benchmarks; returns the summary and writes outputs when a workdir is set.

  Args:
    generate_fn: prompts -> completions (greedy), called on batches of eval.batch_size prompts (every
      prompt gets the budget the function was built with); None when generate_queue is given.
    tokenizer: used only by prompt_style "chat" (its chat template); may be None otherwise.
    benchmarks: names (comma string or list), or {name: [EvalItem]} from `load_items` (loaded once by the
      training loop); None = eval_config.benchmarks.
    eval_config: the config.eval ConfigDict (missing fields take `default_eval_config()` values).
    step: training step, names the output folder <workdir>/eval/step_<step>/.
    workdir: overrides eval_config.workdir; no outputs are written when both are empty.
    sandbox_pool, math_checker: open pools to reuse across calls; by default each call opens its own.
    generate_queue: (prompts, budgets) -> completions, called once with every prompt and its budget
      (budgets_for): the rollout engine's path.

  Returns:
    The results.json dict: per-benchmark accuracy, in_domain_mean, out_of_domain_mean, and "out_dir".
  """
  cfg = with_defaults(eval_config)
  items_by_benchmark = benchmarks if isinstance(benchmarks, dict) else load_items(cfg, benchmarks)
  flat = [item for items in items_by_benchmark.values() for item in items]
  prompt_texts = [prompts.build_prompt(item, cfg.prompt_style, tokenizer) for item in flat]
  if (generate_fn is None) == (generate_queue is None):
    raise ValueError("harness.evaluate: pass exactly one of generate_fn and generate_queue")
  if generate_queue is not None:
    completions = list(generate_queue(prompt_texts, budgets_for(items_by_benchmark, cfg)))
    if len(completions) != len(prompt_texts):
      raise ValueError(f"harness.py: generate_queue returned {len(completions)} completions for "
                       f"{len(prompt_texts)} prompts")
  else:
    completions = generate_all(generate_fn, prompt_texts, max(1, int(cfg.batch_size)), cfg.progress)

  answers, offset = {}, 0
  for name, items in items_by_benchmark.items():
    answers[name] = [_extract(item, completions[offset + k], cfg.prompt_style) for k, item in enumerate(items)]
    offset += len(items)
  verdicts = check_answers(items_by_benchmark, answers, cfg, sandbox_pool, math_checker)

  predictions, offset = [], 0
  for name, items in items_by_benchmark.items():
    for k, item in enumerate(items):
      correct, detail = verdicts[name][k]
      predictions.append({
          "benchmark": name, "id": item.item_id, "correct": bool(correct), "detail": detail,
          "extracted": answers[name][k], "gold": _gold(item), "prompt": prompt_texts[offset + k],
          "completion": completions[offset + k]})
    offset += len(items)
  summary = report.summarize({name: [c for c, _ in v] for name, v in verdicts.items()}, step)
  out_root = workdir or cfg.workdir
  if out_root:
    out_dir = report.write_step_results(report.step_dir(out_root, step), summary, predictions)
    summary["out_dir"] = str(out_dir)
  return summary
