"""cli.call: ``tghost call``'s arguments and usage errors (exit 2), its message when no broker
answers (exit 1), and how progress updates show on stderr. In process, with no broker."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner, Result

from tghost.cli.app import cli
from tghost.cli.call import ProgressLine
from tghost.protocol.wire import Progress
from tghost.system.net import free_port


def _call(*args: str) -> Result:
    """``tghost call ARGS`` in process, on a port where no broker runs."""
    return CliRunner().invoke(cli, ["call", "--pulsar-url", f"pulsar://127.0.0.1:{free_port()}", *args])


def test_call_without_a_broker_says_how_to_start_one() -> None:
    result = _call("--service", "echo", "--topic", "echo")
    assert result.exit_code == 1 and "start one ('tghost run' or 'tghost broker start'" in result.stderr


def test_call_rejects_malformed_arguments_with_usage_exit_2() -> None:
    result = _call("--service", "echo", "--topic", "echo", "novalue")
    assert result.exit_code == 2 and "is not KEY=VALUE" in result.stderr


@pytest.mark.parametrize("option", [("--config", "style=pun"), ("--topic", "joke")])
def test_call_of_a_tool_with_a_service_option_is_a_usage_error_saying_what_to_use(option: tuple[str, str]) -> None:
    result = _call("tell-joke", *option, "topic=cats")
    assert result.exit_code == 2
    assert f"{option[0]} goes with --service, not with a tool name" in result.stderr
    assert f"tghost call --service ID {option[0]}" in result.stderr


def test_call_refuses_an_argument_given_twice() -> None:
    result = _call("tell-joke", "topic=cats", "topic:=\"dogs\"")
    assert result.exit_code == 2 and "'topic' is given twice" in result.stderr


@pytest.mark.parametrize(("args", "error"), [
    ((), "give a TOOL name, or --service ID"),
    (("tell-joke", "--json", '{"topic": "cats"}', "topic=dogs"),
     "give arguments as KEY=VALUE pairs or --json, not both"),
    (("tell-joke", "--json", '["cats"]'), "Invalid value for --json: must be a JSON object"),
    (("tell-joke", "--json", "{topic: cats}"), "Invalid value for --json: ARGS is not JSON"),
    (("--service", "jokes", "--config", "style"), "Invalid value for --config: 'style' is not KEY=VALUE"),
    (("tell-joke", "--timeout", "0"), "Invalid value for '--timeout'"),
    (("tell-joke", "--wait", "-1"), "Invalid value for '--wait'"),
], ids=["nothing-to-call", "pairs-and-json", "json-not-an-object", "json-not-json", "config-not-a-pair",
        "timeout-zero", "wait-negative"])
def test_call_usage_errors_exit_2_saying_what_is_wrong(args: tuple[str, ...], error: str) -> None:
    result = _call(*args)
    assert result.exit_code == 2 and error in result.stderr, result.stderr
    assert result.stdout == ""


def test_progress_off_a_terminal_is_one_line_per_update() -> None:
    line, stderr = _progress_line(tty=False)
    line.show(Progress(3, 10, "page 3"))
    line.show(Progress(4, None, ""))
    line.show(Progress(0.5, 2, "half a step"))
    assert stderr.getvalue() == "progress: 3/10 (30%) page 3\nprogress: 4\nprogress: 0.5/2 (25%) half a step\n"


def test_progress_on_a_terminal_is_one_line_rewritten_that_never_erases_the_observation() -> None:
    line, stderr = _progress_line(tty=True)
    line.show(Progress(1, 2, ""))
    line.printed("an unfinished line")
    line.show(Progress(2, 2, ""))  # would erase it: not drawn
    line.printed(" ends\n")
    line.show(Progress(2, 2, "done"))
    line.clear()
    assert stderr.getvalue() == "\r\033[Kprogress: 1/2 (50%)\r\033[Kprogress: 2/2 (100%) done\r\033[K"


def test_progress_not_shown_reports_nothing() -> None:
    assert ProgressLine(shown=False).report is None


class _Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _progress_line(tty: bool) -> tuple[ProgressLine, _Terminal]:
    """A shown :class:`ProgressLine` and the stderr it writes to, a terminal or not."""
    stderr = _Terminal(tty)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stderr", stderr)
        return ProgressLine(shown=True), stderr
