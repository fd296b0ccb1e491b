"""compile_cache.CompileStats: counts of backend compilations and persistent-cache hits, with the JAX
monitoring listeners registered once per process however many runs (Sessions) make one."""
import jax
import jax.numpy as jnp
from jax._src import monitoring as jax_monitoring

from compassplay_jax import compile_cache


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
  assert second.totals() == {"compile/count": 0, "compile/seconds": 0.0, "compile/cache_hits": 0}
  # The events JAX records on a compile and on a persistent-cache hit, by their names.
  jax.monitoring.record_event_duration_secs(compile_cache._COMPILE_EVENT, 1.5)
  jax.monitoring.record_event_duration_secs("/jax/some/other/duration", 9.0)
  jax.monitoring.record_event(compile_cache._HIT_EVENT)
  jax.monitoring.record_event("/jax/some/other/event")
  assert second.totals() == {"compile/count": 1, "compile/seconds": 1.5, "compile/cache_hits": 1}
  got = first.totals()
  assert got["compile/count"] == after_one["compile/count"] + 1
  assert abs(got["compile/seconds"] - (after_one["compile/seconds"] + 1.5)) < 1e-9
  assert got["compile/cache_hits"] == after_one["compile/cache_hits"] + 1
