"""Pulls Lean pieces out of model text: code blocks, conjectures, proof bodies.

The lexical helpers (comment stripping, header splitting, theorem names, signatures) live in
lean_syntax/statements.py, below verifiers/ and rewards/ which use them too; re-exported here.
"""
import re

from compassplay_jax.lean_syntax.statements import (  # noqa: F401  (re-exported)
    PROOF_START, normalize_header, rename_theorem, split_header, statement_signature,
    strip_lean_comments, theorem_name)

_LEAN4_BLOCK = re.compile(r"```lean4[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


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
  if len(PROOF_START.findall(code)) != 1 or len(re.findall(r"\bsorry\b", code)) > 1:
    return None
  if not (code.endswith("sorry") or re.search(r":=\s*by$", code)):
    return None
  end = PROOF_START.search(code).end()
  statement = split_header(code[:end])[1].strip()
  return statement or None


def extract_proof_body(text: str, strict: bool = False) -> str | None:
  """The model's proof body: everything after the first `:= by` of the last lean4 block.

  strict=True applies SGS's `extract_proof_deepseek_v2_strict` shape rules (sgs/utils/prompts.py:133-181,
  the prover's extractor in SGS's runs): the stripped text starts with ```lean4 and ends with ```,
  has exactly one ```lean4 and two ``` fences, and the substrings "theorem ", "lemma " and "def "
  occur once in all (counted as SGS counts them: `my_lemma ` counts too).
  """
  if strict:
    stripped = text.strip()
    declarations = sum(stripped.count(word) for word in ("theorem ", "lemma ", "def "))
    if (not stripped.startswith("```lean4") or not stripped.endswith("```") or stripped.count("```lean4") != 1
        or stripped.count("```") != 2 or declarations != 1):
      return None
  block = extract_last_lean4_block(text)
  if block is None:
    return None
  match = PROOF_START.search(block)
  if match is None:
    return None
  body = block[match.end():].rstrip()
  return body if body.strip() else None


_TRY = re.compile(r"(?<![\w'.])try(?![\w'!?])")


def uses_try(proof_body: str) -> bool:
  """True when the body (comments ignored) uses the `try` tactic. SGS gives such proofs weight 0
  ("infinite loops"); it matches the substring, we match the word, so `geometry` is no `try`."""
  return _TRY.search(strip_lean_comments(proof_body)) is not None


def prover_completion(proof_body: str, header: str, statement: str, prefilled: bool) -> str:
  """The completion a prover would have written for `proof_body` (so a supplied proof can seed):
  with a prefilled turn, the body and the closing fence; else the whole code block."""
  body = proof_body.rstrip()
  if body and not body[0].isspace():
    body = " " + body
  if prefilled:
    return f"{body}\n```"
  return f"```lean4\n{header}{statement.rstrip()}{body}\n```"
