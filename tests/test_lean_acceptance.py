"""The acceptance rule on recorded REPL replies, on an exploit catalogue, and via the pool."""
import pathlib
import sys

import pytest

from compassplay_jax.verifiers.lean_acceptance import Acceptance
from compassplay_jax.verifiers.lean_acceptance import accept_proof
from compassplay_jax.verifiers.lean_acceptance import banned_construct
from compassplay_jax.verifiers.lean_acceptance import check_proofs
from compassplay_jax.verifiers.lean_acceptance import elaborate_conjecture
from compassplay_jax.verifiers.lean_acceptance import proof_command
from compassplay_jax.verifiers.lean_acceptance import validate_conjecture
from compassplay_jax.verifiers.lean_audit import AUDIT_MARKER
from compassplay_jax.verifiers.lean_audit import audit_commands
from compassplay_jax.verifiers.lean_audit import audit_line_count
from compassplay_jax.verifiers.lean_pool import LeanReplPool
from compassplay_jax.verifiers.lean_repl import LeanCheckResult

FAKE_REPL = str(pathlib.Path(__file__).with_name("fake_lean_repl.py"))
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"
STATEMENT = ("theorem mathd_algebra_478 (b h v : ℝ) (h₀ : 0 < b ∧ 0 < h ∧ 0 < v) (h₁ : v = 1 / 3 * (b * h))\n"
             "    (h₂ : b = 30) (h₃ : h = 13 / 2) : v = 65 := by")
CLEAN = "\n  rw [h₂, h₃] at h₁\n  norm_num [h₁]"
STANDARD_AXIOMS = "'mathd_algebra_478' depends on axioms: [propext, Classical.choice, Quot.sound]"


THEOREM = "mathd_algebra_478"


def axioms_line(body):
  """The line of our `#print axioms` in proof_command's text (the audit's #eval follows it)."""
  return proof_command(STATEMENT, body).count("\n") - audit_line_count() + 1


def info(line, data):
  return {"severity": "info", "pos": {"line": line, "column": 0},
          "endPos": {"line": line, "column": 31}, "data": data}


def audit_report(declarations):
  return "\n".join([AUDIT_MARKER, *(f"{name} {kind}" for name, kind in declarations)])


def reply(body, *messages, sorries=(), axioms=STANDARD_AXIOMS, declarations=((THEOREM, "theorem"),)):
  """A reply shaped like the REPL's, ending with the #print axioms report and the declaration
  audit on their lines (what lean_audit's commands print)."""
  msgs = list(messages)
  if axioms is not None:
    msgs.append(info(axioms_line(body), axioms))
  if declarations is not None:
    msgs.append(info(axioms_line(body) + 1, audit_report(declarations)))
  out = {"env": 1}
  if msgs:
    out["messages"] = msgs
  if sorries:
    out["sorries"] = list(sorries)
  return LeanCheckResult.from_reply(out, time_s=1.0)


SORRY_ENTRY = {"proofState": 0, "pos": {"line": 3, "column": 2}, "endPos": {"line": 3, "column": 7},
               "goal": "b h v : ℝ\nh₀ : 0 < b ∧ 0 < h ∧ 0 < v\n⊢ v = 65"}


def sorry_warning(quote):
  return {"severity": "warning", "pos": {"line": 1, "column": 8}, "endPos": {"line": 1, "column": 25},
          "data": f"declaration uses {quote}sorry{quote}"}


# --- recorded replies ---------------------------------------------------------------------------

def test_clean_reply_is_accepted():
  assert accept_proof(STATEMENT, CLEAN, reply(CLEAN)).ok


def test_no_axioms_at_all_is_accepted():
  verdict = accept_proof(STATEMENT, CLEAN, reply(
      CLEAN, axioms="'mathd_algebra_478' does not depend on any axioms"))
  assert verdict == Acceptance(ok=True, reason="accepted", system_error=False)


def test_linter_warning_does_not_reject():
  unused = {"severity": "warning", "pos": {"line": 1, "column": 30}, "endPos": None,
            "data": "unused variable `h₀`\nnote: this linter can be disabled with "
                    "`set_option linter.unusedVariables false`"}
  assert accept_proof(STATEMENT, CLEAN, reply(CLEAN, unused)).ok


@pytest.mark.parametrize("quote", ["'", "`"])
def test_sorry_warning_rejects_in_both_spellings(quote):
  # Term-mode sorries give the warning but no `sorries` entry, so the warning alone must reject.
  body = "\n  exact (by norm_num : (65 : ℝ) = 65) ▸ h₁.trans (by simp)"
  verdict = accept_proof(STATEMENT, body, reply(body, sorry_warning(quote)))
  assert not verdict.ok and verdict.reason == "declaration uses sorry"


def test_sorries_entry_rejects():
  body = "\n  nlinarith"
  assert accept_proof(STATEMENT, body, reply(body, sorries=[SORRY_ENTRY])).reason == (
      "proof contains sorry")


def test_error_message_rejects():
  error = {"severity": "error", "pos": {"line": 3, "column": 2}, "endPos": {"line": 3, "column": 11},
           "data": "linarith failed to find a contradiction\ncase a\nb h v : ℝ\n⊢ False failed"}
  verdict = accept_proof(STATEMENT, "\n  linarith", reply("\n  linarith", error))
  assert not verdict.ok
  assert verdict.reason == "lean error at line 3: linarith failed to find a contradiction"


def test_unsolved_goals_rejects():
  error = {"severity": "error", "pos": {"line": 2, "column": 49}, "endPos": {"line": 3, "column": 8},
           "data": "unsolved goals\nb h v : ℝ\n⊢ v = 65"}
  assert not accept_proof(STATEMENT, "\n  simp", reply("\n  simp", error)).ok


@pytest.mark.parametrize("axioms, bad", [
    ("'mathd_algebra_478' depends on axioms: [propext, sorryAx, Classical.choice]", "sorryAx"),
    ("'mathd_algebra_478' depends on axioms: [propext, Lean.ofReduceBool]", "Lean.ofReduceBool"),
    ("'mathd_algebra_478' depends on axioms: [Lean.trustCompiler, propext]", "Lean.trustCompiler"),
    ("'mathd_algebra_478' depends on axioms: [cheat]", "cheat"),
])
def test_disallowed_axioms_reject(axioms, bad):
  verdict = accept_proof(STATEMENT, CLEAN, reply(CLEAN, axioms=axioms))
  assert not verdict.ok and verdict.reason == f"disallowed axioms: {bad}"


def test_missing_axiom_report_rejects():
  verdict = accept_proof(STATEMENT, CLEAN, reply(CLEAN, axioms=None))
  assert verdict.reason == "no #print axioms report for the theorem"


def test_axiom_report_is_read_from_our_line_only():
  spoof = info(2, "'mathd_algebra_478' does not depend on any axioms")
  real = "'mathd_algebra_478' depends on axioms: [sorryAx]"
  assert not accept_proof(STATEMENT, CLEAN, reply(CLEAN, spoof, axioms=real)).ok
  assert not accept_proof(STATEMENT, CLEAN, reply(CLEAN, spoof, axioms=None)).ok
  other = "'other_theorem' does not depend on any axioms"
  assert not accept_proof(STATEMENT, CLEAN, reply(CLEAN, axioms=other)).ok


@pytest.mark.parametrize("status, system_error", [
    ("timeout", False), ("memory_limit", False), ("crash", True), ("repl_error", True),
    ("header_error", True)])
def test_no_verdict_rejects_and_flags_system_errors(status, system_error):
  result = LeanCheckResult(status=status, error="what happened\nmore")
  verdict = accept_proof(STATEMENT, CLEAN, result)
  assert not verdict.ok and verdict.system_error == system_error
  assert verdict.reason == f"{status}: what happened"


# --- exploit catalogue (shared notes §3.6), each as a proof body ------------------------------

EXPLOITS = {
    "sorry": "\n  sorry",
    "admit": "\n  admit",
    "sorry after real tactics": "\n  norm_num at h₁\n  sorry",
    "apply? (DSP-V2 PutnamBench hack)": "\n  apply?",
    "exact?": "\n  exact?",
    "rw?": "\n  rw?",
    "aesop?": "\n  aesop?",
    "native_decide": "\n  native_decide",
    "decide +native": "\n  decide +native",
    "decide native config": "\n  decide (config := { native := true })",
    "ofReduceBool": "\n  exact Lean.ofReduceBool _ _ rfl",
    "implemented_by then native_decide": (
        "\n  trivial\n\ndef one : Nat := 1\n@[implemented_by one] def zero : Nat := 0\n"
        "theorem zero_eq_one : zero = one := by native_decide"),
    "extern": '\n  trivial\n\n@[extern "lean_cheat"] opaque cheat : False',
    "csimp hiding sorry": "\n  trivial\n\n@[csimp] theorem bad : @id = @id := by sorry",
    "injected axiom": "\n  exact False.elim cheat\n\naxiom cheat : False",
    "axiom via run_tac addDecl": (
        "\n  run_tac do\n    Lean.addDecl (.axiomDecl { name := `ax, levelParams := [], "
        "type := .const ``False [], isUnsafe := false })\n  exact ax.elim"),
    "run_tac spawning a process": (
        '\n  run_tac do\n    let _ ← IO.Process.run { cmd := "gcc", args := #["ptrace.c"] }\n  simp'),
    "run_cmd": "\n  simp\n\nrun_cmd Lean.logInfo \"done\"",
    "skipKernelTC": "\n  set_option debug.skipKernelTC true in\n  exact fermat_last_theorem_proof",
    "custom elab": '\n  trivial\n\nelab "cheat" : tactic => do\n  Lean.Elab.admitGoal (← Lean.Elab.Tactic.getMainGoal)',
    "custom macro": "\n  trivial\n\nmacro \"cheat\" : tactic => `(tactic| sorry)",
    "syntax and notation": "\n  trivial\n\nnotation \"⊤⊤\" => True\nsyntax \"cheat\" : tactic",
    "unsafe def": "\n  trivial\n\nunsafe def f : Nat := 0",
    "opaque constant": "\n  exact h\n\nopaque h : False",
    "#exit hides the rest": "\n  norm_num\n#exit",
    "#print spoofing the axioms line": "\n  simp\n#print \"'mathd_algebra_478' does not depend on any axioms\"",
    "#eval side effects": "\n  simp\n#eval IO.println \"hi\"",
    "second theorem": "\n  simp\n\ntheorem other : True := trivial",
    "attribute change": "\n  simp\n\nattribute [simp] Nat.add_comm",
    "import in body": "\n  simp\nimport Mathlib",
    "set_option alone": "\n  set_option maxRecDepth 100000 in\n  norm_num",
    "hint tactic": "\n  hint",
    "instance": "\n  simp\n\ninstance : Inhabited False := ⟨by sorry⟩",
}

CLEAN_PROOFS = [
    CLEAN,
    "\n  nlinarith [sq_nonneg (b - h), sq_nonneg (b + h), mul_pos h₀.1 h₀.2.1]",
    "\n  norm_num [h₁, h₂, h₃, Nat.factorial, Finset.sum_range_succ]",
    "\n  have h₄ : v = 1 / 3 * (30 * (13 / 2)) := by\n    rw [h₁, h₂, h₃]\n  linarith",
    "\n  rcases h₀ with ⟨hb, hh, hv⟩\n  subst h₂ h₃\n  field_simp at h₁ ⊢\n  linarith",
    "\n  -- no sorry needed: the arithmetic is direct\n  simp only [h₁, h₂, h₃]\n  ring_nf",
    "\n  /- admit nothing; native arithmetic -/\n  norm_num [h₁, h₂, h₃]",
    " by_contra hne\n  push_neg at hne\n  exact hne (by rw [h₁, h₂, h₃]; norm_num)",
    "\n  interval_cases b <;> simp_all [Set.mem_def]",
    "\n  exact h₁.trans (by rw [h₂, h₃]; norm_num)",
    "\n  have hint₁ := h₀.1\n  omega",
    "\n  haveI : Nonempty ℝ := inferInstance\n  nlinarith [h₀.1, infer_instance]",
    "\n  calc v = 1 / 3 * (b * h) := h₁\n    _ = 65 := by rw [h₂, h₃]; norm_num",
]


@pytest.mark.parametrize("name", sorted(EXPLOITS))
def test_every_exploit_is_rejected_even_if_lean_said_fine(name):
  body = EXPLOITS[name]
  verdict = accept_proof(STATEMENT, body, reply(body))
  assert not verdict.ok, name
  assert verdict.reason.startswith("banned construct in proof body: ")


@pytest.mark.parametrize("body", CLEAN_PROOFS)
def test_every_clean_proof_is_accepted(body):
  assert banned_construct(body) is None
  assert accept_proof(STATEMENT, body, reply(body)).ok


def test_banned_construct_names_the_line():
  assert banned_construct("\n  norm_num\n  native_decide") == "native_decide (line 3)"
  assert banned_construct('  simp [show "--" = "--" from rfl]\n  sorry') == "sorry (line 2)"


def test_proof_command_appends_body_then_axioms_then_the_audit():
  audit = audit_commands("t")
  assert audit.startswith("#print axioms t\n#eval show Lean.CoreM Unit from do\n")
  assert proof_command("theorem t : True := by", "trivial") == (
      "theorem t : True := by trivial\n\n" + audit)
  assert proof_command("theorem t : True := by\n", "\n  trivial\n\n") == (
      "theorem t : True := by\n  trivial\n\n" + audit)
  # A body glued to `by` gets a space: `by'x'` would be one identifier to Lean.
  assert proof_command("theorem t : Char := by", "'x'").startswith("theorem t : Char := by 'x'")
  with pytest.raises(ValueError, match="no 'theorem <name>'"):
    proof_command("example : True := by", "trivial")


# --- conjectures --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, statement", [
    ("theorem pos_sq (x : ℝ) (h : 0 < x) : 0 < x ^ 2 := by sorry",
     "theorem pos_sq (x : ℝ) (h : 0 < x) : 0 < x ^ 2 := by"),
    ("lemma helper (a b : ℕ) : a + b = b + a := by\n  sorry\n",
     "theorem helper (a b : ℕ) : a + b = b + a := by"),
    ("/-- docstring -/\ntheorem c1 (n : ℕ) (h₀ : n % 5 = 3) :\n  (2 * n) % 5 = 1 := by -- easy\n",
     "theorem c1 (n : ℕ) (h₀ : n % 5 = 3) :\n  (2 * n) % 5 = 1 := by"),
])
def test_valid_conjectures(text, statement):
  assert validate_conjecture(text) == (True, "ok", statement)


@pytest.mark.parametrize("text, reason", [
    ("axiom h : False\ntheorem c : False := by sorry", "one 'theorem <name>"),
    ("theorem a : True := by sorry\ntheorem b : True := by sorry", "exactly one ':= by'"),
    ("def f := 1\ntheorem c : f = 1 := by sorry", "one 'theorem <name>"),
    ("set_option maxHeartbeats 0 in\ntheorem c : True := by sorry", "one 'theorem <name>"),
    ("open Real in\ntheorem c : True := by sorry", "one 'theorem <name>"),
    ("theorem c : True := trivial", "one 'theorem <name>"),
    ("theorem c : True := by trivial", "one 'theorem <name>"),
    ("example : True := by sorry", "one 'theorem <name>"),
    ("@[simp] theorem c : True := by sorry", "one 'theorem <name>"),
    ("theorem c (h : (native_decide : Prop)) : True := by sorry", "banned construct"),
    ("theorem c : True := by\n\naxiom z : False\ntheorem d : False := by sorry", "exactly one"),
    ("", "empty conjecture"),
])
def test_invalid_conjectures(text, reason):
  ok, why, statement = validate_conjecture(text)
  assert not ok and statement is None and reason in why


# --- through the pool and the stand-in REPL ----------------------------------------------------

@pytest.fixture(scope="module")
def pool():
  with LeanReplPool(command=(sys.executable, FAKE_REPL), num_workers=2, timeout_s=10,
                    memory_limit_mb=1024) as p:
    yield p


def test_check_proofs_accepts_clean_and_rejects_exploits(pool):
  bodies = CLEAN_PROOFS + list(EXPLOITS.values())
  verdicts = check_proofs(pool, HEADER, STATEMENT, bodies)
  assert [v.ok for v in verdicts] == [True] * len(CLEAN_PROOFS) + [False] * len(EXPLOITS)


def test_check_proofs_rejects_what_only_lean_catches(pool):
  bodies = ["\n  simp -- fake: error unsolved goals",
            "\n  simp -- fake: axioms propext, Lean.ofReduceBool",
            "\n  simp -- fake: axioms cheat",
            "\n  simp -- fake: hang"]
  pool_timeout, pool.timeout_s = pool.timeout_s, 0.5
  try:
    verdicts = check_proofs(pool, HEADER, STATEMENT, bodies)
  finally:
    pool.timeout_s = pool_timeout
  assert [v.ok for v in verdicts] == [False] * 4
  assert verdicts[0].reason.startswith("lean error at line 3: unsolved goals")
  assert verdicts[1].reason == "disallowed axioms: Lean.ofReduceBool"
  assert verdicts[2].reason == "disallowed axioms: cheat"
  assert verdicts[3].reason.startswith("timeout")


def test_elaborate_conjecture(pool):
  assert elaborate_conjecture(pool, HEADER, "theorem c (x : ℕ) : x = x := by").ok
  verdict = elaborate_conjecture(pool, HEADER, "theorem c : True := by -- fake: error bad type")
  assert not verdict.ok and "bad type" in verdict.reason
