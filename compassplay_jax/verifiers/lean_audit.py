"""The Lean-side check: what Lean itself reports about the checked theorem, whatever the guard read.

Two commands follow the proof in the same REPL command (so the local pool and kimina-lean-server
check the same text):

  #print axioms <thm>      the axioms the theorem's proof depends on (Lean's own `#print axioms`)
  #eval … (AUDIT_MARKER)   every declaration the command added to the environment (the stage-2
                           constants of `Environment.constants`: the header's env adds none), each
                           with its kind, after re-adding a renamed copy of every added theorem and
                           definition through the kernel with `debug.skipKernelTC` off. A proof
                           accepted with the kernel check skipped (`set_option debug.skipKernelTC
                           true in`) fails there with a kernel error.

`audit_violation` accepts only when the theorem is there, every other added declaration is a
theorem or definition Lean makes for a proof (`<thm>.match_1`, `<thm>.proof_1`, `_auxLemma.N`),
and (with acceptance.py) the axioms are standard and no message is an error. An `axiom`, `def`,
`instance`, `elab`, `macro` or `syntax` that the guard missed adds a declaration of its own and is
rejected here. What this layer cannot see is in docs/lean.md ("Threat model").

The `#eval` block is Lean 4 that uses only long-stable API (Lean.getEnv, Environment.constants,
SMap.map₂, Lean.addDecl, Lean.withOptions, Lean.logInfo); tests/test_lean_integration.py runs it on
a real REPL when one is configured.
"""
import re

from compassplay_jax.verifiers.lean_repl import LeanCheckResult

AUDIT_MARKER = "compassplay-audit"
ALLOWED_AXIOMS = frozenset({"propext", "Classical.choice", "Quot.sound"})
_AXIOMS_LIST = re.compile(r"depends on axioms:\s*\[(.*)\]", re.S)

_AUDIT_EVAL = """\
#eval show Lean.CoreM Unit from do
  let mut report : Array String := #["{marker}"]
  let mut i : Nat := 0
  for (n, ci) in (← Lean.getEnv).constants.map₂.toList do
    i := i + 1
    let copy := Lean.Name.mkNum `_compassplay_recheck i
    Lean.withOptions (fun o => (o.setBool `debug.skipKernelTC false).setBool `Elab.async false) do
      match ci with
      | .thmInfo v => Lean.addDecl (.thmDecl {{ v with name := copy, all := [copy] }})
      | .defnInfo v => Lean.addDecl (.defnDecl {{ v with name := copy, all := [copy] }})
      | _ => pure ()
    let kind := match ci with
      | .thmInfo _ => "theorem"
      | .defnInfo _ => "definition"
      | .axiomInfo _ => "axiom"
      | .opaqueInfo _ => "opaque"
      | .quotInfo _ => "quot"
      | .inductInfo _ => "inductive"
      | .ctorInfo _ => "constructor"
      | .recInfo _ => "recursor"
    report := report.push s!"{{n}} {{kind}}"
  Lean.logInfo (String.intercalate "\\n" report.toList)
"""


def audit_commands(theorem: str) -> str:
  """The Lean text appended after a proof: `#print axioms` then the declaration audit."""
  return f"#print axioms {theorem}\n" + _AUDIT_EVAL.format(marker=AUDIT_MARKER)


def audit_line_count() -> int:
  return audit_commands("t").count("\n")


def reported_axioms(result: LeanCheckResult, line: int, theorem: str) -> list[str] | None:
  """Axioms named by the `#print axioms` message on `line` (our command's), or None if absent."""
  for message in result.messages:
    if message.line != line or message.severity != "info":
      continue
    if message.data.strip() == f"'{theorem}' does not depend on any axioms":
      return []
    match = _AXIOMS_LIST.search(message.data)
    if match and message.data.startswith(f"'{theorem}' depends on axioms"):
      return [a.strip() for a in match.group(1).split(",") if a.strip()]
  return None


def reported_declarations(result: LeanCheckResult, first_line: int,
                          last_line: int) -> list[tuple[str, str]] | None:
  """(name, kind) pairs from the audit's info message within [first_line, last_line], or None."""
  for message in result.messages:
    if not (first_line <= message.line <= last_line and message.severity == "info"):
      continue
    lines = message.data.strip().split("\n")
    if lines[0].strip() != AUDIT_MARKER:
      continue
    declarations = []
    for line in lines[1:]:
      fields = line.split()
      declarations.append((fields[0], fields[1]) if len(fields) == 2 else (line, "malformed"))
    return declarations
  return None


def _name_parts(name: str) -> list[str]:
  """`a.«b.c».d` -> ["a", "b.c", "d"] (Lean's escaped-name printing)."""
  return [a or b for a, b in re.findall(r"«([^»]*)»|([^.«»]+)", name)]


def is_proof_auxiliary(name: str, kind: str, theorem: str) -> bool:
  """True for declarations Lean adds while elaborating a proof of `theorem`: theorems and definitions
  under its name (`thm.match_1`, `thm.proof_1`, a `where` helper) and `_auxLemma.N`
  (Lean.Meta.mkAuxLemma). The audit has re-checked each of them through the kernel."""
  if kind not in ("theorem", "definition"):
    return False
  parts, own = _name_parts(name), _name_parts(theorem)
  return (len(parts) > len(own) and parts[:len(own)] == own) or "_auxLemma" in parts


def audit_violation(theorem: str, axioms: list[str] | None,
                    declarations: list[tuple[str, str]] | None) -> str | None:
  """Why Lean's own reports reject the proof (one line), or None."""
  if axioms is None:
    return "no #print axioms report for the theorem"
  extra = sorted(set(axioms) - ALLOWED_AXIOMS)
  if extra:
    return f"disallowed axioms: {', '.join(extra)}"
  if declarations is None:
    return "no declarations report (Lean-side audit)"
  if (theorem, "theorem") not in declarations:
    return f"theorem {theorem} missing from the environment's new declarations"
  for name, kind in declarations:
    if name != theorem and not is_proof_auxiliary(name, kind, theorem):
      return f"declaration added beyond the theorem: {name} ({kind})"
  return None
