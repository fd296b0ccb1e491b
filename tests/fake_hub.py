"""A fake Hugging Face Hub (and GitHub raw host) on 127.0.0.1 for download tests.

Serves the routes huggingface_hub reads: model info (/api/models/<repo>/revision/<rev>), the file
tree (/api/models/<repo>/tree/<commit>), and files (HEAD/GET /<repo>/resolve/<rev>/<path>, datasets
under /datasets/...), plus any other path found in `files` (e.g. /gh/<owner>/<repo>/<commit>/<path>).
Every request is recorded in `requests` as (method, path).
"""
from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse

COMMIT = "c" * 40


def git_blob_sha1(data: bytes) -> str:
  return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub(http.server.ThreadingHTTPServer):
  """`files`: URL path (no leading slash) -> bytes. `models`: repo id -> {filename: bytes} at COMMIT."""

  def __init__(self):
    super().__init__(("127.0.0.1", 0), _Handler)
    self.files: dict[str, bytes] = {}
    self.models: dict[str, dict[str, bytes]] = {}
    self.requests: list[tuple[str, str]] = []
    self._thread = threading.Thread(target=self.serve_forever, daemon=True)

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}"

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self.shutdown()
    self.server_close()

  def lookup(self, path: str):
    """(body bytes, is a JSON API answer) for a request path, or None."""
    if path in self.files:
      return self.files[path], False
    for repo, files in self.models.items():
      if path.startswith(f"api/models/{repo}/revision/"):
        return json.dumps({"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]}).encode(), True
      if path.startswith(f"api/models/{repo}/tree/"):
        tree = [{"type": "file", "path": f, "size": len(b), "oid": git_blob_sha1(b)} for f, b in files.items()]
        return json.dumps(tree).encode(), True
      prefix = f"{repo}/resolve/"
      if path.startswith(prefix):
        filename = path[len(prefix):].split("/", 1)[1]
        if filename in files:
          return files[filename], False
    return None


class _Handler(http.server.BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass

  def _serve(self, with_body: bool):
    path = urllib.parse.unquote(self.path.split("?", 1)[0].lstrip("/"))
    self.server.requests.append((self.command, path))
    found = self.server.lookup(path)
    if found is None:
      self.send_response(404)
      self.send_header("Content-Length", "0")
      self.send_header("X-Error-Code", "RepoNotFound" if path.startswith("api/") else "EntryNotFound")
      self.end_headers()
      return
    body, is_api = found
    self.send_response(200)
    self.send_header("Content-Length", str(len(body)))
    if is_api:
      self.send_header("Content-Type", "application/json")
    else:
      self.send_header("ETag", '"' + git_blob_sha1(body) + '"')
      self.send_header("X-Repo-Commit", COMMIT)
    self.end_headers()
    if with_body:
      self.wfile.write(body)

  def do_HEAD(self):
    self._serve(False)

  def do_GET(self):
    self._serve(True)
