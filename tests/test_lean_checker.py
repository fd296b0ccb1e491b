"""The checker interface (verifiers/lean_checker.py): the local REPL pool and the kimina client.

The kimina path runs against tests/fake_kimina_server.py, which speaks kimina-lean-server's API on
127.0.0.1 over the same stand-in REPL the local pool runs, as upstream (fb2393d) or as PyPI's 2.1.3
(tests/test_kimina_real_server.py runs the real ones, outside CI). Both paths check the same bodies on the same REPL replies; the oracle is
the local pool's verdict, field by field.
"""
import sys
import time

import ml_collections
import pytest

from compassplay_jax.models.config import ConfigError
from compassplay_jax.verifiers import lean_checker
from compassplay_jax.verifiers.lean_acceptance import check_proofs
from compassplay_jax.verifiers.lean_acceptance import proof_command
from compassplay_jax.verifiers.lean_kimina import BODY_LINES
from compassplay_jax.verifiers.lean_kimina import SNIPPET_LINES
from compassplay_jax.verifiers.lean_kimina import KiminaChecker
from compassplay_jax.verifiers.lean_pool import LeanReplPool
from compassplay_jax.verifiers.lean_repl import LeanSetupError
from tests.fake_kimina_server import FakeKiminaServer
from tests.test_lean_acceptance import CLEAN
from tests.test_lean_acceptance import FAKE_REPL
from tests.test_lean_acceptance import STATEMENT

# Imports, then lines the kimina server keeps in the body (set_option, open): line numbers must
# come back relative to the proof command on both paths.
HEADER = ("import Mathlib.Tactic\nimport Aesop\n\nset_option maxHeartbeats 400000\n\n"
          "open BigOperators Real Nat Topology Rat\n")
ACCEPTED = [CLEAN, "\n  nlinarith [h₀.1, h₀.2.1]", "\n  match h₀ with\n  | _ => simp"]
REJECTED = ["\n  simp -- fake: error unsolved goals", "\n  exact h -- fake: axioms Lean.ofReduceBool",
            "\n  simp -- fake: decls cheat axiom", "\n  simp -- fake: unchecked", "\n  exact (sorry : _)",
            "\n  native_decide"]
TIMED_OUT = ["\n  simp -- fake: hang"]
MALFORMED = ["\n  simp -- fake: crash", "\n  simp -- fake: crash-mid-reply"]


def verdict_key(verdict):
  """What must agree: acceptance, the system-error flag, and the reason (for checks with no
  verdict, its status: the detail text is each checker's own)."""
  reason = verdict.reason.split(":")[0] if verdict.reason.startswith(("timeout", "crash")) else verdict.reason
  return verdict.ok, verdict.system_error, reason


@pytest.fixture(scope="module")
def local():
  with LeanReplPool(command=(sys.executable, FAKE_REPL), num_workers=2, timeout_s=1.0,
                    memory_limit_mb=1024, crash_retries=1) as pool:
    yield pool


@pytest.fixture(scope="module")
def server():
  with FakeKiminaServer(max_repls=2) as s:
    yield s


def kimina(url, **kwargs):
  kwargs = {"timeout_s": 1.0, "batch_size": 3, "num_workers": 2, "retries": 2, "backoff_s": 0.01, **kwargs}
  return KiminaChecker(url, **kwargs)


@pytest.mark.parametrize("case, bodies", [("accepted", ACCEPTED), ("rejected", REJECTED),
                                          ("timed out", TIMED_OUT), ("malformed", MALFORMED)])
def test_kimina_and_local_give_the_same_verdicts(local, server, case, bodies):
  with kimina(server.url) as remote:
    remote_verdicts = check_proofs(remote, HEADER, STATEMENT, bodies)
  local_verdicts = check_proofs(local, HEADER, STATEMENT, bodies)
  assert [verdict_key(v) for v in remote_verdicts] == [verdict_key(v) for v in local_verdicts]
  expected_ok = case == "accepted"
  assert all(v.ok == expected_ok for v in local_verdicts), local_verdicts
  assert all(v.system_error == (case == "malformed") for v in local_verdicts), local_verdicts


def test_replies_reach_the_acceptance_rule_with_the_local_line_numbers(local, server):
  command = proof_command(STATEMENT, "\n  simp -- fake: error unsolved goals")
  with kimina(server.url) as remote:
    remote_result = remote.check(HEADER, command)
  local_result = local.check(HEADER, command)
  assert remote_result.status == local_result.status == "answered"
  lines = lambda result: [(m.severity, m.line, m.column, m.data.split("\n")[0]) for m in result.messages]
  assert lines(remote_result) == lines(local_result)
  assert lines(local_result)[0] == ("error", 3, 16, "unsolved goals")  # the directive's text


def test_a_malformed_snippet_fails_only_itself_in_a_batch(server):
  # The server fails a whole request with 500 when one REPL crashes; the client then checks the
  # batch's snippets one by one, so the others keep their verdicts.
  bodies = [CLEAN, "\n  simp -- fake: crash", CLEAN]
  with kimina(server.url, batch_size=3, retries=0) as remote:
    verdicts = check_proofs(remote, HEADER, STATEMENT, bodies)
  assert [(v.ok, v.system_error) for v in verdicts] == [(True, False), (False, True), (True, False)]


def test_batches_keep_the_input_order(server):
  bodies = [f"\n  simp -- fake: error goal {i}" for i in range(7)]
  with FakeKiminaServer(max_repls=2) as fresh, kimina(fresh.url, batch_size=3) as remote:
    verdicts = check_proofs(remote, HEADER, STATEMENT, bodies)
    assert fresh.requests == 1 + 3  # the line numbering measured once, then 3 batches
    assert remote.line_mode == SNIPPET_LINES
  assert [v.reason for v in verdicts] == [f"lean error at line 3: goal {i}" for i in range(7)]


@pytest.mark.parametrize("fault", [{"fail_first": 2}, {"drop_first": 2}, {"fail_first": 2, "fail_status": 429}])
def test_failed_requests_are_retried_with_backoff(fault):
  with FakeKiminaServer(**fault) as flaky, kimina(flaky.url, retries=3, backoff_s=0.05, line_mode=SNIPPET_LINES) as remote:
    start = time.monotonic()
    verdicts = check_proofs(remote, HEADER, STATEMENT, [CLEAN])
    elapsed = time.monotonic() - start
    assert flaky.requests == 3 and remote.requests_sent == 3
  assert verdicts[0].ok, verdicts
  assert elapsed >= 0.05 + 0.1  # two waits: backoff_s, then twice that


@pytest.mark.parametrize("fault", [{"fail_first": 10**6}, {"drop_first": 10**6}])
def test_a_server_that_keeps_failing_fails_the_job_not_the_run(fault):
  with FakeKiminaServer(**fault) as broken, kimina(broken.url, retries=2, batch_size=2, line_mode=SNIPPET_LINES) as remote:
    verdicts = check_proofs(remote, HEADER, STATEMENT, [CLEAN, CLEAN])
    # 3 attempts of the batch, then 3 attempts of each snippet on its own.
    assert broken.requests == (9 if "fail_first" in fault else 3)
  assert [(v.ok, v.system_error) for v in verdicts] == [(False, True)] * 2
  assert all(v.reason.startswith("crash: kimina server http://127.0.0.1:") for v in verdicts)


def test_a_server_that_is_down_fails_the_job_not_the_run():
  with FakeKiminaServer() as gone:
    url = gone.url
  with kimina(url, retries=1) as remote:
    verdicts = check_proofs(remote, HEADER, STATEMENT, [CLEAN])
    with pytest.raises(LeanSetupError, match=r"kimina server http://127\.0\.0\.1:\d+ \(version unknown\) failed the warm-up check"):
      remote.warm_up(HEADER)
  assert (verdicts[0].ok, verdicts[0].system_error) == (False, True)


def test_api_key_is_sent_as_a_bearer_token():
  with FakeKiminaServer(api_key="s3cret") as guarded:
    with kimina(guarded.url, api_key="s3cret", line_mode=SNIPPET_LINES) as remote:
      assert check_proofs(remote, HEADER, STATEMENT, [CLEAN])[0].ok
      remote.warm_up(HEADER)
    with kimina(guarded.url, api_key="wrong", retries=3, line_mode=SNIPPET_LINES) as remote:
      verdict = check_proofs(remote, HEADER, STATEMENT, [CLEAN])[0]
      with pytest.raises(LeanSetupError, match="HTTP 401"):
        remote.warm_up(HEADER)
    # check; warm-up: its measurement, then the known-good and known-bad proofs in one request; a 401
    # is not retried
    assert guarded.requests == 1 + 2 + 1 + 1
  assert verdict.system_error and "HTTP 401" in verdict.reason


# --- the PyPI release's behaviour (kimina-ast-server 2.1.3) and the warm-up -------------------------

def test_the_pypi_release_gives_the_local_verdicts(local):
  # 2.1.3 numbers lines from the end of the imports and answers REPL failures per snippet: measured
  # and mapped, every verdict is the local pool's.
  bodies = ACCEPTED + REJECTED + MALFORMED[:1]
  with FakeKiminaServer(flavor="2.1.3") as pypi, kimina(pypi.url) as remote:
    remote_verdicts = check_proofs(remote, HEADER, STATEMENT, bodies)  # measured at the first check
    assert remote.line_mode == BODY_LINES
    remote.warm_up(HEADER)  # measured again, then the known-good and known-bad proofs
    assert remote.line_mode == BODY_LINES
  assert [verdict_key(v) for v in remote_verdicts] == [verdict_key(v) for v in check_proofs(local, HEADER, STATEMENT, bodies)]
  assert sum(v.ok for v in remote_verdicts) == len(ACCEPTED)


@pytest.mark.parametrize("server_args, message", [
    ({"line_skew": 1}, r"reported the warm-up's #print axioms at line 9, neither 8 \(lines of the snippet\) "
                       r"nor 6 \(lines after its imports\)"),
    ({"repl_args": ("--accept-percent", "0"), "flavor": "2.1.3"}, r"rejected the warm-up's known-good proof .*unsolved goals"),
])
def test_warm_up_refuses_a_server_that_reads_proofs_wrong(server_args, message):
  with FakeKiminaServer(**server_args) as s, kimina(s.url) as remote:
    with pytest.raises(LeanSetupError, match=r"^kimina server http://127\.0\.0\.1:\d+ \(v(fb2393d|2\.1\.3)-fake\) "
                                             + message + "[^\n]*$"):
      remote.warm_up(HEADER)


def test_no_free_repl_answers_are_retried_not_failed_proofs():
  # 2.1.3 answers "No available REPLs" per snippet (200); fb2393d fails the request with 429, and a
  # batch still refused after its retries is tried one snippet at a time.
  with FakeKiminaServer(flavor="2.1.3", busy_first=2) as pypi, kimina(pypi.url, line_mode=BODY_LINES) as remote:
    verdicts = check_proofs(remote, HEADER, STATEMENT, [CLEAN] * 3)
    assert remote.snippets_retried == 2 and pypi.requests == 2
  assert [(v.ok, v.system_error) for v in verdicts] == [(True, False)] * 3
  with FakeKiminaServer(busy_first=6) as upstream, kimina(upstream.url, retries=1, line_mode=SNIPPET_LINES) as remote:
    verdicts = check_proofs(remote, HEADER, STATEMENT, [CLEAN] * 3)
    assert upstream.requests == 2 + 3  # the batch twice (429), then each snippet
  assert [(v.ok, v.system_error) for v in verdicts] == [(True, False)] * 3


def test_the_lean_loop_re_queues_system_errors_and_counts_them():
  from compassplay_jax.settings.lean.setting import check_requeued
  # The client gives up at once (retries 0): two "No available REPLs" become system errors, which
  # the loop checks again.
  with FakeKiminaServer(flavor="2.1.3", busy_first=2) as pypi, kimina(pypi.url, retries=0, line_mode=BODY_LINES) as remote:
    verdicts, system_errors = check_requeued(remote, HEADER, STATEMENT, [CLEAN] * 3)
    assert pypi.requests == 2
  assert [v.ok for v in verdicts] == [True] * 3 and system_errors == 2


# --- config.lean.checker ---------------------------------------------------------------------------

def lean_config(**overrides):
  from compassplay_jax.runtime import config_base
  lean = config_base.base_config("lean", "tiny").lean
  lean.command = f"{sys.executable} {FAKE_REPL}"
  lean.update(overrides)
  return lean


def test_make_checker_builds_the_configured_checker(monkeypatch, server):
  with lean_checker.make_checker(lean_config()) as checker:
    assert isinstance(checker, LeanReplPool)
  monkeypatch.setenv("MY_KIMINA_URL", server.url)
  monkeypatch.setenv("MY_KIMINA_KEY", "k")
  lean = lean_config(checker="kimina", kimina_url_env="MY_KIMINA_URL", kimina_key_env="MY_KIMINA_KEY",
                     kimina_batch_size=5, kimina_retries=1, timeout_s=7.0)
  lean_checker.check_checker_config(lean)
  with lean_checker.make_checker(lean) as checker:
    assert isinstance(checker, KiminaChecker)
    assert (checker.url, checker.api_key, checker.batch_size, checker.retries, checker.timeout_s) == (
        server.url, "k", 5, 1, 7.0)


def test_checker_config_errors_name_the_setting(monkeypatch):
  with pytest.raises(ConfigError, match=r"config\.lean\.checker: 'remote' is not one of"):
    lean_checker.check_checker_config(lean_config(checker="remote"))
  monkeypatch.delenv("COMPASSPLAY_KIMINA_URL", raising=False)
  with pytest.raises(LeanSetupError, match="environment variable COMPASSPLAY_KIMINA_URL is not set"):
    lean_checker.check_checker_config(lean_config(checker="kimina"))
  with pytest.raises(LeanSetupError, match="not found"):
    lean_checker.check_checker_config(lean_config(command="/no/such/repl"))


def test_config_base_has_the_checker_fields():
  lean = lean_config()
  assert lean.checker == "local" and isinstance(lean, ml_collections.ConfigDict)
  assert (lean.kimina_url_env, lean.kimina_key_env) == ("COMPASSPLAY_KIMINA_URL", "COMPASSPLAY_KIMINA_API_KEY")
