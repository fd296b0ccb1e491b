"""The device side of the paged continuous engine: decode slots over a pool of KV pages.

Per layer the cache is a pool k, v of shape (kv_heads, num_pages, page_size, head_dim) (page 0: the
trash page, pages.PagePool; the Pallas paged kernels' layout, paged_kernels.py). A row has no left
padding: its prompt's real tokens are columns [0, n) and its fed tokens follow; column c lives in
page table[row][c // page_size]. The host keeps the page lists (pages.PageTables) and passes each
call only what it needs:

  insert_paged(state, prefix, admit, copies, key) -> state
      copies the listed prompt pages out of a batched prefill (slots.prefill_prompts: left-padded,
      (P, L) columns) into pool pages (one page per copy; a prompt's full pages once per prompt, its
      partial last page once per sample) and arms the admitted rows as slots.insert does.
  decode_paged(params, state, host_done, refill_at, write_pages, write_base, *pages_read) -> (state, Emitted)
      up to `chunk` steps. Step: embed, per layer write the new token's k, v into
      write_pages[b, length // ps - write_base[b]] at length % ps (done rows: the trash page), then
      attend over the live rows' pages. attention="gather" (CPU): pages_read = (flat_page, flat_row,
      flat_start), the live rows' pages in blocks of G pages (paged_kernels.gather_attention: reads
      only those, M blocks, M a static bucket (page_bucket) of the blocks they need through this chunk).
      attention="pallas_gpu" | "pallas_tpu": pages_read = (table,), each row's pages (B, P), and the
      kernel reads each row's pages up to its length (paged_kernels.kernel_attention).

On a mesh (PagedPrograms(mesh)) the pool's pages are split over the batch axes like the slots (a
row's pages on its slot's device: pages.PagePool shards) and its KV heads over tensor where they
divide; page ids stay global and write_and_attend makes them local on each device.

Token draws use the same keys as slots.py (fold_in(request, sample, t)), so a row's tokens do not
depend on its slot, its pages or when it starts: the paged engine's rows equal the dense engine's.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from compassplay_jax.infra import sharding as sh
from compassplay_jax.models import rope
from compassplay_jax.models.layout import BATCH_AXES
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import KVCache
from compassplay_jax.models.ops import DEFAULT_OPS
from compassplay_jax.sampling.config import SamplerParams
from compassplay_jax.sampling.paged_kernels import blocks_for, gather_attention, kernel_attention
from compassplay_jax.sampling.slots import Admit, Prefix, _HostArgsPlaced, _is_eos, _row_keys, decode_rows


class PagedState(NamedTuple):
  pages: list              # per-layer KVCache of (kv_heads, num_pages, page_size, head_dim)
  length: jax.Array        # (B,) int32 columns written = the column last_token goes to when fed
  positions: jax.Array     # (B,) int32 position id of last_token
  last_token: jax.Array
  count: jax.Array
  budget: jax.Array
  done: jax.Array
  keys: jax.Array
  out_tokens: jax.Array
  out_logprobs: jax.Array
  out_count: jax.Array


class Copies(NamedTuple):
  """Prompt pages to copy in one insert (arrays of a fixed length; the first `count` used)."""
  page: np.ndarray    # (C,) int32 destination pool page
  row: np.ndarray     # (C,) int32 the prompt's row in the Prefix
  col: np.ndarray     # (C,) int32 its first prefix column (first_col + j * page_size)
  count: np.ndarray   # () int32

  @staticmethod
  def empty(slots: int, prefix_columns: int, page_size: int) -> "Copies":
    """No copies, at the fixed length an insert into `slots` slots from a prefix of `prefix_columns`
    columns uses (every slot's prompt pages, a partial one at each end)."""
    size = slots * (prefix_columns // page_size + 2)
    return Copies(np.zeros(size, np.int32), np.zeros(size, np.int32), np.zeros(size, np.int32), np.int32(0))


def init_paged(key, *, cfg: ModelConfig, slots: int, num_pages: int, page_size: int, chunk: int,
               cache_dtype: str) -> PagedState:
  shape = (cfg.num_key_value_heads, num_pages, page_size, cfg.head_dim)
  pages = [KVCache(jnp.zeros(shape, cache_dtype), jnp.zeros(shape, cache_dtype))
           for _ in range(cfg.num_hidden_layers)]
  zeros = jnp.zeros((slots,), jnp.int32)
  return PagedState(pages=pages, length=zeros, positions=zeros, last_token=zeros, count=zeros, budget=zeros,
                    done=jnp.ones((slots,), bool), keys=jnp.stack([key] * slots),
                    out_tokens=jnp.zeros((slots, chunk + 1), jnp.int32),
                    out_logprobs=jnp.zeros((slots, chunk + 1), jnp.float32), out_count=zeros)


def insert_paged(state: PagedState, prefix: Prefix, admit: Admit, copies: Copies, key, *,
                 eos_ids: tuple[int, ...]) -> PagedState:
  b = state.done.shape[0]
  ps = state.pages[0].k.shape[2]
  # Room for a partial last page read past the prefix's end (dynamic_slice would clamp the start).
  padded = [KVCache(jnp.pad(c.k, ((0, 0), (0, ps), (0, 0), (0, 0))), jnp.pad(c.v, ((0, 0), (0, ps), (0, 0), (0, 0))))
            for c in prefix.cache]

  # One gather of the listed prompt pages and one scatter into the pool per layer (entries past
  # copies.count go to page index num_pages: dropped).
  target = jnp.where(jnp.arange(copies.page.shape[0]) < copies.count, copies.page, state.pages[0].k.shape[1])

  def one(pool, src):  # pool (kv, N, ps, hd); src (P, L + ps, kv, hd)
    blocks = jax.vmap(lambda r, c: jax.lax.dynamic_slice(src, (r, c, 0, 0), (1, ps) + src.shape[2:])[0])(
        copies.row, copies.col)  # (C, ps, kv, hd)
    return pool.at[:, target].set(jnp.transpose(blocks, (2, 0, 1, 3)).astype(pool.dtype), mode="drop")

  pages = [KVCache(one(p.k, s.k), one(p.v, s.v)) for p, s in zip(state.pages, padded)]
  valid = jnp.arange(b) < admit.count
  slot = jnp.where(valid, admit.slot, b)
  token = prefix.tokens[admit.row, admit.sample]
  logprob = prefix.logprobs[admit.row, admit.sample]
  put = lambda arr, value: arr.at[slot].set(value, mode="drop")
  n = prefix.position[admit.row]  # the prompt's length: its columns [0, n) now hold it
  return state._replace(
      pages=pages, length=put(state.length, n), positions=put(state.positions, n),
      last_token=put(state.last_token, token), count=put(state.count, jnp.ones((b,), jnp.int32)),
      budget=put(state.budget, admit.budget), done=put(state.done, _is_eos(token, eos_ids) | (admit.budget <= 1)),
      keys=put(state.keys, _row_keys(key, admit.request, admit.sample)),
      out_tokens=state.out_tokens.at[slot, 0].set(token, mode="drop"),
      out_logprobs=state.out_logprobs.at[slot, 0].set(logprob, mode="drop"),
      out_count=put(state.out_count, jnp.ones((b,), jnp.int32)))


def forward_one(model, tokens, positions, attend):
  """Logits (B, V) float32 for one token per row through the decoder's own modules
  (models/decoder.py: the same ops in the same order as its cached path), with each layer's
  attention given by attend(i, q (B, kv, g, hd), k (B, kv, hd), v (B, kv, hd)) -> (out (B, kv, g, hd),
  layer output kept, e.g. the layer's written pages). Returns (logits, [kept per layer])."""
  cfg = model.config
  ops = DEFAULT_OPS
  dt = jnp.dtype(cfg.dtype)
  b = tokens.shape[0]
  cos, sin = rope.rope_cos_sin(cfg, positions[:, None], dt)
  x = ops.embed("embed_tokens", tokens[:, None], model.embed_tokens[...]).astype(dt)
  kept = []
  for i, block in enumerate(model.layers):
    attn = block.self_attn
    kv, hd, g = attn.num_kv_heads, attn.head_dim, attn.num_heads // attn.num_kv_heads
    h = block.input_layernorm(x, ops)
    q = rope.apply_rope(attn.q_proj(h, ops).reshape(b, 1, attn.num_heads, hd), cos, sin)
    k = rope.apply_rope(attn.k_proj(h, ops).reshape(b, 1, kv, hd), cos, sin)
    v = attn.v_proj(h, ops).reshape(b, 1, kv, hd)
    out, keep = attend(i, q.reshape(b, kv, g, hd), k[:, 0], v[:, 0])
    kept.append(keep)
    x = x + attn.o_proj(out.reshape(b, 1, attn.num_heads * hd), ops)
    x = x + block.mlp(block.post_attention_layernorm(x, ops), ops)
  h = model.norm(x, ops)
  if model.lm_head is None:
    logits = ops.unembed("embed_tokens", h, model.embed_tokens[...].astype(dt))
  else:
    logits = model.lm_head(h, ops)
  return logits[:, -1].astype(jnp.float32), kept


def kv_head_axis(mesh, kv_heads: int):
  """The mesh axis the pool's KV heads are split over: tensor where it divides them (as the dense
  cache, sharding.decode_state_shardings), else none (each tensor device holds every head)."""
  t = 1 if mesh is None else mesh.shape["tensor"]
  return "tensor" if t > 1 and kv_heads % t == 0 else None


def write_and_attend(q, k, v, layer: KVCache, write_page, write_off, pages_read, lengths, *,
                     attention: str = "gather", interpret: bool = False, mesh=None):
  """One layer's paged step: k, v (B, kv, hd) written at (write_page, write_off), then q (B, kv, g, hd)
  attends over the rows' pages. Returns (out (B, kv, g, hd), the layer's pool).

  Page ids are global (pages.PagePool). On a mesh this runs per device (shard_map): the device's
  rows, its shard of the pool (pages over the batch axes, KV heads over tensor where they divide)
  and its rows' page ids made local, so no page and no query crosses devices. pages_read: the
  gather's (block_pages, block_row, block_start), each device's blocks with its own rows (local
  row ids; paged_kernels.flat_blocks per shard), or a kernel's (table,)."""
  def local(q, k, v, kc, vc, write_page, write_off, lengths, *pages_read):
    n = kc.shape[1]  # this device's pages
    first = (0 if mesh is None else jax.lax.axis_index(BATCH_AXES)) * n
    # Another shard's page (never a live row's: pages.PagePool) or padding -> this shard's trash page.
    to_local = lambda p: jnp.where((p >= first) & (p < first + n), p - first, 0)
    at = to_local(write_page)
    # k, v (B, kv, hd) -> the pool's (kv, B, hd) at [:, page[b], offset[b]]
    kp = kc.at[:, at, write_off].set(jnp.swapaxes(k, 0, 1).astype(kc.dtype))
    vp = vc.at[:, at, write_off].set(jnp.swapaxes(v, 0, 1).astype(vc.dtype))
    if attention == "gather":
      block_pages, block_row, block_start = pages_read
      out = gather_attention(q, kp, vp, to_local(block_pages), block_row, block_start, lengths)
    else:
      (table,) = pages_read
      out = kernel_attention(q, kp, vp, to_local(table), lengths, kind=attention, interpret=interpret)
    return out, kp, vp

  args = (q, k, v, layer.k, layer.v, write_page, write_off, lengths, *pages_read)
  if mesh is None:
    out, kp, vp = local(*args)
  else:
    heads = kv_head_axis(mesh, layer.k.shape[0])
    rows, pool = P(BATCH_AXES), P(heads, BATCH_AXES)
    qs = P(BATCH_AXES, heads)
    out, kp, vp = jax.shard_map(local, mesh=mesh, in_specs=(qs, qs, qs, pool, pool, rows, rows, rows)
                                + (rows,) * len(pages_read), out_specs=(qs, pool, pool))(*args)
  return out, KVCache(kp, vp)


def paged_forward(model, tokens, positions, pages, write_page, write_off, pages_read, lengths,
                  attention: str = "gather", interpret: bool = False, mesh=None):
  """Logits (B, V) float32 for one token per row, and the pages with its k, v written at
  (write_page, write_off): the cache attention replaced by a paged write and the paged attention
  (`gather_attention` over blocks, or a Pallas kernel over each row's page table; write_and_attend)."""
  def attend(i, q, k, v):
    return write_and_attend(q, k, v, pages[i], write_page, write_off, pages_read, lengths, attention=attention,
                            interpret=interpret, mesh=mesh)
  return forward_one(model, tokens, positions, attend)


def decode_paged(graphdef, params, state: PagedState, host_done, refill_at, write_pages, write_base, *pages_read,
                 sampler: SamplerParams, eos_ids: tuple[int, ...], attention: str = "gather", interpret: bool = False,
                 mesh=None):
  """slots.decode_chunk over pages (same stopping rules, same outputs). pages_read: the gather's
  (flat_page, flat_row, flat_start), or a kernel's (table,) (module doc); mesh: write_and_attend's."""
  model = nnx.merge(graphdef, params)
  ps = state.pages[0].k.shape[2]
  rows = jnp.arange(state.out_tokens.shape[0])

  def forward(st):
    live = ~st.done
    index = jnp.clip(st.length // ps - write_base, 0, write_pages.shape[1] - 1)
    write_page = jnp.where(live, write_pages[rows, index], 0)
    logits, pages = paged_forward(model, st.last_token, st.positions, st.pages, write_page, st.length % ps,
                                  pages_read, st.length + 1, attention, interpret, mesh)
    return logits, st._replace(pages=pages, length=st.length + live.astype(jnp.int32))

  return decode_rows(state, host_done, refill_at, forward, sampler=sampler, eos_ids=eos_ids)


def compact_paged(state: PagedState, keep, valid) -> PagedState:
  """slots.compact without moving any KV: the pages stay, only the per-slot scalars move (state.pages
  may be empty: PagedPrograms.compact_paged passes only the per-slot arrays)."""
  pages = state.pages
  new = jax.tree.map(lambda x: x[keep], state._replace(pages=[]))
  return new._replace(pages=pages, done=new.done | ~valid)


def write_columns(chunk: int, page_size: int) -> int:
  """Pages one chunk's writes can touch in a row: width of the write_pages table."""
  return -(-chunk // page_size) + 1


class PagedPrograms:
  """The paged functions jitted for one mesh, cached per (static knobs, shapes).

  mesh: a (data, fsdp, tensor) mesh: slots and per-slot arrays over (data, fsdp), the pool's pages
  over (data, fsdp) and its KV heads over tensor where they divide (kv_head_axis), params by the
  partition rules, admission arrays replicated; the decode step's write and attention per device
  (write_and_attend). Insert and compact run with global page ids and slot numbers (XLA moves what
  crosses devices: a prompt page's copy, never a decode step's read). None: plain jits on one device."""

  def __init__(self, mesh=None, head_dim: int | None = None):
    if mesh is not None and mesh.size == 1:
      mesh = None
    self.mesh, self.head_dim = mesh, head_dim
    self._jits: dict = {}
    self.compiles = {"init_paged": 0, "insert_paged": 0, "decode_paged": 0, "compact_paged": 0}

  def _jit(self, name, sig, build):
    key = (name,) + sig
    if key not in self._jits:
      self._jits[key] = build()
      self.compiles[name] += 1
    return self._jits[key]

  @staticmethod
  def _shapes(tree):
    return tuple((tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", ""))) for x in jax.tree.leaves(tree))

  # ---- layouts (a mesh only) ---------------------------------------------------------------------

  def _rows(self, tree):
    """Per-slot arrays: leading dim over (data, fsdp) where it divides, scalars replicated (the dense
    state's layout, sharding.decode_state_shardings; no leaf here is a 4-D cache)."""
    return sh.decode_state_shardings(self.mesh, tree)

  def _repl(self, tree):
    return jax.tree.map(lambda _: sh.replicated(self.mesh), tree)

  def state_shardings(self, state: PagedState) -> PagedState:
    pool = NamedSharding(self.mesh, P(kv_head_axis(self.mesh, state.pages[0].k.shape[0]), BATCH_AXES))
    return self._rows(state._replace(pages=[]))._replace(pages=[KVCache(pool, pool) for _ in state.pages])

  # ---- programs ----------------------------------------------------------------------------------

  def init_paged(self, key, **static):
    def build():
      def init_paged_program(k):
        return init_paged(k, **static)
      if self.mesh is None:
        return jax.jit(init_paged_program)
      out = self.state_shardings(jax.eval_shape(init_paged_program, key))
      return _HostArgsPlaced(jax.jit(init_paged_program, in_shardings=sh.replicated(self.mesh), out_shardings=out),
                             (sh.replicated(self.mesh),))
    return self._jit("init_paged", (tuple(sorted(static.items())), self._shapes(key)), build)(key)

  def insert_paged(self, state, prefix, admit, copies, key, *, eos_ids):
    def build():
      def insert_paged_program(st, pre, adm, cop, k):
        return insert_paged(st, pre, adm, cop, k, eos_ids=eos_ids)
      if self.mesh is None:
        return jax.jit(insert_paged_program, donate_argnums=(0,))
      s_sh = self.state_shardings(state)
      ins = (s_sh, sh.decode_state_shardings(self.mesh, prefix), self._repl(admit), self._repl(copies),
             sh.replicated(self.mesh))
      return _HostArgsPlaced(jax.jit(insert_paged_program, in_shardings=ins, out_shardings=s_sh,
                                     donate_argnums=(0,)), ins)
    sig = (eos_ids, self._shapes((state, prefix, admit, copies, key)))
    return self._jit("insert_paged", sig, build)(state, prefix, admit, copies, key)

  def decode_paged_jit(self, graphdef, args, *, sampler, eos_ids, attention="gather", interpret=False):
    """The jitted (params, state, host_done, refill_at, write_pages, write_base, *pages_read) ->
    (state, Emitted) for these shapes (args may be ShapeDtypeStructs)."""
    mesh = self.mesh

    def build():
      def decode_paged_program(p, st, *rest):
        return decode_paged(graphdef, p, st, *rest, sampler=sampler, eos_ids=eos_ids, attention=attention,
                            interpret=interpret, mesh=mesh)
      if mesh is None:
        return jax.jit(decode_paged_program, donate_argnums=(1,))
      params, state, *rest = args
      s_sh = self.state_shardings(state)
      refill_at = rest[1]
      ins = (sh.tree_shardings(params, mesh, self.head_dim), s_sh, self._rows(rest[0]), self._repl(refill_at),
             *self._rows(tuple(rest[2:])))
      out = jax.eval_shape(decode_paged_program, *args)
      return _HostArgsPlaced(sh.jit(decode_paged_program, in_shardings=ins, out_shardings=(s_sh, self._rows(out[1])),
                                    donate_argnums=(1,)), ins)
    sig = (graphdef, sampler, eos_ids, attention, interpret, self._shapes(args))
    return self._jit("decode_paged", sig, build)

  def decode_paged(self, graphdef, *args, sampler, eos_ids, attention="gather", interpret=False):
    return self.decode_paged_jit(graphdef, args, sampler=sampler, eos_ids=eos_ids, attention=attention,
                                 interpret=interpret)(*args)

  def compact_paged(self, state, keep, valid):
    """keep, valid (new slots,): global slot numbers (a mesh's shrink keeps each row on its device:
    continuous.ContinuousEngine._shrink). Only the per-slot arrays go through the program; the pool is
    handed on as it is (no copy, nothing donated: the state given stays valid)."""
    rows = state._replace(pages=[])

    def build():
      if self.mesh is None:
        return jax.jit(compact_paged)
      r_sh = self._rows(rows)
      ins = (r_sh, sh.replicated(self.mesh), sh.replicated(self.mesh))
      return _HostArgsPlaced(jax.jit(compact_paged, in_shardings=ins, out_shardings=r_sh), ins)
    new = self._jit("compact_paged", self._shapes((rows, keep)), build)(rows, keep, valid)
    return new._replace(pages=state.pages)

  def compile_counts(self) -> dict:
    return dict(self.compiles)


def page_bucket(pages: int, smallest: int = 8) -> int:
  """The static page count a decode call gathers for `pages` live pages: the smallest of 2^k,
  1.25 x 2^k, 1.5 x 2^k, 1.75 x 2^k (>= smallest) holding them (at most 1.25x the pages, four
  programs per doubling)."""
  b = smallest
  while True:
    for step in (4, 5, 6, 7):
      if b * step // 4 >= pages:
        return b * step // 4
    b *= 2


def decode_step_bytes(cfg: ModelConfig, *, slots: int, columns: int, fill: float, page_size: int = 16,
                      cache_dtype: str | None = None, longest: float = 1.0) -> dict:
  """XLA's cost analysis ("bytes accessed") of one decode step's reads, dense and paged, at these
  shapes (lowered on ShapeDtypeStructs: nothing is allocated).

  slots rows of a cache of `columns` columns, `fill` x slots x columns of them filled: one row has
  filled `longest` x columns (1.0: the long tail's longest live row, which sets the dense window),
  the others share the rest equally. Both steps run the decoder's modules on one token per row (forward_one):
  dense attends over the smallest window of slots.windows(columns) holding the longest row, as
  slots.decode_chunk does (the (B, S) cache sliced to (B, W), decoder.attend); paged gathers the
  live rows' pages (page_bucket of them) and runs gather_attention, as decode_paged does. The step's
  KV write (one column per row, the same bytes in both) is left out: XLA's cost analysis prices an
  in-place scatter as its whole buffer read and written. `base`: the paged step with nothing to
  attend to (weights, activations, logits). Returns {dense, paged, base, window, pages, live_pages}."""
  from compassplay_jax.models.decoder import Decoder, attend as dense_attend
  from compassplay_jax.sampling.slots import windows
  dtype = jnp.dtype(cache_dtype or cfg.dtype)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(cfg.dtype)), params)
  kv, hd = cfg.num_key_value_heads, cfg.head_dim
  sds = jax.ShapeDtypeStruct
  i32 = lambda *shape: sds(shape, jnp.int32)
  longest_cols = max(int(longest * columns), int(fill * columns), 1)  # (longest < fill: every row at fill)
  window = min(w for w in windows(columns) if w >= longest_cols)

  def dense(p, cache, tokens, positions, write_at):
    def attend(i, q, k, v):
      allowed = (jnp.arange(window)[None, :] <= write_at[:, None])[:, None, :]
      kc, vc = cache[i].k[:, :window].astype(q.dtype), cache[i].v[:, :window].astype(q.dtype)
      return dense_attend(q[:, None], kc, vc, allowed)[:, 0], None
    return forward_one(nnx.merge(graphdef, p), tokens, positions, attend)[0]

  def paged(p, pages, tokens, positions, flat_page, flat_row, flat_start, lengths):
    def attend(i, q, k, v):
      return gather_attention(q, pages[i].k, pages[i].v, flat_page, flat_row, flat_start, lengths), None
    return forward_one(nnx.merge(graphdef, p), tokens, positions, attend)[0]

  def cost(fn, *args):
    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return float(analysis["bytes accessed"])

  cache = [KVCache(sds((slots, columns, kv, hd), dtype), sds((slots, columns, kv, hd), dtype))
           for _ in range(cfg.num_hidden_layers)]
  dense_bytes = cost(dense, params, cache, i32(slots), i32(slots), i32(slots))
  block = max(1, 64 // page_size)  # as the engine's page_block
  # The other rows share what is left of fill x slots x columns.
  others = max(0, int(fill * slots * columns) - longest_cols) // max(slots - 1, 1)
  counts = [-(-others // page_size)] * (slots - 1) + [-(-longest_cols // page_size)]
  live = sum(counts)
  bucket = page_bucket(blocks_for(counts, block))
  # XLA's cost analysis prices a gather as reading its whole operand (however few rows it takes), so
  # the pool here holds exactly the pages gathered: a gather that reads only the listed pages, as
  # the Pallas kernels do. (The engine's pool is larger; the step reads the same pages.)
  pool = [KVCache(sds((kv, bucket * block, page_size, hd), dtype), sds((kv, bucket * block, page_size, hd), dtype))
          for _ in range(cfg.num_hidden_layers)]
  tiny = [KVCache(sds((kv, 1, page_size, hd), dtype), sds((kv, 1, page_size, hd), dtype))
          for _ in range(cfg.num_hidden_layers)]
  paged_bytes = cost(paged, params, pool, i32(slots), i32(slots), i32(bucket, block), i32(bucket), i32(bucket),
                     i32(slots))
  base = cost(paged, params, tiny, i32(slots), i32(slots), i32(1, 1), i32(1), i32(1), i32(slots))
  return dict(dense=dense_bytes, paged=paged_bytes, base=base, window=window, pages=bucket * block, live_pages=live)
