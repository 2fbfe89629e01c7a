"""logs: a LogSummary counts events by reason and logs one warning line per reason at most once
per interval, with the count and the first example; each event itself at debug level."""

from __future__ import annotations

import logging
import threading

import pytest

from tghost.system.logs import LogSummary

LINE = "ignored %(count)d announcement(s): %(reason)s (e.g. %(example)s)"


@pytest.fixture
def logger(caplog: pytest.LogCaptureFixture) -> logging.Logger:
    caplog.set_level(logging.DEBUG, logger="test.summary")
    return logging.getLogger("test.summary")


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warning lines logged so far (and clear the capture)."""
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    caplog.clear()
    return lines


def test_one_line_per_reason_with_its_count_and_first_example(logger: logging.Logger,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    summary = LogSummary(logger, LINE)
    for example in ("from a", "from b"):
        summary.add("not signed", example)
    summary.add("too big", "5 MB")
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == ["not signed: from a", "not signed: from b", "too big: 5 MB"]  # each event, at debug
    summary.flush(now=0.0)  # the first flush is due at once
    assert warnings(caplog) == ["ignored 2 announcement(s): not signed (e.g. from a)",
                                "ignored 1 announcement(s): too big (e.g. 5 MB)"]
    assert summary.counts == {"not signed": 2, "too big": 1}


def test_at_most_one_summary_per_interval_unless_forced(logger: logging.Logger,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    summary = LogSummary(logger, LINE, interval=60.0)
    summary.add("r", "first")
    summary.flush(now=100.0)
    summary.add("r", "second")
    summary.flush(now=159.0)
    assert len(warnings(caplog)) == 1  # the second waits for the interval
    summary.flush(now=160.0)
    assert warnings(caplog) == ["ignored 1 announcement(s): r (e.g. second)"]  # only what came since
    summary.add("r", "third")
    summary.flush(now=161.0, force=True)
    assert warnings(caplog) == ["ignored 1 announcement(s): r (e.g. third)"]
    summary.flush(now=1000.0)
    assert warnings(caplog) == []  # nothing new: nothing logged
    assert summary.counts == {"r": 3}  # every event counted


def test_silent_reasons_are_counted_never_summarised(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    summary = LogSummary(logger, LINE, silent=frozenset({"expected"}))
    summary.add("expected", "x")
    summary.flush(now=0.0)
    assert warnings(caplog) == [] and summary.counts == {"expected": 1}


def test_counts_may_be_a_counter_the_caller_keeps(logger: logging.Logger) -> None:
    from collections import Counter

    kept: Counter[str] = Counter()
    LogSummary(logger, LINE, counts=kept).add("r", "x")
    assert kept == {"r": 1}


def test_threads_flushing_at_once_log_one_summary(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    summary = LogSummary(logger, LINE)
    for number in range(100):
        summary.add("r", str(number))
    start = threading.Barrier(8)

    def flush() -> None:
        start.wait()
        summary.flush(now=1.0)

    threads = [threading.Thread(target=flush) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert warnings(caplog) == ["ignored 100 announcement(s): r (e.g. 0)"]
