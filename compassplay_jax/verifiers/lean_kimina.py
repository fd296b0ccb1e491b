"""A kimina-lean-server client with the local pool's interface: check, check_batch, warm_up, close.

kimina-lean-server (github.com/project-numina/kimina-lean-server, read at fb2393d) runs pools of the
same Lean REPL behind HTTP, for clusters where the checking machines are not the training ones.
Its API, as this client speaks it:

  POST {url}/api/check            server/routers/check.py
    header  Authorization: Bearer <key>      only when the server sets LEAN_SERVER_API_KEY
            (server/auth.py; 401 "Missing API key" / "Invalid API key" otherwise)
    body    {"snippets": [{"id", "code"}], "timeout": <int s per snippet>, "debug": false,
             "reuse": true}                  (client/kimina_client/models.py CheckRequest)
    200     {"results": [{"id", "time", "error"?, "response"?}]}: `response` is the REPL's own
            reply (a CommandResponse, or {"message"}); `error` is the server's, and contains
            "timed out" for a timeout (models.py ReplResponse.analyze)
    429     no REPL free within LEAN_SERVER_MAX_WAIT; 500 a REPL that crashed or printed garbage

The server splits each snippet into its leading `import` lines (the REPL's header, run once per
REPL) and the rest (server/split.py), and shifts message lines back to the snippet's numbering
(`_apply_header_offset`). We send header + proof command and shift once more, so each message's
line is relative to the command, as the local pool reports it: the acceptance rule then reads the
same reply the same way.

A request that fails (connection refused or dropped, 5xx, 429, a reply that is not JSON) is sent
again after backoff_s, 2 x backoff_s, ...; after `retries` more attempts every snippet in it gets
a CRASH result (a system error: no reward, counted, the run goes on). One crashing REPL makes the
server answer 500 for its whole request, so a batch that still fails with 500 is checked again one
snippet at a time. Other 4xx replies are not retried. Only the standard library is used.
"""
import http.client
import json
import math
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from compassplay_jax.lean_syntax.statements import normalize_header
from compassplay_jax.verifiers.lean_repl import ANSWERED
from compassplay_jax.verifiers.lean_repl import CRASH
from compassplay_jax.verifiers.lean_repl import TIMEOUT
from compassplay_jax.verifiers.lean_repl import LeanCheckResult
from compassplay_jax.verifiers.lean_repl import LeanSetupError

URL_ENV = "COMPASSPLAY_KIMINA_URL"  # e.g. http://lean-checker:8000
KEY_ENV = "COMPASSPLAY_KIMINA_API_KEY"
_RETRY_STATUS = frozenset({429, 499, 500, 502, 503, 504})
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout,
                   TimeoutError, OSError)


class _RequestFailed(Exception):
  def __init__(self, message: str, retry: bool, server_error: bool = False):
    super().__init__(message)
    self.retry = retry
    self.server_error = server_error  # HTTP 500: the server failed on what it was sent


def _shift_lines(reply: dict, offset: int) -> dict:
  """The reply with every message's line moved up by `offset` (header lines before the command)."""
  if offset <= 0 or not isinstance(reply.get("messages"), list):
    return reply
  messages = []
  for message in reply["messages"]:
    message = dict(message)
    for key in ("pos", "endPos"):
      if isinstance(message.get(key), dict) and "line" in message[key]:
        message[key] = {**message[key], "line": int(message[key]["line"]) - offset}
    messages.append(message)
  return {**reply, "messages": messages}


def result_from_kimina(item: dict, header_lines: int) -> LeanCheckResult:
  """One entry of a /api/check reply as the local pool's LeanCheckResult."""
  seconds = float(item.get("time") or 0.0)
  if item.get("error") is not None:
    error = str(item["error"])
    return LeanCheckResult(status=TIMEOUT if "timed out" in error else CRASH, time_s=seconds, error=error)
  reply = item.get("response")
  if not isinstance(reply, dict):
    return LeanCheckResult(status=CRASH, time_s=seconds, error=f"kimina result without a response: {item!r:.200}")
  return LeanCheckResult.from_reply(_shift_lines(reply, header_lines), seconds)


class KiminaChecker:
  """Checks (header, command) pairs on a kimina-lean-server; thread-safe; use as a context manager."""

  def __init__(self, url: str, api_key: str | None = None, *, timeout_s: float = 60.0,
               batch_size: int = 8, num_workers: int = 2, retries: int = 3, backoff_s: float = 1.0,
               request_timeout_s: float | None = None):
    """
    Args:
      url: the server's base URL (http://host:port).
      api_key: sent as `Authorization: Bearer <key>`; None when the server has no key.
      timeout_s: Lean's limit per snippet, enforced by the server (whole seconds, at least 1).
      batch_size: snippets per request; the server checks a request's snippets in parallel.
      num_workers: requests in flight at once.
      retries: further attempts of a failed request; then its snippets get CRASH results.
      backoff_s: the first wait before a retry; it doubles each time.
      request_timeout_s: HTTP read limit per request; None: timeout_s x batch_size + 60 (the server
        may queue a batch's snippets behind each other).
    """
    if not url.startswith(("http://", "https://")):
      raise LeanSetupError(f"kimina server URL must start with http:// or https://, got {url!r}")
    if batch_size < 1 or num_workers < 1 or retries < 0:
      raise ValueError(f"KiminaChecker: batch_size, num_workers >= 1 and retries >= 0, got "
                       f"{batch_size}, {num_workers}, {retries}")
    self.url = url.rstrip("/")
    self.api_key = api_key
    self.timeout_s = timeout_s
    self.batch_size = batch_size
    self.num_workers = num_workers
    self.retries = retries
    self.backoff_s = backoff_s
    self.request_timeout_s = request_timeout_s or timeout_s * batch_size + 60.0
    self.requests_sent = 0
    self._executor = ThreadPoolExecutor(num_workers, thread_name_prefix="kimina")

  @classmethod
  def from_env(cls, url_env: str = URL_ENV, key_env: str = KEY_ENV, **kwargs) -> "KiminaChecker":
    """A client for the server named by $url_env, with the key in $key_env (if set)."""
    url = os.environ.get(url_env)
    if not url:
      raise LeanSetupError(f"environment variable {url_env} is not set (the kimina-lean-server URL, "
                           f"e.g. http://lean-checker:8000; config.lean.checker = 'kimina').")
    return cls(url, os.environ.get(key_env) or None, **kwargs)

  def __enter__(self) -> "KiminaChecker":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    self._executor.shutdown(wait=True)

  def warm_up(self, header: str) -> None:
    """One trivial check now; LeanSetupError if the server is unreachable, refuses the key or
    fails the header."""
    result = self.check(header, "#check True\n")
    if result.status != ANSWERED or result.errors:
      detail = result.error or "; ".join(m.data for m in result.errors)
      raise LeanSetupError(f"kimina server {self.url} failed a trivial check ({result.status}): {detail}")

  def check(self, header: str, body: str) -> LeanCheckResult:
    return self.check_batch([(header, body)])[0]

  def check_batch(self, items: Sequence[tuple[str, str]]) -> list[LeanCheckResult]:
    """Each (header, command) checked on the server, `batch_size` per request, `num_workers`
    requests at a time; results in input order."""
    chunks = [items[i:i + self.batch_size] for i in range(0, len(items), self.batch_size)]
    results: list[LeanCheckResult] = []
    for chunk_results in self._executor.map(self._check_chunk, chunks):
      results.extend(chunk_results)
    return results

  def _check_chunk(self, chunk: Sequence[tuple[str, str]]) -> list[LeanCheckResult]:
    headers = [normalize_header(header) for header, _ in chunk]
    payload = {"snippets": [{"id": str(i), "code": h + body} for i, (h, (_, body)) in enumerate(zip(headers, chunk))],
               "timeout": max(1, math.ceil(self.timeout_s)), "debug": False, "reuse": True}
    error, server_error = "", False
    for attempt in range(self.retries + 1):
      if attempt:
        time.sleep(self.backoff_s * 2 ** (attempt - 1))
      try:
        by_id = self._post_check(payload)
      except _RequestFailed as failed:
        error, server_error = str(failed), failed.server_error
        if not failed.retry:
          break
        continue
      if all(str(i) in by_id for i in range(len(chunk))):
        return [result_from_kimina(by_id[str(i)], h.count("\n")) for i, h in enumerate(headers)]
      error = f"kimina reply lacks results for some snippets (got ids {sorted(by_id)[:10]})"
    if server_error and len(chunk) > 1:
      # The server fails a whole request when one snippet's REPL crashes (routers/check.py gathers
      # the snippets): check them one by one, so only that snippet fails.
      return [result for item in chunk for result in self._check_chunk([item])]
    return [LeanCheckResult(status=CRASH, error=f"kimina server {self.url}: {error} ({attempt + 1} attempts)")
            for _ in chunk]

  def _post_check(self, payload: dict) -> dict[str, dict]:
    """POSTs one /api/check request: {snippet id: result}, or _RequestFailed."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if self.api_key:
      headers["Authorization"] = f"Bearer {self.api_key}"
    request = urllib.request.Request(f"{self.url}/api/check", data=json.dumps(payload).encode(),
                                     headers=headers, method="POST")
    self.requests_sent += 1
    try:
      with urllib.request.urlopen(request, timeout=self.request_timeout_s) as response:
        raw = response.read()
    except urllib.error.HTTPError as e:
      detail = e.read(300).decode(errors="replace").strip()
      hint = " (check the API key in the checker's key variable)" if e.code in (401, 403) else ""
      raise _RequestFailed(f"HTTP {e.code}: {detail}{hint}", retry=e.code in _RETRY_STATUS,
                           server_error=e.code == 500) from None
    except _NETWORK_ERRORS as e:
      raise _RequestFailed(f"{type(e).__name__}: {e}", retry=True) from None
    try:
      results = json.loads(raw)["results"]
      return {str(r["id"]): r for r in results}
    except (ValueError, KeyError, TypeError) as e:
      raise _RequestFailed(f"reply is not a /api/check result list ({e}): {raw[:200]!r}", retry=True) from None
