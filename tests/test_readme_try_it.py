"""The README's "Try it" commands (with docs/getting-started.md's "More to try") and its agent
snippet, run as written against ``tghost run`` serving the three example plugins the README's
set-up command installs: each command gives the output the page shows under it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from tghost_joke import JOKES

from tests.test_docs import block, commands
from tghost.broker import EmbeddedBroker

from .conftest import HostProcess

README = "README.md"
TRY_IT = "$ .venv/bin/tghost tools                      # the live tools every agent sees (--json for programs)"
GETTING_STARTED = "docs/getting-started.md"
MORE = "$ .venv/bin/tghost call --service joke-service --config style=pun topic=cats   # a service, with config values"
#: The host id the README's output shows under PROVIDERS.
HOST_ID = "my-laptop"


def shown_as(output: str) -> list[str]:
    """``output``'s lines as the README shows them: a pun on cats (tghost-joke picks one at random)
    is any pun on cats, a line that starts with a time (``tghost watch``'s) any time, and a line
    the README cuts with `` ...`` is cut there."""
    puns = set(JOKES["cats"]["pun"])
    return [re.sub(r"^\d\d:\d\d:\d\d  ", "<HH:MM:SS>  ", "<a pun on cats>" if line in puns else line)
            for line in output.splitlines()]


def fits(shown: str, output: str) -> bool:
    """Whether ``output`` is what the README shows: line for line, where a shown line ending in
    `` ...`` stands for any line that starts as it does, and the output ends there."""
    expected, actual = shown_as(shown), shown_as(output)
    if expected and expected[-1].endswith(" ..."):
        actual = actual[:len(expected)]
    return len(expected) == len(actual) and all(
        line == got or (line.endswith(" ...") and got.startswith(line.removesuffix(" ...")))
        for line, got in zip(expected, actual, strict=True))


@pytest.fixture
def env(pulsar_broker: EmbeddedBroker, tmp_path: Path) -> dict[str, str]:
    """The README's set-up: the joke, calculator and knowledge plugins (the tox venv has more), this
    broker, the default descriptors topic (the agent snippet's), a private config dir."""
    return {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "XDG_CONFIG_HOME": str(tmp_path),
            "TGHOST_LOAD_PLUGINS": "joke,calculator,knowledge"}


def test_every_try_it_command_gives_the_output_shown(
    env: dict[str, str], host_process: Callable[..., HostProcess],
) -> None:
    host = host_process("--host-id", HOST_ID, env=env)
    host.wait_for("announced")
    ran = []
    for argv, shown in [*commands(README, TRY_IT), *commands(GETTING_STARTED, MORE)]:
        if argv[3:4] == ["watch"]:  # follows until Ctrl-C: it must list the live tools first
            watch = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
            assert watch.stdout is not None
            listed = [watch.stdout.readline() for _ in shown.splitlines()]
            watch.send_signal(signal.SIGINT)
            assert watch.wait(30) == 0 and fits(shown, "".join(listed)), (shown, listed)
        else:
            result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0 and fits(shown, result.stdout), (argv, shown, result.stdout, result.stderr)
            ran.append(result.stdout)
        if argv[3:5] == ["call", "calculate"]:  # the state move goes to stderr, as the README says
            assert result.stderr.splitlines()[-1] == "state: undefined -> results"
    assert len(ran) == 5 + 1
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def test_the_agent_snippet_runs_as_a_script_offers_invokes_and_follows(
    pulsar_broker: EmbeddedBroker, env: dict[str, str], host_process: Callable[..., HostProcess], tmp_path: Path,
) -> None:
    host = host_process(env=env)
    host.wait_for("announced")
    script = tmp_path / "agent.py"
    source = block(README, "# an agent, as a script: python agent.py")
    script.write_text(source.replace("pulsar://localhost:6650", pulsar_broker.url))
    # -u: print() to a pipe is block-buffered, and the script never ends by itself (a terminal is line-buffered);
    # -X faulthandler: a script that does not end after Ctrl-C is stopped with SIGABRT, which prints its threads
    agent = subprocess.Popen([sys.executable, "-u", "-X", "faulthandler", str(script)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert agent.stdout is not None
    watchdog = threading.Timer(60, agent.kill)  # a script that never prints fails this test, not the run
    watchdog.start()
    lines = []
    for line in agent.stdout:  # it follows the changes until stopped
        lines.append(line.rstrip("\n"))
        if line == "added query-customers\n":
            break
    agent.send_signal(signal.SIGINT)  # Ctrl-C: it ends, quietly
    try:
        _, stderr = agent.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        agent.send_signal(signal.SIGABRT)
        pytest.fail(f"the agent did not end within 30 s of Ctrl-C; where it was:\n{agent.communicate()[1]}")
    finally:
        watchdog.cancel()
    assert (agent.returncode, stderr) == (0, "")
    assert "query-customers" in lines[0] and lines[1].startswith("answer: ") and len(lines[1]) > len("answer: ")
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
