"""Token-Jaccard, copy and rename detection on hand-made Python/Lean examples and miniF2F."""
import json
import random
import re

import pytest

from compassplay_jax.rewards.novelty import batch_novelty_metrics
from compassplay_jax.rewards.novelty import bound_names
from compassplay_jax.rewards.novelty import canonicalize
from compassplay_jax.rewards.novelty import code_tokens
from compassplay_jax.rewards.novelty import is_copy
from compassplay_jax.rewards.novelty import is_rename
from compassplay_jax.rewards.novelty import novelty
from compassplay_jax.rewards.novelty import token_jaccard

SEED_LEAN = ("theorem amc12a_2015_p10 (x y : ℤ) (h₀ : 0 < y) (h₁ : y < x)\n"
             "    (h₂ : x + y + x * y = 80) : x = 26 := by")
RENAMED_LEAN = ("theorem conj_7 (a b : ℤ) (hb : 0 < b) (hab : b < a)\n"
                "  (heq : a + b + a * b = 80) : a = 26 := by sorry")
SEED_PY = "def f(a, b):\n    total = a + b  # add\n    return [total * i for i in range(b)]\n"
RENAMED_PY = "def g(x,y):\n  s = x+y\n  return [s*k for k in range(y)]"


def test_lean_tokens_keep_unicode_names_numbers_and_operators():
  tokens = code_tokens("theorem t (h₀ : ∀ x ∈ S, x ≤ Real.sqrt 2.5) (n : ℕ) : n ! ≠ 0 ↔ True := by",
                       "lean")
  assert tokens == ["(", "h₀", ":", "∀", "x", "∈", "S", ",", "x", "≤", "Real.sqrt", "2.5", ")",
                    "(", "n", ":", "ℕ", ")", ":", "n", "!", "≠", "0", "↔", "True"]
  assert code_tokens("a <;> b := c <-> d ∃! x, x' = 1..5", "lean") == [
      "a", "<;>", "b", ":=", "c", "<->", "d", "∃!", "x", ",", "x'", "=", "1", "..", "5"]


def test_lean_normalisation_drops_comments_header_name_and_proof_start():
  text = ("import Mathlib\nopen Real\n\n/-- doc -/\ntheorem foo (x : ℝ) -- hyp\n"
          "  /- note -/ : x = x := by sorry")
  assert code_tokens(text, "lean") == ["(", "x", ":", "ℝ", ")", ":", "x", "=", "x"]


def test_python_tokens():
  assert code_tokens("x **= 2  # comment\nif x != y: print('a b', \"c\")", "python") == [
      "x", "**=", "2", "if", "x", "!=", "y", ":", "print", "(", "'a b'", ",", '"c"', ")"]
  assert code_tokens("os.path.join(a, b) >= 1_000", "python") == [
      "os.path.join", "(", "a", ",", "b", ")", ">=", "1_000"]


def test_jaccard_basics():
  assert token_jaccard("", "") == 1.0
  assert token_jaccard("x = 1", "") == 0.0
  assert token_jaccard("a + b", "b + a") == 1.0  # Sets, not sequences.
  assert token_jaccard("a + b", "a - c") == pytest.approx(1 / 5)
  assert token_jaccard(SEED_PY, RENAMED_PY) == token_jaccard(RENAMED_PY, SEED_PY)
  assert novelty("a + b", "a - c") == pytest.approx(4 / 5)


def test_theorem_name_does_not_count_for_lean():
  assert token_jaccard(SEED_LEAN, SEED_LEAN.replace("amc12a_2015_p10", "copy_1")) == 1.0


def test_copy_threshold_is_strict():
  seed = "a b c d e f g h i j"
  assert token_jaccard(seed, "a b c d e f g h i j k") == pytest.approx(10 / 11)
  assert is_copy("a b c d e f g h i j k", seed, language="python")
  eight_of_ten = "a b c d e f g h"
  assert token_jaccard(eight_of_ten, seed) == pytest.approx(0.8)
  assert not is_copy(eight_of_ten, seed, language="python")  # J > 0.8 is required.


def test_exact_copy_is_not_a_rename():
  renamed_theorem = SEED_LEAN.replace("theorem ", "theorem other_name_", 1)
  assert not is_rename(SEED_LEAN, SEED_LEAN, "lean")
  assert not is_rename(renamed_theorem, SEED_LEAN, "lean")  # the theorem's own name is not a binder
  assert not is_rename("def f(a):\n  return a", "def f(a):\n    return a  # same", "python")


def test_lean_rename_is_detected_though_jaccard_misses_it():
  assert is_rename(RENAMED_LEAN, SEED_LEAN, "lean")
  assert not is_copy(RENAMED_LEAN, SEED_LEAN)
  assert canonicalize(SEED_LEAN, "lean") == (
      "( v0 v1 : ℤ ) ( v2 : 0 < v1 ) ( v3 : v1 < v0 ) ( v4 : v0 + v1 + v0 * v1 = 80 ) : v0 = 26")


@pytest.mark.parametrize("seed, candidate", [
    ("theorem s (f : ℕ → ℕ) (h : ∀ n, f n = 2 * n) : f 3 = 6 := by",
     "theorem c (g : ℕ → ℕ) (hg : ∀ m, g m = 2 * m) : g 3 = 6 := by"),
    ("theorem s (S : Finset ℕ) (h₀ : ∀ n : ℕ, n ∈ S ↔ n ∣ 36) : (∑ k in S, k) = 91 := by",
     "theorem c (T : Finset ℕ) (hT : ∀ d : ℕ, d ∈ T ↔ d ∣ 36) : (∑ j in T, j) = 91 := by"),
    ("theorem s : IsLeast { x : ℕ | 30 * x ≡ 42 [MOD 47] } 39 := by",
     "theorem c : IsLeast { y : ℕ | 30 * y ≡ 42 [MOD 47] } 39 := by"),
    ("theorem s (a : ℝ) (h : 0 < a ∧ a < 1) : a ^ 2 < a := by nlinarith [h.1, h.2]",
     "theorem c (t : ℝ) (ht : 0 < t ∧ t < 1) : t ^ 2 < t := by sorry"),
    ("theorem s : ∃ f : ℕ → ℕ, ∀ x, f x = x := by",
     "theorem c : ∃ g : ℕ → ℕ, ∀ z, g z = z := by"),
    ("theorem s {α : Type*} [Fintype α] (s : Finset α) : s.card ≤ Fintype.card α := by",
     "theorem c {β : Type*} [Fintype β] (t : Finset β) : t.card ≤ Fintype.card β := by"),
    ("theorem s : (fun x : ℝ => x ^ 2) 3 = 9 := by", "theorem c : (fun y : ℝ => y ^ 2) 3 = 9 := by"),
])
def test_lean_renames(seed, candidate):
  assert is_rename(candidate, seed, "lean")


@pytest.mark.parametrize("seed, candidate", [
    (SEED_LEAN, SEED_LEAN.replace("80", "81")),  # A different constant.
    (SEED_LEAN, SEED_LEAN.replace("x * y", "x - y")),  # A different operator.
    (SEED_LEAN, SEED_LEAN.replace("(h₁ : y < x)", "(h₁ : x < y)")),  # Swapped use of names.
    ("theorem s (x : ℝ) : Real.sqrt x ≥ 0 := by", "theorem c (x : ℝ) : Real.exp x ≥ 0 := by"),
    ("theorem s (a b : ℕ) : a + b = b + a := by", "theorem c (a b : ℕ) : a * b = b * a := by"),
])
def test_lean_non_renames(seed, candidate):
  assert not is_rename(candidate, seed, "lean")


def test_python_rename_ignores_formatting_and_comments():
  assert is_rename(RENAMED_PY, SEED_PY, "python")
  assert canonicalize(SEED_PY, "python") == (
      "def v0(v1, v2):\n    v3 = v1 + v2\n    return [v3 * v4 for v4 in range(v2)]")
  loops = "def f(xs):\n  out = {}\n  for i, x in enumerate(xs):\n    out[x] = i\n  return out"
  renamed = "def f(items):\n  d = {}\n  for j, it in enumerate(items):\n    d[it] = j\n  return d"
  assert is_rename(renamed, loops, "python")
  kw = "def f(a, scale=2):\n  return g(a, scale=scale)"
  assert is_rename("def f(b, s=2):\n  return g(b, scale=s)", kw, "python") is False
  assert is_rename("def f(b, s=2):\n  return g(b, s=s)", kw, "python")


@pytest.mark.parametrize("candidate", [
    SEED_PY.replace("a + b", "a - b"),
    SEED_PY.replace("range(b)", "range(a)"),
    SEED_PY.replace("total * i", "total ** i"),
    "def f(a, b):\n    return a.append(b)",
])
def test_python_non_renames(candidate):
  assert not is_rename(candidate, SEED_PY, "python")


def test_python_that_does_not_parse_falls_back_to_tokens():
  assert canonicalize("def f(:\n  x", "python") == "def f ( : x"


def test_language_is_guessed_when_not_given():
  assert code_tokens(SEED_LEAN)[0] == "("  # Lean normalisation dropped `theorem name`.
  assert code_tokens("x = 1 # c") == ["x", "=", "1"]
  with pytest.raises(ValueError, match="language must be 'lean' or 'python'"):
    canonicalize("x", "coq")


def test_batch_metrics():
  candidates = [SEED_LEAN, RENAMED_LEAN, SEED_LEAN.replace("80", "81"),
                "theorem c (n : ℕ) : n + 0 = n := by"]
  metrics = batch_novelty_metrics(candidates, [SEED_LEAN] * 4, "lean")
  assert metrics["copy_rate"] == pytest.approx(2 / 4)  # The exact copy and the one-number edit.
  assert metrics["rename_rate"] == pytest.approx(1 / 4)  # The rename; an exact copy is no rename.
  jaccards = [token_jaccard(c, SEED_LEAN, "lean") for c in candidates]
  assert metrics["mean_jaccard"] == pytest.approx(sum(jaccards) / 4)
  assert metrics["count"] == 4
  assert batch_novelty_metrics([], [], "python")["copy_rate"] == 0.0
  with pytest.raises(ValueError, match="2 candidates but 1 seeds"):
    batch_novelty_metrics(["a", "b"], ["a"], "python")


def _rename_all(statement, rng):
  """Renames the theorem and every bound name to fresh names, by regex on the raw text."""
  names = bound_names(statement, "lean")
  fresh = {name: f"r{rng.randrange(10**6)}_{i}" for i, name in enumerate(names)}
  for name, new in fresh.items():
    statement = re.sub(rf"(?<![\w'.]){re.escape(name)}(?![\w'])", new, statement)
  return re.sub(r"^theorem\s+\S+", "theorem renamed_statement", statement), len(names)


def test_minif2f_renames_are_detected_and_distinct_statements_are_not(shared_data):
  path = shared_data / "minif2f" / "minif2f.jsonl"
  if not path.exists():
    pytest.skip(f"{path} not present")
  statements = [json.loads(line)["formal_statement"] for line in path.read_text().splitlines()]
  assert len(statements) == 488
  rng = random.Random(0)
  renamed_count = 0
  for statement in statements:
    renamed, n_names = _rename_all(statement, rng)
    # A statement with no bound names renames to itself: identical, so no rename.
    assert is_rename(renamed, statement, "lean") == (n_names > 0), statement
    if n_names:
      renamed_count += 1
      assert renamed.split(":", 1)[1] != statement.split(":", 1)[1]
  assert renamed_count > 400
  canonical = [canonicalize(s, "lean") for s in statements]
  assert len(set(canonical)) == len(statements)  # No two distinct statements collide.
  rng.shuffle(statements)
  for a, b in zip(statements, statements[1:]):
    assert not is_rename(a, b, "lean")
