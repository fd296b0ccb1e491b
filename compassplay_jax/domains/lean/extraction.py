"""Pulls Lean pieces out of model text: code blocks, conjectures, proof bodies, names.

Also holds the small Lean lexical helpers (comment stripping, header splitting,
theorem names) that the acceptance rule and the novelty metrics share.
"""
import re

_LEAN4_BLOCK = re.compile(r"```lean4[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PROOF_START = re.compile(r":=\s*by\b")
_DECL_NAME = re.compile(r"^\s*(?:@\[[^\]]*\]\s*)*(?:(?:private|protected|noncomputable)\s+)*"
                        r"(theorem|lemma)\s+([^\s(){}\[\]⦃⦄:]+)")
_HEADER_LINE = re.compile(r"^\s*(?:import|set_option|open|universe|variable)\b|^\s*$")


def strip_lean_comments(text: str) -> str:
  """Removes `--` line comments and nested `/- -/` block comments (incl. docstrings).

  String and character literals are kept intact so a `--` inside a string does
  not eat real code after it. Newlines inside block comments are kept so line
  numbers stay meaningful.
  """
  out = []
  i, n, depth = 0, len(text), 0
  while i < n:
    two = text[i:i + 2]
    if depth:
      if two == "/-":
        depth, i = depth + 1, i + 2
      elif two == "-/":
        depth, i = depth - 1, i + 2
      else:
        if text[i] == "\n":
          out.append("\n")
        i += 1
    elif two == "/-":
      depth, i = 1, i + 2
    elif two == "--":
      while i < n and text[i] != "\n":
        i += 1
    elif text[i] == '"':
      end = _string_end(text, i)
      out.append(text[i:end])
      i = end
    else:
      out.append(text[i])
      i += 1
  return "".join(out)


def _string_end(text: str, start: int) -> int:
  """Index just past the string literal starting at `start` (or end of text)."""
  i = start + 1
  while i < len(text):
    if text[i] == "\\":
      i += 2
    elif text[i] == '"':
      return i + 1
    else:
      i += 1
  return len(text)


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
  proof = _PROOF_START.search(text)
  if proof:  # Anything after the first `:= by` is proof, not statement.
    text = text[:proof.start()]
  text = re.sub(r"\s*:=\s*(?:sorry)?\s*$", "", text.rstrip())
  return text.strip()


def extract_last_lean4_block(text: str) -> str | None:
  """Contents of the last ```lean4 block; an unclosed final block runs to the end."""
  blocks = _LEAN4_BLOCK.findall(text)
  return blocks[-1] if blocks else None


def extract_conjecture(text: str) -> str | None:
  """SGS conjecture extraction: the last lean4 block, cut to end at its `:= by`.

  Rules (SGS `extract_conjecture_deepseek_v2`): exactly one `:= by`, at most one
  `sorry`, and the block ends with `sorry` or `:= by`. Returns the statement
  without header lines, or None when the rules fail.
  """
  block = extract_last_lean4_block(text)
  if block is None:
    return None
  code = block.rstrip()
  if len(_PROOF_START.findall(code)) != 1 or len(re.findall(r"\bsorry\b", code)) > 1:
    return None
  if not (code.endswith("sorry") or re.search(r":=\s*by$", code)):
    return None
  end = _PROOF_START.search(code).end()
  statement = split_header(code[:end])[1].strip()
  return statement or None


def extract_proof_body(text: str, strict: bool = False) -> str | None:
  """The model's proof body: everything after the first `:= by` of the last lean4 block.

  strict=True applies SGS's `extract_proof_deepseek_v2_strict` shape rules: the
  text starts with ```lean4, has exactly one ```lean4 and two ``` fences, and
  declares exactly one theorem/lemma/def.
  """
  if strict:
    stripped = text.strip()
    declarations = len(re.findall(r"\b(?:theorem|lemma|def) ", stripped))
    if (not stripped.startswith("```lean4") or stripped.count("```lean4") != 1
        or stripped.count("```") != 2 or declarations != 1):
      return None
  block = extract_last_lean4_block(text)
  if block is None:
    return None
  match = _PROOF_START.search(block)
  if match is None:
    return None
  body = block[match.end():].rstrip()
  return body if body.strip() else None
