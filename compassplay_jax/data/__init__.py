"""Public data sets: the data directory (`paths`), their pinned sources (`sources`), fetching (`fetch`).

Command line: `python -m compassplay_jax.cli.data fetch --all` (docs/data.md). This folder also ships
the small built-in reference set `math_mini.jsonl` (`builtin:math_mini`).
"""
