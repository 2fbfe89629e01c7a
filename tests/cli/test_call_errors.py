"""cli: a tool's error as a user meets it, in subprocesses on the embedded broker: ``tghost call``
names the host and the request id, the ``tghost run`` log line with the traceback names the same
request, and ``tghost run --error-detail`` (or ``TGHOST_ERROR_DETAIL``) withholds the
exception's text from the caller only."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import READY, PluginDir, tghost_cli
from tghost.broker import EmbeddedBroker

CURRENCY = """
import tghost

RATES = {"EUR": 1.0}


@tghost.tool
def to_euros(amount: float, currency: str) -> float:
    '''Convert an amount to euros.'''
    return amount * RATES[currency]


@tghost.hookimpl
def tghost_register_services(register):
    register(to_euros)
"""


@pytest.mark.parametrize(("option", "env", "told"), [
    ((), {}, "KeyError: 'GBP'"),
    (("--error-detail", "type"), {}, "KeyError (its message and traceback are in the log of host rates-host, "
                                     "under request {request})"),
    ((), {"TGHOST_ERROR_DETAIL": "none"}, "the tool failed; see the log of host rates-host for request {request}"),
], ids=["full", "type", "none-from-env"])
def test_tghost_call_names_the_host_and_the_request_whose_log_line_has_the_traceback(
    plugin_dir: PluginDir, pulsar_broker: EmbeddedBroker, tmp_path: Path, host_process: Any,
    option: tuple[str, ...], env: dict[str, str], told: str
) -> None:
    plugin_dir.add("rates", CURRENCY)
    user = plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "errors")
    host = host_process("--host-id", "rates-host", *option, env={**user, **env})
    host.wait_for(READY)
    called = tghost_cli("call", "to-euros", "amount=3", "currency=GBP", env=user)
    assert called.returncode == 1 and called.stdout == "", called.stderr
    [line] = called.stderr.splitlines()
    request = re.findall(r"request ([0-9a-f]{32})", line)[-1]
    where = "" if "{request}" in told else f" (host rates-host, request {request})"  # the message names them
    assert line == f"Error: tool-service-error: {told.format(request=request)}{where}"
    host.wait_for(f"service to-euros: request {request}: invoke raised")
    host.wait_for(r"^KeyError: 'GBP'$", timeout=5)  # the traceback's last line: the host's log keeps it
