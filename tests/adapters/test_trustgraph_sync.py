"""trustgraph.sync: the plan of one pass (what to put, delete and leave alone), and the command's
errors. The sync against TrustGraph's own config service is tests/adapters/test_trustgraph_interop.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.conftest import tghost_cli
from tghost.adapters.trustgraph.sync import MARKER, ItemChange, plan
from tghost.broker import EmbeddedBroker

OWNER = "tghost"


def service(sid: str, *required: str, owner: str | None = OWNER) -> dict[str, Any]:
    value: dict[str, Any] = {"id": sid, "request-queue": f"non-persistent://tg/request/{sid}",
                             "response-queue": f"non-persistent://tg/response/{sid}",
                             "config-params": [{"name": p, "required": True} for p in required]}
    return value if owner is None else {**value, MARKER: owner}


def tool(name: str, sid: str, owner: str | None = OWNER, **config: Any) -> dict[str, Any]:
    value = {"type": "tool-service", "name": name, "description": f"The {name} tool.", "service": sid, **config}
    return value if owner is None else {**value, MARKER: owner}


def stored(items: dict[tuple[str, str], dict[str, Any] | str]) -> dict[tuple[str, str], str | None]:
    """Items as the config service stores them: value strings (JSON, as written)."""
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in items.items()}


def changes(result: Any) -> set[str]:
    return {str(change) for change in result.changes}


def test_missing_items_are_put_changed_ones_updated_and_equal_ones_left() -> None:
    desired = {("tool-service", "kb"): service("kb"), ("tool", "ask"): tool("ask", "kb"),
               ("tool", "same"): tool("same", "kb")}
    current = stored({("tool", "ask"): {**tool("ask", "kb"), "description": "old"},
                      ("tool", "same"): tool("same", "kb")})
    result = plan(desired, current, OWNER)
    assert result.puts == {("tool-service", "kb"): service("kb"), ("tool", "ask"): tool("ask", "kb")}
    assert result.deletes == []
    assert changes(result) == {"put tool-service/kb (added)", "put tool/ask (updated)"}
    assert [key for key in result.puts] == [("tool-service", "kb"), ("tool", "ask")]  # services first


def test_items_it_did_not_write_are_never_put_or_deleted() -> None:
    desired = {("tool-service", "kb"): service("kb"), ("tool", "ask"): tool("ask", "kb"),
               ("tool-service", "free"): service("free"), ("tool", "taken"): tool("taken", "free")}
    current = stored({("tool-service", "kb"): service("kb", owner=None),  # the user's own, same id
                      ("tool", "taken"): tool("taken", "other", owner="someone-else"),
                      ("tool", "unreadable"): "not json",
                      ("tool", "unmarked"): tool("unmarked", "kb", owner=None)})
    result = plan(desired, current, OWNER)
    assert result.puts == {("tool-service", "free"): service("free")}
    assert result.deletes == []
    skipped = {(c.type, c.key): c.reason for c in result.changes if c.action == "skip"}
    assert set(skipped) == {("tool-service", "kb"), ("tool", "ask"), ("tool", "taken")}
    assert "is not marked tghost-sync='tghost'" in skipped[("tool-service", "kb")]
    assert skipped[("tool", "ask")] == "its tool-service/kb is not written by this sync"


def test_items_of_tools_gone_are_deleted_tools_first_with_the_reason() -> None:
    current = stored({("tool-service", "kb"): service("kb"), ("tool", "ask"): tool("ask", "kb"),
                      ("tool", "keep"): tool("keep", "kb")})
    desired = {("tool-service", "kb"): service("kb"), ("tool", "keep"): tool("keep", "kb")}
    result = plan(desired, current, OWNER, lambda key: "expired")
    assert result.deletes == [("tool", "ask")] and result.puts == {}
    assert changes(result) == {"delete tool/ask (expired)"}
    result = plan({}, current, OWNER, lambda key: "withdrawn")
    assert result.deletes == [("tool", "ask"), ("tool", "keep"), ("tool-service", "kb")]
    assert ItemChange("delete", "tool-service", "kb", "unused") in result.changes


def test_a_service_a_foreign_tool_still_uses_is_kept() -> None:
    current = stored({("tool-service", "kb"): service("kb"), ("tool", "ask"): tool("ask", "kb"),
                      ("tool", "theirs"): tool("theirs", "kb", None)})
    result = plan({}, current, OWNER)
    assert result.deletes == [("tool", "ask")]
    assert ItemChange("skip", "tool-service", "kb", "unused by tghost, but a tool tghost does not own uses it") \
        in result.changes


def test_a_tool_lacking_a_required_config_param_is_not_written() -> None:
    """TrustGraph's agent drops its whole tool config on such a tool, not just the tool."""
    desired = {("tool-service", "kb"): service("kb", "collection"), ("tool", "bad"): tool("bad", "kb"),
               ("tool", "good"): tool("good", "kb", collection="customers")}
    result = plan(desired, {}, OWNER)
    assert set(result.puts) == {("tool-service", "kb"), ("tool", "good")}
    assert ItemChange("skip", "tool", "bad", "lacks required config param(s) ['collection'] of service 'kb'") \
        in result.changes


def test_sync_once_without_a_config_service_exits_1_and_says_what_to_check(
    pulsar_broker: EmbeddedBroker, tmp_path: Path,
) -> None:
    result = tghost_cli("trustgraph", "sync", "--once", "--timeout", "1", "--pulsar-url", pulsar_broker.url,
                    "--config-request-queue", "request:tg:nobody-here",
                    env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)})
    assert result.returncode == 1
    assert "did not answer on non-persistent://tg/request/nobody-here within 1.0s" in result.stderr
    assert "is TrustGraph's config-svc running" in result.stderr


def test_sync_rejects_a_queue_that_is_neither_a_topic_nor_a_queue_id(tmp_path: Path) -> None:
    result = tghost_cli("trustgraph", "sync", "--once", "--config-request-queue", "bogus:tg:config",
                    env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)})
    assert result.returncode == 2 and "unknown queue class 'bogus'" in result.stderr


def test_sync_needs_a_workspace_name(tmp_path: Path) -> None:
    result = tghost_cli("trustgraph", "sync", "--once", "--workspace", "",
                    env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)})
    assert result.returncode == 2 and "needs a workspace name" in result.stderr
