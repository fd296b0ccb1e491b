"""The coding task record shared by prompts, validation, checking and buffers."""
import dataclasses
from typing import Tuple

DEDUCTION = "deduction"  # AZR code_o: predict the output.
ABDUCTION = "abduction"  # AZR code_i: predict an input.
INDUCTION = "induction"  # AZR code_f: write the function from I/O pairs and a message.
TASK_TYPES = (DEDUCTION, ABDUCTION, INDUCTION)


@dataclasses.dataclass(frozen=True)
class CodingTask:
  """A validated task. Values are Python source text, never live objects.

  Deduction/abduction use `input` (argument list, e.g. "'ab', 3") and `output`
  (the gold repr, truncated as AZR does). Induction uses `inputs`/`outputs`
  (all pairs; the first `num_visible` are shown to the solver, the rest are
  hidden tests) and `message`. `imports` are the program's import lines, which
  AZR prepends to an induction solver's program.
  """
  type: str
  program: str
  input: str = ""
  output: str = ""
  inputs: Tuple[str, ...] = ()
  outputs: Tuple[str, ...] = ()
  message: str = ""
  imports: Tuple[str, ...] = ()
  num_visible: int = 0

  def __post_init__(self):
    if self.type not in TASK_TYPES:
      raise ValueError(f"CodingTask.type must be one of {TASK_TYPES}, got {self.type!r}")
    if len(self.inputs) != len(self.outputs):
      raise ValueError(f"CodingTask has {len(self.inputs)} inputs but {len(self.outputs)} outputs")

  @property
  def visible_pairs(self):
    return list(zip(self.inputs[:self.num_visible], self.outputs[:self.num_visible]))

  @property
  def hidden_pairs(self):
    return list(zip(self.inputs[self.num_visible:], self.outputs[self.num_visible:]))
