"""The proof-body guard (issue 17.5): every attack class is rejected even when Lean's reply says fine.

Each attack below was accepted by the guard before this rule set: a construct that reaches the kernel
or the environment without a word the old ban list knew, or a literal the old comment stripper
misread (character literals, raw strings, interpolated strings, «escaped» names), so that it took
real code for a comment and hid a banned word. The oracle is Lean's own lexical grammar, written out
by hand in each case's comment.
"""
import pytest

from compassplay_jax.lean_syntax.lexer import lex
from compassplay_jax.lean_syntax.lexer import mask_literals
from compassplay_jax.domains.lean.extraction import strip_lean_comments
from compassplay_jax.verifiers.lean_acceptance import accept_proof
from compassplay_jax.verifiers.lean_acceptance import banned_construct
from compassplay_jax.verifiers.lean_acceptance import proof_body_violation
from tests.test_lean_acceptance import CLEAN_PROOFS
from tests.test_lean_acceptance import STATEMENT
from tests.test_lean_acceptance import reply

# Constructs that reach the kernel or the environment (each indented, so the keyword ban, not the
# column-0 rule, must catch it).
CONSTRUCTS = {
    # TermElabM code run while elaborating the proof term.
    "by_elab": ("\n  exact by_elab do\n    return mkConst ``True.intro", "by_elab"),
    # `open Lean ... in` lets elaborator names be written without the banned `Lean.` prefix.
    "open Lean in": ("\n  open Lean Elab Tactic in\n  exact (admitGoal · |>.run)", "open"),
    # Dot notation reaches Environment.addDecl without the bare word.
    ".addDecl": ("\n  exact (·.addDecl decl)", "addDecl"),
    "Environment.addDecl": ("\n  have := Environment.addDecl", "addDecl"),
    # The axiom behind sorry, named directly: no `sorry` keyword, no sorry warning.
    "sorryAx": ("\n  exact sorryAx _ false", "sorryAx"),
    # A new syntax category (then `syntax`/`macro_rules` into it).
    "declare_syntax_cat": ("\n  trivial\n  declare_syntax_cat cheat", "declare_syntax_cat"),
    # Mathlib's irreducible_def declares a constant (and its equation) after the proof.
    "irreducible_def": ("\n  trivial\n  irreducible_def cheat : Nat := 0", "irreducible_def"),
    # `_root_.Lean.` slips past an identifier boundary that excludes a preceding dot.
    "_root_.Lean": ("\n  exact (_root_.Lean.ofReduceBool)", "Lean."),
    # «Lean».Elab is the name Lean.Elab, spelled with escaped identifiers.
    "«Lean» escaped name": ("\n  exact («Lean».Elab.Term.reportUnsolvedGoals [])", "Lean."),
    # Native evaluation via bv_decide trusts the compiler (Lean.ofReduceBool).
    "bv_decide": ("\n  bv_decide", "bv_decide"),
    # Commands the old list missed: each ends the tactic block and changes the environment.
    "mutual block": ("\n  trivial\n  mutual\n  end", "mutual"),
    "export": ("\n  trivial\n  export Nat (succ)", "export"),
    "simproc": ("\n  trivial\n  simproc cheat (_) := fun _ => return .continue", "simproc"),
}

# The old stripper took real code for a comment: each body hides `set_option`/`native_decide`.
DESYNCS = {
    # '"' is a character literal; the old stripper opened a string at its quote, closed it at
    # the next string's opening quote, and then read that string's "/-" as a comment.
    "character literal '\"'": '\n  have c := \'"\'\n  have s := "/-"\n  set_option debug.skipKernelTC true in\n'
                              '  have t := "-/"\n  trivial',
    # r"\" is a complete raw string (no escapes); the old stripper read \" as an escaped quote.
    'raw string r"\\"': '\n  have a := r"\\"\n  have b := "/-"\n  native_decide\n  have c := "-/"',
    # r#" " /- "# is one raw string; the old stripper ended a string at its inner quote.
    "raw string r#\"…\"#": '\n  have a := r#" " /- "#\n  native_decide\n  have b := "-/"',
    # s!"{"/-"}" nests a string inside an interpolation; the old stripper closed at the inner quote.
    "interpolated string": '\n  have a := s!"{"/-"}"\n  native_decide\n  have b := "-/"',
    # «x"» is an escaped identifier containing a quote.
    "escaped identifier «x\"»": '\n  have «x"» := "/-"\n  native_decide\n  have y := "-/"',
    # After a number, a literal or an escaped name, `'` opens a character literal (it is a prime
    # only when it continues an identifier): 2'"', 'a''"' and «x»'"' each hold a quote character.
    "number then character literal": '\n  have c := (2\'"\', "/-")\n  native_decide\n  have t := "-/"',
    "adjacent character literals": '\n  have c := [\'a\'\'"\', \'b\']\n  have s := "/-"\n  native_decide\n  have t := "-/"',
    "character literal then raw string": '\n  have c := (\'x\'r"\\", "/-")\n  native_decide\n  have t := "-/"',
}


@pytest.mark.parametrize("name", sorted(CONSTRUCTS))
def test_each_construct_is_rejected(name):
  body, construct = CONSTRUCTS[name]
  verdict = accept_proof(STATEMENT, body, reply(body))
  assert not verdict.ok, name
  assert verdict.reason.startswith(f"banned construct in proof body: {construct} (line "), verdict.reason


@pytest.mark.parametrize("name", sorted(DESYNCS))
def test_each_stripper_desync_is_rejected(name):
  body = DESYNCS[name]
  verdict = accept_proof(STATEMENT, body, reply(body))
  assert not verdict.ok, name
  assert verdict.reason.startswith("banned construct in proof body: "), verdict.reason


@pytest.mark.parametrize("body, line", [
    ("\n  trivial\nmy_new_command foo", 3),          # a command no list knows, at column 0
    ("\n  trivial\n\n/- doc -/unknown_decl x := 1", 4),  # code right after a comment, at column 0
    ("  simp\nx", 2),
])
def test_code_at_column_zero_is_a_top_level_command(body, line):
  assert proof_body_violation(body) == f"top-level command (line {line})"
  assert not accept_proof(STATEMENT, body, reply(body)).ok


@pytest.mark.parametrize("body", [
    "\n-- a comment at column 0\n  simp [h₁, h₂, h₃]",
    "\n  /- a block comment\nat column 0 -/\n  norm_num [h₁]",
    '\n  have s : String := "line one\nline two at column 0"\n  norm_num [h₁, h₂, h₃]',
    "\n  have c : Char := 'a'\n  have d : Char := '\\''\n  norm_num [h₁, h₂, h₃]",
    '\n  have r : String := r#"a "quoted" -- not a comment"#\n  norm_num [h₁, h₂, h₃]',
    "\n  have h' := h₁\n  have h'' : v = v := rfl\n  norm_num [h', h₂, h₃]",
    "\n  nlinarith [h₀.1, h₀.2.1, h₁, h₂, h₃]  -- prime names and a trailing comment",
])
def test_clean_bodies_with_literals_and_comments_are_accepted(body):
  assert proof_body_violation(body) is None
  assert accept_proof(STATEMENT, body, reply(body)).ok


@pytest.mark.parametrize("body", CLEAN_PROOFS)
def test_the_catalogue_of_clean_proofs_still_passes(body):
  assert proof_body_violation(body) is None


def test_string_with_a_brace_is_rejected_as_ambiguous():
  # Whether "…{…}…" is interpolated is decided by the parser (s!, m!, throwError), not the lexer.
  assert proof_body_violation('\n  exact throwError "{x}"') == "string with '{' (interpolation) (line 2)"


def test_lexer_segments_follow_lean_grammar():
  text = 'a -- c\n/- x /- y -/ z -/ \'"\' r#"q"#"s\\"t" «n"m» b\'c'
  kinds = [(s.kind, text[s.start:s.end]) for s in lex(text) if s.kind != "code"]
  assert kinds == [("comment", "-- c"), ("comment", "/- x /- y -/ z -/"), ("char", "'\"'"),
                   ("string", 'r#"q"#'), ("string", '"s\\"t"'), ("name", '«n"m»')]
  # b'c is an identifier with a prime followed by c, not a character literal.
  assert lex(text)[-1].kind == "code" and text[lex(text)[-1].start:].endswith("b'c")


def test_strip_keeps_literals_and_lines():
  text = 'x := \'"\' -- "\n  y /- a\nb -/ r"\\" z'
  assert strip_lean_comments(text) == 'x := \'"\' \n  y \n r"\\" z'
  # Literals blanked to spaces: only the code's layout is left.
  assert mask_literals(text) == "x :=" + " " * 5 + "\n  y \n" + " " * 6 + "z"


def test_banned_construct_is_lexical_only_for_conjectures():
  # Statements may continue at column 0; only proof bodies get the column rule.
  assert banned_construct("(x : ℕ)\n: x = x := by") is None
  assert banned_construct("(h : sorryAx False) : True := by") == "sorryAx (line 1)"


def test_banned_word_between_random_literals_is_always_found():
  """Property test: bodies of random literals and comments (each piece complete by Lean's rules,
  with nasty contents) around one `native_decide` in code position: the guard always finds it, and
  the same bodies without it raise no word ban."""
  import random
  rng = random.Random(17)
  alphabet = ['a', ' ', '"', "'", '-', '/', '#', 'r', '\\', '\n', '«', '»', 'x', '}']

  def content(n):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, n)))

  def piece():
    kind = rng.randrange(7)
    if kind == 0:
      return '"' + content(6).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'
    if kind == 1:
      return "'" + rng.choice(["a", '"', "-", "/", "\\'", "\\\\", "\\n", "«"]) + "'"
    if kind == 2:
      hashes = "#" * rng.randint(0, 2)
      return f'r{hashes}"' + content(6).replace('"', "") + f'"{hashes}'
    if kind == 3:
      return "/- " + content(6).replace("-/", "").replace("/-", "") + " -/"
    if kind == 4:
      return "-- " + content(6).replace("\n", " ") + "\n  "
    if kind == 5:
      return "«" + content(5).replace("»", "").replace("\n", "").replace("#", "") + "»"
    return rng.choice([" simp ", " x ", " := ", " ( ", " ) ", " h' ", "\n  ", " 2", " f '' s "])

  for _ in range(3000):
    parts = [piece() for _ in range(rng.randint(1, 8))]
    cut = rng.randint(0, len(parts))
    body = "\n  " + "".join(parts[:cut]) + " native_decide " + "".join(parts[cut:])
    assert proof_body_violation(body) is not None, repr(body)
    clean = proof_body_violation("\n  " + "".join(parts))
    assert clean is None or clean.startswith(("top-level command", "string with '{'", "#command")), repr(parts)
