"""compile_cache.CompileStats: counts of backend compilations and persistent-cache hits, with the JAX
monitoring listeners registered once per process however many runs (Sessions) make one."""
import jax
import jax.numpy as jnp
from jax._src import monitoring as jax_monitoring

from compassplay_jax.infra import compile_cache


def listener_counts() -> tuple[int, int]:
  return len(jax_monitoring.get_event_listeners()), len(jax_monitoring.get_event_duration_listeners())


def test_many_compile_stats_do_not_grow_jax_listener_lists():
  compile_cache.CompileStats()  # the first one in this process may register
  before = listener_counts()
  stats = [compile_cache.CompileStats() for _ in range(20)]
  assert listener_counts() == before
  del stats


def test_each_instance_counts_what_happened_since_it_was_made():
  first = compile_cache.CompileStats()
  # A real compilation of a program this process has not seen (a shape no other test uses).
  jax.jit(lambda x: jnp.sin(x) * 3 + 1)(jnp.ones((7, 13, 3))).block_until_ready()
  after_one = first.totals()
  assert after_one["compile/count"] >= 1 and after_one["compile/seconds"] > 0
  second = compile_cache.CompileStats()
  assert second.totals() == {"compile/count": 0, "compile/seconds": 0.0, "compile/cache_hits": 0,
                             "compile/cache_load_seconds": 0.0}
  # The events JAX records on a compile, and on a persistent-cache hit (the hit, then the same
  # compile-or-load duration), by their names.
  jax.monitoring.record_event_duration_secs(compile_cache._COMPILE_EVENT, 1.5)
  jax.monitoring.record_event_duration_secs("/jax/some/other/duration", 9.0)
  jax.monitoring.record_event(compile_cache._HIT_EVENT)
  jax.monitoring.record_event_duration_secs(compile_cache._COMPILE_EVENT, 0.25)
  jax.monitoring.record_event("/jax/some/other/event")
  assert second.totals() == {"compile/count": 1, "compile/seconds": 1.5, "compile/cache_hits": 1,
                             "compile/cache_load_seconds": 0.25}
  got = first.totals()
  assert got["compile/count"] == after_one["compile/count"] + 1
  assert abs(got["compile/seconds"] - (after_one["compile/seconds"] + 1.5)) < 1e-9
  assert got["compile/cache_hits"] == after_one["compile/cache_hits"] + 1


def test_a_program_read_from_the_persistent_cache_counts_as_a_load_not_a_compile():
  """JAX's own sequence: a first compile written to the persistent cache (conftest's
  JAX_COMPILATION_CACHE_DIR; every program, whatever its compile time), then, with the in-memory
  caches cleared, the same program read back: one compile, then one hit and no second compile."""
  import time

  from tests.shared_runs import cache_every_compile
  # A constant of this run's own in the program: a miss the first time, even in a cache that an
  # earlier run of this test filled.
  salt = float(time.time_ns() % 1_000_000_007)
  fn = lambda x: jnp.cos(x) * 5 - salt
  x = jnp.ones((11, 5, 3))
  with cache_every_compile():
    stats = compile_cache.CompileStats()
    jax.jit(fn)(x).block_until_ready()
    compiled = stats.totals()
    jax.clear_caches()
    jax.jit(fn)(x).block_until_ready()
    loaded = stats.totals()
  assert compiled["compile/count"] == 1 and compiled["compile/cache_hits"] == 0
  assert loaded["compile/count"] == 1 and loaded["compile/cache_hits"] == 1, loaded
  assert loaded["compile/seconds"] == compiled["compile/seconds"] and loaded["compile/cache_load_seconds"] > 0
