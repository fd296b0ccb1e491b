"""Lean target sets: miniF2F jsonl, Lean Workbook jsonl, or a json list of {header, theorem}.

Every loader yields LeanTarget(name, header, statement, informal, split, proof) where the
statement starts at `theorem` and ends with `:= by` (a trailing `sorry` is cut),
and the header holds the imports/options/opens (kept verbatim for prompts; the
REPL pool normalises it). Records without a header get DEFAULT_HEADER.
"""
import dataclasses
import json
import pathlib
import re

from compassplay_jax.core import jsonl
from compassplay_jax.core.errors import InputFormatError
from compassplay_jax.lean_syntax.statements import split_header, strip_lean_comments, theorem_name

# The DeepSeek-Prover-V2 header (also miniF2F's): no heartbeat cap, so the
# REPL pool's wall-clock timeout is the only limit.
DEFAULT_HEADER = ("import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\n"
                  "open BigOperators Real Nat Topology Rat\n\n")

_STATEMENT_KEYS = ("formal_statement", "theorem", "statement")


@dataclasses.dataclass(frozen=True)
class LeanTarget:
  name: str
  header: str
  statement: str  # `theorem <name> ... := by`
  informal: str | None = None
  split: str | None = None
  proof: str | None = None  # a proof body supplied with the target (checked before it seeds)


def _clean_statement(text: str, where: str) -> str:
  statement = text.rstrip()
  statement = re.sub(r"\s*\bsorry$", "", statement).rstrip()
  if not re.search(r":=\s*(?:by)?$", statement):
    raise InputFormatError(f"{where}: statement does not end with ':= by'")
  return statement


def _informal(record: dict) -> str | None:
  text = record.get("informal_prefix") or record.get("informal") or record.get("informal_statement")
  if not text:
    return None
  text = text.strip()
  text = re.sub(r"^/--?\s*", "", text)
  return re.sub(r"\s*-/$", "", text).strip() or None


def target_from_record(record: dict, where: str, default_name: str) -> LeanTarget:
  """One LeanTarget from a dataset record; `where` names the record in errors."""
  if not isinstance(record, dict):
    raise InputFormatError(f"{where}: record is not a JSON object")
  key = next((k for k in _STATEMENT_KEYS if k in record), None)
  if key is None:
    raise InputFormatError(f"{where}: missing key 'formal_statement' (or 'theorem')")
  inline_header, statement = split_header(record[key])
  header = record.get("header") or inline_header or DEFAULT_HEADER
  if not re.match(r"\s*(?:@\[[^\]]*\]\s*)*(?:theorem|lemma)\b", strip_lean_comments(statement)):
    raise InputFormatError(f"{where}: key '{key}' holds no 'theorem' statement")
  statement = _clean_statement(statement.strip("\n"), f"{where}: key '{key}'")
  name = str(record.get("name") or record.get("id") or theorem_name(statement) or default_name)
  return LeanTarget(name=name, header=header, statement=statement, informal=_informal(record),
                    split=record.get("split"), proof=_supplied_proof(record, where))


def _supplied_proof(record: dict, where: str) -> str | None:
  """Key 'proof' (a proof body), or the first string of key 'proofs' (SGS's D3k has [])."""
  proof = record.get("proof")
  if proof is None and isinstance(record.get("proofs"), list):
    proof = next((p for p in record["proofs"] if isinstance(p, str)), None)
  if proof is not None and not (isinstance(proof, str) and proof.strip()):
    raise InputFormatError(f"{where}: key 'proof' is not a non-empty string")
  return proof


def _records(path: pathlib.Path):
  """(where, record) pairs from a .jsonl file, a json list, or SGS's D3k json."""
  if path.suffix == ".jsonl":
    for lineno, record in jsonl.records(path):
      yield f"{path}:{lineno}", record
    return
  text = path.read_text(encoding="utf-8")
  try:
    data = json.loads(text)
  except ValueError as e:
    raise InputFormatError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from None
  if isinstance(data, dict) and isinstance(data.get("target_statements"), dict):
    data = list(data["target_statements"].values())  # SGS's D_3k_prover_dataset.json.
  if not isinstance(data, list):
    raise InputFormatError(f"{path}: expected a JSON list of {{header, theorem}} records")
  for index, record in enumerate(data):
    yield f"{path}[{index}]", record


def load_targets(path) -> list[LeanTarget]:
  """Loads every target in `path`; names must be unique within the file."""
  path = pathlib.Path(path)
  targets, seen = [], set()
  for index, (where, record) in enumerate(_records(path)):
    target = target_from_record(record, where, f"{path.stem}_{index}")
    if target.name in seen:
      raise InputFormatError(f"{where}: duplicate target name '{target.name}'")
    seen.add(target.name)
    targets.append(target)
  return targets
