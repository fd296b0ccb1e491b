"""Fused attention kernels for passes over whole sequences (train step, reference gradient, cosines, log-probs).

`ModelConfig.attention_impl` picks the attention of a pass without a KV cache:

  * "xla": the decoder's own attention (`decoder.attend`, or `decoder.chunked_attention` with
    `attention_query_chunk`): fp32 scores materialised by XLA. What CPU runs, and every cached pass
    (sampler prefill and decode) on every backend.
  * "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN's flash attention (GPU).
  * "splash": Pallas' splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`, TPU).
  * "auto" (the default): splash on TPU, cuDNN on a CUDA GPU when its constraints hold, else xla.
    `choose_attention_impl` is the rule, a pure function of (backend, dtype, head_dim, shapes).

Masks. The decoder's rows are left-padded prompts followed by completions and right padding:
every row's attention_mask is zeros, one run of ones, zeros (selfplay/sequences.py). A real query
attends to the real keys at or before it. Both kernels compute exactly that for real queries, and
return 0 for padding queries (the plain path returns a uniform average there; those outputs are
never used: padding keys are masked out of every real query and padding slots carry no loss).

  * splash takes segment ids: real tokens segment 1, padding segment 0, with a causal mask. Exact for
    any 0/1 mask. T is padded up to a multiple of the block size (padding in segment 0, dropped).
    GQA runs an MQA kernel (`make_splash_mqa`) per kv head (vmap over batch and kv heads); q is
    scaled by head_dim^-0.5 before the kernel (splash does not scale). Under a mesh (sharding.jit
    traces with an abstract mesh in context) the kernel runs in a shard_map: rows over the batch
    axes, kv heads over `tensor` when they divide it, as the projections are split.
  * cuDNN takes per-row lengths of right-padded rows (`query_seq_lengths` / `key_value_seq_lengths`,
    its PADDING_CAUSAL mask) rather than a (T, S) mask, which it would turn into a materialised bias.
    Each row is rotated left by its count of leading zeros (its real tokens then start at slot 0;
    RoPE was applied before, with the true positions, so the rotation changes nothing else), the
    kernel runs causal with length = the row's count of ones, and the output is rotated back. This
    needs the ones of a row to be contiguous (the packing above guarantees it); a row with holes
    would attend to its holes on this path only.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from compassplay_jax.models.config import ATTENTION_IMPLS

IMPLEMENTATIONS = ATTENTION_IMPLS

# The implementation string handed to jax.nn.dot_product_attention by the "cudnn" path. Tests on CPU
# set "xla": the same call (rotation, lengths, causal flag, GQA) through JAX's reference implementation.
CUDNN_IMPLEMENTATION = "cudnn"
# Pallas interpret mode for the splash kernel (tests on CPU set True: the kernel's own code, interpreted).
SPLASH_INTERPRET = False

_GPU_BACKENDS = ("gpu", "cuda")
_CUDNN_DTYPES = ("bfloat16", "float16")
_CUDNN_MAX_HEAD_DIM = 128  # 256 on Hopper and later; 128 holds on every cuDNN flash-attention GPU
_SPLASH_MAX_BLOCK = 512
_LANES = 128  # splash's block sizes are multiples of 128


def choose_attention_impl(requested: str, *, backend: str, dtype, head_dim: int, q_len: int, kv_len: int,
                          cached: bool) -> str:
  """The attention a pass runs: "xla", "cudnn" or "splash". Pure.

  requested: ModelConfig.attention_impl. backend: jax.default_backend() ("cpu", "gpu", "tpu").
  cached: the pass reads or writes a KV cache (sampler prefill / decode): always "xla", as are passes
  whose query and key lengths differ. "auto" takes splash on TPU; cuDNN on a GPU for bf16/fp16 compute
  with head_dim a multiple of 8 and <= 128 (cuDNN flash attention's conditions); xla otherwise. An
  explicit "cudnn" or "splash" is returned as asked (the kernel raises if the hardware cannot run it).
  """
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f"attention_impl {requested!r} is not one of {IMPLEMENTATIONS}")
  if cached or q_len != kv_len or requested == "xla":
    return "xla"
  if requested != "auto":
    return requested
  if backend == "tpu":
    return "splash"
  if (backend in _GPU_BACKENDS and jnp.dtype(dtype).name in _CUDNN_DTYPES and head_dim % 8 == 0
      and head_dim <= _CUDNN_MAX_HEAD_DIM):
    return "cudnn"
  return "xla"


def fused_attention(impl: str, q, k, v, key_mask):
  """q (B, T, kv, groups, hd), k/v (B, T, kv, hd), key_mask (B, T) bool (real tokens) ->
  (B, T, kv, groups, hd): causal attention of each real query over the real keys up to it; 0 at
  padding queries."""
  if impl == "cudnn":
    return cudnn_attention(q, k, v, key_mask, implementation=CUDNN_IMPLEMENTATION)
  if impl == "splash":
    return splash_attention(q, k, v, key_mask, interpret=SPLASH_INTERPRET)
  raise ValueError(f"no fused attention {impl!r} (expected 'cudnn' or 'splash')")


# ---- cuDNN (GPU) -----------------------------------------------------------------------------------

def right_aligned(key_mask):
  """(leading, lengths, gather, scatter) for rotating each row so its real tokens start at slot 0.

  leading (B,): count of leading padding slots (T for an all-padding row); lengths (B,) int32: count of
  real slots, at least 1 (cuDNN is not asked for empty rows; an all-padding row's output is zeroed);
  gather (B, T): x_rot = take(x, gather) puts slot leading + j at j; scatter (B, T): its inverse."""
  mask = key_mask > 0
  t = mask.shape[1]
  any_real = jnp.any(mask, axis=1)
  leading = jnp.where(any_real, jnp.argmax(mask, axis=1), t).astype(jnp.int32)
  lengths = jnp.maximum(jnp.sum(mask, axis=1, dtype=jnp.int32), 1)
  slots = jnp.arange(t, dtype=jnp.int32)
  gather = (slots[None, :] + leading[:, None]) % t
  scatter = (slots[None, :] - leading[:, None]) % t
  return leading, lengths, gather, scatter


def _take_rows(x, index):
  """x (B, T, ...) gathered along T with a per-row index (B, T)."""
  return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def cudnn_attention(q, k, v, key_mask, implementation: str = "cudnn"):
  """The "cudnn" path (module docstring): rotate rows to right padding, jax.nn.dot_product_attention
  causal with per-row lengths, rotate back, zero padding queries. `implementation="xla"` runs the same
  call through JAX's reference implementation (any backend, any dtype)."""
  b, t, kv, groups, hd = q.shape
  _, lengths, gather, scatter = right_aligned(key_mask)
  q_r = _take_rows(q.reshape(b, t, kv * groups, hd), gather)  # head n = kv head n // groups, as JAX groups
  k_r, v_r = _take_rows(k, gather), _take_rows(v, gather)
  out = jax.nn.dot_product_attention(q_r, k_r, v_r, is_causal=True, query_seq_lengths=lengths,
                                     key_value_seq_lengths=lengths, implementation=implementation)
  out = _take_rows(out, scatter).reshape(b, t, kv, groups, hd)
  return jnp.where((key_mask > 0)[:, :, None, None, None], out, jnp.zeros((), out.dtype))


# ---- splash (TPU) ----------------------------------------------------------------------------------

def splash_block(t: int) -> int:
  """The splash block size for length t: a multiple of 128, at most 512."""
  return min(_SPLASH_MAX_BLOCK, -(-t // _LANES) * _LANES)


def splash_segment_ids(key_mask, padded_len: int):
  """(B, padded_len) int32 segment ids: 1 at real tokens, 0 at padding (the slots added to reach
  padded_len included). With a causal mask, a query attends to keys of its own segment at or before it."""
  seg = (key_mask > 0).astype(jnp.int32)
  return jnp.pad(seg, ((0, 0), (0, padded_len - seg.shape[1])))


def _splash_kernel(groups: int, length: int, block: int, interpret: bool):
  # Built at each trace, not cached: the kernel holds its mask's block tables as arrays, which become
  # tracers of the trace that built them (a cached kernel leaks them into the next trace).
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  mask = sm.MultiHeadMask([sm.CausalMask((length, length)) for _ in range(groups)])
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  return sk.make_splash_mqa(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def _splash_local(q, k, v, seg, *, interpret: bool):
  """One device's rows: q (B, Tp, kv, groups, hd) pre-scaled, k/v (B, Tp, kv, hd), seg (B, Tp)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  _, tp, _, groups, _ = q.shape
  kernel = _splash_kernel(groups, tp, splash_block(tp), interpret)
  qh = jnp.transpose(q, (0, 2, 3, 1, 4))  # (B, kv, groups, Tp, hd)
  kh, vh = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))  # (B, kv, Tp, hd)

  def one_row(qr, kr, vr, sr):
    ids = sk.SegmentIds(q=sr, kv=sr)
    return jax.vmap(lambda qq, kk, vv: kernel(qq, kk, vv, segment_ids=ids))(qr, kr, vr)

  out = jax.vmap(one_row)(qh, kh, vh, seg)  # (B, kv, groups, Tp, hd)
  return jnp.transpose(out, (0, 3, 1, 2, 4))


def _mesh_specs(batch: int, kv_heads: int):
  """(mesh, row axes, head axis) for a shard_map over the abstract mesh in context, or None without one."""
  from compassplay_jax.models.layout import BATCH_AXES
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return None
  rows = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  if batch % math.prod(mesh.shape[a] for a in rows):
    rows = ()
  heads = "tensor" if "tensor" in mesh.axis_names and kv_heads % mesh.shape["tensor"] == 0 else None
  return mesh, (rows or None), heads


def splash_attention(q, k, v, key_mask, interpret: bool = False):
  """The "splash" path (module docstring). Shapes as `fused_attention`'s."""
  b, t, kv, groups, hd = q.shape
  tp = -(-t // splash_block(t)) * splash_block(t)
  scale = np.float32(hd ** -0.5)
  qs = (q.astype(jnp.float32) * scale).astype(q.dtype)
  pad = [(0, 0), (0, tp - t)]
  qs = jnp.pad(qs, pad + [(0, 0)] * 3)
  kp, vp = jnp.pad(k, pad + [(0, 0)] * 2), jnp.pad(v, pad + [(0, 0)] * 2)
  seg = splash_segment_ids(key_mask, tp)
  local = functools.partial(_splash_local, interpret=interpret)
  specs = _mesh_specs(b, kv)
  if specs is not None:
    mesh, rows, heads = specs
    q_spec, kv_spec = P(rows, None, heads, None, None), P(rows, None, heads, None)
    local = jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, P(rows, None)),
                          out_specs=q_spec, check_vma=False)
  out = local(qs, kp, vp, seg)[:, :t]
  return jnp.where((key_mask > 0)[:, :, None, None, None], out, jnp.zeros((), out.dtype))
