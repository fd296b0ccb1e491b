"""Pure-text parsing of proposer and solver outputs (AZR's regexes; nothing is executed here)."""
import re
from typing import List, Optional, Tuple

_FLAGS = re.DOTALL | re.IGNORECASE
_CODE_RE = re.compile(r"```(?:python\s*)?\n?(.*?)\n?```", _FLAGS)
_INPUT_RE = re.compile(r"```input\s*\n?(.*?)\n?```", _FLAGS)
_MESSAGE_RE = re.compile(r"```message\s*\n?(.*?)\n?```", _FLAGS)
_DEF_RE = re.compile(r"^\s*def\s+(\w+)\s*\(", re.MULTILINE)
_FORMAT_RE = re.compile(r"(?s)<think>.*?</think>\s*<answer>.*?</answer>")
_ANY_FENCE_RE = re.compile(r"```(?:\w+)?\s*\n?(.*?)```", re.DOTALL)


def extract_answer(response: str) -> str:
  """AZR: text between the last <answer> and the next </answer>; '' when there is no <answer>."""
  if "<answer>" not in response:
    return ""
  return response.split("<answer>")[-1].split("</answer>")[0].strip()


def format_ok(response: str, prompt_opens_think: bool = True) -> bool:
  """AZR's <think>…</think><answer>…</answer> check; the prompt itself ends with '<think>'.

  Trailing text after </answer> is allowed, as in AZR.
  """
  text = ("<think>" + response) if prompt_opens_think else response
  return _FORMAT_RE.match(text) is not None


def function_names(code: str) -> List[str]:
  """Every `def` line's name, nested defs and methods included (AZR counts them all)."""
  return _DEF_RE.findall(code)


def parse_code_and_input(answer: str) -> Optional[Tuple[str, str]]:
  """Deduction/abduction proposer: (program, input) or None.

  As in AZR the FIRST fenced block is the program (so it must be the python
  block) and the first ```input block is the input, with '# Input:' as fallback.
  """
  code = _CODE_RE.search(answer)
  if not code:
    return None
  found = _INPUT_RE.search(answer)
  if found:
    text = found.group(1)
  else:
    fallback = re.search(r"#\s*Input:\s*(.*)", answer, re.IGNORECASE)
    if not fallback:
      return None
    text = fallback.group(1)
  return code.group(1).strip(), text.strip()


def parse_inputs_and_message(answer: str, num_inputs: int = 10) -> Optional[Tuple[List[str], str]]:
  """Induction proposer: (last `num_inputs` ```input blocks, message) or None if too few / no message."""
  inputs = [m.strip() for m in _INPUT_RE.findall(answer)]
  if len(inputs) < num_inputs:
    return None
  message = _MESSAGE_RE.search(answer)
  if message:
    text = message.group(1)
  else:
    fallback = (re.search(r"<message>(.*?)</message>", answer, _FLAGS)
                or re.search(r"#\s*Message:\s*(.*)", answer, _FLAGS))
    if not fallback:
      return None
    text = fallback.group(1)
  text = text.strip()
  if not text:
    return None
  return inputs[-num_inputs:], text


def _solver_block(answer: str, tag: str) -> str:
  """Last ```tag block; fallbacks '# Tag:', 'tag(...)', '<tag>', 'the tag is', then the answer."""
  blocks = re.findall(rf"```{tag}\s*\n?(.*?)\n?```", answer, _FLAGS)
  if blocks:
    return blocks[-1].strip()
  for pattern in (rf"#\s*{tag}:\s*(.*)", rf"^{tag}\((.*)\)\s*$", rf"<{tag}>(.*?)</{tag}>",
                  rf"the {tag} is:?\s*(.*)"):
    found = re.search(pattern, answer, _FLAGS | re.MULTILINE)
    if found:
      return found.group(1).strip()
  return answer.strip()


def parse_solver_output(answer: str) -> str:
  """Deduction solver's predicted output text."""
  return _solver_block(answer, "output")


def parse_solver_input(answer: str) -> str:
  """Abduction solver's proposed argument list text."""
  return _solver_block(answer, "input")


def parse_solver_program(answer: str) -> Optional[str]:
  """Induction solver: the LAST fenced block of the answer, or None."""
  blocks = _ANY_FENCE_RE.findall(answer)
  return blocks[-1].strip() if blocks else None
