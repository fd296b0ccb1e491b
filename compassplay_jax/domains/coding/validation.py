"""Validation of proposed tasks: static checks here, execution only in the sandbox.

`validate_proposal` returns (valid, reason, task). A valid task has a program
defining exactly one function (renamed to `f`), no banned or dynamic imports,
no `input(` call, an input that is a plain value expression, and runs
deterministically: two calls on fresh arguments agree by != and by repr (AZR's
check, one process), and so do two calls in a job of the worker's second
interpreter (another hash seed and address layout), equal by ==, so no gold
depends on an address or a hash seed. The gold output is
repr(f(input)).strip(), truncated to 200 + '...' + 200 chars beyond 400 as in
AZR. Programs also pass `static_rules` (allow-listed modules
and builtins, no way to reach the interpreter's internals).

The sandbox returns what f returned as plain data (never text the program could
write); determinism, repr, truncation and text validity are decided here
(`values.gold_output`), and every text a task records is valid UTF-8, so no
recorded field can break the tokenizer.

Model output never makes these functions raise: any failure of a parse, a
sandbox run or a JSON step becomes an invalid verdict with a reason, counted in
(the caller counts them: `verdict_stats.tally`).
"""
import ast
import re
from typing import Optional, Sequence, Tuple

from compassplay_jax.domains.coding import jobs
from compassplay_jax.domains.coding import parsing
from compassplay_jax.domains.coding import static_rules
from compassplay_jax.domains.coding import tasks
from compassplay_jax.domains.coding import values

# AZR's banned_words (azr_ppo_trainer.yaml), matched against dotted import components.
AZR_BANNED_MODULES = ("logging", "random", "multiprocessing", "pebble", "subprocess", "threading",
                      "datetime", "time", "hashlib", "hmac", "bcrypt", "os.sys", "os.path",
                      "sys.exit", "os.environ", "calendar", "datetime")
# Ways to import without an import statement; always rejected.
_DYNAMIC_IMPORT_NAMES = frozenset(("__import__", "importlib", "__builtins__", "builtins", "eval",
                                   "exec", "compile", "__loader__", "__spec__"))
MAX_PROGRAM_CHARS = 20000
MAX_INPUT_CHARS = 5000
_INPUT_CALL_RE = re.compile(r"(\s|^)?input\(")

Result = Tuple[bool, str, Optional[tasks.CodingTask]]


def _module_hits(module: str, banned: Sequence[str]) -> Optional[str]:
  """AZR semantics (a banned word equal to a dotted component) plus dotted prefixes."""
  parts = module.split(".")
  for word in banned:
    if word in parts or module == word or module.startswith(word + "."):
      return word
  return None


MAX_AST_DEPTH = 400  # real programs stay far below (CRUXEval, AZR seeds: < 50)


def _ast_depth(tree) -> int:
  """The AST's depth, without recursion."""
  deepest, stack = 0, [(tree, 1)]
  while stack:
    node, depth = stack.pop()
    deepest = max(deepest, depth)
    stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
  return deepest


def safe_parse(code: str):
  """(tree, None) or (None, reason): ast.parse that never raises on model text.

  Deep nesting raises RecursionError or MemoryError inside the parser (bounded
  by its own stack limit), NUL bytes ValueError; all become a reason.
  """
  if not isinstance(code, str):
    return None, f"program is {type(code).__name__}, not str"
  try:
    tree = ast.parse(code)
    # Whether the parser itself gives up depends on the interpreter's recursion limit; a fixed bound
    # makes the verdict the same in every process and keeps later recursive passes safe.
    if _ast_depth(tree) > MAX_AST_DEPTH:
      return None, f"unparsable: nested deeper than {MAX_AST_DEPTH} (nested too deeply)"
    return tree, None
  except SyntaxError as e:
    return None, f"syntax error: {e.msg} (line {e.lineno})"
  except (RecursionError, MemoryError) as e:
    return None, f"unparsable: {type(e).__name__} (nested too deeply)"
  except Exception as e:  # pylint: disable=broad-except  (ValueError for NUL bytes, ...)
    return None, f"unparsable: {type(e).__name__}"


def banned_import_reason(code: str, banned: Sequence[str] = AZR_BANNED_MODULES) -> Optional[str]:
  """Reason the program imports a banned module or imports dynamically; None when clean."""
  tree, reason = safe_parse(code)
  if tree is None:
    return reason
  return _banned_import_reason(tree, banned)


def _banned_import_reason(tree, banned) -> Optional[str]:
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        word = _module_hits(alias.name, banned) or _module_hits(alias.name, _DYNAMIC_IMPORT_NAMES)
        if word:
          return f"banned import {alias.name!r} ({word})"
    elif isinstance(node, ast.ImportFrom):
      module = node.module or ""
      for alias in node.names:
        full = f"{module}.{alias.name}" if module else alias.name
        word = _module_hits(full, banned) or _module_hits(module, _DYNAMIC_IMPORT_NAMES)
        if word:
          return f"banned import {full!r} ({word})"
    elif isinstance(node, ast.Name) and node.id in _DYNAMIC_IMPORT_NAMES:
      return f"dynamic import mechanism {node.id!r}"
    elif isinstance(node, ast.Attribute) and node.attr in ("__import__", "import_module",
                                                            "modules", "__builtins__"):
      return f"dynamic import mechanism '.{node.attr}'"
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
        node.value in ("__import__", "__builtins__", "importlib")):
      return f"dynamic import mechanism {node.value!r} in a string"
  return None


def import_lines(code: str) -> Tuple[str, ...]:
  """Source of every import statement (nested ones too), as AZR's parse_imports collects."""
  tree, _ = safe_parse(code)
  if tree is None:
    return ()
  lines = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      try:
        text = ast.unparse(node)
      except Exception:  # pylint: disable=broad-except  (import lines are flat; never expected)
        continue
      if text not in lines:
        lines.append(text)
  return tuple(lines)


def static_check(program: str, *, reject_multiple_functions: bool = True,
                 banned: Sequence[str] = AZR_BANNED_MODULES) -> Tuple[Optional[str], str]:
  """(reason or None, program with its first function renamed to `f`)."""
  if not isinstance(program, str) or not program.strip():
    return "empty program", program
  if len(program) > MAX_PROGRAM_CHARS:
    return f"program longer than {MAX_PROGRAM_CHARS} chars", program
  names = parsing.function_names(program)
  if not names:
    return "no function definition", program
  if len(names) > 1 and reject_multiple_functions:
    return f"{len(names)} function definitions (exactly one allowed)", program
  if names[0] != "f":
    program = re.sub(rf"\b{re.escape(names[0])}\b", "f", program)
  tree, reason = safe_parse(program)
  if tree is None:
    return reason, program
  if _INPUT_CALL_RE.search(program):
    return "program contains 'input('", program
  reason = _banned_import_reason(tree, banned) or static_rules.unsafe_reason(tree)
  return reason, program


def _failure(result) -> str:
  return f"{result.status}: {result.error_type}: {(result.error_message or '')[:200]}"


def _run_reason(result, other, num_entries) -> Optional[str]:
  """Why a gold job and its second-interpreter job gave no outcomes to compare (None: they did)."""
  for run in (result, other):
    if not run.ok or run.outcomes is None:
      if run is result:
        return _failure(run)
      return f"error: NonDeterministic: in another process the job ended {run.status}"
    if len(run.outcomes) != num_entries:
      return "sandbox returned malformed outputs"
  return None


def _text_reason(*texts) -> Optional[str]:
  """A recorded text that is not valid UTF-8 (a lone surrogate would break the tokenizer)."""
  if not all(values.is_text(t) for t in texts):
    return "text is not valid UTF-8"
  return None


def _invalid(reason: str) -> Result:
  return False, reason, None


def validate_io_batch(pool, items, **static_kwargs):
  """Validates (task_type, program, input) triples for deduction/abduction in one pool batch."""
  outcomes = [None] * len(items)
  pending = []
  for i, (task_type, program, args) in enumerate(items):
    if task_type not in (tasks.DEDUCTION, tasks.ABDUCTION):
      raise ValueError(f"validate_io_batch takes deduction/abduction items, got {task_type!r}")
    try:
      reason, program = static_check(program, **static_kwargs)
      if reason is None and not isinstance(args, str):
        reason = f"input is {type(args).__name__}, not str"
      if reason is None and len(args) > MAX_INPUT_CHARS:
        reason = f"input longer than {MAX_INPUT_CHARS} chars"
      reason = reason or _text_reason(program, args)
    except Exception as e:  # pylint: disable=broad-except  (a bug here must not stop training)
      reason = f"static check failed: {type(e).__name__}"
    if reason is not None:
      outcomes[i] = _invalid(reason)
    else:
      pending.append((i, task_type, program, args))
  firsts = [jobs.gold_output_job(p, a) for _, _, p, a in pending]
  results = pool.run_batch(firsts + [jobs.second_gold_job(job) for job in firsts])
  for (i, task_type, program, args), result, other in zip(pending, results,
                                                          results[len(firsts):]):
    reason = _run_reason(result, other, 1)
    if reason is not None:
      outcomes[i] = _invalid(reason)
      continue
    gold, reason = values.gold_output(*result.outcomes[0], *other.outcomes[0])
    if gold is None:
      outcomes[i] = _invalid(reason)
      continue
    task = tasks.CodingTask(type=task_type, program=program, input=args, output=gold,
                            imports=import_lines(program))
    outcomes[i] = (True, "ok", task)
  return outcomes


def validate_proposal(pool, task_type: str, response: str, *, source_program: Optional[str] = None,
                      num_inputs: int = 10, **static_kwargs) -> Result:
  """Validates one proposer response (the text after the prompt's '<think>').

  Deduction/abduction: the answer holds a ```python program and an ```input.
  Induction: `source_program` is the buffer program shown to the proposer; the
  answer holds >= num_inputs ```input blocks (the last num_inputs are kept) and
  a ```message; every input must pass the determinism check; the first half of
  the pairs are visible to the solver, the rest hidden.
  """
  if task_type not in tasks.TASK_TYPES:
    raise ValueError(f"task_type must be one of {tasks.TASK_TYPES}, got {task_type!r}")
  if task_type == tasks.INDUCTION and source_program is None:
    raise ValueError("induction validation needs source_program")
  try:
    return _validate_proposal(pool, task_type, response, source_program, num_inputs,
                              static_kwargs)
  except Exception as e:  # pylint: disable=broad-except  (model output never crashes the trainer)
    return _invalid(f"validation error: {type(e).__name__}")


def _validate_proposal(pool, task_type, response, source_program, num_inputs, static_kwargs):
  answer = parsing.extract_answer(response)
  if not answer:
    return _invalid("no <answer> content")
  if task_type in (tasks.DEDUCTION, tasks.ABDUCTION):
    parsed = parsing.parse_code_and_input(answer)
    if parsed is None:
      return _invalid("missing ```python or ```input block")
    return validate_io_batch(pool, [(task_type, parsed[0], parsed[1])], **static_kwargs)[0]
  parsed = parsing.parse_inputs_and_message(answer, num_inputs)
  if parsed is None:
    return _invalid(f"fewer than {num_inputs} ```input blocks or no message")
  inputs, message = parsed
  if any(len(text) > MAX_INPUT_CHARS for text in inputs):
    return _invalid(f"an input is longer than {MAX_INPUT_CHARS} chars")
  reason = _text_reason(message, *inputs)
  if reason:
    return _invalid(reason)
  job = jobs.gold_outputs_job(source_program, inputs)
  result, other = pool.run_batch([job, jobs.second_gold_job(job)])
  reason = _run_reason(result, other, len(inputs))
  if reason is not None:
    return _invalid(reason)
  outputs = []
  for calls, again in zip(result.outcomes, other.outcomes):
    gold, reason = values.gold_output(*calls, *again)
    if gold is None:
      return _invalid(reason)
    outputs.append(gold)
  task = tasks.CodingTask(type=tasks.INDUCTION, program=source_program, inputs=tuple(inputs),
                          outputs=tuple(outputs), message=message,
                          imports=import_lines(source_program), num_visible=len(inputs) // 2)
  return True, "ok", task
