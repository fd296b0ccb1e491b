"""Lean 4's tokenizer, ported from Lean's own parser, so the proof guard reads text as Lean does.

Lean has no separate lexer: its parser calls `whitespace` and `tokenFn` (src/Lean/Parser/Basic.lean).
`tokenize` follows those functions step by step, in one forward pass (linear time):

  whitespace        ' ' and '\\n' (Lean's `Char.isWhitespace` also takes '\\t' and '\\r', then rejects
                    them: "tabs are not allowed"), `--` to the end of the line, `/- … -/` nested.
                    After `/-` Lean skips one character before `finishCommentBlock` looks for
                    openers and closers, so `/-/- x -/` is one whole comment; `/--` and `/-!` are doc
                    comment tokens whose body `finishCommentBlock` reads from the same place.
  tokenFnAux        decides on the first character, in this order:
    '"'             `strLitFnAux`: escapes per `quotedCharCoreFn` (\\\\ \\" \\' \\r \\n \\t, \\xHH, \\uHHHH)
                    and `stringGapFn` (backslash, newline, indentation);
    "'" not "''"    `charLitFnAux`: ONE character of any kind (a raw newline too) or an escape,
                    then "'";
    ASCII digit     `numberFnAux`: 0b/0o/0x, decimal, scientific (`decimalNumberFn`), `_`
                    separators (`takeDigitsFn`); after a `.` glued to a term, `fieldIdx` digits;
    '`' + name      `nameLitAux` (a name literal, read by `identFnAux`);
    r#*"            `isRawStrLitStart` / `rawStrLitFnAux`: no escapes, ends at '"' and as many '#';
    otherwise       `identFnAux` against the token table's longest match (`mkIdResult`: a token
                    at least as long as the identifier wins, so keywords are tokens).
  identifiers       `isIdFirst`/`isIdRest`/`isLetterLike`/`isSubScriptAlnum` (src/Init/Meta/Defs.lean;
                    `Char.isAlpha`/`isAlphanum` are ASCII in Lean), `«…»` escapes
                    (`isIdBeginEscape`/`isIdEndEscape`), dotted parts joined by `isIdCont`.

Read at leanprover/lean4 commits 00c1b82 (Parser/Basic.lean) and 024d241 (Init/Meta/Defs.lean).
Where Lean versions differ we take the newer rule when the older one is an error there
(Latin-1 and Latin Extended-A letters and `ⱼ` in identifiers, string gaps), and call it an
error when both versions read it without error but differently (`_` after digits: a separator
since 2025, before that the start of an identifier).

The token table is Lean's, extended by every `syntax`/`notation` in scope, so no fixed list is
the whole of it. TOKENS holds the tokens that matter to where comments and literals start: those
containing `'`, `/` or `-` (Lean core and Mathlib), and the `#` command tokens (HASH_COMMAND_TOKENS),
read by longest match wherever they stand. Any other symbol character is read as a
one-character token; the guard (verifiers/lean_guard.py) then refuses a comment or literal glued
to such a symbol, since a longer token there could swallow its first character.

Unlike Lean, `tokenize` goes on after an error (so comment stripping works on broken text too):
an unterminated comment, string or `«` runs to the end, a bad character literal becomes a
one-character symbol. Every error is in `Lexed.errors`; Lean would reject such text.
"""
import dataclasses
import re

COMMENT, STRING, RAW_STRING, CHAR, NUMBER, NAME_LITERAL, IDENT, SYMBOL = (
    "comment", "string", "raw_string", "char", "number", "name_literal", "ident", "symbol")
LITERALS = (STRING, RAW_STRING, CHAR, NAME_LITERAL)
CODE = "code"  # segments (lex) that are neither comment nor literal

# isLetterLike (Init/Meta/Defs.lean): Greek but λ, Π, Σ; Coptic; polytonic Greek; the Letterlike
# block; mathematical alphanumerics; Latin-1 letters but × ÷; Latin Extended-A.
_LETTER_LIKE = ("\u03b1-\u03ba\u03bc-\u03c9\u0391-\u039f\u03a1\u03a2\u03a4-\u03a9\u03ca-\u03fb"
                "\u1f00-\u1ffe\u2100-\u214f\U0001d49c-\U0001d59f"
                "\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u00ff\u0100-\u017f")
_SUBSCRIPT = "\u2080-\u2089\u2090-\u209c\u1d62-\u1d6a\u2c7c"  # isSubScriptAlnum
_ID_FIRST = f"A-Za-z_{_LETTER_LIKE}"
_ID_REST = f"A-Za-z0-9_'!?{_LETTER_LIKE}{_SUBSCRIPT}"
_ID_PART = re.compile(f"[{_ID_FIRST}][{_ID_REST}]*")
NAME_PART = f"(?:«[^»]*»|[{_ID_FIRST}][{_ID_REST}]*)"  # one part of a dotted name, as a regex
_ID_FIRST_CHAR = re.compile(f"[{_ID_FIRST}]")
_SPACES = re.compile(r"[ \n]+")
_COMMENT_MARK = re.compile(r"-/|/-")
_STRING_STOP = re.compile(r'["\\]')
_GAP = re.compile(r"\n[ \t\r]*")  # stringGapFn after its one newline: more whitespace, no newline
_HEX = "0-9a-fA-F"
_DIGIT_RUNS = {"dec": re.compile(r"(?:_*[0-9])*"), "bin": re.compile(r"(?:_*[01])+"),
               "oct": re.compile(r"(?:_*[0-7])+"), "hex": re.compile(f"(?:_*[{_HEX}])+")}
_FIELD_IDX = re.compile(r"[0-9]+")
_RAW_OPEN = re.compile(r'r(#*)"')
_QUOTABLE = "\\\"'rnt"  # isQuotableCharDefault

# Tokens that contain `'`, `/` or `-`, or that contain a symbol after identifier letters (so a
# one-character guess would cut them short): Lean core (src/Init/Prelude.lean, Init/Core.lean,
# Lean/Parser/Term.lean: `Σ'`, `×'`, `//`, `<-`, `->`, `<->`, `@[`, `..`) and Mathlib
# (Mathlib/Data/Set/Defs.lean `''` `⁻¹'`; Topology/Algebra/InfiniteSum/Defs.lean `∑'` `∏'`;
# Data/PNat/Notation.lean `ℕ+`; Data/NNReal, Data/ENNReal `ℝ≥0` `ℝ≥0∞`; Mathlib/Tactic/TypeStar.lean
# `Type*` `Sort*`).
# `#` command tokens. Lean's tokenizer takes the longest token at the `#` (`matchPrefix` in
# `tokenFnAux`; `#` is no identifier letter, so `identFnAux` does not start there), wherever it stands:
# mid-line, glued after any token (`x#eval`, `)#exit`), and glued to letters (`#evalx` is `#eval`
# then `x`; `#eval!` is its own token). Lean core: src/Lean/Parser/Command.lean (`#check`,
# `#check_failure`, `#reduce`, `#eval`, `#eval!`, `#synth`, `#exit`, `#print`, `#where`, `#version`,
# `#help`), src/Init/Notation.lean and src/Init/Guard.lean (`#guard_msgs`, `#guard`, `#guard_expr`,
# `#check_tactic`, `#check_simp`, `#discr_tree_key`), elaborated by src/Lean/Elab/BuiltinCommand.lean
# and src/Lean/Elab/BuiltinEvalCommand.lean; Batteries/Mathlib add more (`#find`, `#simp`,
# `#norm_num`, `#conv`, `#lint`, `#time`, `#adaptation_note`, …). No list is all of them: the guard
# refuses every `#` glued to an identifier letter (verifiers/lean_guard.py), listed here or not.
HASH_COMMAND_TOKENS = frozenset({
    "#check", "#check_failure", "#reduce", "#eval", "#eval!", "#synth", "#exit", "#print", "#where",
    "#version", "#help", "#guard_msgs", "#guard", "#guard_expr", "#check_tactic", "#check_simp",
    "#discr_tree_key", "#find", "#simp", "#norm_num", "#conv", "#lint", "#time", "#adaptation_note",
})
TOKENS = frozenset({
    "''", "⁻¹'", "⁻¹", "∑'", "∏'", "Σ'", "×'", "//", "/", "-", "<-", "->", "<->", "-[",
    "@[", "@", ".", "..", "...", "(", ")", "[", "]", "{", "}", "⟨", "⟩", ",", ":=", ":", "|",
    "ℕ+", "ℝ≥0", "ℝ≥0∞", "ℚ≥0", "Type*", "Sort*", "#", "#[", "`(", "``(", "`", "$", "%", "+", "*",
    "=", "<", ">", "!", "?", "^", "&", ";", "~", "\\", "·", "←", "→", "↔", "≤", "≥", "≠", "∘",
    *HASH_COMMAND_TOKENS,
})
_BY_FIRST: dict[str, tuple[str, ...]] = {}
for _tk in sorted(TOKENS, key=len, reverse=True):
  _BY_FIRST.setdefault(_tk[0], ())
  _BY_FIRST[_tk[0]] += (_tk,)


class Token:
  """One token (comments included). IDENT and NAME_LITERAL carry the name's parts, «escapes» removed."""
  __slots__ = ("kind", "start", "end", "parts")

  def __init__(self, kind: str, start: int, end: int, parts: tuple[str, ...] = ()):
    self.kind, self.start, self.end, self.parts = kind, start, end, parts

  def __repr__(self) -> str:
    return f"Token({self.kind}, {self.start}, {self.end}{', ' + repr(self.parts) if self.parts else ''})"


@dataclasses.dataclass
class Lexed:
  text: str
  tokens: list[Token]
  errors: list[tuple[int, str]]  # (position, message): places where Lean reports an error


def _finish_comment_block(text: str, i: int) -> int:
  """finishCommentBlock with nesting 1 from i: just past the closing `-/`, or -1 if none."""
  depth = 1
  for mark in _COMMENT_MARK.finditer(text, i):
    if mark.group() == "-/":
      depth -= 1
      if depth == 0:
        return mark.end()
    else:
      depth += 1
  return -1


def _escape_end(text: str, i: int, in_string: bool) -> tuple[int, str | None]:
  """quotedCharCoreFn at i (just after a backslash): (end, error)."""
  n = len(text)
  if i >= n:
    return n, "unexpected end of input in escape"
  c = text[i]
  if c in _QUOTABLE:
    return i + 1, None
  width = {"x": 2, "u": 4}.get(c)
  if width:
    digits = text[i + 1:i + 1 + width]
    if len(digits) == width and all(d in "0123456789abcdefABCDEF" for d in digits):
      return i + 1 + width, None
    return i + 1, "invalid hexadecimal numeral in escape"
  if in_string and c == "\n":  # stringGapFn: the newline, then whitespace with no second newline
    end = _GAP.match(text, i).end()
    if end < n and text[end] == "\n":
      return end + 1, "unexpected additional newline in string gap"
    return end, None
  return i + 1, "invalid escape sequence"


def _string_end(text: str, i: int) -> tuple[int, str | None]:
  """strLitFnAux from the opening quote at i: (end, first error)."""
  j, error, n = i + 1, None, len(text)
  while True:
    stop = _STRING_STOP.search(text, j)
    if stop is None:
      return n, error or "unterminated string literal"
    if text[stop.start()] == '"':
      return stop.end(), error
    j, bad = _escape_end(text, stop.start() + 1, in_string=True)
    error = error or bad


def _char_end(text: str, i: int) -> int:
  """charLitFnAux from the quote at i: the end of the literal, or -1 where Lean reports an error."""
  n = len(text)
  if i + 1 >= n:
    return -1
  j = i + 2
  if text[i + 1] == "\\":
    j, bad = _escape_end(text, i + 2, in_string=False)
    if bad:
      return -1
  return j + 1 if j < n and text[j] == "'" else -1


def _number_end(text: str, i: int) -> tuple[int, str | None]:
  """numberFnAux at the digit at i: (end, error)."""
  n = len(text)
  base = {"b": "bin", "B": "bin", "o": "oct", "O": "oct", "x": "hex", "X": "hex"}.get(
      text[i + 1] if i + 1 < n else "")
  if text[i] == "0" and base:
    run = _DIGIT_RUNS[base].match(text, i + 2)
    if run is None:
      return i + 2, f"expected {base} digits"
    j = run.end()
  else:
    j = _DIGIT_RUNS["dec"].match(text, i + 1).end()
    if j < n and text[j] == ".":  # parseOptDot: the dot is taken even with no digit after it
      digit_next = j + 1 < n and "0" <= text[j + 1] <= "9"
      j = _DIGIT_RUNS["dec"].match(text, j + 1).end() if digit_next else j + 1
    if j < n and text[j] in "eE":  # parseOptExp
      k = j + 1 + (j + 1 < n and text[j + 1] in "+-")
      if not (k < n and "0" <= text[k] <= "9"):
        return k, "missing exponent digits in scientific literal"
      j = _DIGIT_RUNS["dec"].match(text, k).end()
  if j < n and text[j] == "_":
    return j + 1, "digit separator `_` at the end of a number"
  if "_" in text[i:j]:  # before Lean's `takeDigitsFn` took `_`, `1_0'x'` was `1` then `_0'x'`
    return j, "digit separator `_` (read differently by Lean versions before and after 2025)"
  return j, None


def _is_id_first_or_escape(text: str, i: int) -> bool:
  return i < len(text) and (text[i] == "«" or _ID_FIRST_CHAR.match(text, i) is not None)


def _ident_end(text: str, i: int) -> tuple[int, tuple[str, ...], str | None] | None:
  """identFnAux at i: (end, parts, error), or None when text[i] starts no identifier."""
  parts, j, n = [], i, len(text)
  while True:
    if text[j] == "«":
      close = text.find("»", j + 1)
      if close < 0:
        return n, tuple(parts), "unterminated identifier escape"
      parts.append(text[j + 1:close])
      j = close + 1
    else:
      part = _ID_PART.match(text, j)
      if part is None:
        return None  # only possible for the first part: isIdCont checked the rest
      parts.append(part.group())
      j = part.end()
    if j + 1 < n and text[j] == "." and _is_id_first_or_escape(text, j + 1):  # isIdCont
      j += 1
      continue
    return j, tuple(parts), None


def name_parts(name: str) -> tuple[str, ...]:
  """The parts of a dotted name written in Lean syntax (`a.«b.c».d` -> a, b.c, d)."""
  found = _ident_end(name, 0) if name else None
  return found[1] if found else ()


def _table_token(text: str, i: int) -> str | None:
  """The longest token of TOKENS at i (Lean's `TokenTable.matchPrefix`)."""
  for token in _BY_FIRST.get(text[i], ()):
    if text.startswith(token, i):
      return token
  return None


_IDENT_TOKENS = sorted((t for t in TOKENS if _ID_FIRST_CHAR.match(t)), key=len, reverse=True)
_SYMBOL_TOKENS = sorted((t for t in TOKENS if not _ID_FIRST_CHAR.match(t)), key=len, reverse=True)
# One match per step: the common tokens (whitespace, identifiers, table symbols) at C speed; the
# rest (comments, literals, numbers, `«` left open, tabs) go to the `slow` branch below.
_STEP = re.compile(
    r"(?P<space>[ \n]+)"
    r'|(?P<slow>r#*"|--|/-|[\"\'`0-9\t\r])'
    f"|(?P<idtoken>{'|'.join(map(re.escape, _IDENT_TOKENS))})"
    f"|(?P<ident>{NAME_PART}(?:\\.{NAME_PART})*)"
    r"|(?P<escape>«)"
    f"|(?P<symbol>{'|'.join(map(re.escape, _SYMBOL_TOKENS))}|.)", re.S)


def tokenize(text: str) -> Lexed:
  """Lean's tokens of `text` in order, with comments as tokens too (module docstring)."""
  tokens, errors, n, i = [], [], len(text), 0
  step, append = _STEP.match, tokens.append
  while i < n:
    m = step(text, i)
    group = m.lastgroup
    if group == "space":
      i = m.end()
      continue
    if group == "ident":
      end = m.end()
      if text.startswith(".«", end):  # a part left open: identFnAux reports it
        i, parts, error = _ident_end(text, i)
        append(Token(IDENT, m.start(), i, parts))
        errors.append((m.start(), error or "unterminated identifier escape"))
        continue
      piece = m.group()
      append(Token(IDENT, i, end, tuple(piece.split(".")) if "«" not in piece else name_parts(piece)))
      i = end
      continue
    if group in ("symbol", "idtoken"):
      append(Token(SYMBOL, i, m.end()))
      i = m.end()
      continue
    if group == "escape":
      end, parts, error = _ident_end(text, i)
      append(Token(IDENT, i, end, parts))
      errors.append((i, error or "unterminated identifier escape"))
      i = end
      continue
    i, error = _slow_token(text, i, tokens)
    if error:
      errors.append(error)
  return Lexed(text, tokens, errors)


def _slow_token(text: str, i: int, tokens: list[Token]) -> tuple[int, tuple[int, str] | None]:
  """Whitespace errors, comments, literals and numbers at i: (next position, (position, error))."""
  c, n, start, error = text[i], len(text), i, None
  # --- whitespace (Lean's `whitespace`) ---
  if c == "\t" or c == "\r":
    return i + 1, (i, "tabs are not allowed" if c == "\t" else "isolated carriage return")
  if c == "-":  # "--"
    end = text.find("\n", i + 2)
    end = n if end < 0 else end
    tokens.append(Token(COMMENT, i, end))
    return end, None
  if c == "/":  # "/-": plain comments skip the character after it; "/--", "/-!" are 3-char tokens
    end = _finish_comment_block(text, i + 3) if i + 3 <= n else -1
    tokens.append(Token(COMMENT, i, n if end < 0 else end))
    return (n, (i, "unterminated comment")) if end < 0 else (end, None)
  # --- one token (Lean's `tokenFnAux`) ---
  if c == '"':
    i, error = _string_end(text, i)
    tokens.append(Token(STRING, start, i))
  elif c == "'":
    if text.startswith("''", i):
      tokens.append(Token(SYMBOL, i, i + 2))  # the `''` token (Mathlib's image)
      return i + 2, None
    end = _char_end(text, i)
    if end < 0:
      tokens.append(Token(SYMBOL, i, i + 1))
      return i + 1, (i, "missing end of character literal")
    tokens.append(Token(CHAR, start, end))
    return end, None
  elif "0" <= c <= "9":
    prev = tokens[-1] if tokens else None
    glued_dot = (prev is not None and prev.kind == SYMBOL and prev.end == i and text[prev.start] == "."
                 and prev.end - prev.start == 1 and len(tokens) > 1 and tokens[-2].end == prev.start
                 and tokens[-2].kind != COMMENT)
    if glued_dot:  # `h.2`: the projection parser reads `fieldIdx` digits, not a number
      i = _FIELD_IDX.match(text, i).end()
    else:
      i, error = _number_end(text, i)
    tokens.append(Token(NUMBER, start, i))
  elif c == "`":
    if not _is_id_first_or_escape(text, i + 1):
      symbol = _table_token(text, i) or c
      tokens.append(Token(SYMBOL, i, i + len(symbol)))
      return i + len(symbol), None
    i, parts, error = _ident_end(text, i + 1)
    tokens.append(Token(NAME_LITERAL, start, i, parts))
  else:  # r#*"
    raw = _RAW_OPEN.match(text, i)
    close = '"' + raw.group(1)
    end = text.find(close, raw.end())
    i, error = (n, "unterminated raw string literal") if end < 0 else (end + len(close), None)
    tokens.append(Token(RAW_STRING, start, i))
  return i, (start, error) if error else None


# --- views used by the statement helpers -------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Segment:
  kind: str  # CODE, COMMENT, STRING (raw strings too), CHAR
  start: int
  end: int  # exclusive


def lex(text: str) -> list[Segment]:
  """The text as consecutive segments; their spans cover it exactly. Identifiers, symbols, numbers,
  name literals and whitespace are CODE."""
  segments, code_start = [], 0
  for token in tokenize(text).tokens:
    kind = {COMMENT: COMMENT, STRING: STRING, RAW_STRING: STRING, CHAR: CHAR}.get(token.kind)
    if kind is None:
      continue
    if code_start < token.start:
      segments.append(Segment(CODE, code_start, token.start))
    segments.append(Segment(kind, token.start, token.end))
    code_start = token.end
  if code_start < len(text):
    segments.append(Segment(CODE, code_start, len(text)))
  return segments


def strip_comments(text: str) -> str:
  """The text without comments; literals intact; a comment's newlines kept (line numbers hold)."""
  return "".join(text[s.start:s.end] if s.kind != COMMENT else "\n" * text.count("\n", s.start, s.end)
                 for s in lex(text))


def mask_literals(text: str) -> str:
  """strip_comments, with every literal blanked to spaces (newlines kept), so what is left is the
  code's layout."""
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
