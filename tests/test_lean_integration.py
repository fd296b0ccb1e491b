"""The pool and acceptance rule against a real Lean REPL with Mathlib.

Runs only when COMPASSPLAY_LEAN_REPL names the REPL command (for example
`lake env /opt/repl/.lake/build/bin/repl`) and COMPASSPLAY_LEAN_PROJECT names the
Mathlib project it runs in; see docs/lean.md. Otherwise every test skips.
"""
import os

import pytest

from compassplay_jax.domains.lean.targets import DEFAULT_HEADER
from compassplay_jax.verifiers.lean_acceptance import accept_proof
from compassplay_jax.verifiers.lean_acceptance import check_proofs
from compassplay_jax.verifiers.lean_acceptance import elaborate_conjecture
from compassplay_jax.verifiers.lean_acceptance import proof_command
from compassplay_jax.verifiers.lean_acceptance import reported_axioms
from compassplay_jax.verifiers.lean_acceptance import reported_declarations
from compassplay_jax.verifiers.lean_acceptance import validate_conjecture
from compassplay_jax.verifiers.lean_pool import PROJECT_DIR_ENV
from compassplay_jax.verifiers.lean_pool import REPL_COMMAND_ENV
from compassplay_jax.verifiers.lean_pool import LeanReplPool

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (os.environ.get(REPL_COMMAND_ENV) and os.environ.get(PROJECT_DIR_ENV)),
                       reason=f"set {REPL_COMMAND_ENV} (REPL command) and {PROJECT_DIR_ENV} "
                              f"(Mathlib project dir) to run against a real Lean REPL"),
]

STATEMENT = "theorem mathd_algebra_182 (y : ℂ) : 7 * (3 * y + 2) = 21 * y + 14 := by"
EM = "theorem excluded_middle_demo (p : Prop) : p ∨ ¬p := by"
NATIVE = "theorem native_demo : 2 ^ 10 = 1024 := by"


@pytest.fixture(scope="module")
def pool():
  memory = int(os.environ.get("COMPASSPLAY_LEAN_MEMORY_MB", "16384"))
  with LeanReplPool.from_env(num_workers=2, timeout_s=300, memory_limit_mb=memory,
                             header_timeout_s=900) as p:
    p.warm_up(DEFAULT_HEADER)
    yield p


def test_clean_proofs_are_accepted(pool):
  verdicts = check_proofs(pool, DEFAULT_HEADER, STATEMENT, ["\n  ring", " ring_nf"])
  assert all(v.ok for v in verdicts), verdicts
  assert check_proofs(pool, DEFAULT_HEADER, EM, ["\n  exact Classical.em p"])[0].ok


def test_axioms_report_is_parsed(pool):
  body = "\n  exact Classical.em p"
  result = pool.check(DEFAULT_HEADER, proof_command(EM, body))
  assert set(reported_axioms(EM, body, result)) <= {"propext", "Classical.choice", "Quot.sound"}
  assert "Classical.choice" in reported_axioms(EM, body, result)


def test_sorry_errors_and_native_evaluation_are_rejected(pool):
  verdicts = check_proofs(pool, DEFAULT_HEADER, STATEMENT,
                          ["\n  sorry", "\n  exact sorry", "\n  rfl", "\n  linarith"])
  assert not any(v.ok for v in verdicts), verdicts
  # Lean's own evidence for native_decide, with the lexical ban out of the way.
  result = pool.check(DEFAULT_HEADER, proof_command(NATIVE, "\n  native_decide"))
  axioms = reported_axioms(NATIVE, "\n  native_decide", result)
  assert axioms is not None and {"Lean.ofReduceBool", "Lean.trustCompiler"} & set(axioms)
  assert not accept_proof(NATIVE, "\n  native_decide", result).ok


def test_sorry_reply_matches_the_recorded_shape(pool):
  result = pool.check(DEFAULT_HEADER, STATEMENT + "\n  sorry\n")
  assert result.status == "answered" and result.sorries
  assert any(m.severity == "warning" and "declaration uses" in m.data for m in result.messages)


def test_conjecture_is_elaborated_with_sorry(pool):
  ok, _, statement = validate_conjecture("theorem c_1 (x : ℝ) (h : 0 < x) : 0 < x ^ 2 := by sorry")
  assert ok and elaborate_conjecture(pool, DEFAULT_HEADER, statement).ok
  assert not elaborate_conjecture(pool, DEFAULT_HEADER, "theorem c_2 : (1 : ℕ) = := by").ok


def test_the_audit_lists_the_theorem_and_flags_an_injected_axiom(pool):
  # lean_audit's #eval on real Lean: it must run without error and list what the command added.
  body = "\n  exact Classical.em p"
  result = pool.check(DEFAULT_HEADER, proof_command(EM, body))
  assert not result.errors, result.messages
  assert ("excluded_middle_demo", "theorem") in reported_declarations(EM, body, result)
  injected = "\n  exact Classical.em p\n\naxiom cheat_demo : False"  # around the guard, straight to Lean
  result = pool.check(DEFAULT_HEADER, proof_command(EM, injected))
  assert ("cheat_demo", "axiom") in reported_declarations(EM, injected, result)
  assert not accept_proof(EM, injected, result).ok


def test_the_kernel_recheck_catches_a_proof_admitted_with_the_kernel_check_off(pool):
  # A run_tac adds `<thm>.aux : False := True.intro` with debug.skipKernelTC, and the proof uses it:
  # Lean reports no error and no axiom; the audit's kernel re-check of the copy fails.
  statement = "theorem kernel_demo : False := by"
  body = ("\n  set_option debug.skipKernelTC true in\n  run_tac do\n    Lean.addDecl (.thmDecl { name := "
          "`kernel_demo.aux, levelParams := [], type := Lean.mkConst ``False, value := Lean.mkConst "
          "``True.intro })\n  exact kernel_demo.aux")
  result = pool.check(DEFAULT_HEADER, proof_command(statement, body))
  audit_errors = [m for m in result.errors if "(kernel)" in m.data]
  assert audit_errors, result.messages
  assert not accept_proof(statement, body, result).ok
