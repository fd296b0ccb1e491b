"""Lean domain: target loaders, header handling, prompts, extraction, coverage."""
import json

import pytest

from compassplay_jax.domains.lean.coverage import Coverage
from compassplay_jax.domains.lean.extraction import extract_conjecture
from compassplay_jax.domains.lean.extraction import extract_last_lean4_block
from compassplay_jax.domains.lean.extraction import extract_proof_body
from compassplay_jax.domains.lean.extraction import normalize_header
from compassplay_jax.domains.lean.extraction import rename_theorem
from compassplay_jax.domains.lean.extraction import split_header
from compassplay_jax.domains.lean.extraction import statement_signature
from compassplay_jax.domains.lean.extraction import strip_lean_comments
from compassplay_jax.domains.lean.extraction import theorem_name
from compassplay_jax.domains.lean.prompts import conjecturer_prompt
from compassplay_jax.domains.lean.prompts import prover_prompt
from compassplay_jax.domains.lean.targets import DEFAULT_HEADER
from compassplay_jax.domains.lean.targets import LeanTarget
from compassplay_jax.domains.lean.targets import load_targets

MINIF2F_HEADER = ("import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\n"
                  "open BigOperators Real Nat Topology Rat\n\n")
WORKBOOK_HEADER = ("import Mathlib\nimport Aesop\nset_option maxRecDepth 100000\n"
                   "set_option maxHeartbeats 0\nopen BigOperators Real Nat Topology Rat\n\n")


def write_jsonl(path, records):
  path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
  return path


# --- loaders ------------------------------------------------------------------------------------

def test_minif2f_jsonl(tmp_path):
  path = write_jsonl(tmp_path / "minif2f.jsonl", [{
      "name": "mathd_algebra_182", "split": "test", "header": MINIF2F_HEADER,
      "informal_prefix": "/-- Expand $7(3y+2)$. Show that it is 21y+14.-/\n",
      "formal_statement": "theorem mathd_algebra_182 (y : ℂ) : 7 * (3 * y + 2) = 21 * y + 14 := by\n",
      "goal": "y : ℂ\n⊢ 7 * (3 * y + 2) = 21 * y + 14"}])
  assert load_targets(path) == [LeanTarget(
      name="mathd_algebra_182", header=MINIF2F_HEADER,
      statement="theorem mathd_algebra_182 (y : ℂ) : 7 * (3 * y + 2) = 21 * y + 14 := by",
      informal="Expand $7(3y+2)$. Show that it is 21y+14.", split="test")]


def test_lean_workbook_jsonl_with_and_without_inline_header(tmp_path):
  path = write_jsonl(tmp_path / "wb.jsonl", [
      {"name": "lean_workbook_1", "split": "test", "header": "",
       "formal_statement": WORKBOOK_HEADER + "theorem lean_workbook_1 (p q : ℝ) : p + q = q + p  :=  by"},
      {"name": "lean_workbook_2", "split": "test",
       "formal_statement": "theorem lean_workbook_2 (x : ℝ) : x ^ 2 ≥ 0   :=  by"}])
  first, second = load_targets(path)
  assert first.header == WORKBOOK_HEADER
  assert first.statement == "theorem lean_workbook_1 (p q : ℝ) : p + q = q + p  :=  by"
  assert second.header == DEFAULT_HEADER and second.statement.startswith("theorem lean_workbook_2")


def test_json_list_of_header_theorem_and_sgs_d3k(tmp_path):
  items = [{"header": MINIF2F_HEADER, "theorem": "theorem a1 : (2 : ℕ) + 2 = 4 := by sorry"},
           {"theorem": "theorem a2 (n : ℕ) : n ≤ n ^ 2 := by"}]
  (tmp_path / "list.json").write_text(json.dumps(items))
  targets = load_targets(tmp_path / "list.json")
  assert [t.name for t in targets] == ["a1", "a2"]
  assert targets[0].statement == "theorem a1 : (2 : ℕ) + 2 = 4 := by"
  d3k = {"iterations": [], "target_statements": {"d_1": {
      "id": "d_1", "header": MINIF2F_HEADER, "theorem": "theorem d1 : True := by",
      "tag": "statement", "source": "d_3k", "proofs": []}}}
  (tmp_path / "d3k.json").write_text(json.dumps(d3k))
  assert load_targets(tmp_path / "d3k.json")[0].name == "d_1"


@pytest.mark.parametrize("content, error", [
    ('{"name": "x"}\n', "x.jsonl:1: missing key 'formal_statement'"),
    ('{"formal_statement": "theorem t : True := by"}\nnot json\n', "x.jsonl:2: invalid JSON"),
    ('{"formal_statement": "def f := 1"}\n', "x.jsonl:1: key 'formal_statement' holds no 'theorem'"),
    ('{"formal_statement": "theorem t : True := trivial"}\n', "does not end with ':= by'"),
    ('{"name": "a", "formal_statement": "theorem t : True := by"}\n'
     '{"name": "a", "formal_statement": "theorem u : True := by"}\n', "x.jsonl:2: duplicate target name 'a'"),
    ('[1]\n', "x.jsonl:1: record is not a JSON object"),
])
def test_loader_errors_name_file_line_and_key(tmp_path, content, error):
  path = tmp_path / "x.jsonl"
  path.write_text(content)
  with pytest.raises(ValueError, match=error.replace("(", r"\(")):
    load_targets(path)


def test_json_that_is_not_a_list(tmp_path):
  (tmp_path / "bad.json").write_text('{"a": 1}')
  with pytest.raises(ValueError, match=r"bad.json: expected a JSON list"):
    load_targets(tmp_path / "bad.json")


def test_full_minif2f(shared_data):
  path = shared_data / "minif2f" / "minif2f.jsonl"
  if not path.exists():
    pytest.skip(f"{path} not present")
  targets = load_targets(path)
  assert len(targets) == 488
  assert sum(t.split == "valid" for t in targets) == 244
  assert all(theorem_name(t.statement) == t.name for t in targets)
  assert all(t.statement.endswith(":= by") and t.informal for t in targets)
  assert {normalize_header(t.header) for t in targets} == {normalize_header(MINIF2F_HEADER)}


def test_full_lean_workbook(shared_data):
  paths = [shared_data / "leanworkbook" / n for n in ("leanworkbook_test.jsonl",
                                                       "leanworkbook_train_1k.jsonl")]
  if not all(p.exists() for p in paths):
    pytest.skip(f"{paths} not present")
  test, train = load_targets(paths[0]), load_targets(paths[1])
  assert (len(test), len(train)) == (434, 1000)
  for t in test + train:
    assert t.statement.startswith(f"theorem {t.name} ") and t.statement.rstrip().endswith("by")
    assert "import" not in t.statement
  # Two blank-line variants of the test header collapse into one REPL environment.
  assert {normalize_header(t.header) for t in test} == {normalize_header(WORKBOOK_HEADER)}
  assert {normalize_header(t.header) for t in train} == {normalize_header(DEFAULT_HEADER)}


# --- header and comment handling ----------------------------------------------------------------

def test_header_split_and_normalise():
  header, rest = split_header(WORKBOOK_HEADER + "theorem t : True := by")
  assert (header, rest) == (WORKBOOK_HEADER, "theorem t : True := by")
  assert normalize_header("import Mathlib\n\n-- c\nopen Real   \n\n") == "import Mathlib\nopen Real\n"
  assert normalize_header("\n\n") == ""


def test_strip_comments_nested_and_strings():
  text = 'a /- x /- y -/ z -/ b -- tail\nc "--not" d'
  assert strip_lean_comments(text) == 'a  b \nc "--not" d'


def test_theorem_names():
  assert theorem_name("/-- doc -/\ntheorem foo.bar (x : ℕ) : x = x := by") == "foo.bar"
  assert theorem_name("lemma h₁' : True := by") == "h₁'"
  assert theorem_name("example : True := by") is None
  assert rename_theorem("theorem foo (x : ℕ) : x = x := by", "conj_3") == (
      "theorem conj_3 (x : ℕ) : x = x := by")
  assert statement_signature("theorem foo (x : ℕ) : x = x := by\n  rfl") == "(x : ℕ) : x = x"


# --- extraction ---------------------------------------------------------------------------------

def test_last_lean4_block():
  text = "plan\n```lean4\nfirst\n```\nmore\n```lean4\nsecond\n```\n"
  assert extract_last_lean4_block(text) == "second\n"
  assert extract_last_lean4_block("```lean4\nunclosed") == "unclosed"
  assert extract_last_lean4_block("```python\nx\n```") is None


def test_extract_conjecture_sgs_rules():
  ok = "Idea...\n```lean4\nimport Mathlib\ntheorem c (x : ℝ) : x ^ 2 ≥ 0 := by\n  sorry\n```"
  assert extract_conjecture(ok) == "theorem c (x : ℝ) : x ^ 2 ≥ 0 := by"
  assert extract_conjecture("```lean4\ntheorem c : True := by\n```") == "theorem c : True := by"
  assert extract_conjecture("```lean4\ntheorem c : True := by\n  trivial\n```") is None
  assert extract_conjecture("```lean4\ntheorem c : True := by sorry\nlemma d : True := by sorry\n```") is None
  assert extract_conjecture("```lean4\ntheorem c : True := by\n  sorry\n  sorry\n```") is None
  assert extract_conjecture("no block") is None


def test_extract_proof_body():
  output = ("```lean4\nimport Mathlib\n\ntheorem t (x : ℕ) : x + 0 = x := by\n  simp\n```")
  assert extract_proof_body(output) == "\n  simp"
  assert extract_proof_body(output, strict=True) == "\n  simp"
  chatty = "Plan: simp.\n" + output
  assert extract_proof_body(chatty) == "\n  simp"
  assert extract_proof_body(chatty, strict=True) is None
  assert extract_proof_body("```lean4\ntheorem t : True := by\n```") is None


# --- prompts ------------------------------------------------------------------------------------

def test_conjecturer_prompt_is_sgs_text():
  seed = LeanTarget(name="t", header=MINIF2F_HEADER, statement="theorem t (x : ℕ) : x = x := by")
  prompt = conjecturer_prompt(seed)
  assert prompt.startswith("Here is a Lean 4 problem statement:\n```lean4\n"
                           "theorem t (x : ℕ) : x = x := by\n```\nPlease generate a lean4 theorem")
  assert "target statement.It should NOT be identical" in prompt
  assert prompt.endswith("just put 'sorry' for the proof.")
  assert "import" not in prompt


def test_prover_prompt_dsp_v2_formats():
  statement = "theorem t (x : ℕ) : x = x := by"
  assert prover_prompt(statement, MINIF2F_HEADER) == (
      "Complete the following Lean 4 code:\n\n```lean4\n" + MINIF2F_HEADER + statement + "\n```")
  cot = prover_prompt(statement, MINIF2F_HEADER, chain_of_thought=True)
  assert cot.startswith("Complete the following Lean 4 code:\n\n```lean4\n" + MINIF2F_HEADER
                        + statement + "\n  sorry\n```\n\nBefore producing the Lean 4 code")
  assert cot.endswith("guide the construction of the final formal proof.")


# --- coverage -----------------------------------------------------------------------------------

def test_coverage_records_first_solve_and_fraction():
  coverage = Coverage(["a", "b", "c", "d"])
  assert coverage.record(0, ["b"], generations=100) == ["b"]
  assert coverage.record(1, ["b", "c"], generations=250) == ["c"]
  assert coverage.record(1, []) == []
  assert coverage.solved == {"b", "c"} and coverage.unsolved == ["a", "d"]
  assert coverage.history == {"b": 0, "c": 1}
  assert coverage.fraction == 0.5
  assert coverage.curve == [{"iteration": 0, "solved": 1, "generations": 100},
                            {"iteration": 1, "solved": 2, "generations": 250},
                            {"iteration": 1, "solved": 2}]


def test_coverage_round_trips_through_json():
  coverage = Coverage(["a", "b", "c"])
  coverage.record(3, ["a"])
  coverage.record(5, ["c", "a"])
  restored = Coverage.from_json(coverage.to_json())
  assert restored.history == {"a": 3, "c": 5} and restored.curve == coverage.curve
  assert restored.target_names == ("a", "b", "c")
  restored.record(6, ["b"])
  assert restored.fraction == 1.0 and restored.history["a"] == 3


def test_coverage_errors():
  coverage = Coverage(["a"])
  with pytest.raises(ValueError, match="unknown target 'zz'"):
    coverage.record(0, ["zz"])
  coverage.record(2, ["a"])
  with pytest.raises(ValueError, match="iteration 1 is before the last recorded iteration 2"):
    coverage.record(1, [])
  with pytest.raises(ValueError, match="missing key 'curve'"):
    Coverage.from_json(json.dumps({"version": 1, "targets": [], "first_solved": {}}))
  with pytest.raises(ValueError, match="invalid JSON"):
    Coverage.from_json("{")
  assert Coverage([]).fraction == 0.0
