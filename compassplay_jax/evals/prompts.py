"""Evaluation prompts and answer extraction, as AZR's evaluation uses them (docs/paper_settings.md §6).

Prompt styles (config.eval.prompt_style), chosen per model family:
  "azr"        AZR self-play models: the R1-style wrapper as the user turn; code tasks end in
               "Assistant: <think>", math uses AZR's `azr` template (ends "Assistant:").
  "azr_boxed"  as "azr", but the math template's system text ends with AZR's sentence that the answer is
               read from a \\boxed{} tag, before "User:" (AZR evaluates Coder-7B with it; the paper config).
  "azr_think"  as "azr", but the math template also ends in "Assistant: <think>".
  "chat"       base/instruct models: the tokenizer's own chat template; math uses Qwen's "qwen-boxed"
               wording (system "You are a helpful assistant.", "Please reason step by step ...").

The CRUXEval predictor prompts and the wrapper are Absolute Zero Reasoner's
(https://github.com/LeapLabTHU/Absolute-Zero-Reasoner, MIT licence, Copyright (c) 2025 LeapLab), kept
in domains/coding/azr_prompts.py with the licence notice and shared with training.
"""
import re

from compassplay_jax.domains.coding import azr_prompts
from compassplay_jax.domains.coding import parsing
from compassplay_jax.evals.benchmarks import EvalItem

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

# AZR's math templates (evaluation/math_eval/eval/utils.py L171-185, paper branch 41ed983): `azr` is the
# wrapper with "User: {input}\nAssistant:" (L172); `azr_boxed` (L182) puts this sentence between the
# wrapper's "</answer>." and "User:", not after the question; construct_prompt (L293) strips spaces at the
# ends. run.sh L32 evaluates AZR-Coder-7B with azr_boxed, every other AZR model with azr.
_BOXED_SENTENCE = " And your final answer will be extracted automatically by the \\boxed{} tag."
_AZR_BOXED_WRAPPER = _AZR_WRAPPER.replace(" User: {}", _BOXED_SENTENCE.replace("{}", "{{}}") + " User: {}")
_QWEN_BOXED_SYSTEM = "You are a helpful assistant."
_QWEN_BOXED_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def _lcb_body(item: EvalItem) -> str:
  body = f"{_LCB_SYSTEM}\n\n### Question:\n{item.question}\n\n"
  if item.starter_code.strip():
    body += f"### Format: {_LCB_WITH_STARTER}\n```python\n{item.starter_code}\n```\n\n"
  else:
    body += f"### Format: {_LCB_WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
  return body + "### Answer: (use the provided format with backticks)\n"


def math_question(item: EvalItem) -> str:
  """The question as AZR's parse_question gives it (evaluation/math_eval/eval/parser.py L671-685): stripped,
  with " (True or False)" / " (Yes or No)" added when the gold answer is one of those words."""
  question = item.question
  gold = item.answer.lower()
  if gold in ("true", "false"):
    question += " (True or False)"
  if gold in ("yes", "no"):
    question += " (Yes or No)"
  return question.strip()


def task_body(item: EvalItem) -> str:
  """The user-turn text of one item, before any wrapper or chat template."""
  if item.kind == "cruxeval_o":
    return _CODE_OUTPUT_PREDICTOR.format(snippet=item.code, input_args=item.input)
  if item.kind == "cruxeval_i":
    return _CODE_INPUT_PREDICTOR.format(snippet=item.code, output=item.output)
  if item.kind == "lcb":
    return _lcb_body(item)
  if item.kind == "math":
    return math_question(item)
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
    wrapper = _AZR_BOXED_WRAPPER if style == "azr_boxed" else _AZR_WRAPPER
    return (wrapper.format(body) + (" <think>" if style == "azr_think" else "")).strip(" ")
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


# AZR's solver-answer parsing for its code validation (absolute_zero_reasoner, paper branch 41ed983):
# reward_managers.py L142 takes the text after the prompt's "Assistant:" (reward_fn.splitter,
# configs/azr_ppo_trainer.yaml L186) up to any later one, stripped of spaces and quotes; L143 reads its
# <answer> (custom_evaluate.py L86-98, extraction "answer_conditional" in coder7b.sh L60, boxed_retry False:
# no <answer>, no answer); L300/L310 score the format (custom_evaluate.py L113-123: the generation must
# match <think>...</think> <answer>...</answer>) and L462 gives 0 without it; L295/L305 then take the
# input or output with extract_input_output (L76-119): its fallbacks below, in order, the last match of
# the first that matches, else the whole <answer> content.
_AZR_SPLITTER = "Assistant:"
_AZR_FALLBACKS = {
    "input": (r"```input\s*\n?(.*?)\n?```", r"# Input:\s*(.*?)(?=\n```|$)", r"input\s*\((.*?)\)",
              r"<input>\s*(.*?)(?:</input>|\s*$)", r"the input is\s*(.*?)\.?$"),
    "output": (r"```output\s*\n?(.*?)\n?```", r"# Output:\s*(.*?)(?=\n```|$)", r"output\s*\((.*?)\)",
               r"<output>\s*(.*?)(?:</output>|\s*$)", r"the output is\s*(.*?)\.?$"),
}


def azr_generation(completion: str) -> str:
  """The text AZR scores for a code prompt ending "Assistant: <think>" (reward_managers.py L142)."""
  return ("<think>" + completion).split(_AZR_SPLITTER)[0].strip().strip("\"'")


def azr_format_ok(generation: str) -> bool:
  """custom_evaluate.py L118-119: re.match(r"(?s)<think>.*?</think>\s*<answer>.*?</answer>", generation)."""
  return parsing.format_ok(generation, prompt_opens_think=False)


def azr_extract_input_output(content: str, tag: str) -> str:
  """reward_managers.py L76-119 (extract_input_output): `tag` is "input" or "output"."""
  flags = re.DOTALL | re.IGNORECASE
  for pattern in _AZR_FALLBACKS[tag]:
    matches = list(re.finditer(pattern, content, flags))
    if matches:
      return matches[-1].group(1)
  return content


def extract_cruxeval(completion: str, kind: str, style: str = "azr") -> str:
  """The predicted output (cruxeval_o) or input (cruxeval_i) source text, as AZR extracts it.

  AZR styles: '' unless the completion has AZR's <think>...</think><answer>...</answer> format (AZR scores
  such an answer 0); then the ```output / ```input block of the <answer>, else AZR's fallbacks. Chat
  style: the same fallbacks on the <answer> content or, without one, the whole completion."""
  tag = "output" if kind == "cruxeval_o" else "input"
  if style == "chat":
    return azr_extract_input_output(answer_text(completion, style), tag).strip()
  generation = azr_generation(completion)
  if "<answer>" not in generation or not azr_format_ok(generation):
    return ""
  content = generation.split("<answer>")[-1].split("</answer>")[0].strip()
  # eval() ignores the spaces around an expression and the call f(...) those around its arguments.
  return azr_extract_input_output(content, tag).strip()


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


def azr_last_boxed(text: str) -> str | None:
  """The content of AZR's last_boxed_only_string (evaluation/math_eval/eval/parser.py L687-714): any
  "\\boxed " (with a space) wins and runs to the next "$"; else the last \\boxed, else the last \\fbox,
  up to its matching brace; None without one. (AZR keeps the "\\boxed{...}" around it, which its checker's
  parse("\\boxed{" + pred + "}") reads as this content.)"""
  if "\\boxed " in text:
    return text.split("\\boxed ")[-1].split("$")[0]
  start = text.rfind("\\boxed")
  if start < 0:
    start = text.rfind("\\fbox")
    if start < 0:
      return None
  depth = 0
  for j in range(start, len(text)):
    if text[j] == "{":
      depth += 1
    elif text[j] == "}":
      depth -= 1
      if depth == 0:
        opening = text.find("{", start)
        return text[opening + 1:j]
  return None


def extract_math_answer(completion: str) -> str:
  """AZR's extract_azr_answer (evaluation/math_eval/eval/parser.py L716-742; run_execute L751-760 then
  strips it): the <answer> content (its last box if it mentions "boxed"), else the last box, else the
  first one-line \\[...\\] (AZR's regex has no DOTALL: a display that spans lines is no answer)."""
  if "<answer>" in completion:
    answer = completion.split("<answer>")[-1].split("</answer>")[0].strip()
    if "boxed" in answer:
      answer = azr_last_boxed(answer) or ""
  elif "boxed" in completion:
    answer = azr_last_boxed(completion) or ""
  else:
    match = re.search(r"\\\[(.*?)\\\]", completion)
    answer = match.group(1) if match else ""
  return _strip_answer(answer)


def _strip_answer(answer: str) -> str:
  # A light strip_string: math-verify normalises the rest (spacing, \left/\right, \dfrac, ...).
  answer = answer.strip().rstrip(".").strip()
  return answer.strip("$").strip()
