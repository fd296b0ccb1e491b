"""Tokenizers: transformers' AutoTokenizer for checkpoint directories (configs and tokenizers only;
transformers 5 has no Flax models), with pad falling back to eos."""
from __future__ import annotations

import pathlib

from compassplay_jax.core.errors import InputNotFound


def ensure_pad_token(tokenizer):
  """Many causal LMs ship no pad token; we pad with eos (padding is masked everywhere anyway)."""
  if tokenizer.pad_token_id is None:
    tokenizer.pad_token = tokenizer.eos_token
  return tokenizer


def load_hf_tokenizer(directory: str | pathlib.Path):
  from transformers import AutoTokenizer
  directory = pathlib.Path(directory)
  if not any((directory / n).exists() for n in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
    raise InputNotFound(f"{directory}: no tokenizer files (tokenizer.json / tokenizer.model / "
                            f"tokenizer_config.json)")
  return ensure_pad_token(AutoTokenizer.from_pretrained(str(directory)))


def eos_token_ids(tokenizer) -> tuple[int, ...]:
  """All ids that end generation: the tokenizer's eos plus chat end markers it knows (e.g. <|im_end|>)."""
  ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
  for marker in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<｜end▁of▁sentence｜>"):
    # One lookup per marker, not get_vocab() (a 49k-entry dict, 0.4 s, built at every generate call). An
    # unknown token maps to unk (or None): the round trip keeps only ids that are the marker itself.
    found = tokenizer.convert_tokens_to_ids(marker)
    if found is not None and tokenizer.convert_ids_to_tokens(found) == marker:
      ids.add(found)
  return tuple(sorted(ids))
