"""Downloads the pinned upstream files of a data set, checks them, converts them, and records them in a manifest.

Every download is checked against its pinned sha256 (sources.Upstream.sha256; a Hub file without one,
against the content hash the Hub names for it at the pinned commit), and every output with a pinned
sha256 (sources.DataSet.output_sha256) against that, each mismatch one line naming the file, the
expected and the actual sha256. The manifest (<data dir>/MANIFEST.json) holds, per written file: the
set, sha256, size, license and every upstream file it came from (repository, revision, path, sha256).
A file's expected sha256 is its pin, else its manifest entry; a second fetch of a set whose files match
downloads nothing, a file that does not match stops the fetch (delete it and fetch again).

Endpoints: Hub files go through huggingface_hub (HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE, HF_TOKEN as
usual); GitHub files come from $COMPASSPLAY_GITHUB_RAW (default https://raw.githubusercontent.com), and
git-lfs files from $COMPASSPLAY_GITHUB_MEDIA (default https://media.githubusercontent.com/media), checked
against the sha256 their pointer names.
"""
from __future__ import annotations

import datetime
import hashlib
import importlib.util
import json
import os
import pathlib
import tempfile
import urllib.error
import urllib.request
from typing import Callable, Iterable

import tqdm

from compassplay_jax.data import paths
from compassplay_jax.data.sources import DATASETS, GITHUB, DataSet, Upstream, dataset_for, output_sha256

MANIFEST = "MANIFEST.json"
GITHUB_RAW_ENV = "COMPASSPLAY_GITHUB_RAW"
GITHUB_RAW_DEFAULT = "https://raw.githubusercontent.com"
GITHUB_MEDIA_ENV = "COMPASSPLAY_GITHUB_MEDIA"
GITHUB_MEDIA_DEFAULT = "https://media.githubusercontent.com/media"  # where git-lfs files are served
LFS_POINTER = b"version https://git-lfs.github.com/spec/"


class FetchError(RuntimeError):
  """A download, conversion or integrity failure (one line)."""


# Reads a converted file back with the loader a run will read it with; raises on a file it rejects. The
# loaders live above this layer, so the caller supplies it (the command passes data_checks.read_back).
OutputCheck = Callable[[str, pathlib.Path], None]


def sha256_file(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


# ---- manifest ----------------------------------------------------------------------------------------

def read_manifest(directory: pathlib.Path) -> dict:
  path = directory / MANIFEST
  if not path.exists():
    return {"files": {}}
  try:
    manifest = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise FetchError(f"{path}: not valid JSON ({e.msg}); delete it and fetch again") from None
  manifest.setdefault("files", {})
  return manifest


def write_manifest(directory: pathlib.Path, manifest: dict) -> None:
  tmp = directory / (MANIFEST + ".tmp")
  tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
  tmp.replace(directory / MANIFEST)


def expected_sha256(manifest: dict, relpath: str) -> tuple[str, str]:
  """(sha256, what it is) a data-dir file must have: its pin, else what the fetch wrote (the manifest),
  else ("", "") for a file neither pinned nor fetched here."""
  pinned = output_sha256(relpath)
  if pinned:
    return pinned, "its pin in compassplay_jax/data/sources.py"
  entry = manifest["files"].get(relpath)
  return (entry["sha256"], "the sha256 the fetch recorded in MANIFEST.json") if entry else ("", "")


def file_status(directory: pathlib.Path, manifest: dict, relpath: str) -> str:
  """"missing", "ok" (matches its pinned or manifest sha256), "corrupt" (does not), or "present" (there,
  neither pinned nor written by a fetch, so unchecked)."""
  path = directory / relpath
  if not path.exists():
    return "missing"
  expected, _ = expected_sha256(manifest, relpath)
  if not expected:
    return "present"
  return "ok" if sha256_file(path) == expected else "corrupt"


def mismatch(directory: pathlib.Path, manifest: dict, relpath: str) -> str:
  """"" when `relpath` matches its expected sha256 (or has none), else the one-line reason."""
  path = directory / relpath
  expected, what = expected_sha256(manifest, relpath)
  if not expected:
    return ""
  actual = sha256_file(path)
  if actual == expected:
    return ""
  dataset = dataset_for(relpath)
  fix = f"delete it and run {paths.fetch_command([dataset.name], directory)}" if dataset else "delete it"
  return f"{path}: sha256 expected {expected} ({what}), got {actual}; {fix}"


def verify(directory: pathlib.Path, manifest: dict, relpath: str) -> None:
  """Raises FetchError (one line) when `relpath` does not match its expected sha256."""
  reason = mismatch(directory, manifest, relpath)
  if reason:
    raise FetchError(reason)


# ---- downloads ---------------------------------------------------------------------------------------

def _http_get(url: str, dest: pathlib.Path, label: str, progress: bool) -> None:
  request = urllib.request.Request(url, headers={"User-Agent": "compassplay-jax-data-fetch"})
  try:
    with urllib.request.urlopen(request, timeout=60) as response, open(dest, "wb") as out:
      total = int(response.headers.get("Content-Length") or 0) or None
      with tqdm.tqdm(total=total, unit="B", unit_scale=True, desc=label, disable=not progress, leave=False) as bar:
        for block in iter(lambda: response.read(1 << 16), b""):
          out.write(block)
          bar.update(len(block))
  except urllib.error.HTTPError as e:
    raise FetchError(f"{url}: HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError) as e:
    raise FetchError(f"{url}: download failed ({getattr(e, 'reason', e)})") from None


def _download_github(upstream: Upstream, dest: pathlib.Path, progress: bool) -> None:
  base = os.environ.get(GITHUB_RAW_ENV, GITHUB_RAW_DEFAULT).rstrip("/")
  label = f"{upstream.repo}/{upstream.path}"
  _http_get(f"{base}/{upstream.repo}/{upstream.revision}/{upstream.path}", dest, label, progress)
  with open(dest, "rb") as f:
    head = f.read(1024)
  if not head.startswith(LFS_POINTER):
    return
  # A git-lfs file: the raw endpoint serves its pointer (which names the content's sha256), the media
  # endpoint the content.
  fields = dict(line.split(" ", 1) for line in head.decode("utf-8", "replace").splitlines() if " " in line)
  expected = fields.get("oid", "").removeprefix("sha256:")
  media = os.environ.get(GITHUB_MEDIA_ENV, GITHUB_MEDIA_DEFAULT).rstrip("/")
  _http_get(f"{media}/{upstream.repo}/{upstream.revision}/{upstream.path}", dest, label, progress)
  actual = sha256_file(dest)
  if actual != expected:
    raise FetchError(f"{label}: the download's sha256 {actual[:12]}… does not match its git-lfs pointer's "
                     f"{expected[:12]}… (corrupted download); fetch again")


def _download_hub(upstream: Upstream, progress: bool) -> pathlib.Path:
  """The file in huggingface_hub's cache (downloaded there if needed; read in place, not copied)."""
  from huggingface_hub import errors, hf_hub_download
  if not progress:
    from huggingface_hub.utils import disable_progress_bars
    disable_progress_bars()
  label = f"{upstream.repo}@{upstream.revision}/{upstream.path}"
  try:
    cached = hf_hub_download(upstream.repo, upstream.path, repo_type="dataset", revision=upstream.revision,
                             endpoint=os.environ.get("HF_ENDPOINT") or None)
  except errors.LocalEntryNotFoundError:
    raise FetchError(f"{label}: not in the Hugging Face cache and downloads are off (HF_HUB_OFFLINE)") from None
  except (errors.HfHubHTTPError, errors.RepositoryNotFoundError, errors.EntryNotFoundError, OSError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise FetchError(f"{label}: download failed ({first})") from None
  return pathlib.Path(cached)


def download(upstream: Upstream, dest: pathlib.Path, progress: bool = True) -> pathlib.Path:
  """Fetches one upstream file and checks it (check_download); returns where it is (`dest`, or the Hugging
  Face cache for Hub files)."""
  if upstream.kind == GITHUB:
    _download_github(upstream, dest, progress)
    local = dest
  else:
    local = _download_hub(upstream, progress)
  check_download(upstream, local)
  return local


def check_download(upstream: Upstream, local: pathlib.Path) -> str:
  """Raises FetchError (one line) unless `local` has the upstream file's pinned sha256, or (a Hub file
  without a pin) the content hash the Hub names for the file at the pinned commit: the name of the blob
  huggingface_hub cached it under, a sha256 for git-lfs/xet files, a git blob sha1 for small ones.
  Returns what it was checked against."""
  label = f"{upstream.repo}@{upstream.revision[:12]}/{upstream.path}"
  actual = sha256_file(local)
  if upstream.sha256:
    if actual != upstream.sha256:
      raise FetchError(f"{label}: download sha256 expected {upstream.sha256} (its pin), got {actual}; "
                       "not the pinned file: fetch again")
    return "pin"
  named = pathlib.Path(os.path.realpath(local)).name if upstream.kind != GITHUB else ""
  if len(named) == 64:
    expected, got = named, actual
  elif len(named) == 40:
    data = local.read_bytes()
    expected, got = named, hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
  else:
    raise FetchError(f"{label}: no pinned sha256 and no content hash from the Hub to check the download against")
  if got != expected:
    raise FetchError(f"{label}: download hash expected {expected} (the Hub's, at the pinned commit), got {got}; "
                     "corrupted download or cache: delete it from the Hugging Face cache and fetch again")
  return "hub content hash"


# ---- one set -----------------------------------------------------------------------------------------

def fetch_dataset(dataset: DataSet, directory: pathlib.Path, manifest: dict, *, progress: bool = True,
                  log: Callable[[str], None] = print, check_output: OutputCheck | None = None) -> bool:
  """Fetches one set into `directory` unless its files are already there. Returns True if it downloaded."""
  statuses = {out: file_status(directory, manifest, out) for out in dataset.outputs}
  for out, status in statuses.items():
    if status == "corrupt":
      verify(directory, manifest, out)  # raises with the one-line message
  if all(s in ("ok", "present") for s in statuses.values()):
    note = "" if all(s == "ok" for s in statuses.values()) else " (present; neither pinned nor fetched by this tool, not checked)"
    log(f"{dataset.name}: up to date{note}")
    return False
  missing = [m for m in dataset.requires if importlib.util.find_spec(m) is None]
  if missing:
    raise FetchError(f"{dataset.name}: converting it needs the python package(s) {', '.join(missing)} "
                     f"(pip install {' '.join(missing)})")
  with tempfile.TemporaryDirectory(prefix=f"compassplay_{dataset.name}_") as tmp:
    raw, sources = {}, []
    for index, upstream in enumerate(dataset.inputs):
      dest = pathlib.Path(tmp) / f"{index}_{pathlib.Path(upstream.path).name}"
      local = download(upstream, dest, progress)
      raw[upstream.path] = local
      sources.append({"kind": upstream.kind, "repo": upstream.repo, "revision": upstream.revision,
                      "path": upstream.path, "sha256": sha256_file(local),
                      "checked_against": "pin" if upstream.sha256 else "hub content hash"})
    from compassplay_jax.data import convert
    try:
      outputs = dataset.convert(raw)
    except (convert.ConvertError, KeyError, ValueError) as e:
      raise FetchError(f"{dataset.name}: upstream files do not have the expected layout ({e})") from None
  for relpath, content in outputs.items():
    expected = dataset.output_sha256.get(relpath)
    actual = hashlib.sha256(content.encode("utf-8") if isinstance(content, str) else content).hexdigest()
    if expected and actual != expected:
      raise FetchError(f"{relpath}: converted file sha256 expected {expected} (its pin), got {actual}")
  _write_checked(directory, outputs, check_output)
  fetched_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  for relpath in outputs:
    path = directory / relpath
    manifest["files"][relpath] = {"dataset": dataset.name, "sha256": sha256_file(path), "bytes": path.stat().st_size,
                                  "license": dataset.license, "sources": sources, "fetched_at": fetched_at}
  write_manifest(directory, manifest)
  log(f"{dataset.name}: wrote {', '.join(sorted(outputs))}")
  return True


def _write_checked(directory: pathlib.Path, outputs: dict[str, str | bytes], check_output: OutputCheck | None) -> None:
  """Writes each output beside its place, has `check_output` read it, and only then moves it in, so a file
  a loader rejects never lands in the data directory."""
  staged = {}
  try:
    for relpath, content in outputs.items():
      path = directory / relpath
      path.parent.mkdir(parents=True, exist_ok=True)
      staged[relpath] = path.with_name(".incoming-" + path.name)  # same suffix: loaders look at it
      staged[relpath].write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
      if check_output is not None:
        _read_back(check_output, relpath, staged[relpath])
    for relpath, tmp in staged.items():
      tmp.replace(directory / relpath)
  finally:
    for tmp in staged.values():
      tmp.unlink(missing_ok=True)


def _read_back(check_output: OutputCheck, relpath: str, path: pathlib.Path) -> None:
  try:
    check_output(relpath, path)
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise FetchError(f"{relpath}: converted file is not readable by its loader ({first})") from None


def select(names: Iterable[str], all_sets: bool) -> list[DataSet]:
  """The named sets, or with all_sets every set but the opt-in ones (those are fetched only by name)."""
  names = list(names)
  if all_sets:
    return [d for d in DATASETS.values() if not d.opt_in] + [DATASETS[n] for n in dict.fromkeys(names)
                                                              if n in DATASETS and DATASETS[n].opt_in]
  if not names:
    raise FetchError("name the sets to fetch, or pass --all (see --list)")
  unknown = [n for n in names if n not in DATASETS]
  if unknown:
    raise FetchError(f"unknown data set(s) {', '.join(unknown)} (known: {', '.join(DATASETS)})")
  return [DATASETS[n] for n in dict.fromkeys(names)]


def fetch(names: Iterable[str] = (), directory=None, *, all_sets: bool = False, progress: bool = True,
          log: Callable[[str], None] = print, check_output: OutputCheck | None = None) -> list[str]:
  """Fetches the named sets (or all) into the data directory; returns the names that were downloaded.
  `check_output(relpath, path)` reads each converted file back before it is moved in."""
  directory = paths.data_dir(directory)
  datasets = select(names, all_sets)
  if all_sets:
    for left in (d for d in DATASETS.values() if d.opt_in and d not in datasets):
      log(f"{left.name}: not fetched by --all, only by name ({left.opt_in})")
  for dataset in datasets:
    if dataset.opt_in:
      log(f"note: {dataset.opt_in}")
  directory.mkdir(parents=True, exist_ok=True)
  manifest = read_manifest(directory)
  return [d.name for d in datasets
          if fetch_dataset(d, directory, manifest, progress=progress, log=log, check_output=check_output)]


def listing(directory=None) -> list[dict]:
  """Per set: name, status (ok / present / missing / corrupt / partial), files, license, revisions."""
  directory = paths.data_dir(directory)
  manifest = read_manifest(directory)
  rows = []
  for dataset in DATASETS.values():
    statuses = [file_status(directory, manifest, out) for out in dataset.outputs]
    status = statuses[0] if len(set(statuses)) == 1 else ("corrupt" if "corrupt" in statuses else "partial")
    rows.append({"name": dataset.name, "status": status, "files": list(dataset.outputs), "license": dataset.license,
                 "opt_in": bool(dataset.opt_in),
                 "sources": sorted({f"{u.repo}@{u.revision[:12]}" for u in dataset.inputs}),
                 "description": dataset.description})
  return rows
