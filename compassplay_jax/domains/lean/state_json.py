"""The checkpointed JSON of the Lean loop's state objects (coverage, seed pool): one checked reader."""
import json


def load_versioned(text: str, owner: str, version: int, keys: tuple[str, ...]) -> dict:
  """The dict `text` holds, or a one-line ValueError naming `owner` (e.g. "SeedPool.from_json") and
  what is wrong: invalid JSON, another format version, or a missing key."""
  try:
    data = json.loads(text)
  except ValueError as e:
    raise ValueError(f"{owner}: invalid JSON ({e.msg})") from None
  if not isinstance(data, dict) or data.get("version") != version:
    raise ValueError(f"{owner}: expected key 'version' = {version}")
  for key in keys:
    if key not in data:
      raise ValueError(f"{owner}: missing key '{key}'")
  return data
