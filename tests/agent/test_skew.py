"""Skew (docs/protocol.md §4.8): a tool service whose live providers announce different code
(distribution, version or fingerprint of their ``plugin`` objects) is listed with each version
and its hosts, logged once per skew appearing, and never refused. Offline: messages are fed to
a directory that never connects."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest

import tghost
from tghost.agent.directory import ToolDirectory
from tghost.agent.entries import CodeVersion
from tghost.agent.hosts import live_hosts
from tghost.announcing.announcer import Announcer, HostIdentity
from tghost.discovery.discover import catalog_of
from tghost.pulsar.clients import PulsarSettings

OLD = {"entry_point": "joke", "distribution": "tghost-joke", "version": "0.1.0", "fingerprint": "a" * 64}
NEW = {**OLD, "fingerprint": "b" * 64}


@tghost.tool(service="joke-service", name="tell-joke")
async def tell_joke(topic: str) -> str:
    """Tell a joke on a given topic."""
    return f"a joke about {topic}"


def offline() -> ToolDirectory:
    return ToolDirectory(PulsarSettings("pulsar://127.0.0.1:1"), "unused")


def host(host_id: str, plugin: dict[str, Any] | None, status: str = "available") -> list[tuple[str, dict[str, Any]]]:
    """What host ``host_id`` (one process: one instance id) sends serving ``tell_joke`` from ``plugin``."""
    identity = HostIdentity(host_id, "laptop", 42, instance=f"{host_id}-instance")
    announcer = Announcer(catalog_of([tell_joke]), identity, lease=30.0)
    return [(key, {**value, "plugin": plugin if value["kind"] != "host" else None})
            for key, value in announcer._messages(status)]


def feed(found: ToolDirectory, messages: list[tuple[str, dict[str, Any]]]) -> None:
    for key, value in messages:
        found._resolve(found._apply(json.dumps(value).encode(), time.time(), key), "removed")


def test_providers_of_one_code_are_no_skew() -> None:
    found = offline()
    feed(found, host("one", OLD) + host("two", dict(OLD)))
    tool = found.tools["tell-joke"]
    assert not tool.skewed and tool.service.skew == () and tool.to_json()["skew"] == []


def test_another_fingerprint_is_skew_listed_with_each_version_and_its_hosts_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    found = offline()
    with caplog.at_level(logging.WARNING, logger="tghost.agent.directory"):
        feed(found, host("one", OLD) + host("two", NEW) + host("three", NEW))
    tool = found.tools["tell-joke"]
    assert tool.skewed
    assert tool.service.skew == (CodeVersion("tghost-joke", "0.1.0", "a" * 64, ("one",)),
                                 CodeVersion("tghost-joke", "0.1.0", "b" * 64, ("two", "three")))
    assert tool.to_json()["skew"] == [{"distribution": "tghost-joke", "version": "0.1.0", "fingerprint": "a" * 64,
                                       "hosts": ["one"]},
                                      {"distribution": "tghost-joke", "version": "0.1.0", "fingerprint": "b" * 64,
                                       "hosts": ["two", "three"]}]
    skewed = [r.getMessage() for r in caplog.records if "skewed" in r.getMessage()]
    assert len(skewed) == 1, skewed  # the third host serves a version already listed: no new line
    assert "tghost-joke 0.1.0 (code aaaaaaaaaaaa) on host(s) one" in skewed[0]
    assert "tghost-joke 0.1.0 (code bbbbbbbbbbbb) on host(s) two." in skewed[0]  # when it appeared
    assert found.check("tell-joke", groups=["*"]).skewed  # listed, never refused
    assert [h.id for h in live_hosts(found) if h.skewed == ("joke-service",)] == ["one", "three", "two"]


def test_skew_ends_when_the_other_version_leaves(caplog: pytest.LogCaptureFixture) -> None:
    found = offline()
    feed(found, host("one", OLD) + host("two", {**OLD, "version": "0.2.0"}))
    assert found.tools["tell-joke"].skewed
    with caplog.at_level(logging.INFO, logger="tghost.agent.directory"):
        feed(found, host("two", {**OLD, "version": "0.2.0"}, status="withdrawn"))
    assert not found.tools["tell-joke"].skewed
    assert any("serve one version of its code again" in r.getMessage() for r in caplog.records)


def test_a_provider_without_a_fingerprint_agrees_with_its_distribution_and_version() -> None:
    found = offline()
    unfingerprinted = {key: value for key, value in OLD.items() if key != "fingerprint"}
    feed(found, host("old-tghost", unfingerprinted) + host("one", OLD))
    assert not found.tools["tell-joke"].skewed
    feed(found, host("two", NEW))  # two fingerprints: skew, without the host that gives none
    assert [v.hosts for v in found.tools["tell-joke"].service.skew] == [("one",), ("two",)]


def test_another_distribution_or_none_is_skew() -> None:
    found = offline()
    feed(found, host("one", OLD) + host("embedded", {"entry_point": "local", "distribution": None, "version": None}))
    assert [v.describe() for v in found.tools["tell-joke"].service.skew] == [
        "tghost-joke 0.1.0 (code aaaaaaaaaaaa) on host(s) one", "no distribution (no version) on host(s) embedded"]
