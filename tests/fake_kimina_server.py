"""A stand-in for kimina-lean-server, for tests only: its HTTP API over the stand-in REPL.

Why a stand-in: the real server (PyPI's `kimina-ast-server` 2.1.3, or upstream) only starts here
with workarounds (a Python 3.12 venv with pinned fastapi and a stub for its Prisma module, which
downloads an engine at import), which take a minute and PyPI access: tests/test_kimina_real_server.py
runs it that way, outside CI. This one runs in the default suite and follows kimina-lean-server at
fb2393d, with the standard library only:

  POST /api/check  server/routers/check.py `run_checks`: each snippet split by server/split.py
                   (leading `import`/blank lines = header, `import Mathlib.*` collapsed), a REPL per
                   header from a pool of `max_repls` (server/manager.py `get_repl`: reuse a free one
                   with the same header, else start one, else evict the oldest free one, else wait
                   `max_wait` and answer 429), the header run once as `{"cmd": header}`, the body as
                   `{"cmd": body, "env": 0, "gc": true}` (server/repl.py `send`); a reply is the lines
                   up to a blank line (`_read_response`); a timeout kills the REPL and gives
                   `error: "Lean REPL command timed out in N seconds"`; a reply that is not JSON, or
                   anything on stderr, fails the whole request with 500; message lines shifted by
                   the header's line count (`_apply_header_offset`, including its early return when
                   there are no messages).
  auth             server/auth.py: with an API key set, `Authorization: [Bearer ]<key>` or 401.
  GET /health      {"status": "ok"}; GET /api/openapi.json: {"info": {"version": ...}}.

`flavor="2.1.3"` follows the PyPI release kimina-ast-server 2.1.3 where it differs (its
server/routers/check.py, split.py): message lines are left relative to the text after the import
lines (no `_apply_header_offset`); a snippet that finds no REPL within `max_wait` gets
`error: "No available REPLs"` (the request still answers 200); a REPL that fails gives that snippet
`error: "Snippet execution failed: ..."` instead of failing the request with 500.

Faults for the retry tests: `fail_first` requests answered with `fail_status`, `drop_first`
connections closed without an answer, `busy_first` snippets answered as if no REPL were free
(429 for the request at fb2393d, a per-snippet error at 2.1.3), `line_skew` added to every
reported line (a server numbering lines some third way).
"""
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

FAKE_REPL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_lean_repl.py")


class HttpError(Exception):
  def __init__(self, status, detail):
    super().__init__(detail)
    self.status, self.detail = status, detail


def split_snippet(code):
  """server/split.py: (header, body, header_line_count)."""
  lines = code.splitlines()
  i = 0
  while i < len(lines) and (lines[i].strip() == "" or lines[i].strip().startswith("import ")):
    i += 1
  imports, seen, has_mathlib = [], set(), False
  for line in (x.strip() for x in lines[:i]):
    if not line.startswith("import "):
      continue
    if line.startswith("import Mathlib"):
      has_mathlib = True
      continue
    if line not in seen:
      seen.add(line)
      imports.append(line)
  header = "\n".join((["import Mathlib"] if has_mathlib else []) + imports)
  return header, "\n".join(lines[i:]), i


def apply_header_offset(response, offset):
  """routers/check.py `_apply_header_offset`, quirks included."""
  if offset <= 0 or not isinstance(response, dict):
    return
  messages = response.get("messages")
  if not messages:
    return
  for message in messages:
    for key in ("pos", "endPos"):
      if message.get(key):
        message[key]["line"] += offset
  for item in response.get("sorries") or []:
    for key in ("pos", "endPos"):
      if item.get(key):
        item[key]["line"] += offset


class _Repl:
  def __init__(self, header, repl_args):
    self.header, self.use_count, self.last_used = header, 0, time.monotonic()
    self.proc = subprocess.Popen([sys.executable, FAKE_REPL, *repl_args], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

  def send(self, command, timeout):
    """One command and its reply (server/repl.py `send`); TimeoutError, or HttpError(500)."""
    self.proc.stdin.write((json.dumps(command, ensure_ascii=False) + "\n\n").encode())
    self.proc.stdin.flush()
    deadline, lines, buffer = time.monotonic() + timeout, [], b""
    out = self.proc.stdout.fileno()
    while True:
      while b"\n" in buffer:
        line, buffer = buffer.split(b"\n", 1)
        if not line.strip():
          return self._parse(b"\n".join(lines))
        lines.append(line)
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        raise TimeoutError
      ready, _, _ = select.select([out], [], [], remaining)
      if not ready:
        continue
      chunk = os.read(out, 1 << 16)
      if not chunk:  # EOF: what was read is the reply
        return self._parse(b"\n".join(lines + [buffer]))
      buffer += chunk

  def _parse(self, raw):
    try:
      reply = json.loads(raw)
    except ValueError:
      raise HttpError(500, "JSON decode error") from None
    ready, _, _ = select.select([self.proc.stderr], [], [], 0)
    if ready:
      err = os.read(self.proc.stderr.fileno(), 1 << 16).decode(errors="replace").strip()
      if err:
        raise HttpError(500, err)
    self.use_count += 1
    return reply

  def kill(self):
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self.proc.wait()
    for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
      stream.close()


class FakeKiminaServer:
  """`with FakeKiminaServer(...) as server:` serves on 127.0.0.1 at `server.url`."""

  def __init__(self, api_key=None, max_repls=2, max_wait=30.0, repl_args=(), fail_first=0,
               drop_first=0, fail_status=500, flavor="fb2393d", busy_first=0, line_skew=0):
    assert flavor in ("fb2393d", "2.1.3"), flavor
    self.flavor, self.busy_first, self.line_skew = flavor, busy_first, line_skew
    self.snippets = 0  # snippets received
    self.api_key, self.max_repls, self.max_wait = api_key, max_repls, max_wait
    self.repl_args, self.fail_first, self.drop_first, self.fail_status = tuple(repl_args), fail_first, drop_first, fail_status
    self.requests = 0  # POST /api/check requests received
    self._cond = threading.Condition()
    self._free, self._busy = [], set()
    self._executor = ThreadPoolExecutor(16)
    server = self

    class Handler(BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def do_GET(self):
        if self.path.rstrip("/") in ("", "/health"):
          return self._send(200, {"status": "ok"})
        if self.path == "/api/openapi.json":
          return self._send(200, {"info": {"title": "fake kimina server", "version": f"{server.flavor}-fake"}})
        return self._send(404, {})

      def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path.rstrip("/") != "/api/check":
          return self._send(404, {"detail": "Not Found"})
        with server._cond:
          server.requests += 1
          n = server.requests
        if n <= server.drop_first:
          self.close_connection = True
          self.connection.shutdown(2)
          return None
        if n <= server.drop_first + server.fail_first:
          return self._send(server.fail_status, {"detail": "injected failure"})
        try:
          server._authorize(self.headers.get("Authorization"))
          self._send(200, server._check(json.loads(body)))
        except HttpError as e:
          self._send(e.status, {"detail": e.detail})
        except (ValueError, KeyError, TypeError) as e:
          self._send(422, {"detail": f"invalid request: {e}"})

      def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._http.daemon_threads = True
    self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
    self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
    self._thread.start()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self):
    self._http.shutdown()
    self._http.server_close()
    self._executor.shutdown(wait=False)
    with self._cond:
      repls, self._free, self._busy = self._free + list(self._busy), [], set()
    for repl in repls:
      repl.kill()

  def _authorize(self, header):
    if self.api_key is None:
      return
    if not header:
      raise HttpError(401, "Missing API key")
    if header.removeprefix("Bearer ").strip() != self.api_key:
      raise HttpError(401, "Invalid API key")

  def _check(self, request):
    snippets, timeout = request["snippets"], float(request.get("timeout", 30))
    if not snippets or len({s["id"] for s in snippets}) != len(snippets):
      raise HttpError(422, "`snippets` must be non empty with unique ids")
    with self._cond:
      first = self.snippets
      self.snippets += len(snippets)
    busy = [first + j < self.busy_first for j in range(len(snippets))]
    if any(busy) and self.flavor == "fb2393d":
      raise HttpError(429, "No available REPLs")
    futures = [self._executor.submit(self._run_one, s, timeout, b) for s, b in zip(snippets, busy)]
    results = [f.result() for f in futures]  # the first HttpError fails the request (asyncio.gather)
    return {"results": [{k: v for k, v in r.items() if v is not None} for r in results]}

  def _get_repl(self, header):
    deadline = time.monotonic() + self.max_wait
    evict = None
    with self._cond:
      while True:
        for repl in self._free:
          if repl.header == header:
            self._free.remove(repl)
            self._busy.add(repl)
            return repl
        if len(self._free) + len(self._busy) < self.max_repls:
          break
        if self._free:
          evict = min(self._free, key=lambda r: r.last_used)
          self._free.remove(evict)
          break
        if not self._cond.wait(deadline - time.monotonic()):
          raise HttpError(429, "No available REPLs")
      repl = _Repl(header, self.repl_args)
      self._busy.add(repl)
    if evict is not None:
      evict.kill()
    return repl

  def _release(self, repl, keep):
    with self._cond:
      self._busy.discard(repl)
      if keep:
        repl.last_used = time.monotonic()
        self._free.append(repl)
      self._cond.notify()
    if not keep:
      repl.kill()

  def _run_one(self, snippet, timeout, busy=False):
    try:
      if busy:
        raise HttpError(429, "No available REPLs")
      return self._run_snippet(snippet, timeout)
    except HttpError as e:
      if self.flavor == "fb2393d":
        raise
      if e.status == 429:
        return {"id": snippet["id"], "error": "No available REPLs"}
      return {"id": snippet["id"], "error": f"Snippet execution failed: {e.detail}"}

  def _run_snippet(self, snippet, timeout):
    header, body, header_lines = split_snippet(snippet["code"])
    repl = self._get_repl(header)
    start = time.monotonic()
    try:
      if repl.use_count == 0 and header.strip():
        repl.send({"cmd": header}, timeout)
      command = {"cmd": body}
      if repl.use_count != 0:
        command.update(env=0, gc=True)
      response = repl.send(command, timeout)
    except TimeoutError:
      self._release(repl, keep=False)
      return {"id": snippet["id"], "error": f"Lean REPL command timed out in {timeout:g} seconds", "time": timeout}
    except HttpError:
      self._release(repl, keep=False)
      raise
    if self.flavor == "fb2393d":
      apply_header_offset(response, header_lines)
    if self.line_skew and isinstance(response, dict):
      for message in response.get("messages") or []:
        for key in ("pos", "endPos"):
          if message.get(key):
            message[key]["line"] += self.line_skew
    self._release(repl, keep=True)
    return {"id": snippet["id"], "time": round(time.monotonic() - start, 6), "response": response}
