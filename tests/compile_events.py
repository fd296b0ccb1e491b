"""Which thread compiled which program: JAX's own compile events (jax.monitoring), named by program
("jit(update)"). A program loaded from the persistent cache fires the same event on the thread that
loaded it.

  with compile_events.recorded() as events:
    ...
  compile_events.on_main(events)      # {"jit(accumulate)", ...} compiled by the main thread
"""
import contextlib
import threading

from jax import monitoring

_EVENT = "/jax/core/compile/backend_compile_duration"
_recording: list[list] = []  # the event lists of the open `recorded()` blocks


def _on_duration(name, seconds, **kwargs):
  if name == _EVENT:
    for events in _recording:
      events.append((threading.current_thread().name, kwargs.get("fun_name")))


monitoring.register_event_duration_secs_listener(_on_duration)  # once per process; JAX keeps it


@contextlib.contextmanager
def recorded():
  """[(thread name, program name)] of every compilation while the block runs."""
  events: list = []
  _recording.append(events)
  try:
    yield events
  finally:
    _recording.remove(events)


def on_main(events) -> set:
  return {name for thread, name in events if thread == threading.main_thread().name}

