"""cli.output: a command's columns and tables, aligned for a person."""

from __future__ import annotations

import pytest

from tghost.cli.output import columns, table


def test_columns_pad_each_cell_to_its_width_two_spaces_apart_with_no_trailing_space() -> None:
    assert columns(("added", "echo", "s", ""), (7, 6, 3, 0)) == "added    echo    s"


def test_a_cell_longer_than_its_width_pushes_the_rest_of_its_line_right() -> None:
    assert columns(("a-very-long-name", "x"), (4, 1)) == "a-very-long-name  x"


def test_columns_need_a_width_for_every_cell() -> None:
    with pytest.raises(ValueError):
        columns(("a", "b"), (1,))


def test_a_table_is_as_wide_as_its_widest_cell_per_column_header_included() -> None:
    rows = [("TOOL", "SERVICE", "HOSTS"), ("tell-joke", "jokes", "a,b"), ("x", "a-long-service", "-")]
    assert list(table(rows)) == ["TOOL       SERVICE         HOSTS",
                                 "tell-joke  jokes           a,b",
                                 "x          a-long-service  -"]
