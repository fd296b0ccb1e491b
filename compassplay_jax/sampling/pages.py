"""Host-side page accounting for the paged KV cache (device side: paged_slots.py).

The cache is a pool of `num_pages` fixed-size pages (page_size token columns each). Page 0 is the
trash page: never handed out, it takes the writes of rows that are done and backs the unused
entries of every page table, so a stale index can never overwrite a live row's page.

`PagePool`: a free list and a reference count per page. A row holds one reference to each page in
its list; the n samples of a prompt share the prompt's *full* pages (one reference each, plus one
held by the prompt until its last sample is admitted), while the prompt's last, partly filled page
is copied into a private page per sample (copy on admission: each sample writes its own tokens
after the prompt in that page). A page returns to the free list when its count reaches 0.

On a mesh the pool is split over the batch shards as the slots are (`shards`): shard i owns the
global pages [i * per_shard, (i + 1) * per_shard), its first one its own trash page, and a row takes
pages only from its slot's shard (the decode step reads them where the row's query is: no KV crosses
devices). Page ids are global everywhere on the host; the device step makes them local.

Everything here is plain Python/numpy; the engine asks the pool before each device call.
"""
from __future__ import annotations

import dataclasses


def pages_for(tokens: int, page_size: int) -> int:
  """Pages holding `tokens` columns."""
  return -(-max(tokens, 0) // page_size)


class OutOfPages(RuntimeError):
  pass


class PagePool:
  """Free lists over the pages with reference counts: `shards` equal ranges of per_shard pages each,
  shard i's first page (i * per_shard) its trash page, never handed out. One shard: pages
  1..num_pages-1, page 0 the trash page."""

  TRASH = 0  # shard 0's trash page (the one trash page of a one-shard pool)

  def __init__(self, num_pages: int, page_size: int, shards: int = 1):
    if shards < 1 or num_pages % shards:
      raise ValueError(f"num_pages={num_pages} does not split into {shards} equal shards")
    self.per_shard = num_pages // shards
    if self.per_shard < 2:
      raise ValueError(f"num_pages={num_pages}: a pool (each of its {shards} shards) needs the trash page "
                       "and at least one more")
    if page_size < 1:
      raise ValueError(f"page_size={page_size} is less than 1")
    self.num_pages, self.page_size, self.shards = num_pages, page_size, shards
    self.refs = [0] * num_pages
    # pop() hands out low page numbers first
    self._free = [list(range((i + 1) * self.per_shard - 1, i * self.per_shard, -1)) for i in range(shards)]

  def shard_of(self, page: int) -> int:
    return page // self.per_shard

  def is_trash(self, page: int) -> bool:
    return page % self.per_shard == 0

  @property
  def free(self) -> int:
    return sum(len(f) for f in self._free)

  def free_in(self, shard: int) -> int:
    return len(self._free[shard])

  @property
  def capacity(self) -> int:
    return self.num_pages - self.shards

  @property
  def used(self) -> int:
    return self.capacity - self.free

  def alloc(self, count: int, shard: int = 0) -> list[int]:
    """`count` fresh pages of `shard`, each with one reference."""
    free = self._free[shard]
    if count > len(free):
      raise OutOfPages(f"{count} pages wanted, {len(free)} free of {self.per_shard - 1}"
                       + (f" on shard {shard}" if self.shards > 1 else ""))
    out = [free.pop() for _ in range(count)]
    for p in out:
      self.refs[p] = 1
    return out

  def share(self, pages) -> None:
    """One more reference to each of `pages` (a sample joining its prompt's pages)."""
    for p in pages:
      if self.is_trash(p) or self.refs[p] < 1:
        raise ValueError(f"page {p} is not allocated")
      self.refs[p] += 1

  def release(self, pages) -> None:
    """Drops one reference to each of `pages`; pages left with none go back to their shard's free list."""
    for p in pages:
      if self.is_trash(p) or self.refs[p] < 1:
        raise ValueError(f"page {p} released but not held")
      self.refs[p] -= 1
      if self.refs[p] == 0:
        self._free[self.shard_of(p)].append(p)

  def check(self) -> None:
    """Invariants: each shard's free list holds exactly its unreferenced pages, each once, never a trash page."""
    for i, free_list in enumerate(self._free):
      free = set(free_list)
      assert len(free) == len(free_list), "a page is on the free list twice"
      trash = i * self.per_shard
      assert trash not in free and self.refs[trash] == 0
      assert free == {p for p in range(trash + 1, trash + self.per_shard) if self.refs[p] == 0}, \
          f"free list and counts disagree (shard {i})"


@dataclasses.dataclass
class RowPages:
  """One row's pages in column order: pages[j] holds columns [j * page_size, (j + 1) * page_size)."""
  pages: list
  length: int  # columns written (prompt + fed tokens)
  shard: int = 0  # the pool shard its pages come from (its slot's batch shard)


class PageTables:
  """Per-slot page lists over a PagePool, with the prompt sharing rules.

  Prompt pages: `prompt_pages(n_tokens)` allocates the prompt's full pages once (shared by all its
  samples); `admit(slot, shared, n_tokens)` gives a slot those shared pages (a reference each) plus a
  private page for the prompt's partial last page, if any; `grow(slot, columns)` adds private pages
  until the row holds `columns` columns; `finish(slot)` releases all of them."""

  def __init__(self, pool: PagePool):
    self.pool = pool
    self.rows: dict[int, RowPages] = {}

  def prompt_pages(self, n_tokens: int, shard: int = 0) -> list[int]:
    return self.pool.alloc(n_tokens // self.pool.page_size, shard)

  def admit(self, slot: int, shared: list[int], n_tokens: int, shard: int = 0) -> list[int]:
    """The slot's page list for a prompt of n_tokens whose full pages are `shared` (on `shard`, the
    slot's); returns it."""
    if slot in self.rows:
      raise ValueError(f"slot {slot} already holds a row")
    ps = self.pool.page_size
    if len(shared) != n_tokens // ps:
      raise ValueError(f"{len(shared)} shared pages for a prompt of {n_tokens} tokens (page size {ps})")
    if any(self.pool.shard_of(p) != shard for p in shared):
      raise ValueError(f"shared pages {shared} are not all on shard {shard}")
    own = self.pool.alloc(pages_for(n_tokens, ps) - len(shared), shard)  # first: on OutOfPages nothing is held
    self.pool.share(shared)
    self.rows[slot] = RowPages(list(shared) + own, n_tokens, shard)
    return self.rows[slot].pages

  def grow(self, slot: int, columns: int) -> list[int]:
    """Adds pages (from the row's shard) until the slot's row holds `columns` columns; returns the new pages."""
    row = self.rows[slot]
    need = pages_for(columns, self.pool.page_size) - len(row.pages)
    new = self.pool.alloc(need, row.shard) if need > 0 else []
    row.pages.extend(new)
    return new

  def finish(self, slot: int) -> None:
    row = self.rows.pop(slot)
    self.pool.release(row.pages)

  def move(self, old_to_new: dict[int, int]) -> None:
    """Renumbers slots (the drain's compaction): pages stay where they are."""
    self.rows = {old_to_new[s]: r for s, r in self.rows.items()}

  def live_pages(self) -> int:
    return sum(len(r.pages) for r in self.rows.values())
