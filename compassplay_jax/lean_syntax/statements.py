"""Lean statements as text: comment stripping, header splitting, theorem names, signatures.

Shared by the acceptance rule (verifiers/), the novelty metrics (rewards/) and the Lean domain, so it
sits below all three and imports none of them. Literals and comments are read by lexer.py as Lean does.
"""
import re

from compassplay_jax.lean_syntax import lexer

PROOF_START = re.compile(r":=\s*by\b")  # where a statement ends and its proof starts
_DECL_NAME = re.compile(r"^\s*(?:@\[[^\]]*\]\s*)*(?:(?:private|protected|noncomputable)\s+)*"
                        r"(theorem|lemma)\s+([^\s(){}\[\]⦃⦄:]+)")
_HEADER_LINE = re.compile(r"^\s*(?:import|set_option|open|universe|variable)\b|^\s*$")


def strip_lean_comments(text: str) -> str:
  """Removes `--` line comments and nested `/- -/` block comments (incl. docstrings).

  String, character and raw-string literals and «escaped» names are kept intact
  (lexer.py reads them as Lean does), so a `--` or `"` inside one does not eat
  real code after it. Newlines inside block comments are kept so line numbers
  stay meaningful.
  """
  return lexer.strip_comments(text)


def split_header(text: str) -> tuple[str, str]:
  """Splits leading import/set_option/open lines off a Lean snippet: (header, rest)."""
  lines = text.splitlines(keepends=True)
  cut = 0
  for line in lines:
    if not _HEADER_LINE.match(strip_lean_comments(line)):
      break
    cut += 1
  return "".join(lines[:cut]), "".join(lines[cut:])


def normalize_header(header: str) -> str:
  """Header text as sent to the REPL: comment-free, no blank lines, one trailing newline.

  Headers that differ only in blank lines or spacing share one REPL environment.
  """
  lines = [ln.rstrip() for ln in strip_lean_comments(header).splitlines()]
  lines = [ln for ln in lines if ln.strip()]
  return "\n".join(lines) + "\n" if lines else ""


def theorem_name(statement: str) -> str | None:
  """Name declared by the first `theorem`/`lemma` in `statement`, or None."""
  match = _DECL_NAME.match(strip_lean_comments(statement))
  return match.group(2) if match else None


def rename_theorem(statement: str, new_name: str) -> str:
  """Returns `statement` with its theorem name replaced (e.g. to avoid clashes)."""
  match = _DECL_NAME.match(statement)
  if not match:
    raise ValueError(f"rename_theorem: no 'theorem <name>' at the start of: {statement[:60]!r}")
  return statement[:match.start(2)] + new_name + statement[match.end(2):]


def statement_signature(statement: str) -> str:
  """The binders and type of a statement: no comments, header, keyword, name or proof."""
  text = strip_lean_comments(statement)
  text = split_header(text)[1]
  match = _DECL_NAME.match(text)
  if match:
    text = text[match.end():]
  proof = PROOF_START.search(text)
  if proof:  # Anything after the first `:= by` is proof, not statement.
    text = text[:proof.start()]
  text = re.sub(r"\s*:=\s*(?:sorry)?\s*$", "", text.rstrip())
  return text.strip()
