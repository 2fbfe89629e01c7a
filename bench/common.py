"""Shared benchmark plumbing: a private broker, percentiles, and the table + JSON report.

Benchmarks print a table and write JSON to bench/results/; they assert nothing about time.
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tghost.broker import EmbeddedBroker, free_port

RESULTS = Path(__file__).parent / "results"


@contextmanager
def broker() -> Iterator[EmbeddedBroker]:
    """A fresh embedded broker on a free port with a temporary data dir."""
    with tempfile.TemporaryDirectory() as data, EmbeddedBroker(Path(data), free_port()) as running:
        yield running


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def summary(samples_ms: Sequence[float]) -> dict[str, float]:
    """Median, p99, min and max of samples in milliseconds, rounded to 0.01 ms."""
    return {"n": len(samples_ms), "median_ms": round(statistics.median(samples_ms), 2),
            "p99_ms": round(percentile(samples_ms, 99), 2), "min_ms": round(min(samples_ms), 2),
            "max_ms": round(max(samples_ms), 2)}


def report(name: str, title: str, rows: list[dict[str, Any]]) -> None:
    """Print rows as an aligned table under ``title`` and write them to results/<name>.json."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [columns] + [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    print(f"\n## {title}\n")
    for i, row in enumerate(cells):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    RESULTS.mkdir(exist_ok=True)
    machine = {"python": platform.python_version(), "machine": platform.machine(), "system": platform.system()}
    (RESULTS / f"{name}.json").write_text(json.dumps({"title": title, "machine": machine, "rows": rows}, indent=2))
