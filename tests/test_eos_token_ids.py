"""models.tokenizer.eos_token_ids against the naive reading of the whole vocabulary (the oracle)."""
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from compassplay_jax.models.tokenizer import eos_token_ids

MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<｜end▁of▁sentence｜>")


def naive(tokenizer):
  vocab = tokenizer.get_vocab()
  ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
  return tuple(sorted(ids | {vocab[m] for m in MARKERS if m in vocab}))


def _word_level(vocab, **special):
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>" if "<unk>" in vocab else None))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


@pytest.mark.parametrize("vocab,special", [
    # Qwen-like: eos is <|endoftext|>, <|im_end|> also ends; an unk token (unknown markers map to it).
    ({"<unk>": 0, "a": 1, "<|endoftext|>": 2, "<|im_end|>": 3}, {"eos_token": "<|endoftext|>", "unk_token": "<unk>"}),
    # No unk token: unknown markers map to None.
    ({"a": 0, "<|eot_id|>": 1, "b": 2}, {"eos_token": "b"}),
    # No eos at all, DeepSeek's marker only.
    ({"<unk>": 0, "<｜end▁of▁sentence｜>": 5, "a": 1}, {"unk_token": "<unk>"}),
    # Nothing ends a row.
    ({"<unk>": 0, "a": 1}, {"unk_token": "<unk>"}),
], ids=["qwen_like", "no_unk", "deepseek_marker_only", "none"])
def test_equals_the_whole_vocabulary_reading(vocab, special):
  tokenizer = _word_level(vocab, **special)
  assert eos_token_ids(tokenizer) == naive(tokenizer)


def test_embedded_tokenizer():
  from compassplay_jax.models.gguf_io import embedded_gguf_path, load_gguf_tokenizer
  try:
    tokenizer = load_gguf_tokenizer(embedded_gguf_path())
  except FileNotFoundError as e:
    pytest.skip(str(e))
  assert eos_token_ids(tokenizer) == naive(tokenizer) == (0, 2)
