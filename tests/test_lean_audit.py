"""The Lean-side check (verifiers/lean_audit.py): Lean's own reports, independent of the guard.

Recorded replies carry the audit's message as the real REPL prints a `logInfo` (severity info, at
the `#eval` line); the stand-in REPL (tests/fake_lean_repl.py) answers the audit from the code it
reads, so the pool tests send bodies straight to Lean, around the guard, and check that Lean's
reports alone reject them. Acceptance needs both layers: accept_proof rejects when either does.
"""
import sys

import pytest

from compassplay_jax.verifiers import lean_audit
from compassplay_jax.verifiers.lean_acceptance import accept_proof
from compassplay_jax.verifiers.lean_acceptance import check_proofs
from compassplay_jax.verifiers.lean_acceptance import proof_body_violation
from compassplay_jax.verifiers.lean_acceptance import proof_command
from compassplay_jax.verifiers.lean_acceptance import reported_axioms
from compassplay_jax.verifiers.lean_acceptance import reported_declarations
from compassplay_jax.verifiers.lean_pool import LeanReplPool
from tests.test_lean_acceptance import CLEAN
from tests.test_lean_acceptance import FAKE_REPL
from tests.test_lean_acceptance import HEADER
from tests.test_lean_acceptance import STATEMENT
from tests.test_lean_acceptance import THEOREM
from tests.test_lean_acceptance import audit_report
from tests.test_lean_acceptance import axioms_line
from tests.test_lean_acceptance import info
from tests.test_lean_acceptance import reply


@pytest.mark.parametrize("declarations", [
    [(THEOREM, "theorem")],
    [(THEOREM, "theorem"), (f"{THEOREM}.match_1", "definition"), ("_auxLemma.3", "theorem"),
     (f"{THEOREM}.go", "definition"), (f"{THEOREM}.proof_1", "theorem")],
])
def test_the_theorem_and_its_auxiliaries_are_accepted(declarations):
  assert accept_proof(STATEMENT, CLEAN, reply(CLEAN, declarations=declarations)).ok


@pytest.mark.parametrize("declarations, reason", [
    ([(THEOREM, "theorem"), ("cheat", "axiom")], "declaration added beyond the theorem: cheat (axiom)"),
    ([(THEOREM, "theorem"), ("instInhabitedFalse", "definition")],
     "declaration added beyond the theorem: instInhabitedFalse (definition)"),
    ([(THEOREM, "theorem"), ("_aux_cheat___elabRules_1", "definition")],
     "declaration added beyond the theorem: _aux_cheat___elabRules_1 (definition)"),
    ([(THEOREM, "theorem"), (f"{THEOREM}.ax", "axiom")],  # under its name, but not a theorem/def
     f"declaration added beyond the theorem: {THEOREM}.ax (axiom)"),
    ([(THEOREM, "theorem"), (f"{THEOREM}x", "theorem")],  # a longer name is not under it
     f"declaration added beyond the theorem: {THEOREM}x (theorem)"),
    ([(THEOREM, "theorem"), ("Foo", "inductive"), ("Foo.mk", "constructor")],
     "declaration added beyond the theorem: Foo (inductive)"),
    ([], f"theorem {THEOREM} missing from the environment's new declarations"),
    ([(THEOREM, "definition")], f"theorem {THEOREM} missing from the environment's new declarations"),
    ([(THEOREM, "theorem"), ("«a b»", "theorem")],  # a line that is not `name kind`
     "declaration added beyond the theorem: «a b» theorem (malformed)"),
    (None, "no declarations report (Lean-side audit)"),
])
def test_declarations_beyond_the_theorem_reject(declarations, reason):
  assert accept_proof(STATEMENT, CLEAN, reply(CLEAN, declarations=declarations)).reason == reason


def test_the_audit_is_read_from_its_own_lines_only():
  # A report printed from inside the body (line 2) is no audit; nor is one without the marker.
  spoof = info(2, audit_report([(THEOREM, "theorem")]))
  assert accept_proof(STATEMENT, CLEAN, reply(CLEAN, spoof, declarations=None)).reason == (
      "no declarations report (Lean-side audit)")
  unmarked = info(axioms_line(CLEAN) + 1, f"{THEOREM} theorem")
  assert not accept_proof(STATEMENT, CLEAN, reply(CLEAN, unmarked, declarations=None)).ok


def test_a_failed_kernel_recheck_rejects():
  # What the audit's Lean.addDecl prints when a proof was only accepted with the kernel check off.
  kernel = {"severity": "error", "pos": {"line": axioms_line(CLEAN) + 1, "column": 0}, "endPos": None,
            "data": "(kernel) declaration type mismatch, '_compassplay_recheck.1' has type\n  True"}
  verdict = accept_proof(STATEMENT, CLEAN, reply(CLEAN, kernel))
  assert verdict.reason == f"lean error at line {axioms_line(CLEAN) + 1}: (kernel) declaration type " \
                           "mismatch, '_compassplay_recheck.1' has type"


def test_audit_commands_are_lean_that_reports_and_rechecks():
  text = lean_audit.audit_commands("t")
  assert text.count("\n") == lean_audit.audit_line_count()
  assert text.startswith("#print axioms t\n#eval show Lean.CoreM Unit from do\n")
  assert f'#["{lean_audit.AUDIT_MARKER}"]' in text and ".constants.map₂.toList" in text
  # The renamed copies go through the kernel with its check forced on.
  assert "setBool `debug.skipKernelTC false" in text and text.count("Lean.addDecl") == 2


# --- through the pool and the stand-in REPL, around the guard ---------------------------------

# Commands a body could smuggle if the guard ever misread it; each also fails the guard.
INJECTED = {
    "axiom": ("\n  trivial\n\naxiom cheat : False", "cheat (axiom)"),
    "def": ("\n  trivial\n\ndef helper : Nat := 0", "helper (definition)"),
    "instance": ("\n  trivial\n\ninstance : Inhabited False := ⟨by trivial⟩", "instFake (definition)"),
    "elab": ('\n  trivial\n\nelab "cheat" : tactic => pure ()', "_aux_elab_1 (definition)"),
    "macro": ('\n  trivial\n\nmacro "cheat" : tactic => `(tactic| trivial)', "_aux_macro_1 (definition)"),
    "structure": ("\n  trivial\n\nstructure Foo where", "Foo (inductive)"),
    "second theorem": ("\n  trivial\n\ntheorem other : True := trivial", "other (theorem)"),
}


@pytest.fixture(scope="module")
def pool():
  with LeanReplPool(command=(sys.executable, FAKE_REPL), num_workers=2, timeout_s=10,
                    memory_limit_mb=1024) as p:
    yield p


def _lean_side(pool, body):
  result = pool.check(HEADER, proof_command(STATEMENT, body))
  return result, lean_audit.audit_violation(THEOREM, reported_axioms(STATEMENT, body, result),
                                            reported_declarations(STATEMENT, body, result))


@pytest.mark.parametrize("name", sorted(INJECTED))
def test_lean_side_alone_rejects_injected_commands(pool, name):
  body, declaration = INJECTED[name]
  assert proof_body_violation(body) is not None  # the guard rejects it too
  result, violation = _lean_side(pool, body)
  assert result.status == "answered" and not result.errors
  if name == "axiom":
    assert violation == "disallowed axioms: cheat"
  else:
    assert violation == f"declaration added beyond the theorem: {declaration}"


def test_lean_side_accepts_a_clean_proof_and_its_matcher(pool):
  for body in (CLEAN, "\n  match h₀ with\n  | ⟨hb, hh, hv⟩ => nlinarith [hb, hh]"):
    result, violation = _lean_side(pool, body)
    assert violation is None, (body, result)
  result, _ = _lean_side(pool, "\n  match h₀ with\n  | _ => simp")
  assert (f"{THEOREM}.match_1", "definition") in reported_declarations(
      STATEMENT, "\n  match h₀ with\n  | _ => simp", result)


def test_acceptance_needs_both_layers(pool):
  # Guard clean, Lean's reports not: rejected by Lean's side.
  bodies = ["\n  simp -- fake: decls cheat axiom",
            "\n  simp -- fake: decls instBad definition",
            "\n  simp -- fake: unchecked",
            CLEAN]
  assert all(proof_body_violation(b) is None for b in bodies)
  verdicts = check_proofs(pool, HEADER, STATEMENT, bodies)
  audit_line = axioms_line(bodies[2]) + 1
  assert [v.reason for v in verdicts] == [
      "declaration added beyond the theorem: cheat (axiom)",
      "declaration added beyond the theorem: instBad (definition)",
      f"lean error at line {audit_line}: (kernel) declaration type mismatch, '_compassplay_recheck.1' has type",
      "accepted"]
  # Lean's reports clean, guard not: rejected by the guard (tests/test_lean_acceptance.py::EXPLOITS).
  body = "\n  set_option maxRecDepth 100 in\n  simp"
  result, violation = _lean_side(pool, body)
  assert violation is None and not accept_proof(STATEMENT, body, result).ok
