"""Builds sandbox jobs from the trusted prelude plus task-specific lines (no execution here)."""
import functools
import pathlib

from compassplay_jax.verifiers import sandbox

# None: the pool's SandboxLimits.timeout_s (AZR uses 10 s, the default).
CHECK_TIMEOUT_S = None


@functools.lru_cache(maxsize=1)
def prelude_source() -> str:
  return pathlib.Path(__file__).with_name("sandbox_prelude.py").read_text()


def make_job(body: str, result_expr: str, timeout_s=CHECK_TIMEOUT_S) -> sandbox.Job:
  """Prelude + body; untrusted text must only reach `body` through repr() literals."""
  return sandbox.Job(code=body, expr=result_expr, timeout_s=timeout_s, prelude=prelude_source())


def gold_output_job(program: str, args: str) -> sandbox.Job:
  """Runs AZR's determinism check; value_text is the (truncated) gold output repr."""
  body = (f"_cp_ns = _cp_run_program({program!r})\n"
          f"_cp_out = _cp_gold_output(_cp_ns['f'], {args!r}, _cp_plain_names(_cp_ns))\n")
  return make_job(body, "_cp_out")


def gold_outputs_job(program: str, inputs) -> sandbox.Job:
  """Determinism check for each input; value_text is a JSON list of gold reprs."""
  body = (f"_cp_ns = _cp_run_program({program!r})\n"
          f"_cp_names = _cp_plain_names(_cp_ns)\n"
          f"_cp_out = _cp_dumps([_cp_gold_output(_cp_ns['f'], a, _cp_names) "
          f"for a in {list(inputs)!r}])\n")
  return make_job(body, "_cp_out")


def canon_values_job(value_texts) -> sandbox.Job:
  """Canonical text of each value expression (no program); JSON list, '!Reason' on failure."""
  body = (f"_cp_out = _cp_dumps([_cp_canon_or_reason(lambda t=t: _cp_eval(t)) "
          f"for t in {list(value_texts)!r}])\n")
  return make_job(body, "_cp_out")


def canon_call_job(program: str, args: str) -> sandbox.Job:
  """Canonical text of f(args) for the program's f; JSON list with one entry."""
  body = (f"_cp_ns = _cp_run_program({program!r})\n"
          f"_cp_names = _cp_plain_names(_cp_ns)\n"
          f"def _cp_call():\n"
          f"  a, k = _cp_call_args({args!r}, _cp_names)\n"
          f"  return _cp_ns['f'](*a, **k)\n"
          f"_cp_out = _cp_dumps([_cp_canon_or_reason(_cp_call)])\n")
  return make_job(body, "_cp_out")


def canon_calls_job(program: str, inputs) -> sandbox.Job:
  """Canonical text of f(x) for each input x (no names from the program); JSON list."""
  body = (f"_cp_ns = _cp_run_program({program!r})\n"
          f"def _cp_call(a):\n"
          f"  args, kwargs = _cp_call_args(a)\n"
          f"  return _cp_ns['f'](*args, **kwargs)\n"
          f"_cp_out = _cp_dumps([_cp_canon_or_reason(lambda a=a: _cp_call(a)) "
          f"for a in {list(inputs)!r}])\n")
  return make_job(body, "_cp_out")
