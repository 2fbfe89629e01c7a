"""Issue 42's edit without ``--reload``, on the embedded broker: a ``tghost run`` host serves a
plugin, whose source is then edited (an argument and a tool added). ``tghost plugins`` marks the
plugin as served at its old code by that host, and ``tghost call`` says so after the
``invalid-arguments`` of the new argument and the ``no-provider`` of the new tool; once the host
is restarted, neither does, and the new argument is served. Where no broker answers, or what
answers is not one, ``tghost plugins`` lists the plugins unchecked."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from tests.conftest import HostProcess, PluginDir, live_tools, tghost_cli
from tghost.broker import EmbeddedBroker
from tghost.cli.app import cli

PLUGIN = '''
import tghost

@tghost.tool(name="count")
def count(text: str{argument}) -> str:
    """Count the words."""
    return str(len(text.split()))
{more}
@tghost.hookimpl
def tghost_register_services(register):
    register(count){registered}
'''
ORIGINAL = PLUGIN.format(argument="", more="", registered="")
EDITED = PLUGIN.format(argument=", unique: bool = False", registered="\n    register(shout)", more='''
@tghost.tool(name="shout")
def shout(text: str) -> str:
    """Shout the text."""
    return text.upper()
''')


def plugin_report(env: dict[str, str], *args: str) -> dict[str, Any]:
    """``tghost plugins --json``'s report of the plugin ``count``."""
    listed = tghost_cli("plugins", "--json", *args, env=env)
    assert listed.returncode == 0, listed.stderr
    [report] = [report for report in json.loads(listed.stdout) if report["name"] == "count"]
    return report


def test_a_host_serving_a_plugin_from_before_its_edit_is_named_until_it_is_restarted(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path,
    host_process: Callable[..., HostProcess],
) -> None:
    plugin_dir.add("count", ORIGINAL)
    env = plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "old-code")
    host = host_process(env=env)
    host.wait_for("announced")
    [host_id] = live_tools(env)["count"]["providers"]
    before = plugin_report(env)
    assert before["old_code"] == []
    assert plugin_report(env, "--pulsar-url", "pulsar://127.0.0.1:1")["old_code"] is None  # no broker: not checked

    (plugin_dir.root / "tghost_test_count.py").write_text(EDITED)
    assert plugin_report(env)["old_code"] == [{"distribution": "tghost-test-count", "version": "1.0",
                                               "fingerprint": before["fingerprint"], "hosts": [host_id]}]
    said = f"host {host_id} serves it at its old code (before your edit): restart it or run it with --reload"
    assert f"\n  old code:    {said}\n" in tghost_cli("plugins", env=env).stdout
    hint = (f". Host {host_id} serves plugin 'count' at its old code (before your edit): restart it or run it "
            "with --reload")
    new_argument = tghost_cli("call", "count", "text=a b a", "unique:=true", env=env)
    assert new_argument.returncode == 1
    assert new_argument.stderr.startswith("Error: invalid-arguments: argument 'unique'"), new_argument.stderr
    assert new_argument.stderr.endswith(f"{hint}\n"), new_argument.stderr
    new_tool = tghost_cli("call", "shout", "text=hi", env=env)
    assert new_tool.returncode == 1
    assert new_tool.stderr.startswith("Error: no-provider: no live host serves tool 'shout'"), new_tool.stderr
    assert new_tool.stderr.endswith(f"{hint}\n"), new_tool.stderr

    host.process.send_signal(signal.SIGTERM)
    assert host.finish() == 0
    host_process(env=env).wait_for("announced")
    assert plugin_report(env)["old_code"] == []
    assert "old code" not in tghost_cli("plugins", env=env).stdout
    served = tghost_cli("call", "count", "text=a b a", "unique:=true", env=env)
    assert (served.returncode, served.stdout) == (0, "3\n"), served.stderr


def hold_connections(server: socket.socket) -> None:
    """Accept connections and never answer, as no Pulsar broker does, until ``server`` is closed."""
    held = []
    with contextlib.suppress(OSError):
        while True:
            held.append(server.accept()[0])


def test_plugins_are_listed_unchecked_when_what_answers_at_the_url_is_no_broker(plugin_dir: PluginDir) -> None:
    plugin_dir.add("count", ORIGINAL)
    with socket.create_server(("127.0.0.1", 0)) as server:
        threading.Thread(target=hold_connections, args=(server,), daemon=True).start()
        url = f"pulsar://127.0.0.1:{server.getsockname()[1]}"
        result = CliRunner().invoke(cli, ["plugins", "--json", "--pulsar-url", url],
                                    env={"TGHOST_LOAD_PLUGINS": "count"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["old_code"] is None
    assert result.stderr.startswith(f"note: cannot read the live hosts at {url} (not a Pulsar broker at {url}")
    assert result.stderr.endswith("): not checked whether one serves a plugin at its old code\n")
