"""Host-side page accounting for the paged KV cache (device side: paged_slots.py).

The cache is a pool of `num_pages` fixed-size pages (page_size token columns each). Page 0 is the
trash page: never handed out, it takes the writes of rows that are done and backs the unused
entries of every page table, so a stale index can never overwrite a live row's page.

`PagePool`: a free list and a reference count per page. A row holds one reference to each page in
its list; the n samples of a prompt share the prompt's *full* pages (one reference each, plus one
held by the prompt until its last sample is admitted), while the prompt's last, partly filled page
is copied into a private page per sample (copy on admission: each sample writes its own tokens
after the prompt in that page). A page returns to the free list when its count reaches 0.

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
  """A free list over pages 1..num_pages-1 (page 0 is the trash page) with reference counts."""

  TRASH = 0

  def __init__(self, num_pages: int, page_size: int):
    if num_pages < 2:
      raise ValueError(f"num_pages={num_pages}: a pool needs the trash page and at least one more")
    if page_size < 1:
      raise ValueError(f"page_size={page_size} is less than 1")
    self.num_pages, self.page_size = num_pages, page_size
    self.refs = [0] * num_pages
    self._free = list(range(num_pages - 1, 0, -1))  # pop() hands out low page numbers first

  @property
  def free(self) -> int:
    return len(self._free)

  @property
  def capacity(self) -> int:
    return self.num_pages - 1

  @property
  def used(self) -> int:
    return self.capacity - self.free

  def alloc(self, count: int) -> list[int]:
    """`count` fresh pages, each with one reference."""
    if count > len(self._free):
      raise OutOfPages(f"{count} pages wanted, {len(self._free)} free of {self.capacity}")
    out = [self._free.pop() for _ in range(count)]
    for p in out:
      self.refs[p] = 1
    return out

  def share(self, pages) -> None:
    """One more reference to each of `pages` (a sample joining its prompt's pages)."""
    for p in pages:
      if p == self.TRASH or self.refs[p] < 1:
        raise ValueError(f"page {p} is not allocated")
      self.refs[p] += 1

  def release(self, pages) -> None:
    """Drops one reference to each of `pages`; pages left with none go back to the free list."""
    for p in pages:
      if p == self.TRASH or self.refs[p] < 1:
        raise ValueError(f"page {p} released but not held")
      self.refs[p] -= 1
      if self.refs[p] == 0:
        self._free.append(p)

  def check(self) -> None:
    """Invariants: the free list holds exactly the unreferenced pages, each once, never the trash page."""
    free = set(self._free)
    assert len(free) == len(self._free), "a page is on the free list twice"
    assert self.TRASH not in free and self.refs[self.TRASH] == 0
    assert free == {p for p in range(1, self.num_pages) if self.refs[p] == 0}, "free list and counts disagree"


@dataclasses.dataclass
class RowPages:
  """One row's pages in column order: pages[j] holds columns [j * page_size, (j + 1) * page_size)."""
  pages: list
  length: int  # columns written (prompt + fed tokens)


class PageTables:
  """Per-slot page lists over a PagePool, with the prompt sharing rules.

  Prompt pages: `prompt_pages(n_tokens)` allocates the prompt's full pages once (shared by all its
  samples); `admit(slot, shared, n_tokens)` gives a slot those shared pages (a reference each) plus a
  private page for the prompt's partial last page, if any; `grow(slot, columns)` adds private pages
  until the row holds `columns` columns; `finish(slot)` releases all of them."""

  def __init__(self, pool: PagePool):
    self.pool = pool
    self.rows: dict[int, RowPages] = {}

  def prompt_pages(self, n_tokens: int) -> list[int]:
    return self.pool.alloc(n_tokens // self.pool.page_size)

  def admit(self, slot: int, shared: list[int], n_tokens: int) -> list[int]:
    """The slot's page list for a prompt of n_tokens whose full pages are `shared`; returns it."""
    if slot in self.rows:
      raise ValueError(f"slot {slot} already holds a row")
    ps = self.pool.page_size
    if len(shared) != n_tokens // ps:
      raise ValueError(f"{len(shared)} shared pages for a prompt of {n_tokens} tokens (page size {ps})")
    own = self.pool.alloc(pages_for(n_tokens, ps) - len(shared))  # first: on OutOfPages nothing is held
    self.pool.share(shared)
    self.rows[slot] = RowPages(list(shared) + own, n_tokens)
    return self.rows[slot].pages

  def grow(self, slot: int, columns: int) -> list[int]:
    """Adds pages until the slot's row holds `columns` columns; returns the new pages."""
    row = self.rows[slot]
    need = pages_for(columns, self.pool.page_size) - len(row.pages)
    new = self.pool.alloc(need) if need > 0 else []
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
