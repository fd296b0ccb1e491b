"""Loaders and the registry: real formats (committed fixtures), subsampling, one-line format errors."""
import json
import pathlib

import pytest

from compassplay_jax.evals import benchmarks

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"


def test_math_answers_are_normalised_per_set():
  load = lambda name: [i.answer for i in benchmarks.load_benchmark(name, FIXTURES)]
  assert load("amc23") == ["27", "-1", "0.25"]  # Floats in the file.
  assert load("gsm8k") == ["7", "1600", "9"]  # After "####", thousands commas dropped.
  assert load("minerva_math") == ["200", "3 \\times 10^{8}", "\\frac{1}{2} m v^{2}"]  # Last \boxed{}.
  assert load("olympiadbench")[0] == "-2,2"  # final_answer list, dollars dropped.
  assert load("aime24")[1] == "025"


def test_cruxeval_gives_both_directions():
  out = benchmarks.load_benchmark("cruxeval_o", FIXTURES)
  inp = benchmarks.load_benchmark("cruxeval_i", FIXTURES)
  assert {i.kind for i in out} == {"cruxeval_o"} and {i.kind for i in inp} == {"cruxeval_i"}
  assert [i.item_id for i in out] == [i.item_id for i in inp]


def test_livecodebench_drops_shared_and_wrong_type_tests():
  items = benchmarks.load_benchmark("livecodebench_generation", FIXTURES)
  assert [len(i.tests) for i in items] == [2, 2, 2, 2]
  assert all(t.testtype == "stdin" for t in items[0].tests)
  assert all(t.testtype == "functional" for t in items[2].tests)
  assert items[2].starter_code.startswith("class Solution")


def test_subsample_is_deterministic_and_in_file_order():
  a = benchmarks.load_benchmark("cruxeval_o", FIXTURES, limit=3, seed=1)
  b = benchmarks.load_benchmark("cruxeval_o", FIXTURES, limit=3, seed=1)
  c = benchmarks.load_benchmark("cruxeval_o", FIXTURES, limit=3, seed=2)
  assert a == b and len(a) == 3
  ids = [i.item_id for i in a]
  assert ids == sorted(ids)
  assert len(benchmarks.load_benchmark("cruxeval_o", FIXTURES, limit=0)) == 6
  assert len(c) == 3


def test_names_parse_and_unknown_names_fail():
  assert benchmarks.parse_benchmark_names("math500, gsm8k") == ["math500", "gsm8k"]
  assert benchmarks.parse_benchmark_names("all") == list(benchmarks.BENCHMARKS)
  with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
    benchmarks.parse_benchmark_names(["nope"])


def test_bad_lines_name_file_and_line(tmp_path):
  path = tmp_path / "test.jsonl"
  path.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n" + json.dumps({"problem": "q"}) + "\n")
  with pytest.raises(benchmarks.DataFormatError, match=r"test.jsonl:2: missing key 'answer'"):
    benchmarks.load_benchmark("math500", path=path)
  path.write_text("{not json\n")
  with pytest.raises(benchmarks.DataFormatError, match=r"test.jsonl:1: invalid JSON"):
    benchmarks.load_benchmark("math500", path=path)
  gsm = tmp_path / "gsm.jsonl"
  gsm.write_text(json.dumps({"question": "q", "answer": "no final"}) + "\n")
  with pytest.raises(benchmarks.DataFormatError, match=r"gsm.jsonl:1: key 'answer' has no '####'"):
    benchmarks.load_benchmark("gsm8k", path=gsm)
  with pytest.raises(FileNotFoundError, match="benchmark file for 'aime24'"):
    benchmarks.load_benchmark("aime24", data_dir=tmp_path)


def test_last_boxed_handles_nesting_and_space_form():
  assert benchmarks.last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
  assert benchmarks.last_boxed("\\boxed 5$") == "5"
  assert benchmarks.last_boxed("\\fbox{x}") == "x"
  assert benchmarks.last_boxed("none") is None


@pytest.mark.parametrize("name,count", [
    ("cruxeval_o", 800), ("livecodebench_generation", 279), ("math500", 500), ("amc23", 40), ("gsm8k", 1319),
    ("minerva_math", 272), ("olympiadbench", 675), ("aime24", 30), ("aime25", 30)])
def test_full_shared_files_load(shared_data, name, count):
  items = benchmarks.load_benchmark(name, shared_data)
  assert len(items) == count
  if name == "livecodebench_generation":
    # The copy appends 12 identical functional tests to all 279 problems; they must be gone.
    assert max(len(i.tests) for i in items) <= 6
    assert all(len({t.testtype for t in i.tests}) == 1 for i in items)


def test_lcb_execution_rows_are_prepared_as_azr_prepares_them():
  """process_code_reasoning_data.py (AZR): the called function renamed f, the input reduced to f's
  argument list, imports the program uses put on top, typing's List written list."""
  items = benchmarks.load_benchmark("livecodebench_execution", FIXTURES)
  assert [i.item_id for i in items] == ["sample_0", "sample_1", "sample_2", "sample_3"]
  assert items[1].code == "def f(details: list[str]) -> int:\n    return sum(int(d[11:13]) > 60 for d in details)\n"
  assert items[1].input == "details = ['7868190130M7522', '5303914400F9211', '9273338290F4010']"
  assert items[1].output == "2"
  assert items[2].code.startswith("from collections import Counter\ndef f(s: str) -> str:")
  assert items[3].code.startswith("from collections import defaultdict\ndef f(nums: list[int]) -> bool:")
  program, args = benchmarks.azr_lcb_execution_program(
      "def g(n: int) -> int:\n    return n\n\ndef main(a: Dict[int, int]) -> int:\n    return prod(a) + g(1)",
      "main(a = {1: 2})", "row")
  assert program == ("from math import prod\ndef g(n: int) -> int:\n    return n\n\n"
                     "def f(a: dict[int, int]) -> int:\n    return prod(a) + g(1)")
  assert args == "a = {1: 2}"
  with pytest.raises(benchmarks.DataFormatError, match=r"^row: the function called in 'input' is not defined"):
    benchmarks.azr_lcb_execution_program("def g(x):\n    return x", "h(x = 1)", "row")


def test_the_old_livecodebench_name_says_what_replaced_it():
  with pytest.raises(ValueError, match=r"'livecodebench' is now livecodebench_execution .* or livecodebench_generation"):
    benchmarks.parse_benchmark_names("cruxeval_o,livecodebench")
  assert benchmarks.BENCHMARKS["livecodebench_execution"].domain == benchmarks.IN_DOMAIN
  assert benchmarks.BENCHMARKS["livecodebench_generation"].domain == benchmarks.EXTRA
