"""Benchmark registry and loaders for the evaluation harness.

Every loader reads a local file (nothing is downloaded here) and returns a list of `EvalItem`s. The files
live in the data directory, laid out and converted by `python -m compassplay_jax.data fetch` (docs/data.md):
CRUXEval jsonl, a LiveCodeBench json list, and the math jsonl files, whose question and answer fields differ
per set.
"""
import dataclasses
import json
import pathlib
import random
import re
from typing import Callable

from compassplay_jax import jsonl
from compassplay_jax.errors import InputNotFound, UserError

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
  kind: str  # "cruxeval_o", "cruxeval_i", "lcb" or "math".
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


def load_cruxeval(name: str, path: pathlib.Path) -> list[EvalItem]:
  kind = "cruxeval_i" if name.endswith("_i") else "cruxeval_o"
  items = []
  for lineno, row in _read_jsonl(path):
    items.append(EvalItem(
        benchmark=name, kind=kind,
        item_id=str(_field(path, lineno, row, "id")),
        code=_field(path, lineno, row, "code"),
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


BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec for spec in [
        BenchmarkSpec("cruxeval_i", "CRUXEval-I", "cruxeval/cruxeval.jsonl", IN_DOMAIN, load_cruxeval),
        BenchmarkSpec("cruxeval_o", "CRUXEval-O", "cruxeval/cruxeval.jsonl", IN_DOMAIN, load_cruxeval),
        BenchmarkSpec("livecodebench", "LiveCodeBench", "livecodebench/test_2408_2501.json", IN_DOMAIN,
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
    if name not in BENCHMARKS:
      raise ValueError(f"eval.benchmarks: unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")
  return names


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
  if name not in BENCHMARKS:
    raise ValueError(f"eval.benchmarks: unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")
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
