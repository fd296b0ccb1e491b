"""Token-Jaccard novelty, copy detection and rename detection for Python and Lean text.

Pure functions, no I/O. The reward is `cos(g(x), g_ref) * novelty(conjecture, seed)`
with `novelty = 1 - J`, where J is the Jaccard index of the two token *sets*.

Tokens come from a regex tokenizer that suits both languages (not the LLM's BPE,
whose merges depend on whitespace): identifiers (Unicode letters, Greek, subscripts,
primes, dotted names such as `Real.sqrt`), numbers, multi-character operators
(`:=`, `<->`, `**`, ...) and every other non-space symbol (`≤`, `∑`, `(`) on its own.

Before tokenizing, Lean statements lose comments, header lines, the
`theorem <name>` prefix and the trailing `:= by`/`sorry`; Python code loses `#`
comments. `language=None` picks Lean when the text declares a theorem or uses
`:= by`, else Python.
"""
import ast
import re
from collections.abc import Sequence

from compassplay_jax.lean_syntax.statements import statement_signature

COPY_THRESHOLD = 0.8  # The paper's threshold: J > 0.8 to the seed is a copy.

_MULTI_OPS = ["**=", "//=", ">>=", "<<=", "<;>", "<->", "...", "|>.", "∃!", "∀ᶠ", "∃ᶠ",
              ":=", "->", "<-", "=>", "<=", ">=", "!=", "==", "::", "..", "**", "//", "+=",
              "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<", ">>", "&&", "||", "++", "|>",
              "<|", "^^"]
_IDENT = r"[^\W\d][\w']*(?:[!?](?![=]))?"
_DOTTED_IDENT = rf"{_IDENT}(?:\.{_IDENT})*"
_NUMBER = r"0[xXbBoO][0-9a-fA-F_]+|\d[\d_]*(?:\.\d[\d_]*)?(?:[eE][+-]?\d+)?"
_DQ_STRING = r'"(?:[^"\\\n]|\\.)*"'
_SQ_STRING = r"'(?:[^'\\\n]|\\.)*'"
_OPS = "|".join(re.escape(op) for op in _MULTI_OPS)
_LEAN_TOKEN = re.compile(rf"{_DQ_STRING}|{_OPS}|{_DOTTED_IDENT}|{_NUMBER}|\S")
_PYTHON_TOKEN = re.compile(rf"{_DQ_STRING}|{_SQ_STRING}|{_OPS}|{_DOTTED_IDENT}|{_NUMBER}|\S")
_SIMPLE_IDENT = re.compile(rf"{_IDENT}")
_LOOKS_LEAN = re.compile(r"^\s*(?:theorem|lemma)\s|:=\s*by\b|^\s*import\s+Mathlib", re.M)

# Tokens after which Lean binds names: quantifiers, big operators, lambdas, let.
_LEAN_BINDERS = {"∀", "∃", "∃!", "∀ᶠ", "∃ᶠ", "Π", "Σ", "λ", "fun", "∑", "∏", "⨆", "⨅", "⋃",
                 "⋂", "∫", "∮", "let", "have", "obtain"}
_LEAN_KEYWORDS = {"in", "fun", "at", "with", "if", "then", "else", "by", "do", "match",
                  "let", "have", "show", "from", "theorem", "lemma", "Type", "Prop", "Sort"}
_OPENERS = {"(": ")", "{": "}", "⦃": "⦄", "[": "]", "⟨": "⟩"}


def _resolve_language(text: str, language: str | None) -> str:
  if language is None:
    return "lean" if _LOOKS_LEAN.search(text) else "python"
  if language not in ("lean", "python"):
    raise ValueError(f"novelty: language must be 'lean' or 'python', got {language!r}")
  return language


def _strip_python_comments(text: str) -> str:
  """Drops `#` comments outside string literals."""
  out, i, n = [], 0, len(text)
  while i < n:
    ch = text[i]
    if ch == "#":
      while i < n and text[i] != "\n":
        i += 1
    elif ch in "\"'":
      quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else ch
      end = i + len(quote)
      while end < n and not text.startswith(quote, end):
        end += 2 if text[end] == "\\" else 1
      end = min(n, end + len(quote))
      out.append(text[i:end])
      i = end
    else:
      out.append(ch)
      i += 1
  return "".join(out)


def _normalize(text: str, language: str) -> str:
  if language == "lean":
    return statement_signature(text)
  return _strip_python_comments(text)


def code_tokens(text: str, language: str | None = None) -> list[str]:
  """Tokens of `text` after the language's normalisation (see the module doc)."""
  language = _resolve_language(text, language)
  pattern = _LEAN_TOKEN if language == "lean" else _PYTHON_TOKEN
  return pattern.findall(_normalize(text, language))


def token_jaccard(a: str, b: str, language: str | None = None) -> float:
  """|A ∩ B| / |A ∪ B| on token sets; two texts with no tokens are identical (J = 1)."""
  language = _resolve_language(a + "\n" + b, language)
  set_a, set_b = set(code_tokens(a, language)), set(code_tokens(b, language))
  union = set_a | set_b
  if not union:
    return 1.0
  return len(set_a & set_b) / len(union)


def novelty(candidate: str, seed: str, language: str | None = None) -> float:
  """1 - token_jaccard(candidate, seed): 0 for a copy, 1 for disjoint vocabularies."""
  return 1.0 - token_jaccard(candidate, seed, language)


def is_copy(candidate: str, seed: str, threshold: float = COPY_THRESHOLD,
            language: str | None = None) -> bool:
  """True when the token-Jaccard to the seed exceeds `threshold` (0.8 in the paper)."""
  return token_jaccard(candidate, seed, language) > threshold


def _is_simple_name(token: str) -> bool:
  return (token not in _LEAN_KEYWORDS and token != "_"
          and _SIMPLE_IDENT.fullmatch(token) is not None)


def _matching_close(tokens: list[str], start: int) -> int:
  """Index of the bracket closing tokens[start] (or len(tokens) if unbalanced)."""
  opener, depth = tokens[start], 0
  closer = _OPENERS[opener]
  for i in range(start, len(tokens)):
    if tokens[i] == opener:
      depth += 1
    elif tokens[i] == closer:
      depth -= 1
      if depth == 0:
        return i
  return len(tokens)


def _group_names(tokens: list[str], start: int, end: int) -> list[str]:
  """Names a bracket group binds: `(x y : T)`, `[inst : C]`, `⟨a, b⟩`; none for `(f x)`."""
  inner = tokens[start + 1:end]
  if tokens[start] == "⟨":
    return [t for t in inner if _is_simple_name(t)]
  names = []
  for token in inner:
    if token == ":":
      return names
    if not _is_simple_name(token):
      return []
    names.append(token)
  return []


def _lean_bound_names(tokens: list[str]) -> list[str]:
  """Names bound in a Lean signature, in order of first binding."""
  found = []
  # Top-level binder groups: brackets at depth 0 before the statement's main colon.
  i = 0
  while i < len(tokens) and tokens[i] != ":":
    if tokens[i] in _OPENERS:
      end = _matching_close(tokens, i)
      found += _group_names(tokens, i, end)
      i = end
    i += 1
  for i, token in enumerate(tokens):
    if token in _LEAN_BINDERS:
      j = i + 1
      while j < len(tokens):
        if _is_simple_name(tokens[j]) or tokens[j] == "_":
          found.append(tokens[j])
          j += 1
        elif tokens[j] in _OPENERS:
          end = _matching_close(tokens, j)
          found += _group_names(tokens, j, end)
          j = end + 1
        else:
          break
    elif token == "{" and i > 0:
      # Set-builder `{x | p x}` or `{x : T | p x}` binds x.
      end = _matching_close(tokens, i)
      names = []
      for t in tokens[i + 1:end]:
        if not _is_simple_name(t):
          break
        names.append(t)
      if names and i + 1 + len(names) < end and tokens[i + 1 + len(names)] in ("|", ":"):
        if "|" in tokens[i + 1:end]:
          found += names
  return list(dict.fromkeys(n for n in found if n != "_"))


def bound_names(text: str, language: str | None = None) -> list[str]:
  """Names bound in `text` (binders, hypotheses, locals), in order of first binding."""
  language = _resolve_language(text, language)
  if language == "lean":
    return _lean_bound_names(code_tokens(text, "lean"))
  try:
    tree = ast.parse(_normalize(text, "python"))
  except SyntaxError:
    return []
  collector = _PythonBindings()
  collector.visit(tree)
  return list(dict.fromkeys(collector.names))


class _PythonBindings(ast.NodeVisitor):
  """Collects names a Python snippet binds, in source order."""

  def __init__(self):
    self.names = []

  def visit_FunctionDef(self, node):
    self.names.append(node.name)
    self.generic_visit(node)

  visit_AsyncFunctionDef = visit_FunctionDef
  visit_ClassDef = visit_FunctionDef

  def visit_arg(self, node):
    self.names.append(node.arg)

  def visit_Name(self, node):
    if not isinstance(node.ctx, ast.Load):
      self.names.append(node.id)

  def visit_ExceptHandler(self, node):
    if node.name:
      self.names.append(node.name)
    self.generic_visit(node)


class _PythonRenamer(ast.NodeTransformer):
  """Applies a name mapping to every binding and use of the mapped names."""

  def __init__(self, mapping: dict[str, str]):
    self.mapping = mapping

  def _rename(self, name):
    return self.mapping.get(name, name)

  def visit_FunctionDef(self, node):
    node.name = self._rename(node.name)
    return self.generic_visit(node)

  visit_AsyncFunctionDef = visit_FunctionDef
  visit_ClassDef = visit_FunctionDef

  def visit_arg(self, node):
    node.arg = self._rename(node.arg)
    return node

  def visit_Name(self, node):
    node.id = self._rename(node.id)
    return node

  def visit_keyword(self, node):
    if node.arg:
      node.arg = self._rename(node.arg)
    return self.generic_visit(node)

  def visit_ExceptHandler(self, node):
    if node.name:
      node.name = self._rename(node.name)
    return self.generic_visit(node)

  def visit_Global(self, node):
    node.names = [self._rename(n) for n in node.names]
    return node

  visit_Nonlocal = visit_Global


def _rename_token(token: str, mapping: dict[str, str]) -> str:
  head, dot, rest = token.partition(".")
  return mapping.get(head, head) + dot + rest if head in mapping else token


def canonicalize(text: str, language: str) -> str:
  """Text with bound variables and hypothesis names replaced by v0, v1, ... in order.

  Lean: the normalised statement's tokens (projections such as `h₀.le` follow
  their head), joined by single spaces. Python: the renamed AST unparsed, so
  formatting and comments do not matter; code that does not parse falls back to
  its plain token sequence.
  """
  language = _resolve_language(text, language)
  mapping = {name: f"v{i}" for i, name in enumerate(bound_names(text, language))}
  if language == "python":
    try:
      tree = ast.parse(_normalize(text, "python"))
    except SyntaxError:
      return " ".join(code_tokens(text, "python"))
    return ast.unparse(_PythonRenamer(mapping).visit(tree))
  return " ".join(_rename_token(t, mapping) for t in code_tokens(text, "lean"))


def is_identical(candidate: str, seed: str, language: str) -> bool:
  """True when the two normalised texts have the same token sequence (a verbatim copy; for Lean
  the theorem name, comments and layout do not count)."""
  return code_tokens(candidate, language) == code_tokens(seed, language)


def is_rename(candidate: str, seed: str, language: str) -> bool:
  """True when the candidate equals the seed after canonical renaming but is not identical to it.

  The paper's rename: bound variables or hypotheses renamed, nothing else changed. An exact copy
  (`is_identical`) is not a rename; `is_copy` counts it.
  """
  return (canonicalize(candidate, language) == canonicalize(seed, language)
          and not is_identical(candidate, seed, language))


def batch_novelty_metrics(candidates: Sequence[str], seeds: Sequence[str],
                          language: str) -> dict[str, float]:
  """Copy rate (J > 0.8), rename rate (canonically equal, not identical) and mean Jaccard over
  (candidate, seed) pairs."""
  if len(candidates) != len(seeds):
    raise ValueError(f"batch_novelty_metrics: {len(candidates)} candidates but {len(seeds)} seeds")
  if not candidates:
    return {"copy_rate": 0.0, "rename_rate": 0.0, "mean_jaccard": 0.0, "count": 0}
  jaccards = [token_jaccard(c, s, language) for c, s in zip(candidates, seeds)]
  renames = [is_rename(c, s, language) for c, s in zip(candidates, seeds)]
  n = len(candidates)
  return {
      "copy_rate": sum(j > COPY_THRESHOLD for j in jaccards) / n,
      "rename_rate": sum(renames) / n,
      "mean_jaccard": sum(jaccards) / n,
      "count": n,
  }
