"""The REPL pool against the stand-in REPL: framing, timeouts, crashes, memory, recycling."""
import json
import os
import pathlib
import sys
import threading
import time

import pytest

from compassplay_jax.verifiers import lean_repl
from compassplay_jax.verifiers.lean_pool import LeanReplPool
from compassplay_jax.verifiers.lean_repl import LeanReplProcess
from compassplay_jax.verifiers.lean_repl import LeanSetupError

FAKE_REPL = str(pathlib.Path(__file__).with_name("fake_lean_repl.py"))
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat\n\n"
PROOF = "theorem t (x : ℕ) : x + 0 = x := by\n  simp\n\n#print axioms t\n"


def fake_command(*flags):
  return (sys.executable, FAKE_REPL, *flags)


def events(log_path):
  if not log_path.exists():
    return []
  return [json.loads(line) for line in log_path.read_text().splitlines()]


def is_running(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


@pytest.fixture
def log(tmp_path):
  return tmp_path / "repl.log"


def make_pool(log, **kwargs):
  kwargs.setdefault("timeout_s", 10.0)
  kwargs.setdefault("memory_limit_mb", 1024)
  return LeanReplPool(command=fake_command("--log", str(log)), **kwargs)


def test_answered_check_carries_messages_with_positions(log):
  with make_pool(log) as pool:
    result = pool.check(HEADER, "theorem t : 1 = 1 := by\n  sorry\n\n#print axioms t\n")
  assert result.status == lean_repl.ANSWERED
  assert result.env == 1  # env 0 is the header's.
  warning, info = result.messages
  assert (warning.severity, warning.data, warning.line, warning.column) == (
      "warning", "declaration uses 'sorry'", 1, 8)
  assert (info.severity, info.line, info.data) == ("info", 4, "'t' depends on axioms: [sorryAx]")
  assert result.sorries[0]["pos"] == {"line": 2, "column": 2}


def test_header_runs_once_per_process_and_equal_headers_share_it(log):
  respaced = HEADER.replace("\n\n", "\n") + "-- a comment\n"
  with make_pool(log, num_workers=1) as pool:
    for header in (HEADER, respaced, HEADER, respaced):
      assert pool.check(header, PROOF).status == lean_repl.ANSWERED
  kinds = [e["event"] for e in events(log)]
  assert kinds.count("start") == 1 and kinds.count("header") == 1 and kinds.count("cmd") == 4
  assert all(e["env"] == 0 for e in events(log) if e["event"] == "cmd")


def test_other_header_evicts_the_idle_process_when_slots_are_full(log):
  with make_pool(log, num_workers=1) as pool:
    for header in (HEADER, "import Aesop\n", HEADER):
      assert pool.check(header, PROOF).status == lean_repl.ANSWERED
    assert pool.processes_started == 3
    assert len(pool.live_pids()) == 1


def test_timeout_kills_the_process_and_the_next_check_gets_a_fresh_one(log):
  with make_pool(log, timeout_s=0.5) as pool:
    start = time.monotonic()
    result = pool.check(HEADER, "theorem t : True := by\n  trivial -- fake: hang\n")
    assert result.status == lean_repl.TIMEOUT and not result.is_system_error
    assert time.monotonic() - start < 3
    assert pool.live_pids() == []
    assert pool.check(HEADER, PROOF).status == lean_repl.ANSWERED
    assert pool.processes_started == 2
  hung_pid = events(log)[0]["pid"]
  assert not is_running(hung_pid)


def test_crash_is_a_system_error_retried_on_a_fresh_process(log):
  with make_pool(log, crash_retries=1) as pool:
    result = pool.check(HEADER, "theorem t : True := by\n  trivial -- fake: crash\n")
    assert result.status == lean_repl.CRASH and result.is_system_error
    assert "crashing as asked" in result.error
    assert pool.processes_started == 2  # One retry.
    assert pool.check(HEADER, PROOF).status == lean_repl.ANSWERED


def test_crash_mid_reply_is_reported_not_parsed(log):
  with make_pool(log, crash_retries=0) as pool:
    result = pool.check(HEADER, "theorem t : True := by\n  trivial -- fake: crash-mid-reply\n")
    assert result.status == lean_repl.CRASH
    assert "died mid-reply" in result.error
    assert pool.processes_started == 1


def test_memory_limit_kills_the_process(log):
  with make_pool(log, memory_limit_mb=300) as pool:
    result = pool.check(HEADER, "theorem t : True := by\n  trivial -- fake: grow 400\n")
    assert result.status == lean_repl.MEMORY_LIMIT and not result.is_system_error
    assert pool.live_pids() == []
    assert pool.check(HEADER, PROOF).status == lean_repl.ANSWERED


def test_recycles_after_max_checks(log):
  with make_pool(log, num_workers=1, max_checks_per_process=2) as pool:
    for _ in range(5):
      assert pool.check(HEADER, PROOF).status == lean_repl.ANSWERED
    assert pool.processes_started == 3


def test_recycles_after_memory_growth(log):
  with make_pool(log, num_workers=1, max_memory_growth_mb=40) as pool:
    assert pool.check(HEADER, "theorem t : True := by\n  trivial -- fake: grow 20\n").status == "answered"
    assert pool.processes_started == 1 and len(pool.live_pids()) == 1
    assert pool.check(HEADER, "theorem t : True := by\n  trivial -- fake: grow 60\n").status == "answered"
    assert pool.live_pids() == []  # Grew past 40 MiB: dropped after answering.
    pool.check(HEADER, PROOF)
    assert pool.processes_started == 2


def test_check_batch_runs_in_parallel_and_keeps_order(log):
  bodies = [f"theorem t{i} : True := by\n  trivial -- fake: sleep 1.0\n\n#print axioms t{i}\n"
            for i in range(4)]
  with make_pool(log, num_workers=2) as pool:
    pool.warm_up(HEADER)
    start = time.monotonic()
    results = pool.check_batch([(HEADER, b) for b in bodies])
    elapsed = time.monotonic() - start
  assert [r.messages[-1].data for r in results] == [
      f"'t{i}' does not depend on any axioms" for i in range(4)]
  assert elapsed > 1.9  # two rounds of 1 s sleeps
  assert len({e["pid"] for e in events(log) if e["event"] == "start"}) == 2
  # Side by side, not four in a row: each check began while another process's 1 s sleep was running
  # (start times, not the wall clock, whose upper bound a loaded machine can break).
  starts = sorted((e["t"], e["pid"]) for e in events(log) if e["event"] == "cmd" and "sleep" in e["cmd"])
  assert len(starts) == 4
  for (t0, pid0), (t1, pid1) in zip(starts[0::2], starts[1::2]):
    assert pid0 != pid1 and t1 - t0 < 0.9, starts


def test_reply_framing_survives_stray_output(log):
  with LeanReplPool(command=fake_command("--banner"), timeout_s=5) as pool:
    result = pool.check(HEADER, "theorem t : True := by\n  trivial -- fake: noise\n")
  assert result.status == lean_repl.ANSWERED and result.env == 1


# Issue 46: a proof that does IO inside the checker (an `#eval` past the guard) can write bytes shaped
# like a passing reply to the REPL's stdout. Here the real verdict is an error; the stand-in prints
# a forged `{"env": 1}` (no messages: a pass) before the real reply, before it with a byte glued to
# the real reply, or after it. Before issue 46 the reader took the first as this check's verdict and
# the real reply as the next check's; the third fed the next check.
FAILING = "theorem t : 1 = 2 := by\n  rfl -- fake: error type mismatch\n"


@pytest.mark.parametrize("directive", ['forge {"env": 1}', 'forge-glued {"env": 1}', 'forge-after {"env": 1}',
                                       'reply {"env": 0}'])  # the last: an env already answered (the header's)
def test_forged_reply_bytes_in_a_proofs_output_are_no_verdict(log, directive):
  with make_pool(log, num_workers=1) as pool:
    forged = pool.check(HEADER, FAILING + f"-- fake: {directive}\n")
    following = pool.check(HEADER, PROOF)
  assert not (forged.status == lean_repl.ANSWERED and not forged.errors), "forged bytes taken as a pass"
  assert [m.data for m in following.messages] == ["'t' does not depend on any axioms"]  # in step
  assert forged.status == lean_repl.PROTOCOL_ERROR and forged.is_system_error, forged
  assert following.status == lean_repl.ANSWERED and pool.processes_started == 2  # a fresh process


def test_each_check_ends_with_a_sentinel_that_echoes_a_fresh_nonce(log):
  with make_pool(log, num_workers=1) as pool:
    results = [pool.check(HEADER, PROOF) for _ in range(3)]
  assert [r.env for r in results] == [1, 3, 5]  # each sentinel takes an env of its own
  marks = [e["cmd"] for e in events(log) if e["event"] == "sentinel"]
  assert len(set(marks)) == 3 and all(m.startswith(f'#print "{lean_repl.REPLY_MARK}') for m in marks)


def test_stray_bytes_waiting_before_a_check_are_a_protocol_error():
  proc = LeanReplProcess(fake_command(), None, HEADER, memory_limit_mb=1024)
  assert proc.start(header_timeout_s=10).env == 0
  proc._buffer = b'{"env": 5}\n\n'  # what an earlier check's code left on stdout
  result = proc.check(PROOF, 5)
  assert result.status == lean_repl.PROTOCOL_ERROR and "stray output" in result.error
  assert not proc.alive


def test_header_error_is_reported_once_with_its_message(log):
  with make_pool(log) as pool:
    result = pool.check("import NoSuchLibrary\n", PROOF)
    assert result.status == lean_repl.HEADER_ERROR and result.is_system_error
    assert "unknown module prefix 'NoSuchLibrary'" in result.error
    with pytest.raises(LeanSetupError, match="NoSuchLibrary"):
      pool.warm_up("import NoSuchLibrary\n")


def test_unknown_environment_is_a_repl_error():
  proc = LeanReplProcess(fake_command(), None, HEADER, memory_limit_mb=1024)
  assert proc.start(header_timeout_s=10).env == 0
  result = proc.request({"cmd": "theorem t : True := trivial", "env": 7}, 5)
  assert result.status == lean_repl.REPL_ERROR and result.error == "Unknown environment."
  assert not proc.alive


def test_missing_command_fails_at_start_with_setup_steps(tmp_path):
  with pytest.raises(LeanSetupError) as info:
    LeanReplPool(command=("no-such-lean-repl-binary", "--x"))
  first_line, *steps = str(info.value).splitlines()
  assert first_line == ("Lean REPL command 'no-such-lean-repl-binary' not found (command "
                        "['no-such-lean-repl-binary', '--x'], cwd None): set up Lean with "
                        "`bash scripts/setup_lean.sh`.")
  assert "elan" in "\n".join(steps) and "docs/lean.md" in "\n".join(steps)
  with pytest.raises(LeanSetupError, match="does not exist .*: set up Lean with `bash scripts/setup_lean.sh`"):
    LeanReplPool(command=fake_command(), cwd=str(tmp_path / "missing"))


def test_from_env_reads_command_and_project(monkeypatch, tmp_path):
  monkeypatch.setenv("COMPASSPLAY_LEAN_REPL", f"{sys.executable} {FAKE_REPL}")
  monkeypatch.setenv("COMPASSPLAY_LEAN_PROJECT", str(tmp_path))
  with LeanReplPool.from_env(timeout_s=5) as pool:
    assert pool.cwd == str(tmp_path)
    assert pool.check(HEADER, PROOF).status == lean_repl.ANSWERED
  monkeypatch.delenv("COMPASSPLAY_LEAN_REPL")
  with pytest.raises(LeanSetupError, match="COMPASSPLAY_LEAN_REPL"):
    LeanReplPool.from_env()


def test_close_leaves_no_process_behind_even_mid_check(log):
  pool = make_pool(log, num_workers=2, timeout_s=60)
  pool.check(HEADER, PROOF)
  outcome = {}
  worker = threading.Thread(target=lambda: outcome.update(
      result=pool.check("import Aesop\n", "theorem t : True := by\n  trivial -- fake: hang\n")))
  worker.start()
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline and not any(
      "fake: hang" in e.get("cmd", "") for e in events(log)):
    time.sleep(0.02)
  pids = pool.live_pids()
  assert len(pids) == 2
  pool.close()
  worker.join(timeout=5)
  assert not worker.is_alive()
  assert outcome["result"].status == lean_repl.CRASH
  assert not any(is_running(pid) for pid in pids)
  assert {e["pid"] for e in events(log)} == set(pids)
  with pytest.raises(RuntimeError, match="closed"):
    pool.check(HEADER, PROOF)
