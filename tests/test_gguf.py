"""The embedded default from its GGUF: weights, config and tokenizer against transformers' own load."""
import ast

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compassplay_jax.models.gguf_io import load_gguf_model, unpermute_llama_rows
from compassplay_jax.models.safetensors_io import CheckpointError

TEXT_SAMPLE = [
    "Hello world!",
    "def f(x):\n    return x**2 + 1\n",
    "x = 12345 + 6.75e-3",
    "Ünïcødé — 中文 😀 ∀x ∈ ℕ, x ≥ 0",
    "  leading  spaces\t\ttabs\n\n\ntrailing   ",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "theorem foo (a b : ℕ) (h₀ : a ≠ b) : a + b = b + a := by\n  omega",
    "I'm sure they'll've done it; it's 3 o'clock.",
]


def test_unpermute_inverts_llama_cpp_permute():
  rng = np.random.default_rng(0)
  w = rng.normal(size=(3 * 8, 5))

  def llama_cpp_permute(w, n_head):  # convert_hf_to_gguf.py's LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

  np.testing.assert_array_equal(unpermute_llama_rows(llama_cpp_permute(w, 3), 3), w)


def test_tokenizer_matches_transformers_gguf_tokenizer(smollm2, smollm2_torch_tokenizer):
  _, ours = smollm2
  theirs = smollm2_torch_tokenizer
  for text in TEXT_SAMPLE:
    assert ours.encode(text) == theirs.encode(text), text
    assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text))
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write f."},
              {"role": "assistant", "content": "def f(): pass"}, {"role": "user", "content": "Again."}]
  for msgs in (messages[1:2], messages):
    assert (ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) ==
            theirs.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
  assert ours.eos_token_id == theirs.eos_token_id and ours.pad_token_id is not None


def test_logits_match_transformers_gguf_load(smollm2, smollm2_torch):
  import torch
  model, tok = smollm2
  torch_model = smollm2_torch
  prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3? Answer briefly."}],
                                   tokenize=False, add_generation_prompt=True)
  ids = np.asarray([tok.encode(prompt)], np.int32)
  ours = np.asarray(model(jnp.asarray(ids)))
  with torch.no_grad():
    theirs = torch_model(torch.tensor(ids, dtype=torch.long)).logits.numpy()
  assert np.max(np.abs(ours - theirs)) <= 1e-3


def _naive_greedy(model, ids, steps, done=lambda out: False):
  """Greedy decoding by a full forward per step (no cache): an oracle independent of the sampler.
  Stops after `steps` tokens or once done(tokens so far) holds."""
  forward = jax.jit(lambda m, x, mask: m(x, attention_mask=mask))
  length = ids.shape[1] + steps
  buf = np.zeros((1, length), np.int32)
  buf[0, :ids.shape[1]] = ids[0]
  n = ids.shape[1]
  out = []
  for _ in range(steps):
    mask = (np.arange(length) < n).astype(np.int32)[None]
    logits = forward(model, jnp.asarray(buf), jnp.asarray(mask))
    nxt = int(jnp.argmax(logits[0, n - 1]))
    out.append(nxt)
    if done(out):
      break
    buf[0, n] = nxt
    n += 1
  return out


def _closed_code_block(text):
  """True once text holds a ```python block and its closing fence."""
  return "```python" in text and "```" in text.split("```python", 1)[1]


@pytest.mark.slow
def test_greedy_writes_parseable_python(smollm2):
  model, tok = smollm2
  prompt = tok.apply_chat_template(
      [{"role": "user", "content": "Write a Python function f(x) that returns x squared plus one."}],
      tokenize=False, add_generation_prompt=True)
  ids = np.asarray([tok.encode(prompt)], np.int32)
  # Up to 48 tokens, or until the first ```python block is closed (18 tokens today: each full forward of
  # SmolLM2 costs ~0.47 CPU s, and the checks below read only the ```python block, not the prose after it).
  done = lambda out: _closed_code_block(tok.decode(out, skip_special_tokens=True))
  text = tok.decode(_naive_greedy(model, ids, 48, done), skip_special_tokens=True)
  assert "def " in text, text
  code = text.split("```python")[-1].split("```")[0] if "```" in text else text
  start = code.index("def ")
  lines = code[start:].splitlines()
  # The smallest prefix of whole lines from `def` that parses (the model may keep talking after).
  assert any(_parses("\n".join(lines[:k])) for k in range(2, len(lines) + 1)), text


def _parses(src):
  try:
    tree = ast.parse(src)
  except SyntaxError:
    return False
  return any(isinstance(node, ast.FunctionDef) for node in tree.body)


def test_unsupported_gguf_architecture_is_one_clear_error(tmp_path):
  import gguf
  path = tmp_path / "falcon.gguf"
  writer = gguf.GGUFWriter(str(path), "falcon")
  writer.add_block_count(1)
  writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  with pytest.raises(CheckpointError, match=r"falcon\.gguf.*'falcon'.*general\.architecture"):
    load_gguf_model(path)


def test_garbage_gguf_is_one_clear_error(tmp_path):
  path = tmp_path / "garbage.gguf"
  path.write_bytes(b"not a gguf file at all")
  with pytest.raises(CheckpointError, match="garbage.gguf"):
    load_gguf_model(path)
