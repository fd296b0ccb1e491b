"""Model checkpoints by Hugging Face Hub id: "Qwen/Qwen2.5-Coder-7B" or "Qwen/Qwen2.5-Coder-7B@<revision>".

`resolve_checkpoint(path)` turns a Hub id into the local snapshot directory that huggingface_hub
keeps in its cache (downloading only the files the loader reads), and returns anything else
unchanged. huggingface_hub does the work, so HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_ENDPOINT and
tokens (HF_TOKEN, `hf auth login`) behave as they do for transformers.

On a multi-process run only process 0 downloads; the others wait at a barrier, then read the same
snapshot from the cache (a shared file system, or each host's own cache filled the same way).
"""
from __future__ import annotations

import pathlib
import re

from compassplay_jax.core.errors import UserError

# What load_model reads: config, weights (single file or sharded with an index), tokenizer files,
# generation config. Everything else in a model repo (other formats, READMEs, images) is skipped.
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)

# owner/name with Hub-legal characters, optionally @revision (a branch, tag or commit).
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_])(?:@(?P<revision>[\w./-]+))?$")


class HubModelError(UserError, FileNotFoundError):
  """A Hub id that cannot be resolved to a local snapshot (missing repo, revision, or offline)."""


def parse_hub_id(path: str) -> tuple[str, str | None] | None:
  """(repo_id, revision) when `path` is a Hub id and not an existing local path; otherwise None."""
  text = str(path)
  if pathlib.Path(text).exists() or text.startswith((".", "/", "~")) or text.endswith(".gguf"):
    return None
  match = _HUB_ID.match(text)
  if match is None:
    return None
  return match.group("repo"), match.group("revision")


def _download(repo_id: str, revision: str | None, cache_dir, local_files_only: bool) -> pathlib.Path:
  from huggingface_hub import snapshot_download
  from huggingface_hub import errors
  label = f"{repo_id}@{revision}" if revision else repo_id
  try:
    # Top level only: repos keep other copies in subfolders (e.g. original/*.safetensors) the loader never reads.
    folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=list(CHECKPOINT_FILES),
                               ignore_patterns=["*/*"], local_files_only=local_files_only)
  except errors.RevisionNotFoundError:
    raise HubModelError(f"{label}: no such revision on the Hugging Face Hub") from None
  except errors.GatedRepoError:
    raise HubModelError(f"{label}: gated model; accept its license on the Hub and log in "
                        f"(HF_TOKEN or `hf auth login`)") from None
  except errors.RepositoryNotFoundError:
    raise HubModelError(f"{label}: no local directory of that name and no such model repository on the "
                        f"Hugging Face Hub (if it is private, set HF_TOKEN)") from None
  except errors.LocalEntryNotFoundError:
    raise HubModelError(f"{label}: no local directory of that name, not in the Hugging Face cache, and downloads "
                        f"are off (HF_HUB_OFFLINE=1 or no connection); download it once with network access") from None
  except (errors.HfHubHTTPError, OSError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise HubModelError(f"{label}: download failed ({first})") from None
  return pathlib.Path(folder)


def resolve_checkpoint(path, *, cache_dir=None, local_files_only: bool | None = None) -> str | pathlib.Path:
  """The local directory for a Hub id (downloaded on process 0 if needed); other paths unchanged.

  cache_dir / local_files_only default to huggingface_hub's own settings (HF_HUB_CACHE, HF_HUB_OFFLINE).
  """
  parsed = parse_hub_id(path)
  if parsed is None:
    return path
  repo_id, revision = parsed
  if local_files_only is None:
    from huggingface_hub import constants
    local_files_only = bool(constants.HF_HUB_OFFLINE)
  import jax
  if jax.process_count() == 1:
    return _download(repo_id, revision, cache_dir, local_files_only)
  from jax.experimental import multihost_utils
  error = None
  if jax.process_index() == 0:
    try:
      _download(repo_id, revision, cache_dir, local_files_only)
    except HubModelError as e:  # reach the barrier anyway, so the others do not hang
      error = e
  multihost_utils.sync_global_devices(f"compassplay hub download {repo_id}")
  if error is not None:
    raise error
  # Every process reads the files process 0 fetched; nothing else is downloaded.
  return _download(repo_id, revision, cache_dir, local_files_only=True)
