"""Lean 4's lexical layer, as far as the proof guard needs it: where comments and literals are.

Splits text into segments of kind
  code     everything else
  comment  `-- …` to the end of the line, or `/- … -/` nested (docstrings `/-- -/`, `/-! -/` too);
           Lean reads no strings inside a block comment, and neither do we
  string   `"…"` with backslash escapes, or a raw string `r"…"` / `r#"…"#` (no escapes; it ends at
           a quote followed by as many `#` as it opened with)
  char     a character literal `'a'`, `'\\''`, `'\\x41'`, `'\\u{3b1}'` (a `'` that continues an
           identifier is a prime, `h'`, not a literal; after a number or a literal it is one)
  name     an escaped identifier `«…»` (any characters but `»`)
A guard that gets one of these wrong can be made to take real code for a comment (a `"` inside a
character literal, raw string or escaped name opens a phantom string whose end is off by one
literal) and so miss a banned word; docs/lean.md lists the attacks.

Unterminated comments and literals run to the end of the text, as in Lean (which then reports an
error, so the axioms report after them is never printed and the proof is rejected).
"""
import dataclasses
import re

CODE, COMMENT, STRING, CHAR, NAME = "code", "comment", "string", "char", "name"

_CHAR_LITERAL = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|[^\n])|[^\\'\n])'")
_RAW_STRING_OPEN = re.compile(r'r(#*)"')


@dataclasses.dataclass(frozen=True)
class Segment:
  kind: str
  start: int
  end: int  # exclusive


def _is_ident_char(ch: str) -> bool:
  """Characters that may continue an identifier: letters, digits, `_`, `'`, `!`, `?`, subscripts."""
  return ch.isalnum() or ch in "_'!?" or "\u2080" <= ch <= "\u209c"


def _continues_identifier(text: str, i: int, code_start: int) -> bool:
  """True when text[i] would continue an identifier: the run of identifier characters before it
  (inside the current code run) starts with a letter or `_`. So `h'` is a prime, but `2'a'`,
  `'a''b'` (the first literal is a token of its own) and `«x»'a'` start a character literal."""
  j = i
  while j > code_start and _is_ident_char(text[j - 1]):
    j -= 1
  return j < i and (text[j].isalpha() or text[j] == "_")


def _block_comment_end(text: str, i: int) -> int:
  depth, n = 0, len(text)
  while i < n:
    two = text[i:i + 2]
    if two == "/-":
      depth, i = depth + 1, i + 2
    elif two == "-/":
      depth, i = depth - 1, i + 2
      if depth == 0:
        return i
    else:
      i += 1
  return n


def _string_end(text: str, i: int) -> int:
  """Just past the `"…"` literal opening at i (backslash escapes)."""
  i += 1
  while i < len(text):
    if text[i] == "\\":
      i += 2
    elif text[i] == '"':
      return i + 1
    else:
      i += 1
  return len(text)


def _literal_at(text: str, i: int, code_start: int) -> tuple[str, int] | None:
  """(kind, end) of a comment or literal starting at i, or None when text[i] is plain code.
  `code_start` is where the current run of code began (just after the previous literal)."""
  ch, two = text[i], text[i:i + 2]
  after_ident = _continues_identifier(text, i, code_start)
  if two == "/-":
    return COMMENT, _block_comment_end(text, i)
  if two == "--":
    end = text.find("\n", i)
    return COMMENT, len(text) if end < 0 else end
  if ch == '"':
    return STRING, _string_end(text, i)
  if ch == "«":
    end = text.find("»", i + 1)
    return NAME, len(text) if end < 0 else end + 1
  if after_ident:
    return None
  if ch == "'":
    match = _CHAR_LITERAL.match(text, i)
    return (CHAR, match.end()) if match else None
  if ch == "r":
    match = _RAW_STRING_OPEN.match(text, i)
    if match:
      close = '"' + match.group(1)
      end = text.find(close, match.end())
      return STRING, len(text) if end < 0 else end + len(close)
  return None


def lex(text: str) -> list[Segment]:
  """The text as consecutive segments (module docstring); their spans cover it exactly."""
  segments, i, code_start, n = [], 0, 0, len(text)
  while i < n:
    found = _literal_at(text, i, code_start)
    if found is None:
      i += 1
      continue
    kind, end = found
    if code_start < i:
      segments.append(Segment(CODE, code_start, i))
    segments.append(Segment(kind, i, end))
    i = code_start = end
  if code_start < n:
    segments.append(Segment(CODE, code_start, n))
  return segments


def strip_comments(text: str) -> str:
  """The text without comments; literals intact; a comment's newlines kept (line numbers hold)."""
  return "".join(text[s.start:s.end] if s.kind != COMMENT else "\n" * text.count("\n", s.start, s.end)
                 for s in lex(text))


def mask_literals(text: str) -> str:
  """strip_comments, with every literal and escaped name blanked to spaces (newlines kept), so what
  is left is the code's layout: a line that starts with a non-space here starts with code."""
  parts = []
  for s in lex(text):
    piece = text[s.start:s.end]
    if s.kind == CODE:
      parts.append(piece)
    elif s.kind == COMMENT:
      parts.append("\n" * piece.count("\n"))
    else:
      parts.append(re.sub(r"[^\n]", " ", piece))
  return "".join(parts)


def unescape_names(text: str) -> str:
  """`«Lean».«Elab»` -> `Lean.Elab`: escaped identifiers name the same constants as plain ones."""
  return "".join(text[s.start + 1:s.end - 1] if s.kind == NAME and text[s.end - 1:s.end] == "»"
                 else text[s.start:s.end] for s in lex(text))
