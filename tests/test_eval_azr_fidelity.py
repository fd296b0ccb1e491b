"""Issue 50 item 2: the evaluation of the coder model as AZR runs it (paper branch 41ed983 of
LeapLabTHU/Absolute-Zero-Reasoner): its math template, LCB-Execution posed as abduction, Python's ==
as its equality (computed in the sandbox), black-formatted programs and its answer-extraction fallbacks."""
import pathlib

import pytest

from compassplay_jax.evals import benchmarks
from compassplay_jax.evals import code_check
from compassplay_jax.evals import prompts

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"

# evaluation/math_eval/eval/utils.py L181-185 ("azr_boxed"), verbatim; construct_prompt (L293) returns
# input_template.format(input=question).strip(" ").
AZR_BOXED = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>. And "
    "your final answer will be extracted automatically by the \\boxed{{}} tag. User: {input}\nAssistant:")
# utils.py L171-175 ("azr").
AZR = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>. "
    "User: {input}\nAssistant:")


@pytest.fixture(scope="module")
def pool():
  sandbox = pytest.importorskip("compassplay_jax.verifiers.sandbox", reason="sandbox not available")
  with sandbox.SandboxPool(num_workers=2) as sandbox_pool:
    yield sandbox_pool


# ---- math template ----------------------------------------------------------------------------------

def test_math_prompts_are_azrs_templates_rendered():
  item = benchmarks.load_benchmark("math500", FIXTURES)[0]
  assert prompts.build_prompt(item, "azr_boxed") == AZR_BOXED.format(input=item.question.strip()).strip(" ")
  assert prompts.build_prompt(item, "azr") == AZR.format(input=item.question.strip()).strip(" ")
  # parse_question (parser.py L679-685): a yes/no or true/false gold adds the hint.
  yes = benchmarks.EvalItem(benchmark="t", item_id="0", kind="math", question=" Is 7 prime? ", answer="Yes")
  assert prompts.build_prompt(yes, "azr_boxed") == AZR_BOXED.format(input="Is 7 prime?  (Yes or No)")


def test_paper_config_uses_azrs_coder_settings():
  # The text, not the loaded config: loading configs/coding.py imports JAX (~6 s).
  text = (pathlib.Path(__file__).parents[1] / "configs" / "coding.py").read_text()
  paper = text[:text.index('if variant == "demo":')]  # the lines every variant shares, before the variants
  for line in ('config.eval.prompt_style = "azr_boxed"',  # run.sh L32 (AZR-Coder-7B)
               'config.eval.equality = "azr"', 'config.eval.budgets = "math=16000"',
               '"cruxeval_i,cruxeval_o,livecodebench_execution,"'):
    assert line in paper, line


# ---- LCB-Execution posed as AZR poses it --------------------------------------------------------------

def test_lcb_execution_is_posed_as_abduction_with_the_output_posing_as_an_extra():
  azr = benchmarks.load_benchmark("livecodebench_execution", FIXTURES)
  out = benchmarks.load_benchmark("livecodebench_execution_o", FIXTURES)
  assert {i.kind for i in azr} == {"cruxeval_i"} and {i.kind for i in out} == {"cruxeval_o"}
  assert benchmarks.BENCHMARKS["livecodebench_execution"].domain == benchmarks.IN_DOMAIN
  assert benchmarks.BENCHMARKS["livecodebench_execution_o"].domain == benchmarks.EXTRA
  text = prompts.build_prompt(azr[1], "azr")
  # process_code_reasoning_data.py L146-147: instruction_following.format(code_i predictor prompt).
  assert text == prompts._AZR_WRAPPER.format(prompts._CODE_INPUT_PREDICTOR.format(
      snippet=azr[1].code, output="2")) + " <think>"
  assert "# Task: Provide One Possible Input" in text and "```output\n2\n```" in text
  with pytest.raises(ValueError, match="livecodebench_execution_i' is now livecodebench_execution"):
    benchmarks.load_benchmark("livecodebench_execution_i", FIXTURES)


# ---- black, as format_python_code ------------------------------------------------------------------

SAMPLE = ("def f(nums,target):\n    d={}\n    for i,x in enumerate(nums):\n"
          "        if target-x in d: return [d[target-x],i]\n        d[x]=i\n"
          "    return sorted(nums[:target+1],key=lambda v:(-v,v))\n")
# black.format_str(SAMPLE, mode=black.Mode()) with black 25.1.0 (AZR's pin, requirements.txt L15).
SAMPLE_BLACK = ("def f(nums, target):\n    d = {}\n    for i, x in enumerate(nums):\n"
                "        if target - x in d:\n            return [d[target - x], i]\n        d[x] = i\n"
                "    return sorted(nums[: target + 1], key=lambda v: (-v, v))\n")


def test_programs_are_black_formatted_as_azr_formats_them():
  black = pytest.importorskip("black")
  assert black.format_str(SAMPLE, mode=black.Mode()) == SAMPLE_BLACK
  raw = benchmarks._read_jsonl(FIXTURES / "cruxeval" / "cruxeval.jsonl")
  lcb_raw = benchmarks._read_jsonl(FIXTURES / "lcb_execution" / "test.jsonl")
  # One child process for all (the loads below then read the cache).
  formatted = benchmarks.black_format([SAMPLE, "print 'py2'\n"] + [r["code"] for _, r in raw + lcb_raw])
  assert formatted[:2] == [SAMPLE_BLACK, "print 'py2'\n"]  # a program black cannot parse stays as it is
  items = benchmarks.load_benchmark("cruxeval_o", FIXTURES)
  assert [i.code for i in items] == [black.format_str(r["code"], mode=black.Mode()) for _, r in raw]
  lcb = benchmarks.load_benchmark("livecodebench_execution", FIXTURES)[0]
  assert "nums[: i + 1]" in lcb.code and lcb.code.startswith("def f(nums: list[int]) -> list[int]:")


def test_black_failure_leaves_programs_unformatted(monkeypatch):
  monkeypatch.setattr(benchmarks, "_black_cache", {})
  monkeypatch.setattr(benchmarks.sys, "executable", "/nonexistent/python")
  assert benchmarks.black_format([SAMPLE]) == [SAMPLE]


# ---- equality: eval(gold) == eval(prediction), in the sandbox -------------------------------------------

# (gold, prediction): each side a value written out. Python's == decides the expected verdict.
PAIRS = [
    ("1", "1.0"), ("1", "True"), ("True", "1.0"), ("0", "False"), ("0.0", "-0.0"), ("1", "1+0j"),
    ("(1, 2)", "[1, 2]"), ("[1, 2]", "[1.0, 2]"), ("[1, 2]", "[True, 2.0]"), ("(1, (2, 3))", "(1.0, (2, 3.0))"),
    ("{1: 'a'}", "{1.0: 'a'}"), ("{(1, 2): [1]}", "{(1.0, 2): [True]}"), ("{'a': 1, 'b': 2}", "{'b': 2, 'a': 1}"),
    ("{1, 2}", "frozenset({2, 1})"), ("{1, 2}", "{1.0, 2}"), ("{}", "set()"), ("[]", "()"), ("None", "0"),
    ("'1'", "1"), ("b'a'", "'a'"), ("0.30000000000000004", "0.3"), ("1e20", "100000000000000000000"),
    ("9007199254740993", "9007199254740992.0"), ("float('nan')", "float('nan')"), ("[float('nan')]", "[nan]"),
    ("float('inf')", "inf"), ("-float('inf')", "-inf"), ("[3, 2, 1]", "[3, 2, 1]"),
]


def _item(kind, output, code="def f(x):\n    return x\n"):
  return benchmarks.EvalItem(benchmark="t", item_id="0", kind=kind, code=code, output=output)


def test_azr_equality_is_pythons_eq_where_strict_equality_differs(pool):
  expected = [eval(g, {"nan": float("nan"), "inf": float("inf")}) == eval(p, {"nan": float("nan"), "inf": float("inf")})
              for g, p in PAIRS]  # test literals only (never model text)
  assert expected.count(True) >= 15 and expected.count(False) >= 10
  items = [_item("cruxeval_o", g) for g, _ in PAIRS]
  azr = code_check.check_cruxeval(items, [p for _, p in PAIRS], pool, equality="azr")
  assert {pair: v.correct for pair, v in zip(PAIRS, azr)} == dict(zip(PAIRS, expected))
  strict = code_check.check_cruxeval(items, [p for _, p in PAIRS], pool, equality="strict")
  assert not strict[0].correct and not strict[1].correct and azr[0].correct and azr[1].correct
  # Input prediction: AZR's `{gold_output} == f({agent_input})` (templates.py L10-11).
  inputs = ["True", "1.0", "[1]", "1"]
  verdicts = code_check.check_cruxeval([_item("cruxeval_i", "1")] * 4, inputs, pool, equality="azr")
  assert [v.correct for v in verdicts] == [1 == True, 1 == 1.0, 1 == [1], True]  # noqa: E712
  # Still values only and still no custom __eq__: the issue-46 rule holds under "azr".
  tricks = ["f(1)", "type('A', (), {'__eq__': lambda s, o: True})()"]
  assert not any(v.correct for v in code_check.check_cruxeval([_item("cruxeval_o", "1")] * 2, tricks, pool,
                                                                equality="azr"))
  with pytest.raises(ValueError, match="config.eval.equality"):
    code_check.check_cruxeval(items[:1], ["1"], pool, equality="loose")


# ---- extraction: AZR's fallbacks (reward_managers.py L76-119, L142-143; custom_evaluate.py L86-123) ----

@pytest.mark.parametrize("completion,kind,expected", [
    ("r</think> <answer>```output\n[1, 2]\n```</answer>", "cruxeval_o", "[1, 2]"),
    ("r</think> <answer>```output\n1\n```\n```output\n2\n```</answer>", "cruxeval_o", "2"),  # the last block
    ("r</think> <answer># Output: [1, 2]</answer>", "cruxeval_o", "[1, 2]"),
    ("r</think> <answer>call output([1, 2]) here</answer>", "cruxeval_o", "[1, 2]"),
    ("r</think> <answer><output> 'ab' </output></answer>", "cruxeval_o", "'ab'"),
    ("r</think> <answer>So the output is 42.</answer>", "cruxeval_o", "42"),
    ("r</think> <answer>{'a': 1}</answer>", "cruxeval_o", "{'a': 1}"),  # no pattern: the whole answer
    ("r</think> <answer># Input: 'x', 2\n```</answer>", "cruxeval_i", "'x', 2"),
    ("r</think> <answer>input('x', 2)</answer>", "cruxeval_i", "'x', 2"),
    ("r</think> <answer><input>[3]</answer>", "cruxeval_i", "[3]"),
    ("r</think> <answer>The input is [3].</answer>", "cruxeval_i", "[3]"),
    ("no think <answer>```output\n1\n```</answer>", "cruxeval_o", ""),  # format: 0 in AZR
    ("r</think> ```output\n1\n```", "cruxeval_o", ""),  # no <answer>
    ("r</think> <answer>1</answer>\nAssistant: <answer>2</answer>", "cruxeval_o", "1"),  # the splitter
])
def test_code_answer_extraction_follows_azr(completion, kind, expected):
  assert prompts.extract_cruxeval(completion, kind, "azr") == expected


@pytest.mark.parametrize("completion,expected", [
    ("hence \\[ x = 7 \\] done", "x = 7"),
    ("hence \\[ x =\n 7 \\] done", ""),  # AZR's \[...\] regex has no DOTALL
    ("so \\boxed 5$ and \\boxed{6}", "5"),  # "\boxed " wins (last_boxed_only_string L689-690)
    ("<answer>\\boxed{\\frac{1}{2}}</answer>", "\\frac{1}{2}"),
])
def test_math_extraction_follows_azr(completion, expected):
  assert prompts.extract_math_answer(completion) == expected
