"""Prompt construction per style and AZR's answer extraction."""
import pathlib

import pytest

from compassplay_jax.evals import benchmarks
from compassplay_jax.evals import prompts

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"


class _ChatTokenizer:
  """Stands in for a tokenizer with a chat template (records the messages)."""
  chat_template = "<fake>"

  def apply_chat_template(self, messages, tokenize, add_generation_prompt):
    assert not tokenize and add_generation_prompt
    return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"


def _item(name, index=0):
  return benchmarks.load_benchmark(name, FIXTURES)[index]


def test_azr_code_prompts_start_inside_think():
  text = prompts.build_prompt(_item("cruxeval_o"), "azr")
  assert text.startswith("A conversation between User and Assistant.")
  assert "# Task: Deduce the Output of a Python Code Snippet" in text
  assert "```input\n[3, 1, 3, 2]\n```" in text and "{'age': 20, 'city': 'New York'}" in text
  assert text.endswith("Assistant: <think>")
  text_i = prompts.build_prompt(_item("cruxeval_i"), "azr")
  assert "# Output:\n```output\n[3, 2, 1]\n```" in text_i and text_i.endswith("Assistant: <think>")
  lcb = prompts.build_prompt(_item("livecodebench_generation", 2), "azr")
  assert "```python\nclass Solution:" in lcb and "### Answer:" in lcb
  assert "Read the inputs from stdin" in prompts.build_prompt(_item("livecodebench_generation", 0), "azr")


def test_lcb_execution_uses_azrs_abduction_prompt_on_the_prepared_program():
  text = prompts.build_prompt(_item("livecodebench_execution", 1), "azr")
  assert "# Task: Provide One Possible Input" in text and text.endswith("Assistant: <think>")
  assert "```python\ndef f(details: list[str]) -> int:" in text and "```output\n2\n```" in text
  assert "countSeniors" not in text and "7868190130M7522" not in text  # neither the original name nor the gold input
  deduction = prompts.build_prompt(_item("livecodebench_execution_o", 1), "azr")
  assert "# Task: Deduce the Output of a Python Code Snippet" in deduction
  assert "```input\ndetails = ['7868190130M7522', '5303914400F9211', '9273338290F4010']\n```" in deduction


def test_math_templates_differ_per_style():
  item = _item("math500")
  assert prompts.build_prompt(item, "azr").endswith("Assistant:")
  assert prompts.build_prompt(item, "azr_think").endswith("Assistant: <think>")
  assert "extracted automatically by the \\boxed{} tag" in prompts.build_prompt(item, "azr_boxed")
  chat = prompts.build_prompt(item, "chat", _ChatTokenizer())
  assert chat.startswith("<|system|>You are a helpful assistant.")
  assert "Please reason step by step, and put your final answer within \\boxed{}." in chat


def test_bad_style_and_missing_chat_template_fail():
  with pytest.raises(ValueError, match="eval.prompt_style: unknown style 'r1'"):
    prompts.build_prompt(_item("math500"), "r1")
  with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
    prompts.build_prompt(_item("math500"), "chat", None)


def test_cruxeval_extraction_takes_last_block_inside_answer():
  completion = "```output\n1\n```</think> <answer>```output\n2\n```\n```output\n[3]\n```</answer>"
  assert prompts.extract_cruxeval(completion, "cruxeval_o") == "[3]"
  assert prompts.extract_cruxeval("no tags ```output\n2\n```", "cruxeval_o") == ""  # AZR needs <answer>.
  assert prompts.extract_cruxeval("```input\n'a', 1\n```", "cruxeval_i", "chat") == "'a', 1"
  assert prompts.extract_cruxeval("</think><answer>'abc'</answer>", "cruxeval_o") == "'abc'"
  assert prompts.extract_cruxeval("<answer>'abc'</answer>", "cruxeval_o") == ""  # AZR's format: <think> first


def test_program_extraction():
  text = "<answer>```python\nx = 1\n```\nthen\n```python\nprint(2)\n```</answer>"
  assert prompts.extract_program(text) == "print(2)"
  assert prompts.extract_program("```\nprint(3)\n```") == "print(3)"
  assert prompts.extract_program("no code") == ""


@pytest.mark.parametrize("completion,expected", [
    ("</think> <answer>\\boxed{\\frac{1}{2}}</answer>", "\\frac{1}{2}"),
    ("</think> <answer> 42 </answer>", "42"),
    ("so \\boxed{3} and finally \\boxed{4}.", "4"),
    ("hence \\[ x = 7 \\] done", "x = 7"),
    ("<answer>$5$.</answer>", "5"),
    ("nothing here", ""),
])
def test_math_extraction(completion, expected):
  assert prompts.extract_math_answer(completion) == expected
