"""Converters: upstream files (in their published formats) -> the files the project's loaders read.

Each converter takes {upstream path: local file} and returns {output relpath: text or bytes}. They are pure
(no network, no writing), so tests can feed them small files in the upstream layout.
"""
from __future__ import annotations

import base64
import io
import json
import pathlib
import pickle
import random
import zlib
from typing import Callable, Iterable, Iterator, Mapping

from compassplay_jax.core import jsonl
from compassplay_jax.core.errors import UserError

Raw = Mapping[str, pathlib.Path]
Converter = Callable[[Raw], dict[str, str | bytes]]


class ConvertError(UserError, ValueError):
  """An upstream file that does not have the published layout."""


def iter_jsonl(path: pathlib.Path, required: Iterable[str] = ()) -> Iterator[dict]:
  """Records of a jsonl file, one at a time (LiveCodeBench's files are gigabytes); each must be an
  object with the `required` keys, and there must be at least one."""
  count = 0
  for lineno, row in jsonl.records(path, ConvertError, where=path.name):
    missing = [k for k in required if k not in row]
    if missing:
      raise ConvertError(f"{path.name}:{lineno}: missing key(s) {missing}")
    count += 1
    yield row
  if not count:
    raise ConvertError(f"{path.name}: no records")


def read_jsonl(path: pathlib.Path, required: Iterable[str] = ()) -> list[dict]:
  return list(iter_jsonl(path, required))


def to_jsonl(rows: Iterable[dict]) -> str:
  return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def copy_jsonl(upstream: str, output: str, required: Iterable[str]) -> Converter:
  """A converter that keeps a jsonl file byte for byte as published, after checking every record's keys."""
  required = tuple(required)

  def convert(raw: Raw) -> dict[str, str | bytes]:
    read_jsonl(raw[upstream], required)
    return {output: raw[upstream].read_bytes()}
  return convert


def copy_jsonl_files(mapping: Mapping[str, str], required: Iterable[str]) -> Converter:
  """copy_jsonl for several files at once: {upstream path: output relpath}."""
  parts = [copy_jsonl(up, out, required) for up, out in mapping.items()]

  def convert(raw: Raw) -> dict[str, str | bytes]:
    out = {}
    for part in parts:
      out.update(part(raw))
    return out
  return convert


def parquet_to_jsonl(upstream: str, output: str, required: Iterable[str]) -> Converter:
  """A Hub parquet file -> one JSON object per row (columns in file order; timestamps as ISO 8601 text).
  Needs pyarrow, which only this converter uses (the fetch checks DataSet.requires before downloading)."""
  required = tuple(required)

  def convert(raw: Raw) -> dict[str, str | bytes]:
    import pyarrow.parquet  # pylint: disable=g-import-not-at-top
    try:
      rows = pyarrow.parquet.read_table(raw[upstream]).to_pylist()
    except pyarrow.ArrowException as e:
      raise ConvertError(f"{upstream}: not a readable parquet file ({e})") from None
    if not rows:
      raise ConvertError(f"{upstream}: no rows")
    for index, row in enumerate(rows):
      missing = [k for k in required if k not in row]
      if missing:
        raise ConvertError(f"{upstream}: row {index}: missing column(s) {missing}")
    return {output: to_jsonl([{k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in row.items()}
                              for row in rows])}
  return convert


def copy_d3k(upstream: str, output: str) -> Converter:
  """SGS's D3k file kept byte for byte, after checking its layout: {"target_statements": {id: {header,
  theorem, ...}}} with at least one statement (the Lean targets loader reads it as published)."""
  def convert(raw: Raw) -> dict[str, str | bytes]:
    data = raw[upstream].read_bytes()
    try:
      statements = json.loads(data)["target_statements"]
    except (ValueError, KeyError, TypeError):
      raise ConvertError(f"{upstream}: expected a JSON object with key 'target_statements'") from None
    if not isinstance(statements, dict) or not statements:
      raise ConvertError(f"{upstream}: 'target_statements' holds no statements")
    for key, record in statements.items():
      if not isinstance(record, dict) or not isinstance(record.get("theorem"), str):
        raise ConvertError(f"{upstream}: statement {key!r} has no 'theorem'")
    return {output: data}
  return convert


# ---- MATH (PRM800K's math_splits: the 12,000 / 500 re-split of Hendrycks et al.'s MATH) -------------

def _math_level(level) -> str:
  """MATH writes levels "Level 1" .. "Level 5", and "Level ?" for a few unrated problems."""
  if level is None or level == "":
    return "Level ?"
  text = str(level)
  return text if text.startswith("Level ") else f"Level {text}"


def _math_record(row: dict) -> dict:
  """PRM800K's record -> MATH's own field names (level "Level N", type = subject)."""
  return {"problem": row["problem"], "level": _math_level(row["level"]), "type": row["subject"],
          "solution": row["solution"], "unique_id": row["unique_id"]}


MATH_KEYS = ("problem", "solution", "answer", "subject", "level", "unique_id")


def convert_math(train_upstream: str, test_upstream: str) -> Converter:
  """MATH's original train (7,500) and test (5,000) splits, recovered from PRM800K's re-split.

  PRM800K moved 4,500 MATH test problems into its train file; their unique_id ("test/<subject>/<n>.json")
  still names the original split, so the original splits are exact.
  """
  def convert(raw: Raw) -> dict[str, str | bytes]:
    rows = read_jsonl(raw[train_upstream], MATH_KEYS) + read_jsonl(raw[test_upstream], MATH_KEYS)
    train = [_math_record(r) for r in rows if r["unique_id"].startswith("train/")]
    test = [_math_record(r) for r in rows if r["unique_id"].startswith("test/")]
    if not train or not test:
      raise ConvertError(f"{train_upstream}: no unique_id starting with train/ or test/")
    return {"math/train.jsonl": to_jsonl(train), "math/test.jsonl": to_jsonl(test)}
  return convert


# ---- LiveCodeBench (livecodebench/code_generation_lite) ----------------------------------------------

class _StringOnlyUnpickler(pickle.Unpickler):
  """LCB's private tests are a pickled JSON string; refuse anything but plain values."""

  def find_class(self, module, name):
    raise ConvertError(f"private_test_cases: pickled object {module}.{name} refused (only strings expected)")


def decode_lcb_tests(field: str) -> list[dict]:
  """LCB test cases: plain JSON, or base64(zlib(pickle(JSON string))) for the private ones."""
  try:
    return json.loads(field)
  except json.JSONDecodeError:
    pass
  text = _StringOnlyUnpickler(io.BytesIO(zlib.decompress(base64.b64decode(field.encode("utf-8"))))).load()
  return json.loads(text)


LCB_KEYS = ("question_id", "question_content", "contest_date", "starter_code", "public_test_cases",
            "private_test_cases")


def convert_livecodebench(upstreams: Iterable[str], output: str, start: str, end: str) -> Converter:
  """Problems with start <= contest_date < end (ISO dates), with public and private tests."""
  upstreams = tuple(upstreams)

  def convert(raw: Raw) -> dict[str, str | bytes]:
    problems, seen = [], set()
    for upstream in upstreams:
      for row in iter_jsonl(raw[upstream], LCB_KEYS):
        if not start <= row["contest_date"][:10] < end or row["question_id"] in seen:
          continue
        seen.add(row["question_id"])
        tests = decode_lcb_tests(row["public_test_cases"]) + decode_lcb_tests(row["private_test_cases"])
        problems.append({
            "question_id": row["question_id"], "question_title": row.get("question_title", ""),
            "platform": row.get("platform", ""), "difficulty": row.get("difficulty", ""),
            "contest_date": row["contest_date"], "problem": row["question_content"],
            "starter_code": row["starter_code"],
            "tests": [{"input": t["input"], "output": t["output"], "testtype": t["testtype"]} for t in tests]})
    if not problems:
      raise ConvertError(f"livecodebench: no problems dated {start} .. {end}")
    problems.sort(key=lambda p: (p["contest_date"], p["question_id"]))
    return {output: json.dumps(problems, ensure_ascii=False)}
  return convert


# ---- Lean Workbook (internlm/Lean-Workbook, lean_workbook.json) --------------------------------------

def convert_lean_workbook(upstream: str, train_size: int, seed: int) -> Converter:
  """A seeded sample of `train_size` statements with a formal statement (the Lean setting's stand-in
  targets); the file is a JSON list, or one JSON object per line. Lean Workbook marks no test split
  (its records' `split` is the collection they come from), so no test file is written."""
  def convert(raw: Raw) -> dict[str, str | bytes]:
    text = raw[upstream].read_text(encoding="utf-8")
    try:
      records = json.loads(text)
    except json.JSONDecodeError as e:
      if e.msg != "Extra data":
        raise ConvertError(f"{upstream}:{e.lineno}: not valid JSON ({e.msg})") from None
      records = read_jsonl(raw[upstream])  # one statement per line
    if not isinstance(records, list):
      raise ConvertError(f"{upstream}: expected a JSON list of statements")
    rows = []
    for index, record in enumerate(records):
      if not isinstance(record, dict) or "id" not in record or "formal_statement" not in record:
        raise ConvertError(f"{upstream}: record {index} needs keys 'id' and 'formal_statement'")
      rows.append({"name": record["id"], "split": record.get("split", "train"),
                   "formal_statement": record["formal_statement"]})
    if len(rows) < train_size:
      raise ConvertError(f"{upstream}: {len(rows)} statements, fewer than {train_size}")
    train = random.Random(seed).sample(rows, train_size)
    return {"leanworkbook/leanworkbook_train_1k.jsonl": to_jsonl(train)}
  return convert
