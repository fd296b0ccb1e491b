"""Pure-text parsing of proposer and solver outputs (AZR's regexes; nothing is executed here).

Model text is hostile: every function here takes any str (non-str gives the
"absent" answer), runs in time linear in the text (no regex that backtracks
over the whole text once per candidate start), and never raises. Texts longer
than MAX_RESPONSE_CHARS have no answer.
"""
import json
import re
from typing import List, Optional, Tuple

# Far above any generation length (AZR: 8096 tokens); longer text is not parsed at all.
MAX_RESPONSE_CHARS = 1 << 18
_FLAGS = re.DOTALL | re.IGNORECASE
_CODE_RE = re.compile(r"```(?:python\s*)?\n?(.*?)\n?```", _FLAGS)
_INPUT_RE = re.compile(r"```input\s*\n?(.*?)\n?```", _FLAGS)
_MESSAGE_RE = re.compile(r"```message\s*\n?(.*?)\n?```", _FLAGS)
# AZR's r"^\s*def\s+(\w+)\s*\(" finds the same defs; [^\S\n] keeps blank-line runs linear.
_DEF_RE = re.compile(r"^[^\S\n]*def\s+(\w+)\s*\(", re.MULTILINE)
_THINK_THEN_ANSWER_RE = re.compile(r"</think>\s*<answer>")
_ANY_FENCE_RE = re.compile(r"```(?:\w+)?\s*\n?(.*?)```", re.DOTALL)
_CLOSE_PAREN_AT_EOL_RE = re.compile(r"\)[^\S\n]*(?=\n|\Z)")


def _text(value) -> Optional[str]:
  return value if isinstance(value, str) and len(value) <= MAX_RESPONSE_CHARS else None


def extract_answer(response: str) -> str:
  """AZR: text between the last <answer> and the next </answer>; '' when there is no <answer>."""
  response = _text(response)
  if response is None or "<answer>" not in response:
    return ""
  return response.split("<answer>")[-1].split("</answer>")[0].strip()


def format_ok(response: str, prompt_opens_think: bool = True) -> bool:
  """AZR's <think>…</think><answer>…</answer> check; the prompt itself ends with '<think>'.

  Same result as re.match(r"(?s)<think>.*?</think>\s*<answer>.*?</answer>"), found with
  one linear search: the earliest '</think>\s*<answer>' then any later '</answer>'.
  Trailing text after </answer> is allowed, as in AZR.
  """
  response = _text(response)
  if response is None:
    return False
  text = ("<think>" + response) if prompt_opens_think else response
  if not text.startswith("<think>"):
    return False
  found = _THINK_THEN_ANSWER_RE.search(text, len("<think>"))
  return found is not None and text.find("</answer>", found.end()) >= 0


def function_names(code: str) -> List[str]:
  """Every `def` line's name, nested defs and methods included (AZR counts them all)."""
  code = _text(code)
  return _DEF_RE.findall(code) if code is not None else []


def json_string_list(text, expected_len: int) -> Optional[List[str]]:
  """A JSON list of exactly expected_len strings, or None (deep nesting, bad JSON, wrong shape)."""
  if not isinstance(text, str) or len(text) > MAX_RESPONSE_CHARS * 4:
    return None
  try:
    values = json.loads(text)
  except Exception:  # pylint: disable=broad-except  (RecursionError on deep nesting, ValueError)
    return None
  if (not isinstance(values, list) or len(values) != expected_len
      or not all(isinstance(v, str) for v in values)):
    return None
  return values


def parse_code_and_input(answer: str) -> Optional[Tuple[str, str]]:
  """Deduction/abduction proposer: (program, input) or None.

  As in AZR the FIRST fenced block is the program (so it must be the python
  block) and the first ```input block is the input, with '# Input:' as fallback.
  """
  answer = _text(answer)
  if answer is None:
    return None
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
  answer = _text(answer)
  if answer is None:
    return None
  inputs = [m.strip() for m in _INPUT_RE.findall(answer)]
  if len(inputs) < num_inputs:
    return None
  message = _MESSAGE_RE.search(answer)
  if message:
    text = message.group(1)
  else:
    text = _between_tags(answer, "message")
    if text is None:
      fallback = re.search(r"#\s*Message:\s*(.*)", answer, _FLAGS)
      if not fallback:
        return None
      text = fallback.group(1)
  text = text.strip()
  if not text:
    return None
  return inputs[-num_inputs:], text


def _between_tags(text: str, tag: str) -> Optional[str]:
  """re.search(rf"<{tag}>(.*?)</{tag}>", re.S | re.I) without rescanning per '<tag>'."""
  opening = re.search(rf"<{tag}>", text, re.IGNORECASE)
  if not opening:
    return None
  closing = re.compile(rf"</{tag}>", re.IGNORECASE).search(text, opening.end())
  return text[opening.end():closing.start()] if closing else None


def _call_form(text: str, tag: str) -> Optional[str]:
  """re.search(rf"^{tag}\((.*)\)\s*$", re.S | re.I | re.M) in linear time.

  The first line starting with 'tag(' up to the LAST ')' that ends a line; if that
  first line has none after it, no later line can have one either.
  """
  start = re.search(rf"^{tag}\(", text, re.IGNORECASE | re.MULTILINE)
  if not start:
    return None
  ends = [m.start() for m in _CLOSE_PAREN_AT_EOL_RE.finditer(text, start.end())]
  return text[start.end():ends[-1]] if ends else None


def _solver_block(answer: str, tag: str) -> str:
  """Last ```tag block; fallbacks '# Tag:', 'tag(...)', '<tag>', 'the tag is', then the answer."""
  blocks = re.findall(rf"```{tag}\s*\n?(.*?)\n?```", answer, _FLAGS)
  if blocks:
    return blocks[-1].strip()
  found = re.search(rf"#\s*{tag}:\s*(.*)", answer, _FLAGS | re.MULTILINE)
  if found:
    return found.group(1).strip()
  for text in (_call_form(answer, tag), _between_tags(answer, tag)):
    if text is not None:
      return text.strip()
  found = re.search(rf"the {tag} is:?\s*(.*)", answer, _FLAGS | re.MULTILINE)
  if found:
    return found.group(1).strip()
  return answer.strip()


def parse_solver_output(answer: str) -> Optional[str]:
  """Deduction solver's predicted output text (None for non-text or oversized answers)."""
  answer = _text(answer)
  return _solver_block(answer, "output") if answer is not None else None


def parse_solver_input(answer: str) -> Optional[str]:
  """Abduction solver's proposed argument list text (None for non-text or oversized answers)."""
  answer = _text(answer)
  return _solver_block(answer, "input") if answer is not None else None


def parse_solver_program(answer: str) -> Optional[str]:
  """Induction solver: the LAST fenced block of the answer, or None."""
  answer = _text(answer)
  if answer is None:
    return None
  blocks = _ANY_FENCE_RE.findall(answer)
  return blocks[-1].strip() if blocks else None
