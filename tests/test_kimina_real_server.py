"""The kimina client against the real kimina-lean-server, not a re-implementation of its API.

The server users install from PyPI (kimina-ast-server 2.1.3, the one docs/lean.md names) and, when
prepared, upstream's code (github.com/project-numina/kimina-lean-server HEAD, `python -m server`) run
on 127.0.0.1 with the project's stand-in REPL (tests/fake_lean_repl.py) behind them: a workspace with
the folders the server expects, and a `lake` shim that runs `lake env CMD ...` as `CMD ...`.
The oracle is the local pool on the same stand-in REPL: the same bodies get the same verdicts.

Marked `kimina_server` and skipped unless COMPASSPLAY_KIMINA_SERVER_DIR names a directory prepared by
scripts/setup_kimina_server.sh (a Python 3.12 venv with the server; about a minute, needs PyPI), so
CI does not run it (docs/testing.md, "The real kimina server"):
  bash scripts/setup_kimina_server.sh --dir /tmp/kimina [--upstream CLONE/.git]
  COMPASSPLAY_KIMINA_SERVER_DIR=/tmp/kimina python -m pytest -m kimina_server tests/test_kimina_real_server.py
Only KiminaChecker is imported from the client, so the same test runs on an older client.
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from compassplay_jax.verifiers.lean_acceptance import check_proofs
from compassplay_jax.verifiers.lean_kimina import KiminaChecker
from compassplay_jax.verifiers.lean_pool import LeanReplPool
from tests.test_lean_acceptance import CLEAN
from tests.test_lean_acceptance import FAKE_REPL
from tests.test_lean_acceptance import STATEMENT
# The same header and proof sets as the client's tests against the stand-in server.
from tests.test_lean_checker import ACCEPTED, HEADER, MALFORMED, REJECTED, TIMED_OUT

SERVER_DIR_ENV = "COMPASSPLAY_KIMINA_SERVER_DIR"
SERVER_DIR = os.environ.get(SERVER_DIR_ENV, "")
pytestmark = [pytest.mark.kimina_server,
              pytest.mark.skipif(not SERVER_DIR, reason=f"{SERVER_DIR_ENV} is not set (scripts/setup_kimina_server.sh)")]

TIMEOUT_S = 3.0  # per proof: the server's REPL start and header run under it too


def verdict_key(verdict):
  reason = verdict.reason.split(":")[0] if verdict.reason.startswith(("timeout", "crash")) else verdict.reason
  return verdict.ok, verdict.system_error, reason


def _flavors():
  flavors = [pytest.param("pypi", id="pypi-2.1.3")]
  upstream = os.path.join(SERVER_DIR, "upstream")
  commit = open(os.path.join(upstream, "COMMIT")).read()[:7] if os.path.exists(os.path.join(upstream, "COMMIT")) else ""
  flavors.append(pytest.param("upstream", id=f"upstream-{commit or 'absent'}", marks=pytest.mark.skipif(
      not commit, reason="upstream not prepared (scripts/setup_kimina_server.sh --upstream GIT_DIR)")))
  return flavors


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def real_server(flavor, workdir, max_repls, max_wait=60):
  """The real server on 127.0.0.1 over the stand-in REPL; yields its URL."""
  ws, bin_dir = workdir / "workspace", workdir / "bin"
  for folder in ("repl/.lake/build/bin", "mathlib4", "ast_export/.lake/build/bin"):
    (ws / folder).mkdir(parents=True, exist_ok=True)
  bin_dir.mkdir(exist_ok=True)
  files = {ws / "repl/.lake/build/bin/repl": f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_REPL}" "$@"\n',
           ws / "ast_export/.lake/build/bin/ast-export": "#!/bin/sh\nexit 1\n",
           bin_dir / "lake": '#!/bin/sh\n[ "$1" = env ] && shift\nexec "$@"\n'}
  for path, text in files.items():
    path.write_text(text)
    path.chmod(0o755)
  port = _free_port()
  env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
         "LEAN_SERVER_WORKSPACE": str(ws), "LEAN_SERVER_REPL_PATH": str(ws / "repl/.lake/build/bin/repl"),
         "LEAN_SERVER_PROJECT_DIR": str(ws / "mathlib4"), "LEAN_SERVER_HOST": "127.0.0.1",
         "LEAN_SERVER_PORT": str(port), "LEAN_SERVER_MAX_REPLS": str(max_repls),
         "LEAN_SERVER_MAX_WAIT": str(max_wait), "LEAN_SERVER_MAX_REPL_MEM": "2G",
         "LEAN_SERVER_ENVIRONMENT": "prod", "LEAN_SERVER_LOG_LEVEL": "WARNING"}
  for key in ("LEAN_SERVER_DATABASE_URL", "LEAN_SERVER_API_KEY", "PYTHONPATH"):
    env.pop(key, None)
  python = os.path.join(SERVER_DIR, "venv", "bin", "python")
  if flavor == "pypi":
    command, cwd = [os.path.join(SERVER_DIR, "venv", "bin", "kimina-ast-server")], ws
  else:
    upstream = os.path.join(SERVER_DIR, "upstream")
    env["PYTHONPATH"] = f"{upstream}{os.pathsep}{os.path.join(upstream, 'client')}"
    command, cwd = [python, "-m", "server"], upstream
  log_path = workdir / "server.log"
  with open(log_path, "wb") as log:
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
  url = f"http://127.0.0.1:{port}"
  try:
    deadline = time.monotonic() + 90
    while True:
      try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
          if json.loads(response.read()).get("status") == "ok":
            break
      except OSError:
        pass
      if proc.poll() is not None or time.monotonic() > deadline:
        raise RuntimeError(f"the {flavor} server did not start (exit {proc.poll()}):\n"
                           f"{log_path.read_text(errors='replace')[-3000:]}")
      time.sleep(0.3)
    yield url
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, signal.SIGTERM)  # its lifespan closes the REPLs, which also see EOF
    try:
      proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()


@pytest.fixture(scope="module")
def local():
  with LeanReplPool(command=(sys.executable, FAKE_REPL), num_workers=2, timeout_s=TIMEOUT_S,
                    memory_limit_mb=1024, crash_retries=1) as pool:
    yield pool


@pytest.mark.parametrize("flavor", _flavors())
def test_the_real_server_gives_the_local_verdicts(flavor, local, tmp_path):
  bodies = ACCEPTED + REJECTED + TIMED_OUT + MALFORMED
  # MAX_REPLS >= workers x batch (docs/lean.md §2b): no snippet waits for a REPL.
  with real_server(flavor, tmp_path, max_repls=3) as url:
    with KiminaChecker(url, timeout_s=TIMEOUT_S, batch_size=3, num_workers=1, retries=2, backoff_s=0.2) as remote:
      remote.warm_up(HEADER)  # accepts the known-good proof, rejects the known-bad one for its sorry
      remote_verdicts = check_proofs(remote, HEADER, STATEMENT, bodies)
  local_verdicts = check_proofs(local, HEADER, STATEMENT, bodies)
  assert [verdict_key(v) for v in remote_verdicts] == [verdict_key(v) for v in local_verdicts]
  assert [v.ok for v in remote_verdicts] == [True] * len(ACCEPTED) + [False] * (len(bodies) - len(ACCEPTED))


@pytest.mark.parametrize("flavor", _flavors())
def test_a_busy_real_server_costs_retries_not_proofs(flavor, tmp_path):
  # One REPL for a batch of three 1.5 s proofs, MAX_WAIT 1 s: 2.1.3 answers "No available REPLs" per
  # snippet, upstream fails the request with 429. Either way every proof ends verified.
  bodies = [CLEAN + " -- fake: sleep 1.5"] * 3
  with real_server(flavor, tmp_path, max_repls=1, max_wait=1) as url:
    with KiminaChecker(url, timeout_s=TIMEOUT_S, batch_size=3, num_workers=1, retries=3, backoff_s=0.2) as remote:
      verdicts = check_proofs(remote, HEADER, STATEMENT, bodies)
      requests = remote.requests_sent
  assert [(v.ok, v.system_error) for v in verdicts] == [(True, False)] * 3, [v.reason for v in verdicts]
  assert requests > 2  # the line numbering measured, the batch, then its retries
