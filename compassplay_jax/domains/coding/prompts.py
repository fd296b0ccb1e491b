"""Proposer and solver prompts for the three AZR coding tasks: AZR's own text (azr_prompts.py).

Styles "plain" (the paper config) and "chat" use these; "compact" (the demo and tiny configs) uses
settings/coding/compact_prompts.py instead, because a 135M model does not follow AZR's long prompts.
`wrap` is AZR's single user turn ending in 'Assistant: <think>' (no system prompt, no chat tokens),
the same wrapper evaluation uses (evals/prompts.py). Payloads sit in fenced blocks inside <answer>:
```python, ```input, ```output, ```message, and ```input_i / ```output_i for induction pairs.
"""
from typing import Sequence

from compassplay_jax.domains.coding import azr_prompts
from compassplay_jax.domains.coding import tasks
from compassplay_jax.domains.coding import validation

# Our task types -> AZR's problem types.
AZR_TYPES = {tasks.DEDUCTION: azr_prompts.CODE_O, tasks.ABDUCTION: azr_prompts.CODE_I,
             tasks.INDUCTION: azr_prompts.CODE_F}


def wrap(prompt: str) -> str:
  """AZR's instruction_following wrapper around one unwrapped prompt."""
  return azr_prompts.instruction_following(prompt)


def proposer_prompt(task_type: str, references: Sequence[tasks.CodingTask] = (),
                    program: str = "", num_inputs: int = 10) -> str:
  """Unwrapped proposer prompt. Deduction/abduction show the K references; induction one program.

  AZR renders its banned_words list as it is in its config (`datetime` twice), and keeps its swapped
  difficulty sentences (the abduction prompt speaks of predicting the output and vice versa).
  """
  if task_type not in AZR_TYPES:
    raise ValueError(f"task_type must be one of {tasks.TASK_TYPES}, got {task_type!r}")
  if task_type == tasks.INDUCTION:
    refs = [(program, "", "")]
  else:
    refs = [(t.program, t.input, t.output) for t in references]
  return azr_prompts.generator_prompt(AZR_TYPES[task_type], refs, validation.AZR_BANNED_MODULES, num_inputs)


def solver_prompt(task: tasks.CodingTask) -> str:
  """Unwrapped solver prompt for a validated task (induction shows only the visible pairs)."""
  return azr_prompts.predictor_prompt(AZR_TYPES[task.type], task.program, task.input, task.output,
                                      task.message, task.visible_pairs)
