"""Proposer and solver prompts for the three AZR coding tasks (our wording, AZR's content and tags).

Every prompt is wrapped by `wrap` (AZR's single user turn ending in
'Assistant: <think>'; no system prompt, no chat tokens). Payloads sit in
fenced blocks inside <answer>: ```python, ```input, ```output, ```message, and
```input_i / ```output_i for induction pairs.
"""
from typing import Sequence

from compassplay_jax.domains.coding import tasks
from compassplay_jax.domains.coding import validation

WRAPPER = (
    "A conversation between User and Assistant. The User asks a question and the Assistant "
    "solves it. The Assistant first reasons in its mind and then gives the answer. The reasoning "
    "and the answer are enclosed in <think> </think> and <answer> </answer> tags, i.e. <think> "
    "reasoning here </think> <answer> answer here </answer>. User: {prompt}\nAssistant: <think>")

_RULES = (
    "Requirements for the code:\n"
    "- Define exactly one function named `f` taking at least one argument and returning a value; "
    "put imports and any helper classes at the top.\n"
    "- It must be deterministic: no randomness, dates or times, file or network I/O, printing, "
    "or external state.\n"
    "- It must finish within 10 seconds.\n"
    "- Do not use these words anywhere, even in comments: {banned}.\n")


def wrap(prompt: str) -> str:
  return WRAPPER.format(prompt=prompt)


def _banned_text():
  return ", ".join(dict.fromkeys(validation.AZR_BANNED_MODULES))


def render_reference(i: int, task: tasks.CodingTask) -> str:
  return (f"<snippet_{i}>\n```python\n{task.program}\n```\n```input\n{task.input}\n```\n"
          f"```output\n{task.output}\n```\n</snippet_{i}>")


def proposer_prompt(task_type: str, references: Sequence[tasks.CodingTask] = (),
                    program: str = "", num_inputs: int = 10) -> str:
  """Unwrapped proposer prompt. Deduction/abduction show K references; induction one program."""
  rules = _RULES.format(banned=_banned_text())
  if task_type == tasks.INDUCTION:
    return (
        "## Task: Write inputs and a message for a code snippet so that another model can infer "
        "the function from input/output pairs.\n\n"
        f"Write {num_inputs} inputs that produce diverse outputs when plugged into the snippet "
        "below, plus a message that hints at what the function does without giving it away. "
        "Each input is the argument list of one call, as Python literals.\n\n"
        f"### Snippet:\n```python\n{program}\nf(<|YOUR INPUT WILL BE PLUGGED HERE|>)\n```\n\n"
        "### Answer format (inside <answer>):\n```input\narg1, arg2, ...\n```\n(one ```input "
        f"block per input, {num_inputs} in all)\n```message\nyour message\n```\n\n"
        "First plan which inputs best reveal the function, then write them and the message.")
  if task_type not in (tasks.DEDUCTION, tasks.ABDUCTION):
    raise ValueError(f"task_type must be one of {tasks.TASK_TYPES}, got {task_type!r}")
  # AZR swaps the difficulty sentences between these two prompts; we keep that.
  target, hard = (("output", "your ```input```") if task_type == tasks.DEDUCTION
                  else ("input", "the output"))
  refs = "\n".join(render_reference(i, t) for i, t in enumerate(references))
  return (
      f"## Task: Create a new Python code snippet and one input for it, so that a solver must "
      f"deduce the {target}.\n\n"
      "Write a function `f` and one input (its argument list, as Python literals). The pair "
      f"should be challenging: judge it by the difficulty in predicting {hard}, and by its "
      "creativity and clarity. It should differ from the references below.\n\n" + rules +
      "\n### Answer format (inside <answer>):\n```python\ndef f(...):\n    ...\n```\n"
      "```input\narg1, arg2, ...\n```\n\n"
      "First plan a clear, novel snippet and input, then write the final code snippet and its "
      f"input.\n\n### Reference Code Snippets:\n{refs}")


def solver_prompt(task: tasks.CodingTask) -> str:
  """Unwrapped solver prompt for a validated task."""
  if task.type == tasks.DEDUCTION:
    return (
        "# Task: Deduce the output of a Python code snippet for a given input\n"
        "Think step by step and predict what the snippet returns for the input. Put the output "
        "in ```output``` tags. Write strings with quotes and several return values as a tuple.\n\n"
        f"# Code Snippet:\n```python\n{task.program}\n```\n\n# Input:\n```input\n{task.input}\n"
        "```\n\n# Example Output:\n```output\n{'age': 20, 'city': 'New York'}\n```")
  if task.type == tasks.ABDUCTION:
    return (
        "# Task: Find an input that makes a Python code snippet return the given output\n"
        "Think step by step and give one possible input (the argument list of f, as Python "
        "literals) in ```input``` tags.\n\n"
        f"# Code Snippet:\n```python\n{task.program}\n```\n\n# Output:\n```output\n{task.output}"
        "\n```\n\n# Example Input:\n```input\n'John', {'age': 20, 'city': 'New York'}\n```")
  pairs = "\n".join(f"```input_{i}\n{x}\n```\n```output_{i}\n{y}\n```"
                    for i, (x, y) in enumerate(task.visible_pairs))
  return (
      "# Task: Write the Python function that maps these inputs to these outputs\n"
      "Infer the function from the input/output pairs and the message, then write it in a "
      "```python``` block. Name your entry function `f()`!!!\n\n" +
      _RULES.format(banned=_banned_text()) +
      f"\n# Input/Output pairs:\n{pairs}\n\n# Message:\n```message\n{task.message}\n```")
