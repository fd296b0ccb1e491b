"""Decode attention over a paged KV cache: one query token per row, keys and values in pages.

Pool layout (paged_slots.py): k_pages, v_pages of shape (kv_heads, num_pages, page_size, head_dim),
the layout of both Pallas paged kernels, so the engine's pool goes to them as it is (no copy per call).
A row's columns [j * page_size, (j + 1) * page_size) live in its j-th page; the row attends to its
columns [0, length).

`gather_attention` (pure JAX, every backend; what the engine runs): the live rows' pages come as one
flat list of blocks (G consecutive pages of one row, its first column), padded to a static bucket M
(paged_slots.page_bucket of the blocks the live rows need). It gathers exactly those M x G pages,
scores each row's query against its own pages only, and combines the per-block partial softmaxes per
row with segment reductions. Its cost is M x G x page_size keys: it grows with the filled tokens, not
with any row's window or with the slot count.

Kernels (the same math; `kernel_attention` reshapes our (B, kv, groups, hd) queries to their (B, heads,
hd) and hands them a per-row page table (B, pages_per_row); the engine runs them with
`paged_attention="pallas_gpu" | "pallas_tpu"`, which "auto" picks on those backends):

* GPU: jax.experimental.pallas.ops.gpu.paged_attention (Triton; per-row block tables; skips pages
  past each row's length). Runs in Pallas interpret mode on CPU: tested against `gather_attention`.
* TPU: jax.experimental.pallas.ops.tpu.paged_attention runs under pltpu.force_tpu_interpret_mode()
  on CPU: tested. The newer ragged_paged_attention (combined K/V pool (pages, page_size, 2 x kv_heads, hd), ragged queries)
  does NOT run in TPU interpret mode with the installed jax 0.10.2: the interpreter raises
  `AttributeError: 'ReshapeTransform' object has no attribute 'indices'` on the kernel's reshaped
  VMEM refs. What is tested instead: its reference implementation (ref_ragged_paged_attention, the
  same inputs and semantics) against `gather_attention`, so the adapter's layout and masking are
  checked; the kernel itself needs a TPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def gather_attention(q, k_pages, v_pages, block_pages, block_row, block_start, lengths):
  """q (B, kv, g, hd) -> (B, kv, g, hd).

  The live rows' pages in blocks of G consecutive pages of one row: block_pages (M, G) page ids
  (a row's last block padded with the trash page 0), block_row (M,) the row (>= B: a padding block,
  ignored), block_start (M,) the row column of the block's first entry; lengths (B,) columns each row
  attends to. Each block gathers its G pages and its row's query once (blocks, not single pages, so
  the query and the partial outputs cost 1/G as much per key). Scores and softmax in float32 (as
  models/decoder.attend), the blocks' partial softmaxes combined per row with segment reductions;
  a row with no valid key gets zeros."""
  b, kv, g, hd = q.shape
  m, blk = block_pages.shape
  width = blk * k_pages.shape[2]
  row = jnp.minimum(block_row, b - 1)
  real = block_row < b
  k = k_pages[:, block_pages].reshape(kv, m, width, hd).astype(q.dtype)  # only the listed pages are read
  v = v_pages[:, block_pages].reshape(kv, m, width, hd).astype(q.dtype)
  s = jnp.einsum("mkgd,kmpd->mkgp", q[row], k, preferred_element_type=jnp.float32) * (hd ** -0.5)
  cols = block_start[:, None] + jnp.arange(width, dtype=block_start.dtype)
  valid = (cols < lengths[row][:, None]) & real[:, None]  # (M, width)
  s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
  seg = jnp.where(real, block_row, b)  # out-of-range segments are dropped
  row_max = jax.ops.segment_max(jnp.max(s, axis=-1), seg, num_segments=b, indices_are_sorted=True)
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  e = jnp.where(valid[:, None, None, :], jnp.exp(s - row_max[row][..., None]), 0.0)
  denom = jax.ops.segment_sum(jnp.sum(e, axis=-1), seg, num_segments=b, indices_are_sorted=True)
  num = jax.ops.segment_sum(jnp.einsum("mkgp,kmpd->mkgd", e.astype(q.dtype), v, preferred_element_type=jnp.float32),
                            seg, num_segments=b, indices_are_sorted=True)
  return (num / jnp.maximum(denom, 1e-30)[..., None]).astype(q.dtype)


def table_attention(q, k_pages, v_pages, table, lengths):
  """The pure-JAX reference on a per-row page table (B, P): every row reads its P pages as one block."""
  b, _ = table.shape
  return gather_attention(q, k_pages, v_pages, table, jnp.arange(b, dtype=jnp.int32), jnp.zeros((b,), jnp.int32),
                          lengths)


def flat_blocks(table, counts, bucket, page_size, block):
  """Host helper: rows' first counts[b] pages of `table` (B, P) as blocks of `block` pages, padded to
  `bucket` blocks: (block_pages (bucket, block), block_row (bucket,), block_start (bucket,)); padding
  entries are page 0 (the trash page) and row B."""
  import numpy as np
  table, counts = np.asarray(table), np.asarray(counts)
  b = table.shape[0]
  pages, rows, starts = [], [], []
  for r, c in enumerate(counts):
    for j in range(0, int(c), block):
      part = table[r, j:min(j + block, int(c))]
      pages.append(np.pad(part, (0, block - len(part))))
      rows.append(r)
      starts.append(j * page_size)
  if len(rows) > bucket:
    raise ValueError(f"{len(rows)} live blocks do not fit a bucket of {bucket}")
  out = (np.zeros((bucket, block), np.int32), np.full(bucket, b, np.int32), np.zeros(bucket, np.int32))
  if rows:
    out[0][:len(rows)], out[1][:len(rows)], out[2][:len(rows)] = np.stack(pages), rows, starts
  return out


def blocks_for(counts, block: int) -> int:
  """Blocks flat_blocks makes for these per-row page counts."""
  return int(sum(-(-int(c) // block) for c in counts))


PAGED_ATTENTIONS = ("auto", "gather", "pallas_gpu", "pallas_tpu")


def backend_kernel(platform: str | None = None) -> str:
  """Which attention a paged decode uses on this backend ("auto"): "pallas_tpu", "pallas_gpu" or "gather"."""
  platform = platform or jax.default_backend()
  return {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu"}.get(platform, "gather")


KERNEL_BLOCK = 8  # pages per compute block of the Pallas kernels (a table's width is a multiple of it)


def table_width(pages: int) -> int:
  """Columns of the per-row page table the kernels take for rows of up to `pages` pages: a multiple of
  their compute block (the Pallas kernels split the table into blocks of KERNEL_BLOCK pages)."""
  return pages if pages <= KERNEL_BLOCK else -(-pages // KERNEL_BLOCK) * KERNEL_BLOCK


def kernel_attention(q, k_pages, v_pages, table, lengths, *, kind: str, interpret: bool = False):
  """q (B, kv, g, hd), pools (kv, num_pages, ps, hd), table (B, P) int32, lengths (B,) -> (B, kv, g, hd)
  through a Pallas kernel (kind "pallas_gpu" | "pallas_tpu" | "ragged_tpu_reference")."""
  b, kv, g, hd = q.shape
  scale = hd ** -0.5
  q_heads = q.reshape(b, kv * g, hd)
  block = min(KERNEL_BLOCK, table.shape[1])
  if kind == "pallas_gpu":
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention
    out = paged_attention(q_heads * scale, k_pages, v_pages, table, lengths, block_h=16,
                          pages_per_compute_block=block, k_splits=max(1, table.shape[1] // block),
                          interpret=interpret)
  elif kind == "pallas_tpu":
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
    call = lambda: paged_attention(q_heads * scale, k_pages, v_pages, lengths, table, pages_per_compute_block=block)
    if interpret:
      with pltpu.force_tpu_interpret_mode():
        out = call()
    else:
      out = call()
  elif kind == "ragged_tpu_reference":
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention
    k, v = jnp.transpose(k_pages, (1, 2, 0, 3)), jnp.transpose(v_pages, (1, 2, 0, 3))  # its combined layout
    kv_pages = jnp.stack([k, v], axis=3).reshape(k.shape[:2] + (2 * kv, hd))  # k0 v0 k1 v1 ..
    out = ref_ragged_paged_attention(q_heads, kv_pages, lengths, table, jnp.arange(b + 1, dtype=jnp.int32),
                                     jnp.array([b], jnp.int32), sm_scale=scale)
  else:
    raise ValueError(f"unknown paged attention kernel {kind!r}")
  return out.reshape(b, kv, g, hd).astype(q.dtype)
