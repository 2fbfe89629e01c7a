"""cli.output: how commands lay out text for a person: columns of a table, aligned."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

__all__ = ["columns", "table"]


def columns(cells: Sequence[str], widths: Sequence[int]) -> str:
    """One line: each cell left-aligned in its width (characters), two spaces apart, with no
    trailing space (a cell longer than its width pushes the rest right)."""
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()


def table(rows: Sequence[Sequence[str]]) -> Iterator[str]:
    """The lines of a table whose first row is its header: every column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return (columns(row, widths) for row in rows)
