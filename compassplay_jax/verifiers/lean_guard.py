"""The proof-body guard: a model's proof body must be plain tactic text for the fixed statement.

It reads the body with lean_syntax/lexer.py (a port of Lean's own tokenizer) and rejects, with a
one-line reason naming the line:
  * a body longer than MAX_PROOF_CHARS (one check, before any reading: the guard stays linear and
    a runaway completion costs nothing);
  * anything Lean would report as a lexical error (tabs, unterminated literals, bad escapes);
  * a banned word (BANNED_WORDS, BANNED_NAMES, …) in an identifier, keyword or name literal, or
    anywhere inside a string (literals hide nothing; only comments do); `«Lean».Elab` is the name
    `Lean.Elab`, so escaped names are read as their parts;
  * a string literal containing `{` (interpolation: whether a string is interpolated is the
    parser's choice, and inside `{…}` is code with its own strings and comments);
  * a `#` command token anywhere (`x := 1 #eval e`, `#evalx`, `#eval!`), and any `#` glued to an
    identifier letter or symbol, known command or not (HASH_COMMANDS);
  * a comment or literal glued to a symbol other than a bracket or comma (`//-`, `ᶜ'"'`): the
    token table decides whether the symbol swallows its first character, and Lean's table is
    Mathlib's, larger than any fixed list;
  * (proof bodies only) code at column 0 after the first line: a new top-level command.
docs/lean.md ("The body rule") gives the attack each rule stops; tests/test_lean_guard.py has them.
"""
import re

from compassplay_jax.lean_syntax import lexer

# Proof bodies of DeepSeek-Prover-V2 and SGS runs are a few thousand characters (8192 new tokens at
# most in SGS); 100 000 leaves room and keeps the worst case (one token per character) well under 1 s.
MAX_PROOF_CHARS = 100_000

# Keywords that end the tactic block and start a command (any column), or open a scope for one.
COMMAND_KEYWORDS = (
    "import", "theorem", "lemma", "def", "instance", "abbrev", "example", "structure", "inductive",
    "class", "attribute", "namespace", "section", "end", "universe", "variable", "omit", "include",
    "open", "export", "mutual", "deriving", "noncomputable", "private", "protected", "initialize",
    "builtin_initialize", "irreducible_def", "alias", "recall", "declare_syntax_cat",
    "add_decl_doc", "register_option", "register_simp_attr", "register_label_attr", "seal",
    "unseal", "simproc", "dsimproc", "simproc_decl", "dsimproc_decl", "builtin_simproc",
    "builtin_dsimproc", "declare_simp_like_tactic", "binder_predicate", "notation3",
    "suppress_compilation", "assert_not_exists", "library_note", "initialize_simps_projections",
    "local", "scoped")
# Banned as an identifier's first part (`sorry`, `axiom.x`; `x.sorry` is another name).
BANNED_WORDS = frozenset((
    "sorry", "admit", "native_decide", "bv_decide", "implemented_by", "extern", "csimp",
    "axiom", "opaque", "unsafe", "partial", "set_option", "run_tac", "run_cmd", "run_elab",
    "run_meta", "by_elab", "elab", "elab_rules", "macro", "macro_rules", "syntax", "notation",
    "infix", "infixl", "infixr", "prefix", "postfix", "hint", *COMMAND_KEYWORDS))
# Banned as any part, so a dot does not shield them (`Environment.addDecl`, `.addDecl`).
BANNED_NAMES = frozenset(("sorryAx", "ofReduceBool", "ofReduceNat", "trustCompiler", "addDecl",
                          "addAndCompile", "compileDecl", "evalConst"))
# Search tactics that close goals silently on some Lean versions (`simp?!` included).
SEARCH_TACTICS = ("apply?", "exact?", "rw?", "simp?", "aesop?")
# The `#word` command tokens we know (lexer.HASH_COMMAND_TOKENS, Lean's token table), without the `#`.
# The guard refuses them, and every other `#` glued to anything but `(`, `{`, `[` (`#[`), a space or
# the end, wherever it stands: Lean's tokenizer reads `#` plus letters by longest match against a
# table that Mathlib extends, so `#evalx`, `x#eval`, `#eval!` and a `#word` we never heard of may
# all be commands. `#s` and `#α` (Finset.card and Cardinal.mk notation) are refused with them;
# `# s` and `#(s)` pass.
HASH_COMMANDS = frozenset(token[1:] for token in lexer.HASH_COMMAND_TOKENS)
HASH_TERM_TOKENS = frozenset(("#", "#["))  # `#` tokens that are no command
AFTER_LONE_HASH = frozenset(" \n({[")  # what may follow a lone `#` token
# Symbols after which a glued comment or literal cannot be part of a longer token.
SAFE_BEFORE_LITERAL = frozenset(("(", ")", "[", "]", "{", "}", "⟨", "⟩", ","))


def _line_of(text: str, index: int) -> int:
  return text.count("\n", 0, index) + 1


def _banned_name(parts: tuple[str, ...]) -> str | None:
  """The banned construct an identifier (as its parts) names first, or None."""
  if not parts:
    return None
  head = parts[0]
  if head in BANNED_WORDS:
    return head
  for search in SEARCH_TACTICS:
    if head.startswith(search):
      return search
  if head == "native":  # `decide +native`, `decide (native := true)`
    return "decide +native"
  if head == "debug" and len(parts) > 1:
    return "debug."
  for i, part in enumerate(parts):
    if part == "Lean" and i + 1 < len(parts):  # `Lean.Elab`, `_root_.Lean.x`, `«Lean».x`
      return "Lean."
    if part in BANNED_NAMES:
      return part
  return None


_LITERAL_NAME = re.compile(f"{lexer.NAME_PART}(?:\\.{lexer.NAME_PART})*")
# In a string, a known command is read as Lean's tokenizer would read it in code: by its prefix
# (`"#evalx"` holds `#eval`), not as a whole word.
_LITERAL_COMMAND = re.compile(r"@\[|#(?:" + "|".join(sorted(HASH_COMMANDS, key=len, reverse=True)) + ")")


def _banned_in_literal(piece: str):
  """(offset, construct) for banned names in a string's contents. Literals hide nothing from the
  guard: if it ever misplaced a string's end, what Lean reads as code would still be checked."""
  for match in _LITERAL_NAME.finditer(piece):
    banned = _banned_name(lexer.name_parts(match.group()))
    if banned:
      yield match.start(), banned
  for match in _LITERAL_COMMAND.finditer(piece):
    yield match.start(), "@[attribute]" if match.group() == "@[" else "#command"


def _hits(lexed: lexer.Lexed):
  """(position, construct) for every rule a token breaks (module docstring)."""
  text, tokens = lexed.text, lexed.tokens
  for position, message in lexed.errors:
    yield position, f"lexical error: {message}"
  prev = None
  for token in tokens:
    kind, start = token.kind, token.start
    if kind == lexer.COMMENT or kind in lexer.LITERALS or text[start] == "«":
      if (prev is not None and prev.end == start and prev.kind == lexer.SYMBOL
          and text[prev.start:prev.end] not in SAFE_BEFORE_LITERAL):
        yield start, "ambiguous token boundary"
    prev = token
    if kind == lexer.COMMENT:
      continue
    if kind == lexer.IDENT or kind == lexer.NAME_LITERAL:
      banned = _banned_name(token.parts)
      if banned:
        yield start, banned
    elif kind == lexer.SYMBOL:
      piece = text[start:token.end]
      if piece == "@[":
        yield start, "@[attribute]"
      elif piece[0] == "#" and (piece not in HASH_TERM_TOKENS or (
          piece == "#" and token.end < len(text) and text[token.end] not in AFTER_LONE_HASH)):
        yield start, "#command"  # a `#word` token, known or not, at any place (HASH_COMMANDS)
    elif kind == lexer.STRING or kind == lexer.RAW_STRING:
      piece = text[start:token.end]
      if kind == lexer.STRING and "{" in piece:
        yield start, "string with '{' (interpolation)"
      for offset, banned in _banned_in_literal(piece):
        yield start + offset, banned


def _first(hits, text: str) -> str | None:
  hits = list(hits)
  if not hits:
    return None
  position, name = min(hits, key=lambda hit: hit[0])
  return f"{name} (line {_line_of(text, position)})"


def _too_long(text: str) -> str | None:
  if len(text) > MAX_PROOF_CHARS:
    return f"text too long: {len(text)} characters (limit {MAX_PROOF_CHARS})"
  return None


def banned_construct(text: str, allow_declaration: bool = False) -> str | None:
  """The first banned construct in `text` as 'name (line N)', or None.

  allow_declaration: the text is a conjecture, whose own leading `theorem`/`lemma` is allowed.
  """
  too_long = _too_long(text)
  if too_long:
    return too_long
  lexed = lexer.tokenize(text)
  skip = -1
  if allow_declaration:
    code = [t for t in lexed.tokens[:3] if t.kind != lexer.COMMENT]
    if code and code[0].kind == lexer.IDENT and code[0].parts in (("theorem",), ("lemma",)):
      skip = code[0].start
  return _first(((p, name) for p, name in _hits(lexed) if p != skip), text)


def _column_zero(lexed: lexer.Lexed) -> str | None:
  text = lexed.text
  for token in lexed.tokens:
    if token.kind != lexer.COMMENT and token.start > 0 and text[token.start - 1] == "\n":
      return f"top-level command (line {_line_of(text, token.start)})"
  return None


def top_level_command(proof_body: str) -> str | None:
  """'top-level command (line N)' when a line after the body's first starts with code at column 0.

  The body continues the `:= by` line, so its tactics are indented; a token at column 0 (outside
  comments and literals) is a new command, whatever its keyword.
  """
  return _too_long(proof_body) or _column_zero(lexer.tokenize(proof_body))


def proof_body_violation(proof_body: str) -> str | None:
  """Why `proof_body` is not plain tactic text for the fixed statement, or None. One pass of the
  tokenizer, then the rules (a banned construct is named before a top-level command)."""
  too_long = _too_long(proof_body)
  if too_long:
    return too_long
  lexed = lexer.tokenize(proof_body)
  return _first(_hits(lexed), proof_body) or _column_zero(lexed)
