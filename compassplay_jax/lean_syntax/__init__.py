"""Lean 4 syntax as text (no Lean process): the lexer and statement helpers."""
