"""When a Lean proof counts: the acceptance rule, conjecture validation, batch checking.

We fix the statement (from the dataset or a validated conjecture) and append only the model's
proof body, then Lean's own reports (lean_audit.py). A proof is accepted only if both layers agree:
  1. the guard (lean_guard.py): the body is tactic text, read by a port of Lean's tokenizer;
  2. Lean: the REPL answered with no error message, no sorries, no "declaration uses 'sorry'"
     warning (either quote style) and no warning containing "failed" (SGS's rule, below);
  3. Lean: `#print axioms` reports only ALLOWED_AXIOMS, and the declaration audit shows nothing
     added beyond the theorem and its auxiliaries, every one re-checked by the kernel.
A missing report rejects. docs/lean.md ("Threat model") says what each layer stops.
"""
import dataclasses
import re
from collections.abc import Sequence

from compassplay_jax.lean_syntax.statements import strip_lean_comments, theorem_name
from compassplay_jax.verifiers import lean_audit
from compassplay_jax.verifiers.lean_audit import ALLOWED_AXIOMS  # noqa: F401  (re-exported)
from compassplay_jax.verifiers.lean_guard import MAX_PROOF_CHARS
from compassplay_jax.verifiers.lean_guard import banned_construct
from compassplay_jax.verifiers.lean_guard import proof_body_violation
from compassplay_jax.verifiers.lean_guard import top_level_command  # noqa: F401  (re-exported)
from compassplay_jax.verifiers.lean_repl import ANSWERED
from compassplay_jax.verifiers.lean_repl import LeanCheckResult

_SORRY_WARNING = re.compile(r"declaration uses ['`]sorry['`]")
# SGS's verifier (github.com/LukeBailey181/sgs at 64d2de4, sgs/verification/prover/lean/verifier.py:147, and
# :476-483, :568-575 in its other two paths; DeepSeek-Prover-V1.5's rule) counts a proof complete only if no
# message of severity "warning" contains the substring 'failed' (case-sensitive) or "declaration uses 'sorry'".
_FAILED_IN_WARNING = "failed"
_CONJECTURE_SHAPE = re.compile(r"^(?:theorem|lemma)\s+\S+[\s\S]*?:=\s*by$")


@dataclasses.dataclass(frozen=True)
class Acceptance:
  ok: bool
  reason: str  # "accepted" or why not, one line.
  system_error: bool = False  # The checker failed (crash, bad header): retry, do not reward.


def _joined_body(proof_body: str) -> str:
  """The body as it follows `:= by` in the checked text (a space before a body glued to `by`,
  which would otherwise continue the keyword: `by'x'` is one identifier)."""
  body = proof_body.rstrip()
  return " " + body if body and body[0] not in " \n" else body


def proof_command(statement: str, proof_body: str) -> str:
  """The text checked on top of the header: statement + body + Lean's reports (lean_audit)."""
  name = theorem_name(statement)
  if name is None:
    raise ValueError(f"proof_command: statement has no 'theorem <name>': {statement[:80]!r}")
  return f"{statement.rstrip()}{_joined_body(proof_body)}\n\n{lean_audit.audit_commands(name)}"


def _audit_lines(statement: str, proof_body: str) -> tuple[int, int]:
  """(line of `#print axioms`, last line of the declaration audit) in proof_command's text."""
  last = proof_command(statement, proof_body).count("\n")
  return last - lean_audit.audit_line_count() + 1, last


def reported_axioms(statement: str, proof_body: str,
                    check_result: LeanCheckResult) -> list[str] | None:
  """Axioms named by our `#print axioms` line (located by position), or None if absent."""
  line, _ = _audit_lines(statement, proof_body)
  return lean_audit.reported_axioms(check_result, line, theorem_name(statement))


def reported_declarations(statement: str, proof_body: str,
                          check_result: LeanCheckResult) -> list[tuple[str, str]] | None:
  """(name, kind) of every declaration the checked command added, from the audit, or None."""
  line, last = _audit_lines(statement, proof_body)
  return lean_audit.reported_declarations(check_result, line + 1, last)


def _lean_failure(result: LeanCheckResult) -> Acceptance | None:
  """The rejection for a check with no verdict or with an error message, else None."""
  if result.status != ANSWERED:
    detail = result.error.splitlines()[0] if result.error else ""
    return Acceptance(False, f"{result.status}: {detail}".rstrip(": "),
                      system_error=result.is_system_error)
  if result.errors:
    first = result.errors[0]
    return Acceptance(False, f"lean error at line {first.line}: {first.data.splitlines()[0]}")
  return None


def accept_proof(statement: str, proof_body: str, check_result: LeanCheckResult) -> Acceptance:
  """Applies the acceptance rule to the REPL's answer for proof_command(statement, body)."""
  banned = proof_body_violation(proof_body)
  if banned:
    return Acceptance(False, f"banned construct in proof body: {banned}")
  failed = _lean_failure(check_result)
  if failed:
    return failed
  if check_result.sorries:
    return Acceptance(False, "proof contains sorry")
  if any(_SORRY_WARNING.search(m.data) for m in check_result.messages):
    return Acceptance(False, "declaration uses sorry")
  failed = next((m for m in check_result.messages if m.severity == "warning" and _FAILED_IN_WARNING in m.data), None)
  if failed:
    return Acceptance(False, f"lean warning containing 'failed' at line {failed.line}: {failed.data.splitlines()[0]}")
  audit = lean_audit.audit_violation(theorem_name(statement),
                                     reported_axioms(statement, proof_body, check_result),
                                     reported_declarations(statement, proof_body, check_result))
  if audit:
    return Acceptance(False, audit)
  return Acceptance(True, "accepted")


def check_proofs(pool, header: str, statement: str,
                 proof_bodies: Sequence[str]) -> list[Acceptance]:
  """Checks each body against the fixed statement in parallel; one Acceptance per body.

  Bodies with a banned construct are rejected without running Lean.
  """
  verdicts: list[Acceptance | None] = [None] * len(proof_bodies)
  to_run = []
  for i, body in enumerate(proof_bodies):
    banned = proof_body_violation(body)
    if banned:
      verdicts[i] = Acceptance(False, f"banned construct in proof body: {banned}")
    else:
      to_run.append(i)
  results = pool.check_batch([(header, proof_command(statement, proof_bodies[i]))
                              for i in to_run])
  for i, result in zip(to_run, results):
    verdicts[i] = accept_proof(statement, proof_bodies[i], result)
  return verdicts


def validate_conjecture(text: str) -> tuple[bool, str, str | None]:
  """Checks a conjecture is exactly one theorem statement: (ok, reason, statement).

  Accepts `theorem name binders : type := by` optionally followed by `sorry`;
  comments are dropped, `lemma` becomes `theorem`. Anything else (a second
  declaration, an axiom, set_option, an open, a banned construct) is rejected.
  The returned statement ends with `:= by`, ready for proof_command().
  """
  if len(text) > MAX_PROOF_CHARS:
    return False, f"conjecture too long: {len(text)} characters (limit {MAX_PROOF_CHARS})", None
  code = strip_lean_comments(text).strip()
  code = re.sub(r"\s*\bsorry\s*$", "", code).rstrip()
  if not code:
    return False, "empty conjecture", None
  if not _CONJECTURE_SHAPE.match(code):
    return False, "conjecture must be one 'theorem <name> ... := by' statement", None
  if len(re.findall(r":=\s*by\b", code)) != 1:
    return False, "conjecture must contain exactly one ':= by'", None
  decl_end = re.match(r"^(?:theorem|lemma)\s+\S+", code).end()
  # The statement's own keyword is allowed once; everything else goes through the ban list.
  banned = banned_construct(code, allow_declaration=True)
  if banned:
    return False, f"banned construct in conjecture: {banned}", None
  if theorem_name(code) is None or ":" not in code[decl_end:]:
    return False, "conjecture has no name or no type", None
  statement = re.sub(r"^lemma\b", "theorem", code)
  return True, "ok", statement


def elaborate_conjecture(pool, header: str, statement: str) -> Acceptance:
  """Elaborates `statement` with `sorry` in Lean: ok iff no error and exactly one sorry."""
  result = pool.check(header, f"{statement.rstrip()} sorry\n")
  failed = _lean_failure(result)
  if failed:
    return failed
  if len(result.sorries) != 1:
    return Acceptance(False, f"expected one sorry, Lean reported {len(result.sorries)}")
  return Acceptance(True, "ok")
