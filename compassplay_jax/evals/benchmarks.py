"""Benchmark registry and loaders for the evaluation harness.

Every loader reads a local file (nothing is downloaded here) and returns a list of `EvalItem`s. The files
live in the data directory, laid out and converted by `python -m compassplay_jax.cli.data fetch` (docs/data.md):
CRUXEval jsonl, LiveCodeBench-Execution jsonl, a LiveCodeBench code-generation json list, and the math jsonl
files, whose question and answer fields differ per set.
"""
import dataclasses
import json
import logging
import pathlib
import random
import re
import subprocess
import sys
from typing import Callable

from compassplay_jax.core import jsonl
from compassplay_jax.core.errors import InputNotFound, UserError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# Domains decide which mean a benchmark counts towards in the report.
IN_DOMAIN = "in_domain"
OUT_OF_DOMAIN = "out_of_domain"
EXTRA = "extra"  # Reported, but in neither mean (AIME).


@dataclasses.dataclass(frozen=True)
class LcbTest:
  input: str
  output: str
  testtype: str  # "stdin" or "functional".


@dataclasses.dataclass(frozen=True)
class EvalItem:
  """One benchmark question with what is needed to check an answer to it."""
  benchmark: str
  item_id: str
  kind: str  # "cruxeval_o", "cruxeval_i" (CRUXEval, LCB-Execution), "lcb" (code generation) or "math".
  question: str = ""  # Problem text (math, LiveCodeBench).
  code: str = ""  # CRUXEval program defining f.
  input: str = ""  # CRUXEval gold input (argument list source).
  output: str = ""  # CRUXEval gold output (value source).
  answer: str = ""  # Math gold answer, normalised to a string.
  starter_code: str = ""  # LiveCodeBench functional problems.
  tests: tuple[LcbTest, ...] = ()
  solution: str = ""  # A gold solution, where the file carries one (used by oracle tests).


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
  name: str
  display_name: str
  relpath: str  # Default path under data_dir.
  domain: str
  loader: Callable[[str, pathlib.Path], list[EvalItem]]


class DataFormatError(UserError, ValueError):
  """A benchmark file does not have the expected format."""


def _read_jsonl(path: pathlib.Path) -> list[tuple[int, dict]]:
  return list(jsonl.records(path, DataFormatError))


def _field(path, lineno, row, *keys):
  """Returns the first of `keys` present in `row`; the error names the file, line and keys."""
  for key in keys:
    if key in row and row[key] is not None:
      return row[key]
  raise DataFormatError(f"{path}:{lineno}: missing key {' or '.join(repr(k) for k in keys)}")


def _number_to_str(value) -> str:
  # AMC23 stores answers as floats (27.0); the checker wants "27".
  if isinstance(value, float) and value.is_integer():
    return str(int(value))
  return str(value)


def last_boxed(text: str) -> str | None:
  """Content of the last \\boxed{...} or \\fbox{...} in `text`, with nested braces; None if absent."""
  start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
  if start < 0:
    return None
  i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
  if text.startswith(" ", i):  # "\boxed 5" form.
    match = re.match(r"\s*([^\s$]+)", text[i:])
    return match.group(1) if match else None
  if not text.startswith("{", i):
    return None
  depth = 0
  for j in range(i, len(text)):
    if text[j] == "{":
      depth += 1
    elif text[j] == "}":
      depth -= 1
      if depth == 0:
        return text[i + 1:j]
  return None


# ---- black, as AZR formats the benchmark programs -------------------------------------------------------
# AZR formats every CRUXEval and LCB-Execution program before posing it: process_code_reasoning_data.py
# L88 and L140 map format_python_code over the `code` column, and format_python_code
# (absolute_zero_reasoner/rewards/code_reward.py L24-29) is black.format_str(code, mode=black.Mode())
# (line length 88, black's defaults), black pinned at 25.1.0 (AZR's requirements.txt L15). Where black
# fails AZR falls back to an autopep8 re-indentation (L30-80); here the program stays as it is.
# The programs are dataset text, not model text; black still runs in a child process with a timeout, and
# any failure there (black missing, a timeout, a crash) leaves the programs unformatted, with a warning.
BLACK_TIMEOUT_S = 120.0
_BLACK_SCRIPT = """
import json, sys
import black
out = []
for code in json.load(sys.stdin):
    try:
        out.append(black.format_str(code, mode=black.Mode()))
    except Exception:
        out.append(None)
json.dump(out, sys.stdout)
"""
_black_cache: dict[str, str] = {}


def black_format(programs: list[str], timeout_s: float = BLACK_TIMEOUT_S) -> list[str]:
  """Each program as AZR formats it (black.format_str, black.Mode()); unchanged where black fails."""
  todo = sorted({p for p in programs if p not in _black_cache})
  if todo:
    try:
      done = subprocess.run([sys.executable, "-c", _BLACK_SCRIPT], input=json.dumps(todo), capture_output=True,
                            text=True, timeout=timeout_s, check=True)
      formatted = json.loads(done.stdout)
      if not (isinstance(formatted, list) and len(formatted) == len(todo)):
        raise ValueError("black's child returned the wrong number of programs")
    except Exception as e:  # pylint: disable=broad-except  (no black, timeout, crash: keep the programs)
      detail = getattr(e, "stderr", None) or e
      logging.warning("benchmarks.py: black formatting failed (%s); %d programs stay unformatted "
                      "(pip install black==25.1.0)", str(detail).strip().splitlines()[-1:] or type(e).__name__,
                      len(todo))
      return list(programs)
    for program, text in zip(todo, formatted):
      _black_cache[program] = text if isinstance(text, str) else program
  return [_black_cache[p] for p in programs]


def load_cruxeval(name: str, path: pathlib.Path) -> list[EvalItem]:
  kind = "cruxeval_i" if name.endswith("_i") else "cruxeval_o"
  rows = _read_jsonl(path)
  codes = black_format([_field(path, lineno, row, "code") for lineno, row in rows])  # L88
  items = []
  for (lineno, row), code in zip(rows, codes):
    items.append(EvalItem(
        benchmark=name, kind=kind,
        item_id=str(_field(path, lineno, row, "id")),
        code=code,
        input=_field(path, lineno, row, "input"),
        output=_field(path, lineno, row, "output")))
  return items


def _load_json_list(path: pathlib.Path) -> list:
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise DataFormatError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
  if not isinstance(data, list):
    raise DataFormatError(f"{path}:1: expected a JSON list of problems")
  return data


def _drop_shared_tests(problems: list[list[LcbTest]]) -> list[list[LcbTest]]:
  """Removes tests that appear in more than half of the problems.

  The public LiveCodeBench copy appends the same 12 functional tests (from one unrelated problem) to
  every problem; no test case can legitimately belong to many different problems.
  """
  if len(problems) < 3:
    return problems
  counts = {}
  for tests in problems:
    for test in set(tests):
      counts[test] = counts.get(test, 0) + 1
  shared = {test for test, n in counts.items() if n > len(problems) / 2}
  return [[t for t in tests if t not in shared] for tests in problems]


def load_livecodebench(name: str, path: pathlib.Path) -> list[EvalItem]:
  raw = _load_json_list(path)
  rows, all_tests = [], []
  for index, row in enumerate(raw):
    where = f"{path}: problem {index}"
    if not isinstance(row, dict):
      raise DataFormatError(f"{where}: expected a JSON object")
    for key in ("problem", "tests"):
      if key not in row:
        raise DataFormatError(f"{where}: missing key {key!r}")
    tests = []
    for t_index, test in enumerate(row["tests"]):
      try:
        test = LcbTest(str(test["input"]), str(test["output"]), str(test["testtype"]))
      except (KeyError, TypeError):
        raise DataFormatError(f"{where}: test {t_index} needs keys 'input', 'output', 'testtype'") from None
      if test.testtype not in ("stdin", "functional"):
        raise DataFormatError(f"{where}: test {t_index} has testtype {test.testtype!r}")
      tests.append(test)
    rows.append((index, row))
    all_tests.append(tests)
  items = []
  for (index, row), tests in zip(rows, _drop_shared_tests(all_tests)):
    starter = row.get("starter_code") or ""
    # A stdin program has no Solution class to call, and a functional one reads no stdin.
    wanted = "functional" if starter.strip() else "stdin"
    tests = [t for t in tests if t.testtype == wanted]
    if not tests:
      raise DataFormatError(f"{path}: problem {index}: no {wanted} tests")
    items.append(EvalItem(
        benchmark=name, kind="lcb", item_id=str(row.get("question_id", row.get("id", index))),
        question=row["problem"], starter_code=starter, tests=tuple(tests),
        solution=row.get("solution") or ""))
  return items


# ---- LiveCodeBench-Execution (livecodebench/execution-v2), prepared as AZR prepares it ------------------
# AZR's in-training validation reads these rows through process_livecodebench_execution and add_imports
# (absolute_zero_reasoner/data_construction/process_code_reasoning_data.py:13-39 and :42-78, paper branch
# 41ed983; Absolute Zero Reasoner, MIT licence, Copyright (c) 2025 LeapLab): the called function is renamed
# f, the input loses its "name(" ... ")" so it is f's argument list, and imports the program needs are
# put on top, with typing's List/Dict/Tuple/Set written as the builtins. AZR formats the program with black
# first (L140, format_python_code), and so does load_lcb_execution (black_format above).
# AZR poses these rows as abduction (L146: get_code_problem_predictor_prompt('code_i', ...), metric
# pred_code_i at L163-164): `livecodebench_execution`, the in-domain LCB column, is that posing (kind
# cruxeval_i); `livecodebench_execution_o` is the output prediction LiveCodeBench's own runner scores (extra).

_AZR_IMPORTS = (  # (condition on the program text, import line), in AZR's order (each is put on top)
    (lambda p: "collections" in p, "import collections"),
    (lambda p: "Counter" in p, "from collections import Counter"),
    (lambda p: "gcd" in p, "from math import gcd"),
    (lambda p: "deque" in p, "from collections import deque"),
    (lambda p: "@cache" in p, "from functools import cache"),
    (lambda p: "= inf" in p or "[inf]" in p or "inf)" in p, "from math import inf"),
    (lambda p: "accumulate" in p, "from itertools import accumulate"),
    (lambda p: "@lru_cache" in p, "from functools import lru_cache"),
    (lambda p: "defaultdict" in p, "from collections import defaultdict"),
    (lambda p: "bisect" in p, "import bisect"),
    (lambda p: "islice" in p, "from itertools import islice"),
    (lambda p: "math.inf" in p, "import math"),
    (lambda p: "prod(" in p, "from math import prod"),
    (lambda p: "heapify(" in p, "from heapq import heapify, heappop, heappush"),
    (lambda p: "reduce(" in p, "from functools import reduce"),
    (lambda p: "comb(" in p, "from math import comb"),
)


def azr_lcb_execution_program(code: str, call: str, where: str) -> tuple[str, str]:
  """(program defining f, f's argument list) from an LCB-Execution row's `code` and `input` (a call)."""
  defined = re.findall(r"def\s+(\w+)\s*\(", code)
  called = re.search(r"(\w+)\(", call)
  if not defined or not called or called.group(1) not in defined:
    raise DataFormatError(f"{where}: the function called in 'input' is not defined in 'code'")
  program = re.sub(r"def\s+" + re.escape(called.group(1)) + r"\s*\(", "def f(", code)
  args = re.sub(r"^\w+\s*\(|\)$", "", call).strip()
  for needed, line in _AZR_IMPORTS:
    if needed(program):
      program = f"{line}\n{program}"
  program = program.replace("List", "list").replace("Dict", "dict").replace("Tuple", "tuple").replace("Set", "set")
  return program.replace("from typing import list", "from typing import List"), args


def load_lcb_execution(name: str, path: pathlib.Path) -> list[EvalItem]:
  """LiveCodeBench-Execution as AZR poses it (an input giving the output, like CRUXEval-I), or, for the
  `..._o` variant, f's output on the input predicted (like CRUXEval-O)."""
  kind = "cruxeval_o" if name.endswith("_o") else "cruxeval_i"
  rows = _read_jsonl(path)
  codes = black_format([str(_field(path, lineno, row, "code")) for lineno, row in rows])  # L140
  items = []
  for (lineno, row), code in zip(rows, codes):
    program, args = azr_lcb_execution_program(code, str(_field(path, lineno, row, "input")), f"{path}:{lineno}")
    items.append(EvalItem(benchmark=name, kind=kind, item_id=str(_field(path, lineno, row, "id")),
                          code=program, input=args, output=str(_field(path, lineno, row, "output"))))
  return items


def _math_loader(question_keys, answer_fn):
  """Builds a loader for one math jsonl layout; `answer_fn(path, lineno, row)` gives the gold string."""
  def load(name: str, path: pathlib.Path) -> list[EvalItem]:
    items = []
    for lineno, row in _read_jsonl(path):
      item_id = row.get("unique_id", row.get("id", row.get("idx", lineno - 1)))
      items.append(EvalItem(
          benchmark=name, kind="math", item_id=str(item_id),
          question=_field(path, lineno, row, *question_keys),
          answer=answer_fn(path, lineno, row).strip()))
    return items
  return load


def _plain_answer(path, lineno, row):
  return _number_to_str(_field(path, lineno, row, "answer"))


def _gsm8k_answer(path, lineno, row):
  answer = _field(path, lineno, row, "answer")
  if "####" not in answer:
    raise DataFormatError(f"{path}:{lineno}: key 'answer' has no '####' final answer")
  return answer.split("####")[-1].strip().replace(",", "")  # "1,600" means 1600.


def _minerva_answer(path, lineno, row):
  boxed = last_boxed(_field(path, lineno, row, "solution"))
  if boxed is None:
    raise DataFormatError(f"{path}:{lineno}: key 'solution' has no \\boxed{{}} answer")
  return boxed


def _olympiad_answer(path, lineno, row):
  answers = _field(path, lineno, row, "final_answer")
  if not isinstance(answers, list) or not answers:
    raise DataFormatError(f"{path}:{lineno}: key 'final_answer' must be a non-empty list")
  # Answers are written "$69$,$84$": the dollars are markup, not content.
  return ",".join(str(a).replace("$", "").strip() for a in answers)


LCB_EXECUTION = "lcb_execution/test.jsonl"

BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec for spec in [
        BenchmarkSpec("cruxeval_i", "CRUXEval-I", "cruxeval/cruxeval.jsonl", IN_DOMAIN, load_cruxeval),
        BenchmarkSpec("cruxeval_o", "CRUXEval-O", "cruxeval/cruxeval.jsonl", IN_DOMAIN, load_cruxeval),
        # AZR's in-domain "LCB": LiveCodeBench-Execution posed as AZR's validation poses it, an input to find
        # (code_i; process_code_reasoning_data.py L146, docs/evaluation.md).
        BenchmarkSpec("livecodebench_execution", "LCB-Execution", LCB_EXECUTION, IN_DOMAIN, load_lcb_execution),
        # The same rows as output prediction (LiveCodeBench's own scenario): extra, in no mean.
        BenchmarkSpec("livecodebench_execution_o", "LCB-Execution-O", LCB_EXECUTION, EXTRA, load_lcb_execution),
        BenchmarkSpec("livecodebench_generation", "LCB-Generation", "livecodebench/test_2408_2501.json", EXTRA,
                      load_livecodebench),
        BenchmarkSpec("math500", "MATH500", "math500/test.jsonl", OUT_OF_DOMAIN,
                      _math_loader(("problem",), _plain_answer)),
        BenchmarkSpec("amc23", "AMC23", "amc23/test.jsonl", OUT_OF_DOMAIN,
                      _math_loader(("problem", "question"), _plain_answer)),
        BenchmarkSpec("gsm8k", "GSM8K", "gsm8k/test.jsonl", OUT_OF_DOMAIN,
                      _math_loader(("question",), _gsm8k_answer)),
        BenchmarkSpec("minerva_math", "Minerva", "minerva_math/test.jsonl", OUT_OF_DOMAIN,
                      _math_loader(("problem",), _minerva_answer)),
        BenchmarkSpec("olympiadbench", "OlympiadBench", "olympiadbench/test.jsonl", OUT_OF_DOMAIN,
                      _math_loader(("question",), _olympiad_answer)),
        BenchmarkSpec("aime24", "AIME24", "aime24/test.jsonl", EXTRA,
                      _math_loader(("problem", "question"), _plain_answer)),
        BenchmarkSpec("aime25", "AIME25", "aime25/test.jsonl", EXTRA,
                      _math_loader(("problem", "question"), _plain_answer)),
    ]
}


def parse_benchmark_names(benchmarks) -> list[str]:
  """Accepts a comma string or a list; "all" means every registered benchmark."""
  names = [b.strip() for b in benchmarks.split(",")] if isinstance(benchmarks, str) else list(benchmarks)
  names = [n for n in names if n]
  if names == ["all"]:
    return list(BENCHMARKS)
  for name in names:
    _check_name(name)
  return names


# Names that no longer exist -> what to use instead.
RENAMED = {"livecodebench": "livecodebench_execution (AZR's in-domain LCB) or livecodebench_generation "
                            "(code generation, 2024-08..2025-01)",
           "livecodebench_execution_i": "livecodebench_execution (AZR's input-prediction posing is now the "
                                        "in-domain LCB; output prediction is livecodebench_execution_o)"}


def _check_name(name: str) -> None:
  if name in RENAMED:
    raise ValueError(f"eval.benchmarks: {name!r} is now {RENAMED[name]}")
  if name not in BENCHMARKS:
    raise ValueError(f"eval.benchmarks: unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")


def resolve_data_dir(data_dir) -> pathlib.Path:
  """"" or None = the data directory ($COMPASSPLAY_DATA or the per-user default); an absolute data_dir
  is used as is; a relative one is relative to the repository root."""
  if not data_dir:
    from compassplay_jax.data import paths
    return paths.data_dir("")
  path = pathlib.Path(data_dir).expanduser()
  return path if path.is_absolute() else (REPO_ROOT / path).resolve()


def subsample(items: list[EvalItem], limit: int, seed: int) -> list[EvalItem]:
  """Keeps `limit` items (all when limit <= 0), chosen by a seed-and-name RNG, in file order."""
  if limit <= 0 or limit >= len(items):
    return list(items)
  rng = random.Random(f"{seed}:{items[0].benchmark}")  # String seeds hash the same on every platform.
  keep = sorted(rng.sample(range(len(items)), limit))
  return [items[i] for i in keep]


def load_benchmark(name: str, data_dir="", path=None, limit: int = 0,
                   seed: int = 0) -> list[EvalItem]:
  """Loads one benchmark from `path` (or its default file under `data_dir`), then subsamples it."""
  _check_name(name)
  spec = BENCHMARKS[name]
  directory = None if path else resolve_data_dir(data_dir)
  file_path = pathlib.Path(path) if path else directory / spec.relpath
  if not file_path.exists():
    hint = "set eval.paths"
    if directory is not None:
      from compassplay_jax.data import paths, sources
      dataset = sources.dataset_for(spec.relpath)
      hint = f"get it: {paths.fetch_command([dataset.name], directory)}" if dataset else "set eval.data_dir"
    raise InputNotFound(f"{file_path}: benchmark file for {name!r} not found ({hint})")
  return subsample(spec.loader(name, file_path), limit, seed)
