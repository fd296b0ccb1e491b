"""A kimina-lean-server client with the local pool's interface: check, check_batch, warm_up, close.

kimina-lean-server (github.com/project-numina/kimina-lean-server, read at fb2393d; packaged on PyPI
as `kimina-ast-server`, read at 2.1.3) runs pools of the same Lean REPL behind HTTP, for clusters
where the checking machines are not the training ones. Its API, as this client speaks it:

  POST {url}/api/check            server/routers/check.py
    header  Authorization: Bearer <key>      only when the server sets LEAN_SERVER_API_KEY
            (server/auth.py; 401 "Missing API key" / "Invalid API key" otherwise)
    body    {"snippets": [{"id", "code"}], "timeout": <int s per snippet>, "debug": false,
             "reuse": true}                  (client/kimina_client/models.py CheckRequest)
    200     {"results": [{"id", "time", "error"?, "response"?}]}: `response` is the REPL's own
            reply (a CommandResponse, or {"message"}); `error` is the server's
    429     fb2393d: no REPL free within LEAN_SERVER_MAX_WAIT (the whole request fails);
            2.1.3 answers that per snippet instead, as `error: "No available REPLs"`
    500     fb2393d: a REPL that crashed or printed garbage fails the whole request; 2.1.3
            answers per snippet ("Snippet execution failed: ...", "REPL prep failed: ...")

Both split each snippet into its leading `import`/blank lines (the REPL's header, run once per
REPL) and the rest (server/split.py), but they number message lines differently: fb2393d shifts
them back to the snippet's numbering (`_apply_header_offset`, since its PR #56), 2.1.3 leaves them
relative to the rest. We send header + proof command and move each line so it is relative to the
command, as the local pool reports it, so the acceptance rule reads the same reply the same way.
Which numbering a server uses is measured, not assumed: `warm_up` (or, without it, the first
check whose header has import lines) checks a known proof and finds its `#print axioms` report.

Per snippet, a timeout of the proof is a `timeout` result. A request that fails (connection refused
or dropped, 5xx, 429, a reply that is not JSON) and a snippet the server could not run (no REPL
free, a REPL that failed to start or crashed, the header's import timing out) are sent again after
backoff_s, 2 x backoff_s, ...; snippets that got an answer are kept. After `retries` more attempts
what is left gets a CRASH result: a system error, which the Lean loop re-queues and counts, never a
failed proof. A request still failing with 500 or 429 is then tried one snippet at a time, so one
crashing proof or a saturated pool costs only the snippets it hits. Other 4xx replies are not
retried. Only the standard library is used.
"""
import http.client
import json
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from compassplay_jax.lean_syntax.statements import normalize_header
from compassplay_jax.verifiers import lean_acceptance
from compassplay_jax.verifiers.lean_repl import ANSWERED
from compassplay_jax.verifiers.lean_repl import CRASH
from compassplay_jax.verifiers.lean_repl import TIMEOUT
from compassplay_jax.verifiers.lean_repl import LeanCheckResult
from compassplay_jax.verifiers.lean_repl import LeanSetupError

URL_ENV = "COMPASSPLAY_KIMINA_URL"  # e.g. http://lean-checker:8000
KEY_ENV = "COMPASSPLAY_KIMINA_API_KEY"
_RETRY_STATUS = frozenset({429, 499, 500, 502, 503, 504})
_SPLIT_STATUS = frozenset({429, 500})  # still failing after retries: try the snippets one by one
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout,
                   TimeoutError, OSError)

# How a server numbers message lines (see the module docstring).
SNIPPET_LINES = "snippet"  # fb2393d: lines of the whole snippet (header + command)
BODY_LINES = "body"        # kimina-ast-server 2.1.3: lines of the snippet after its leading import lines

# The warm-up's known proofs: `trivial` proves True with no axioms; `sorry` must be rejected, with
# the sorry reported and `#print axioms` naming sorryAx on its own line.
WARM_UP_GOOD = ("theorem compassplay_warm_up_good : True := by", "\n  trivial")
WARM_UP_BAD = ("theorem compassplay_warm_up_bad : False := by", "\n  sorry")


class _RequestFailed(Exception):
  def __init__(self, message: str, retry: bool, status: int | None = None):
    super().__init__(message)
    self.retry = retry
    self.status = status  # the HTTP status, None for a network error or a reply that is not JSON


def leading_import_lines(code: str) -> int:
  """How many lines the server takes as the snippet's header (server/split.py): the leading lines
  that are blank or start with `import `."""
  lines = code.splitlines()
  i = 0
  while i < len(lines) and (lines[i].strip() == "" or lines[i].strip().startswith("import ")):
    i += 1
  return i


def line_offset(mode: str | None, header: str, code: str) -> int:
  """Lines to subtract from a reported line so it counts from the command after `header`.
  None (not measured): only possible when both numberings agree, i.e. no leading import lines."""
  n = header.count("\n")
  return n - leading_import_lines(code) if mode == BODY_LINES else n


def _shift_lines(reply: dict, offset: int) -> dict:
  """The reply with every message's line moved up by `offset` (header lines before the command)."""
  if offset == 0 or not isinstance(reply.get("messages"), list):
    return reply
  messages = []
  for message in reply["messages"]:
    message = dict(message)
    for key in ("pos", "endPos"):
      if isinstance(message.get(key), dict) and "line" in message[key]:
        message[key] = {**message[key], "line": int(message[key]["line"]) - offset}
    messages.append(message)
  return {**reply, "messages": messages}


def retryable_error(error: str) -> bool:
  """A per-snippet server error that says nothing about the proof: no REPL free, a REPL that failed
  to start, to import the header in time, or that crashed. Only the proof's own timeout is not."""
  return "timed out" not in error or "header command timed out" in error


def result_from_kimina(item: dict, offset: int) -> LeanCheckResult:
  """One entry of a /api/check reply as the local pool's LeanCheckResult; `offset` from line_offset."""
  seconds = float(item.get("time") or 0.0)
  if item.get("error") is not None:
    error = str(item["error"])
    return LeanCheckResult(status=CRASH if retryable_error(error) else TIMEOUT, time_s=seconds, error=error)
  reply = item.get("response")
  if not isinstance(reply, dict):
    return LeanCheckResult(status=CRASH, time_s=seconds, error=f"kimina result without a response: {item!r:.200}")
  return LeanCheckResult.from_reply(_shift_lines(reply, offset), seconds)


class KiminaChecker:
  """Checks (header, command) pairs on a kimina-lean-server; thread-safe; use as a context manager."""

  def __init__(self, url: str, api_key: str | None = None, *, timeout_s: float = 60.0,
               batch_size: int = 8, num_workers: int = 2, retries: int = 3, backoff_s: float = 1.0,
               request_timeout_s: float | None = None, line_mode: str | None = None):
    """
    Args:
      url: the server's base URL (http://host:port).
      api_key: sent as `Authorization: Bearer <key>`; None when the server has no key.
      timeout_s: Lean's limit per snippet, enforced by the server (whole seconds, at least 1).
      batch_size: snippets per request; the server checks a request's snippets in parallel.
      num_workers: requests in flight at once.
      retries: further attempts of a failed request or snippet; then CRASH results.
      backoff_s: the first wait before a retry; it doubles each time.
      request_timeout_s: HTTP read limit per request; None: timeout_s x batch_size + 60 (the server
        may queue a batch's snippets behind each other).
      line_mode: SNIPPET_LINES or BODY_LINES if known; None: measured at the first need.
    """
    if not url.startswith(("http://", "https://")):
      raise LeanSetupError(f"kimina server URL must start with http:// or https://, got {url!r}")
    if batch_size < 1 or num_workers < 1 or retries < 0:
      raise ValueError(f"KiminaChecker: batch_size, num_workers >= 1 and retries >= 0, got "
                       f"{batch_size}, {num_workers}, {retries}")
    if line_mode not in (None, SNIPPET_LINES, BODY_LINES):
      raise ValueError(f"KiminaChecker: line_mode must be {SNIPPET_LINES!r}, {BODY_LINES!r} or None, got {line_mode!r}")
    self.url = url.rstrip("/")
    self.api_key = api_key
    self.timeout_s = timeout_s
    self.batch_size = batch_size
    self.num_workers = num_workers
    self.retries = retries
    self.backoff_s = backoff_s
    self.request_timeout_s = request_timeout_s or timeout_s * batch_size + 60.0
    self.line_mode = line_mode
    self.requests_sent = 0
    self.snippets_retried = 0  # snippets sent again after a busy, crashed or failed answer
    self._calibration = threading.Lock()
    self._version: str | None = None
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

  # ---- start-up ------------------------------------------------------------------------------

  @property
  def server(self) -> str:
    """The server as error messages name it: URL and version (from its OpenAPI document)."""
    if self._version is None:
      try:
        with urllib.request.urlopen(f"{self.url}/api/openapi.json", timeout=10) as response:
          self._version = "v" + str(json.loads(response.read())["info"]["version"])
      except Exception:  # noqa: BLE001 - only a label
        self._version = "version unknown"
    return f"kimina server {self.url} ({self._version})"

  def warm_up(self, header: str) -> None:
    """Measures the server's line numbering, then requires a known-good proof accepted and a
    known-bad one rejected for its sorry; LeanSetupError (one line: the server, what it answered)
    otherwise, e.g. when it is unreachable, refuses the key or fails the header."""
    self._calibrate(header, required=True)
    bad_statement, bad_body = WARM_UP_BAD
    good, bad = self.check_batch([(header, lean_acceptance.proof_command(*WARM_UP_GOOD)),
                                  (header, lean_acceptance.proof_command(bad_statement, bad_body))])
    verdict = lean_acceptance.accept_proof(*WARM_UP_GOOD, good)
    if not verdict.ok:
      raise LeanSetupError(f"{self.server} rejected the warm-up's known-good proof "
                           f"({WARM_UP_GOOD[0]} {WARM_UP_GOOD[1].strip()}): {verdict.reason}")
    why = self._bad_rejection(bad)
    if why:
      raise LeanSetupError(f"{self.server} did not reject the warm-up's known-bad proof "
                           f"({bad_statement} sorry) for its sorry: {why}")

  @staticmethod
  def _bad_rejection(result: LeanCheckResult) -> str:
    """'' when the known-bad proof's result rejects it for the right reason, else what is wrong."""
    if result.status != ANSWERED:
      return f"{result.status}: {' '.join(result.error.split())}"[:300]
    if result.errors:
      return f"lean error at line {result.errors[0].line}: {result.errors[0].data.splitlines()[0]}"
    if not result.sorries and not any("declaration uses" in m.data for m in result.messages):
      return "no sorry reported"
    axioms = lean_acceptance.reported_axioms(*WARM_UP_BAD, result)
    if axioms is None:
      return "no #print axioms report at its line"
    if "sorryAx" not in axioms:
      return f"#print axioms reported {axioms}, without sorryAx"
    return ""

  def _calibrate(self, header: str, required: bool = False) -> None:
    """Sets line_mode from where the server reports a known proof's `#print axioms` line."""
    with self._calibration:
      if self.line_mode is not None and not required:
        return
      header = normalize_header(header)
      command = lean_acceptance.proof_command(*WARM_UP_GOOD)
      code = header + command
      (item,) = self._fetch([(header, command)])
      if isinstance(item, LeanCheckResult):
        raise LeanSetupError(f"{self.server} failed the warm-up check ({item.status}): {' '.join(item.error.split())}"[:600])
      if item.get("error") is not None or not isinstance(item.get("response"), dict):
        raise LeanSetupError(f"{self.server} answered the warm-up check with {item!r:.300}")
      expected, _ = lean_acceptance._audit_lines(*WARM_UP_GOOD)
      name = WARM_UP_GOOD[0].split()[1]
      reported = [int((m.get("pos") or {}).get("line", 0)) for m in item["response"].get("messages") or []
                  if isinstance(m, dict) and str(m.get("data", "")).startswith(f"'{name}'")
                  and "axioms" in str(m.get("data", ""))]
      if not reported:
        raise LeanSetupError(f"{self.server} answered the warm-up check without a #print axioms report: "
                             f"{item['response']!r:.300}")
      offsets = {SNIPPET_LINES: line_offset(SNIPPET_LINES, header, code),
                 BODY_LINES: line_offset(BODY_LINES, header, code)}
      found = [mode for mode, offset in offsets.items() if reported[0] - offset == expected]
      if not found:
        raise LeanSetupError(f"{self.server} reported the warm-up's #print axioms at line {reported[0]}, "
                             f"neither {expected + offsets[SNIPPET_LINES]} (lines of the snippet) nor "
                             f"{expected + offsets[BODY_LINES]} (lines after its imports)")
      if len(found) == 1:  # both fit when the header has no import lines: measured at the next need
        self.line_mode = found[0]

  # ---- checking ----------------------------------------------------------------------------------

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
    pairs = [(normalize_header(header), body) for header, body in chunk]
    if self.line_mode is None:
      with_imports = [h for h, body in pairs if leading_import_lines(h + body) > 0]
      if with_imports:
        try:
          self._calibrate(with_imports[0])
        except LeanSetupError as e:
          return [LeanCheckResult(status=CRASH, error=str(e)) for _ in pairs]
    results = []
    for (header, body), item in zip(pairs, self._fetch(pairs)):
      results.append(item if isinstance(item, LeanCheckResult) else
                     result_from_kimina(item, line_offset(self.line_mode, header, header + body)))
    return results

  def _fetch(self, pairs: Sequence[tuple[str, str]]) -> list:
    """The server's result dict for each (normalised header, command), or a CRASH LeanCheckResult
    where none came after the retries. Snippets answered for good are not sent again."""
    codes = [header + body for header, body in pairs]
    out: list = [None] * len(pairs)
    pending, last_error, status = list(range(len(pairs))), {}, None
    attempt = 0
    for attempt in range(self.retries + 1):
      if attempt:
        time.sleep(self.backoff_s * 2 ** (attempt - 1))
        self.snippets_retried += len(pending)
      payload = {"snippets": [{"id": str(i), "code": codes[i]} for i in pending],
                 "timeout": max(1, math.ceil(self.timeout_s)), "debug": False, "reuse": True}
      try:
        by_id = self._post_check(payload)
      except _RequestFailed as failed:
        status = failed.status
        last_error.update((i, str(failed)) for i in pending)
        if not failed.retry:
          break
        continue
      status, still = None, []
      for i in pending:
        item = by_id.get(str(i))
        if item is None:
          last_error[i] = f"kimina reply lacks this snippet's result (got ids {sorted(by_id)[:10]})"
        elif item.get("error") is not None and retryable_error(str(item["error"])):
          last_error[i] = f"the server answered {str(item['error'])[:200]!r}"
        else:
          out[i] = item
          continue
        still.append(i)
      pending = still
      if not pending:
        break
    if status in _SPLIT_STATUS and len(pending) > 1:
      # A crashing REPL fails a whole request with 500 on fb2393d (it gathers the snippets), and a
      # request finding no free REPL fails whole with 429: check what is left one by one.
      for i in pending:
        out[i] = self._fetch([pairs[i]])[0]
      pending = []
    for i in pending:
      out[i] = LeanCheckResult(status=CRASH, error=f"{self.server}: {last_error[i]} ({attempt + 1} attempts)")
    return out

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
      raise _RequestFailed(f"HTTP {e.code}: {detail}{hint}", retry=e.code in _RETRY_STATUS, status=e.code) from None
    except _NETWORK_ERRORS as e:
      raise _RequestFailed(f"{type(e).__name__}: {e}", retry=True) from None
    try:
      results = json.loads(raw)["results"]
      return {str(r["id"]): r for r in results}
    except (ValueError, KeyError, TypeError) as e:
      raise _RequestFailed(f"reply is not a /api/check result list ({e}): {raw[:200]!r}", retry=True) from None
