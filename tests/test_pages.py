"""The paged KV cache's host accounting (sampling/pages.py): a long randomized run of admissions,
growth, preemption-like early releases and finishes against a naive model of who holds which page,
ending with every page back in the pool; prompt pages shared by a prompt's samples; errors."""
import collections

import numpy as np
import pytest

from compassplay_jax.sampling import batching
from compassplay_jax.sampling.pages import OutOfPages, PagePool, PageTables, pages_for


def test_pages_for_counts_whole_pages():
  assert [pages_for(n, 4) for n in (0, 1, 3, 4, 5, 8, 9)] == [0, 1, 1, 1, 2, 2, 3]


def test_randomized_admission_and_finish_never_leaks():
  rng = np.random.default_rng(0)
  ps, num_pages, slots = 4, 97, 12
  pool = PagePool(num_pages, ps)
  tables = PageTables(pool)
  holders = collections.defaultdict(set)  # naive model: page -> {("row", slot) | ("prompt", id)}
  prompts = {}  # live prompt id -> (shared pages, n tokens, samples left to admit)
  next_prompt = 0
  for step in range(4000):
    op = rng.integers(0, 4)
    free_slots = [s for s in range(slots) if s not in tables.rows]
    if op == 0 and len(prompts) < 6:  # a new prompt: its full pages, held by the prompt
      n = int(rng.integers(1, 30))
      try:
        shared = tables.prompt_pages(n)
      except OutOfPages:
        continue
      prompts[next_prompt] = (shared, n, int(rng.integers(1, 4)))
      for p in shared:
        holders[p].add(("prompt", next_prompt))
      next_prompt += 1
    elif op == 1 and prompts and free_slots:  # admit a sample of a live prompt
      pid = int(rng.choice(list(prompts)))
      shared, n, left = prompts[pid]
      slot = int(rng.choice(free_slots))
      try:
        pages = tables.admit(slot, shared, n)
      except OutOfPages:
        continue
      assert pages[:len(shared)] == shared and len(pages) == pages_for(n, ps)
      for p in pages:
        holders[p].add(("row", slot))
      if left == 1:  # its last sample: the prompt drops its own reference
        pool.release(shared)
        for p in shared:
          holders[p].discard(("prompt", pid))
        del prompts[pid]
      else:
        prompts[pid] = (shared, n, left - 1)
    elif op == 2 and tables.rows:  # grow a row
      slot = int(rng.choice(list(tables.rows)))
      row = tables.rows[slot]
      try:
        new = tables.grow(slot, len(row.pages) * ps + int(rng.integers(0, 3 * ps)))
      except OutOfPages:
        continue
      for p in new:
        holders[p].add(("row", slot))
    elif op == 3 and tables.rows:  # a row ends (or is preempted): every page released once
      slot = int(rng.choice(list(tables.rows)))
      for p in tables.rows[slot].pages:
        holders[p].discard(("row", slot))
      tables.finish(slot)
    if step % 50 == 0:
      pool.check()
      assert all(pool.refs[p] == len(holders[p]) for p in range(1, num_pages)), "counts disagree with holders"
      # A page two rows hold is a prompt's full page (shared); no row holds the trash page.
      for slot, row in tables.rows.items():
        assert 0 not in row.pages and len(set(row.pages)) == len(row.pages)
  for slot in list(tables.rows):
    tables.finish(slot)
  for shared, _, _ in prompts.values():
    pool.release(shared)
  pool.check()
  assert pool.free == pool.capacity == num_pages - 1 and not any(pool.refs)


def test_samples_share_full_prompt_pages_and_copy_the_partial_one():
  pool = PagePool(20, 4)
  tables = PageTables(pool)
  shared = tables.prompt_pages(10)  # 2 full pages, 2 tokens in a third
  a, b = tables.admit(0, shared, 10), tables.admit(1, shared, 10)
  assert a[:2] == b[:2] == shared and a[2] != b[2]
  assert [pool.refs[p] for p in shared] == [3, 3]
  pool.release(shared)
  tables.finish(0)
  tables.finish(1)
  assert pool.free == pool.capacity


def test_shards_hand_out_their_own_pages_and_keep_their_trash_pages():
  """A pool split over 3 batch shards of 5 pages: shard i owns pages 5i..5i+4, 5i its trash page; a
  row's pages all come from its shard, and running one shard dry leaves the others untouched."""
  pool = PagePool(15, 4, shards=3)
  tables = PageTables(pool)
  assert pool.capacity == 12 and [pool.free_in(i) for i in range(3)] == [4, 4, 4]
  shared = tables.prompt_pages(8, shard=1)  # 2 full pages on shard 1
  assert shared == [6, 7]
  row = tables.admit(4, shared, 9, shard=1)  # + a private page for the 9th column
  assert row == [6, 7, 8] and all(pool.shard_of(p) == 1 for p in row)
  with pytest.raises(ValueError, match="not all on shard 2"):
    tables.admit(8, shared, 9, shard=2)
  tables.grow(4, 16)
  assert tables.rows[4].pages == [6, 7, 8, 9] and pool.free_in(1) == 0
  with pytest.raises(OutOfPages, match="on shard 1"):
    tables.grow(4, 17)
  assert [pool.free_in(i) for i in (0, 2)] == [4, 4]
  assert tables.admit(0, [], 3, shard=2) == [11]
  pool.release(shared)
  tables.finish(4)
  tables.finish(0)
  pool.check()
  assert pool.free == pool.capacity and not any(pool.refs)
  with pytest.raises(ValueError, match="not allocated"):
    pool.share([10])  # shard 2's trash page
  with pytest.raises(ValueError, match="does not split into 4 equal shards"):
    PagePool(15, 4, shards=4)


def test_errors():
  pool = PagePool(4, 4)
  with pytest.raises(OutOfPages, match="4 pages wanted, 3 free"):
    pool.alloc(4)
  with pytest.raises(ValueError, match="released but not held"):
    pool.release([1])
  with pytest.raises(ValueError, match="not allocated"):
    pool.share([0])
  with pytest.raises(ValueError, match="needs the trash page"):
    PagePool(1, 4)


def test_paged_budget_gives_more_slots_where_rows_are_short():
  from compassplay_jax.costs.memory_report import PAPER_MODELS
  cfg = PAPER_MODELS["qwen2.5-coder-7b"].replace(dtype="bfloat16")
  budget, bucket, new = 40 << 30, 2048, 8096
  dense = batching.slots_for_budget(cfg, 16384, "bfloat16", budget, bucket)
  slots, pages = batching.paged_layout_for_budget(cfg, budget, 16, "bfloat16", bucket, bucket + 0.25 * new,
                                                  bucket + new)
  assert slots > 2 * dense  # a row expected to fill a quarter of its budget takes ~4k of 16k columns
  assert (pages - 1) * batching.bytes_per_page(cfg, 16, "bfloat16") <= budget
