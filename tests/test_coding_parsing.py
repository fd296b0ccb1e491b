"""Parsing of proposer/solver outputs, the format check, prompts and the reward table."""
import pytest

from compassplay_jax.domains.coding import parsing, prompts, rewards_table, tasks

PROPOSAL = """ plan </think>
<answer>
```python
def g(x):
    return g(x - 1) if x > 0 else 0
```
```input
3
```
</answer>"""


def test_extract_answer():
  assert parsing.extract_answer("a <answer> x </answer> b") == "x"
  assert parsing.extract_answer("<answer>1</answer><answer>2</answer>") == "2"
  assert parsing.extract_answer("no tags") == ""
  assert parsing.extract_answer("<answer> open only") == "open only"


@pytest.mark.parametrize("response,ok", [
    (" r </think> <answer> a </answer>", True),
    (" r </think>\n\n<answer>a</answer> trailing", True),
    (" r <answer>a</answer>", False),
    (" r </think> text <answer>a</answer>", False),
    (" r </think> <answer> a", False),
    ("", False),
])
def test_format_ok(response, ok):
  assert parsing.format_ok(response) is ok


def test_format_ok_without_prompt_think():
  assert parsing.format_ok("<think>r</think><answer>a</answer>", prompt_opens_think=False)
  assert not parsing.format_ok("r</think><answer>a</answer>", prompt_opens_think=False)


def test_parse_code_and_input():
  code, args = parsing.parse_code_and_input(parsing.extract_answer(PROPOSAL))
  assert code.startswith("def g(x):") and args == "3"
  assert parsing.parse_code_and_input("```python\ndef f(a): return a\n```\n# Input: 5") == (
      "def f(a): return a", "5")
  assert parsing.parse_code_and_input("```python\ndef f(a): return a\n```") is None
  assert parsing.parse_code_and_input("no blocks at all") is None
  # The first fenced block is taken as the program, as in AZR.
  code, _ = parsing.parse_code_and_input("```input\n1\n```\n```python\ndef f(a): return a\n```")
  assert "def f" not in code


def test_function_names_counts_nested_and_methods():
  assert parsing.function_names("def f(a):\n  def h(b):\n    return b\n  return h(a)") == ["f", "h"]
  assert parsing.function_names("class A:\n  def m(self): pass") == ["m"]
  assert parsing.function_names("x = 1") == []


def test_parse_inputs_and_message():
  blocks = "".join(f"```input\n{i}\n```\n" for i in range(12))
  inputs, message = parsing.parse_inputs_and_message(blocks + "```message\nadds\n```")
  assert inputs == [str(i) for i in range(2, 12)] and message == "adds"
  assert parsing.parse_inputs_and_message(blocks + "<message> hi </message>")[1] == "hi"
  assert parsing.parse_inputs_and_message(blocks + "# Message: hey")[1] == "hey"
  assert parsing.parse_inputs_and_message(blocks) is None
  assert parsing.parse_inputs_and_message(blocks + "```message\n\n```") is None
  short = "".join(f"```input\n{i}\n```\n" for i in range(9)) + "```message\nm\n```"
  assert parsing.parse_inputs_and_message(short) is None


def test_solver_answers():
  assert parsing.parse_solver_output("```output\n1\n```\n```output\n[2]\n```") == "[2]"
  assert parsing.parse_solver_output("# Output: 'a'") == "'a'"
  assert parsing.parse_solver_output("<output>3</output>") == "3"
  assert parsing.parse_solver_output("The output is 4") == "4"
  assert parsing.parse_solver_output(" 5 ") == "5"
  assert parsing.parse_solver_input("```input\n'a', 1\n```") == "'a', 1"
  assert parsing.parse_solver_program("```python\ndef f(a):\n  return 1\n```\n```\ndef f(a):\n"
                                      "  return 2\n```") == "def f(a):\n  return 2"
  assert parsing.parse_solver_program("no code") is None


def test_prompts_carry_the_information():
  ref = tasks.CodingTask(type=tasks.DEDUCTION, program="def f(a):\n  return a", input="1",
                         output="1")
  text = prompts.wrap(prompts.proposer_prompt(tasks.DEDUCTION, [ref, ref]))
  assert text.endswith("Assistant: <think>") and "<snippet_1>" in text and "```input" in text
  assert "random" in text and "### Reference Code Snippets:" in text
  assert "```message" in prompts.proposer_prompt(tasks.INDUCTION, program="def f(a): return a")
  assert "# Input:\n```input\n1" in prompts.solver_prompt(ref)
  abd = tasks.CodingTask(type=tasks.ABDUCTION, program="def f(a):\n  return a", input="1",
                         output="1")
  assert "```output\n1\n```" in prompts.solver_prompt(abd)
  ind = tasks.CodingTask(type=tasks.INDUCTION, program="def f(b):\n  return b",
                         inputs=("1", "2", "3", "4"), outputs=("1", "2", "3", "4"),
                         message="identity", num_visible=2)
  solver = prompts.solver_prompt(ind)  # (AZR's example answer is `def f(a): return a`, so a program in b)
  assert "```input_1\n2" in solver and "```input_2" not in solver and "def f(b)" not in solver
  with pytest.raises(ValueError, match="task_type"):
    prompts.proposer_prompt("other")


def test_reward_tables():
  code, paper = rewards_table.AZR_CODE, rewards_table.PAPER
  assert code.solver(False, True) == -1.0 and code.solver(True, False) == -0.5
  assert code.solver(True, True) == 1.0
  assert code.proposer(False, True, 0.5) == -1.0 and code.proposer(True, False, 0.5) == -1.0
  assert code.proposer(True, True, 0.0) == -0.5 and code.proposer(True, True, 1.0) == -0.5
  assert code.proposer(True, True, 0.25) == 0.75
  assert paper.proposer(True, True, 1.0) == 0.0 and paper.proposer(True, True, 0.0) == 0.0
  assert paper.solver(True, False) == -0.5
  with pytest.raises(ValueError, match="solve_rate"):
    code.proposer(True, True, 1.5)


def test_task_record_checks():
  with pytest.raises(ValueError, match="CodingTask.type"):
    tasks.CodingTask(type="x", program="")
  with pytest.raises(ValueError, match="inputs"):
    tasks.CodingTask(type=tasks.INDUCTION, program="", inputs=("1",), outputs=())


# AZR's original regexes (the oracle for the linear-time rewrites in parsing.py).
import random as _random  # pylint: disable=g-import-not-at-top
import re as _re  # pylint: disable=g-import-not-at-top

_AZR_FLAGS = _re.DOTALL | _re.IGNORECASE


def _azr_format_ok(text):
  return _re.match(r"(?s)<think>.*?</think>\s*<answer>.*?</answer>", text) is not None


def _azr_solver_block(answer, tag):
  blocks = _re.findall(rf"```{tag}\s*\n?(.*?)\n?```", answer, _AZR_FLAGS)
  if blocks:
    return blocks[-1].strip()
  for pattern in (rf"#\s*{tag}:\s*(.*)", rf"^{tag}\((.*)\)\s*$", rf"<{tag}>(.*?)</{tag}>",
                  rf"the {tag} is:?\s*(.*)"):
    found = _re.search(pattern, answer, _AZR_FLAGS | _re.MULTILINE)
    if found:
      return found.group(1).strip()
  return answer.strip()


def _azr_message(answer):
  found = _re.search(r"```message\s*\n?(.*?)\n?```", answer, _AZR_FLAGS)
  if found:
    return found.group(1)
  found = (_re.search(r"<message>(.*?)</message>", answer, _AZR_FLAGS)
           or _re.search(r"#\s*Message:\s*(.*)", answer, _AZR_FLAGS))
  return found.group(1) if found else None


_SOUP = ["<think>", "</think>", "<answer>", "</answer>", "```output\n", "```input\n", "```",
         "output(", "input(", "OUTPUT(", ")", ") ", ")\t", "\n", " ", "\t\n", "x", "1, 2",
         "<output>", "</output>", "<message>", "</Message>", "# Output:", "# input:", "#",
         "the output is ", "the input is: ", "def f(a):", "  def g(", "\n\n  def h (", "```message\n"]


def test_linear_rewrites_agree_with_azr_regexes():
  rng = _random.Random(0)
  for _ in range(4000):
    text = "".join(rng.choice(_SOUP) for _ in range(rng.randrange(0, 14)))
    assert parsing.format_ok(text, prompt_opens_think=False) == _azr_format_ok(text), text
    assert parsing.format_ok(text) == _azr_format_ok("<think>" + text), text
    assert parsing.parse_solver_output(text) == _azr_solver_block(text, "output"), text
    assert parsing.parse_solver_input(text) == _azr_solver_block(text, "input"), text
    assert parsing.function_names(text) == _re.findall(r"^\s*def\s+(\w+)\s*\(", text, _re.M), text
    inputs = "```input\n1\n```" * 10
    parsed = parsing.parse_inputs_and_message(inputs + text)
    message = _azr_message(inputs + text)
    expected = None if message is None or not message.strip() else message.strip()
    assert (parsed[1] if parsed else None) == expected, text


def test_parsing_is_linear_on_backtracking_bait():
  import time  # pylint: disable=g-import-not-at-top
  for bait in ("output(\n" * 40000, "<output>" * 40000, "<message>" * 40000, "\n" * 200000,
               "</think><answer>" * 20000, "#" + " " * 200000):
    start = time.process_time()
    parsing.parse_solver_output(bait)
    parsing.parse_inputs_and_message("```input\n1\n```" * 10 + bait)
    parsing.function_names(bait)
    parsing.format_ok(bait)
    assert time.process_time() - start < 2.0, bait[:20]  # CPU time: a loaded machine stretches wall time, not this
