"""Evaluation prompts and answer extraction, as AZR's evaluation uses them (docs/paper_settings.md §6).

Prompt styles (config.eval.prompt_style), chosen per model family:
  "azr"        AZR self-play models: the R1-style wrapper as the user turn; code tasks end in
               "Assistant: <think>", math uses AZR's `azr` template (ends "Assistant:").
  "azr_boxed"  as "azr", but the math template asks for a \\boxed{} answer (AZR used it for Coder-7B).
  "azr_think"  as "azr", but the math template also ends in "Assistant: <think>".
  "chat"       base/instruct models: the tokenizer's own chat template; math uses Qwen's "qwen-boxed"
               wording (system "You are a helpful assistant.", "Please reason step by step ...").

The CRUXEval predictor prompts and the wrapper are Absolute Zero Reasoner's
(https://github.com/LeapLabTHU/Absolute-Zero-Reasoner, MIT licence, Copyright (c) 2025 LeapLab), kept
in domains/coding/azr_prompts.py with the licence notice and shared with training.
"""
import re

from compassplay_jax.domains.coding import azr_prompts
from compassplay_jax.evals.benchmarks import EvalItem, last_boxed

PROMPT_STYLES = ("azr", "azr_boxed", "azr_think", "chat")

# AZR's wrapper (process_data.py L51, without its final " <think>") and CRUXEval predictor prompts:
# the one copy training uses too (domains/coding/azr_prompts.py), so train and eval prompts agree.
_AZR_WRAPPER = azr_prompts.INSTRUCTION_FOLLOWING.removesuffix(" <think>")
_CODE_OUTPUT_PREDICTOR = azr_prompts.CODE_OUTPUT_PREDICTOR_PROMPT
_CODE_INPUT_PREDICTOR = azr_prompts.CODE_INPUT_PREDICTOR_PROMPT

# LiveCodeBench's generic code-generation prompt (lcb_runner/prompts/code_generation.py), as the AZR style
# puts it inside the wrapper.
_LCB_SYSTEM = ("You are an expert Python programmer. You will be given a question (problem specification) and "
               "will generate a correct Python program that matches the specification and passes all tests.")
_LCB_WITH_STARTER = ("You will use the following starter code to write the solution to the problem and enclose "
                     "your code within delimiters.")
_LCB_WITHOUT_STARTER = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the "
    "sample inputs). Enclose your code within delimiters as follows. Ensure that when the python program runs, "
    "it reads the inputs, runs the algorithm and writes output to STDOUT.")

_BOXED_SUFFIX = " And your final answer will be extracted automatically by the \\boxed{} tag."
_QWEN_BOXED_SYSTEM = "You are a helpful assistant."
_QWEN_BOXED_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def _lcb_body(item: EvalItem) -> str:
  body = f"{_LCB_SYSTEM}\n\n### Question:\n{item.question}\n\n"
  if item.starter_code.strip():
    body += f"### Format: {_LCB_WITH_STARTER}\n```python\n{item.starter_code}\n```\n\n"
  else:
    body += f"### Format: {_LCB_WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
  return body + "### Answer: (use the provided format with backticks)\n"


def task_body(item: EvalItem) -> str:
  """The user-turn text of one item, before any wrapper or chat template."""
  if item.kind == "cruxeval_o":
    return _CODE_OUTPUT_PREDICTOR.format(snippet=item.code, input_args=item.input)
  if item.kind == "cruxeval_i":
    return _CODE_INPUT_PREDICTOR.format(snippet=item.code, output=item.output)
  if item.kind == "lcb":
    return _lcb_body(item)
  if item.kind == "math":
    return item.question
  raise ValueError(f"prompts.py: unknown item kind {item.kind!r}")


def build_prompt(item: EvalItem, style: str = "azr", tokenizer=None) -> str:
  """The full prompt text for `item` in `style` (see the module docstring)."""
  if style not in PROMPT_STYLES:
    raise ValueError(f"eval.prompt_style: unknown style {style!r} (known: {', '.join(PROMPT_STYLES)})")
  body = task_body(item)
  if style == "chat":
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
      raise ValueError("eval.prompt_style: 'chat' needs a tokenizer with a chat template")
    messages = [{"role": "user", "content": body}]
    if item.kind == "math":
      messages = [{"role": "system", "content": _QWEN_BOXED_SYSTEM},
                  {"role": "user", "content": body + _QWEN_BOXED_SUFFIX}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  if item.kind == "math":
    if style == "azr_boxed":
      body += _BOXED_SUFFIX
    return _AZR_WRAPPER.format(body) + (" <think>" if style == "azr_think" else "")
  return _AZR_WRAPPER.format(body) + " <think>"  # Code tasks always start inside <think>, as in training.


# ---------------------------------------------------------------- extraction


def answer_text(completion: str, style: str) -> str:
  """AZR: the content of the last <answer> tag ('' without one); chat styles: the whole completion."""
  if style == "chat":
    if "<answer>" in completion:
      return completion.split("<answer>")[-1].split("</answer>")[0].strip()
    return completion.strip()
  if "<answer>" not in completion:
    return ""
  return completion.split("<answer>")[-1].split("</answer>")[0].strip()


def _last_fenced(text: str, tag: str) -> str | None:
  blocks = re.findall(rf"```{tag}\s*\n?(.*?)\n?```", text, re.DOTALL | re.IGNORECASE)
  return blocks[-1].strip() if blocks else None


def extract_cruxeval(completion: str, kind: str, style: str = "azr") -> str:
  """The predicted output (cruxeval_o) or input (cruxeval_i) source text, as AZR extracts it."""
  answer = answer_text(completion, style)
  tag = "output" if kind == "cruxeval_o" else "input"
  block = _last_fenced(answer, tag)
  if block is not None:
    return block
  match = re.search(rf"#\s*{tag}:\s*(.*)", answer, re.IGNORECASE | re.DOTALL)
  if match:
    return match.group(1).strip()
  return answer.strip().strip("`").strip()


def extract_program(completion: str) -> str:
  """The program of a LiveCodeBench answer: the last ```python block (else the last fenced block).

  Like lcb_runner's AZR style, it looks inside <answer> when there is one and in the whole text otherwise.
  """
  answer = answer_text(completion, "chat")
  block = _last_fenced(answer, "python")
  if block is None:
    blocks = re.findall(r"```[^\n`]*\n(.*?)```", answer, re.DOTALL)
    block = blocks[-1].strip() if blocks else ""
  return block


def extract_math_answer(completion: str) -> str:
  """AZR's extract_azr_answer: <answer> content (its last box if boxed), else last box, else first \\[..\\]."""
  if "<answer>" in completion:
    answer = completion.split("<answer>")[-1].split("</answer>")[0].strip()
    if "boxed" in answer:
      answer = last_boxed(answer) or ""
  elif "boxed" in completion:
    answer = last_boxed(completion) or ""
  else:
    match = re.search(r"\\\[(.*?)\\\]", completion, re.DOTALL)
    answer = match.group(1) if match else ""
  return _strip_answer(answer)


def _strip_answer(answer: str) -> str:
  # A light strip_string: math-verify normalises the rest (spacing, \left/\right, \dfrac, ...).
  answer = answer.strip().rstrip(".").strip()
  return answer.strip("$").strip()
