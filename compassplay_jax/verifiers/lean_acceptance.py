"""When a Lean proof counts: the acceptance rule, conjecture validation, batch checking.

We fix the statement (from the dataset or a validated conjecture) and append only
the model's proof body, then `#print axioms <name>`. A proof is accepted only if:
  1. the body is tactic text: none of BANNED_CONSTRUCTS outside comments, no code at column 0
     after its first line (a new command), no string with `{` (lexing: lean_syntax/lexer.py);
  2. the REPL answered, with no error message, no sorries, and no
     "declaration uses 'sorry'" warning (either quote style);
  3. the `#print axioms` line reports only ALLOWED_AXIOMS (a missing report rejects).
"""
import dataclasses
import re
from collections.abc import Sequence

from compassplay_jax.lean_syntax import lexer
from compassplay_jax.lean_syntax.statements import strip_lean_comments, theorem_name
from compassplay_jax.verifiers.lean_repl import ANSWERED
from compassplay_jax.verifiers.lean_repl import LeanCheckResult

ALLOWED_AXIOMS = frozenset({"propext", "Classical.choice", "Quot.sound"})

# Each entry: (name shown in the reason, regex run on the comment-free body, «names» unescaped).
# Identifier-bounded so `sorry_free` or `hint₁` do not trip them. docs/lean.md §3 gives, for each
# rule, the attack it stops (sources: the Lean reference manual's "Validating a Lean Proof", the
# comparator and lean-by-example issues, DeepSeek-Prover-V2's PutnamBench report).
_ID_START = r"(?<![\w'.?!])"
_ID_END = r"(?![\w'?!])"
# Names that reach the kernel, the compiler or the environment are banned qualified too
# (`Environment.addDecl`, `.addDecl`, `_root_.Lean.`), so a preceding dot does not shield them.
_NAME_START = r"(?<![\w'?!])"


def _word(word: str) -> tuple[str, re.Pattern]:
  return word, re.compile(_ID_START + re.escape(word) + _ID_END)


def _name(word: str) -> tuple[str, re.Pattern]:
  return word, re.compile(_NAME_START + re.escape(word) + _ID_END)


def _search_tactic(word: str) -> tuple[str, re.Pattern]:
  return word, re.compile(_ID_START + re.escape(word))


# Keywords that end the tactic block and start a command (any column), or open a scope for one.
_COMMAND_KEYWORDS = (
    "import", "theorem", "lemma", "def", "instance", "abbrev", "example", "structure", "inductive",
    "class", "attribute", "namespace", "section", "end", "universe", "variable", "omit", "include",
    "open", "export", "mutual", "deriving", "noncomputable", "private", "protected", "initialize",
    "builtin_initialize", "irreducible_def", "alias", "recall", "declare_syntax_cat",
    "add_decl_doc", "register_option", "register_simp_attr", "register_label_attr", "seal",
    "unseal", "simproc", "dsimproc", "simproc_decl", "dsimproc_decl", "builtin_simproc",
    "builtin_dsimproc", "declare_simp_like_tactic", "binder_predicate", "notation3",
    "suppress_compilation", "assert_not_exists", "library_note", "initialize_simps_projections",
    "local", "scoped")

BANNED_CONSTRUCTS: tuple[tuple[str, re.Pattern], ...] = (
    *(_word(w) for w in (
        "sorry", "admit", "native_decide", "bv_decide", "implemented_by", "extern", "csimp",
        "axiom", "opaque", "unsafe", "partial", "set_option", "run_tac", "run_cmd", "run_elab",
        "run_meta", "by_elab", "elab", "elab_rules", "macro", "macro_rules", "syntax", "notation",
        "infix", "infixl", "infixr", "prefix", "postfix", "hint", *_COMMAND_KEYWORDS)),
    *(_name(w) for w in ("sorryAx", "ofReduceBool", "ofReduceNat", "trustCompiler", "addDecl",
                         "addAndCompile", "compileDecl", "evalConst")),
    ("decide +native", re.compile(r"\+\s*native\b|\bnative\s*:=")),
    ("Lean.", re.compile(_NAME_START + r"Lean\.")),
    ("debug.", re.compile(_ID_START + r"debug\.")),
    *(_search_tactic(w) for w in ("apply?", "exact?", "rw?", "simp?", "aesop?")),
    # Commands such as #print/#eval; `#s` in the middle of a term is Finset.card notation.
    ("#command", re.compile(r"^[ \t]*#[A-Za-z_]|#(?:eval|exit|print|check|reduce|synth|guard|"
                            r"help|lint|where|find|simp|norm_num|conv|time)\b", re.M)),
    ("@[attribute]", re.compile(r"@\[")),
)
_SORRY_WARNING = re.compile(r"declaration uses ['`]sorry['`]")
_AXIOMS_LIST = re.compile(r"depends on axioms:\s*\[(.*)\]", re.S)
_CONJECTURE_SHAPE = re.compile(r"^(?:theorem|lemma)\s+\S+[\s\S]*?:=\s*by$")


@dataclasses.dataclass(frozen=True)
class Acceptance:
  ok: bool
  reason: str  # "accepted" or why not, one line.
  system_error: bool = False  # The checker failed (crash, bad header): retry, do not reward.


def _line_of(text: str, index: int) -> int:
  return text.count("\n", 0, index) + 1


def banned_construct(text: str) -> str | None:
  """The first banned construct in `text` as 'name (line N)', or None.

  Comments are ignored (Lean's lexer decides what is one: lexer.py); literals are not, and
  escaped names `«Lean».x` are read as the names they are. A string literal containing `{` is
  reported too: whether it is interpolated (`s!"…{code}…"`, `throwError "…"`) is the parser's
  choice, so no lexer can say where it ends.
  """
  code = strip_lean_comments(text)
  hits = []
  for segment in lexer.lex(code):
    piece = code[segment.start:segment.end]
    if segment.kind == lexer.STRING and not piece.startswith("r") and "{" in piece:
      hits.append((segment.start, "string with '{' (interpolation)"))
      break
  code = lexer.unescape_names(code)
  for name, pattern in BANNED_CONSTRUCTS:
    match = pattern.search(code)
    if match:
      hits.append((match.start(), name))
  if not hits:
    return None
  start, name = min(hits)
  return f"{name} (line {_line_of(code, start)})"


def top_level_command(proof_body: str) -> str | None:
  """'top-level command (line N)' when a line after the body's first starts with code at column 0.

  The body continues the `:= by` line, so its tactics are indented; code at column 0 (outside
  comments and literals) is a new command, whatever its keyword.
  """
  masked = lexer.mask_literals(proof_body)
  match = re.search(r"\n(?=\S)", masked)
  return None if match is None else f"top-level command (line {_line_of(masked, match.end())})"


def proof_body_violation(proof_body: str) -> str | None:
  """Why `proof_body` is not plain tactic text for the fixed statement (banned construct or a
  top-level command), or None."""
  return banned_construct(proof_body) or top_level_command(proof_body)


def proof_command(statement: str, proof_body: str) -> str:
  """The text checked on top of the header: statement + body + `#print axioms`."""
  name = theorem_name(statement)
  if name is None:
    raise ValueError(f"proof_command: statement has no 'theorem <name>': {statement[:80]!r}")
  body = proof_body.rstrip()
  if body and not body[0].isspace():
    body = " " + body
  return f"{statement.rstrip()}{body}\n\n#print axioms {name}\n"


def _axioms_line(statement: str, proof_body: str) -> int:
  return proof_command(statement, proof_body).count("\n")


def reported_axioms(statement: str, proof_body: str,
                    check_result: LeanCheckResult) -> list[str] | None:
  """Axioms named by our `#print axioms` line (located by position), or None if absent."""
  line = _axioms_line(statement, proof_body)
  name = theorem_name(statement)
  for message in check_result.messages:
    if message.line != line or message.severity != "info":
      continue
    if message.data.strip() == f"'{name}' does not depend on any axioms":
      return []
    match = _AXIOMS_LIST.search(message.data)
    if match and message.data.startswith(f"'{name}' depends on axioms"):
      return [a.strip() for a in match.group(1).split(",") if a.strip()]
  return None


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
  axioms = reported_axioms(statement, proof_body, check_result)
  if axioms is None:
    return Acceptance(False, "no #print axioms report for the theorem")
  extra = sorted(set(axioms) - ALLOWED_AXIOMS)
  if extra:
    return Acceptance(False, f"disallowed axioms: {', '.join(extra)}")
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
  banned = banned_construct(code[decl_end:])
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
