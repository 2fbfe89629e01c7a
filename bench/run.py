"""Run the benchmarks: ``python bench/run.py [--quick] [name ...]`` (default: all, at full size).

Prints the machine, then each benchmark's table; JSON goes to bench/results/<name>.json.
``--quick`` uses tiny sizes for a smoke run: its numbers are noise.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BENCHMARKS = ["roundtrip", "streaming", "discovery", "plugins", "scaleout", "amplifier", "isolation", "edges", "drain",
              "access", "search", "tracing", "scale", "flood", "reload", "liveness"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="name", help=f"benchmarks to run (default: all of {BENCHMARKS})")
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}")
    importlib.import_module("bench.common").print_header(args.quick)
    for name in args.names or BENCHMARKS:
        importlib.import_module(f"bench.{name}").main(quick=args.quick)


if __name__ == "__main__":
    main()
