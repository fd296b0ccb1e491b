"""python -m compassplay_jax.cli.data fetch [NAMES ...|--all] [--dir DIR] | fetch --list [--dir DIR]

Fetches the public data sets the configs and the evaluation read into the data directory
(--dir, else $COMPASSPLAY_DATA, else ~/.cache/compassplay/data); docs/data.md lists them.

An entry point, imported by nothing: it wires the project's loaders (data_checks.read_back, above the
data layer) into the fetch, so every converted file is read back before it lands.
"""
from __future__ import annotations

import argparse
import os
import sys

from compassplay_jax.selfplay import data_files as data_checks
from compassplay_jax.data import fetch as fetch_lib
from compassplay_jax.data import paths
from compassplay_jax.data.sources import DATASETS


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m compassplay_jax.cli.data", description=__doc__.splitlines()[2])
  sub = parser.add_subparsers(dest="command", required=True)
  f = sub.add_parser("fetch", help="download and convert data sets (or --list what is present)")
  f.add_argument("names", nargs="*", help=f"sets to fetch: {', '.join(DATASETS)}")
  f.add_argument("--all", action="store_true", help="every set")
  f.add_argument("--list", action="store_true", help="show each set's status in the data directory")
  f.add_argument("--dir", default="", help=f"data directory (default ${paths.ENV} or {paths.default_data_dir()})")
  f.add_argument("--no-progress", action="store_true", help="no progress bars")
  return parser


def _print_listing(directory) -> None:
  print(f"data directory: {paths.data_dir(directory)}")
  for row in fetch_lib.listing(directory):
    by_name = " (fetched by name only, not by --all)" if row["opt_in"] else ""
    print(f"  {row['name']:<14} {row['status']:<10} {row['license']:<11} {', '.join(row['sources'])}{by_name}")
    if row["status"] not in ("ok", "present"):
      for file in row["files"]:
        print(f"  {'':<14} {'':<10} {file}")


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  try:
    if args.list:
      _print_listing(args.dir)
      return 0
    fetch_lib.fetch(args.names, args.dir, all_sets=args.all, progress=not args.no_progress,
                    check_output=data_checks.read_back)
    return 0
  except (fetch_lib.FetchError, OSError) as e:
    if os.environ.get("COMPASSPLAY_TRACEBACK"):
      raise
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"error: {first}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())
