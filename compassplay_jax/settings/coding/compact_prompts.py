"""Short proposer and solver prompts for small models (coding.prompt_style = "compact").

AZR's prompts (domains/coding/azr_prompts.py, the paper config's) run to ~890 SmolLM2 tokens for a
proposer with two one-line references and ~250 for a solver. A 135M model gets nothing from the long
rules, and every prompt token is paid again in each forward/backward pass of the update, the reference
and the cosines; these keep the same content (the task, the references, the answer fence) in ~80-150
tokens. Used with the response scaffolds (proposer_prefix, input_scaffold, solver_prefix), which write
AZR's <think>/<answer> format.
Deduction and abduction only.
"""
from __future__ import annotations

from typing import Sequence

from compassplay_jax.domains.coding import tasks

TASK_TYPES = (tasks.DEDUCTION, tasks.ABDUCTION)


def proposer_prompt(task_type: str, references: Sequence[tasks.CodingTask]) -> str:
  """Asks for one new small function and an input, showing the references as examples."""
  if task_type not in TASK_TYPES:
    raise ValueError(f"compact prompts: task type {task_type!r} is not one of {TASK_TYPES}")
  examples = "\n\n".join(f"```python\n{t.program}\n```\n```input\n{t.input}\n```" for t in references)
  goal = "its output" if task_type == tasks.DEDUCTION else "an input from its output"
  return (f"Write a new short Python function `f` with one argument, and one input for it, so that a "
          f"student can work out {goal}. Examples:\n\n{examples}")


# The two worked examples every compact solver prompt shows before its task: (return expression of
# `def f(x)`, input, output). Seed programs must not be one of these (a solver would copy the answer;
# tests/test_compact_prompts.py); docs/demo.md lists them.
WORKED_EXAMPLES = (("x + 1", "2", "3"), ("x * 3", "'ab'", "'ababab'"))


def worked_example_program(body: str) -> str:
  return f"def f(x):\n    return {body}"


def _block(task_type: str, program: str, given: str) -> str:
  fence = "input" if task_type == tasks.DEDUCTION else "output"
  return f"```python\n{program}\n```\n```{fence}\n{given}\n```\n"


def solver_prompt(task: tasks.CodingTask, response_prefix: str) -> str:
  """Plain text, not a chat turn: two worked examples, each the task and the full response (written
  with `response_prefix`, the solver's scaffold with {block}), then the task, to be continued by the
  scaffold. Measured on SmolLM2-135M: a chat-turn question gets prose back; this pattern gets values."""
  if task.type not in TASK_TYPES:
    raise ValueError(f"compact prompts: task type {task.type!r} is not one of {TASK_TYPES}")
  answer_block = "output" if task.type == tasks.DEDUCTION else "input"
  shots = []
  for body, x, y in WORKED_EXAMPLES:
    given, answer = (x, y) if task.type == tasks.DEDUCTION else (y, x)
    shots.append(_block(task.type, worked_example_program(body), given) +
                 response_prefix.format(block=answer_block) + f"{answer}\n```\n</answer>")
  given = task.input if task.type == tasks.DEDUCTION else task.output
  return "\n\n".join(shots) + "\n\n" + _block(task.type, task.program, given)
