"""The paper config trains with AZR's prompts, word for word, and evaluates with the same wrapper.

Oracle: tests/fixtures/azr_prompts_41ed983.json, prompts rendered by AZR's own code at commit
41ed983 (`paper` branch) for one task of each type and role (tests/fixtures/azr_prompts_make_fixture.py).
"""
import importlib.util
import json
import pathlib
import re

import pytest

from compassplay_jax.domains.coding import azr_prompts, parsing, prompts, tasks, validation
from compassplay_jax.evals import benchmarks
from compassplay_jax.evals import prompts as eval_prompts
from compassplay_jax.settings.coding import setting as coding

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = json.loads((REPO / "tests" / "fixtures" / "azr_prompts_41ed983.json").read_text())
TYPES = {"code_o": tasks.DEDUCTION, "code_i": tasks.ABDUCTION, "code_f": tasks.INDUCTION}


def _paper_config():
  spec = importlib.util.spec_from_file_location("coding_config", REPO / "configs" / "coding.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config("")


def _case(role, problem_type):
  return next(c for c in FIXTURE["cases"] if c["role"] == role and c["problem_type"] == problem_type)


def _solver_task(case) -> tasks.CodingTask:
  t, task_type = case["task"], TYPES[case["problem_type"]]
  if task_type == tasks.INDUCTION:
    return tasks.CodingTask(type=task_type, program=t["snippet"], inputs=tuple(t["inputs"]),
                            outputs=tuple(t["outputs"]), message=t["message"], num_visible=case["num_visible"])
  return tasks.CodingTask(type=task_type, program=t["snippet"], input=t["input"], output=t["output"])


@pytest.mark.parametrize("problem_type", ["code_o", "code_i", "code_f"])
def test_paper_config_proposer_prompt_is_azrs(problem_type):
  config = _paper_config()
  case = _case("proposer", problem_type)
  assert FIXTURE["banned_keywords"] == list(validation.AZR_BANNED_MODULES)
  refs = [tasks.CodingTask(type=TYPES[problem_type] if problem_type != "code_f" else tasks.DEDUCTION,
                           program=r["snippet"], input=r["input"], output=r["output"]) for r in case["references"]]
  if problem_type == "code_f":
    assert config.coding.induction_inputs == case["num_inputs"]
    body = prompts.proposer_prompt(tasks.INDUCTION, program=refs[0].program, num_inputs=config.coding.induction_inputs)
  else:
    body = prompts.proposer_prompt(TYPES[problem_type], refs)
  assert not config.coding.proposer_prefix  # the paper's response starts right after "<think>"
  assert coding.render(None, body, config.coding.prompt_style) == case["prompt"]


@pytest.mark.parametrize("problem_type", ["code_o", "code_i", "code_f"])
def test_paper_config_solver_prompt_is_azrs(problem_type):
  config = _paper_config()
  case = _case("solver", problem_type)
  assert not config.coding.solver_prefix
  body = prompts.solver_prompt(_solver_task(case))
  assert coding.render(None, body, config.coding.prompt_style) == case["prompt"]


def test_azr_fill_functions_match_the_fixture():
  for case in FIXTURE["cases"]:
    if case["role"] == "proposer":
      refs = [(r["snippet"], r["input"], r["output"]) for r in case["references"]]
      body = azr_prompts.generator_prompt(case["problem_type"], refs, FIXTURE["banned_keywords"], case["num_inputs"])
    else:
      t, half = case["task"], case["num_visible"]
      body = azr_prompts.predictor_prompt(case["problem_type"], t["snippet"], t["input"], t["output"], t["message"],
                                          list(zip(t["inputs"][:half], t["outputs"][:half])))
    assert azr_prompts.instruction_following(body) == case["prompt"], (case["role"], case["problem_type"])


@pytest.mark.parametrize("kind,problem_type", [("cruxeval_o", "code_o"), ("cruxeval_i", "code_i")])
def test_evaluation_uses_the_training_solver_prompt(kind, problem_type):
  """AZR validates on CRUXEval with its solver prompt in the same wrapper (process_code_reasoning_data.py L91-115)."""
  t = _case("solver", problem_type)["task"]
  item = benchmarks.EvalItem(benchmark=kind, item_id="0", kind=kind, code=t["snippet"], input=t["input"],
                             output=t["output"])
  assert eval_prompts.build_prompt(item, "azr") == _case("solver", problem_type)["prompt"]


def _example_format(template: str) -> str:
  """The answer AZR's proposer prompt shows under '### Example Format:' (its braces unescaped)."""
  return template.split("### Example Format:\n", 1)[1].split("\n\n### Evaluation Criteria", 1)[0].format()


def test_parser_reads_the_answers_azrs_prompts_ask_for():
  response = f" plan ...\n</think>\n<answer>\n{_example_format(azr_prompts.CODE_OUTPUT_PROMPT)}\n</answer>"
  assert parsing.format_ok(response)
  program, inp = parsing.parse_code_and_input(parsing.extract_answer(response))
  assert program.startswith("def f(name: str, info: dict):") and inp == "'John', {'age': 20, 'city': 'New York'}"
  # Induction: AZR's example shows two ```input blocks; ten of them and a ```message.
  blocks = _example_format(azr_prompts.CODE_FUNCTION_PROMPT)
  assert blocks.count("```input") == 2
  answer = "\n".join([blocks] * 5) + "\n```message\nsorts the dict\n```"
  inputs, message = parsing.parse_inputs_and_message(answer, num_inputs=10)
  assert len(inputs) == 10 and inputs[1] == "'Sammy', {'age': 37, 'city': 'Los Angeles'}"
  assert message == "sorts the dict"
  # Solvers answer in the fence their prompt names (the example in each predictor prompt).
  for template, parse in ((azr_prompts.CODE_OUTPUT_PREDICTOR_PROMPT, parsing.parse_solver_output),
                          (azr_prompts.CODE_INPUT_PREDICTOR_PROMPT, parsing.parse_solver_input),
                          (azr_prompts.CODE_FUNCTION_PREDICTOR_PROMPT, parsing.parse_solver_program)):
    example = re.split(r"# Example Output:\n", template)[1].split("\n```\n", 1)[0] + "\n```"
    example = example.replace("{{", "{").replace("}}", "}")
    answer = parsing.extract_answer(f"...</think> <answer>{example}</answer>")
    assert parse(answer) == example.split("\n", 1)[1].rsplit("\n```", 1)[0], template[:60]


def test_unknown_types_fail_with_a_message():
  with pytest.raises(ValueError, match="task_type"):
    prompts.proposer_prompt("other")
  with pytest.raises(ValueError, match="AZR problem type"):
    azr_prompts.predictor_prompt("code_e")
