"""Run every benchmark in turn: ``python bench/run.py [name ...]`` (default: all)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BENCHMARKS = ["discovery"]

if __name__ == "__main__":
    for name in sys.argv[1:] or BENCHMARKS:
        importlib.import_module(f"bench.{name}").main()
