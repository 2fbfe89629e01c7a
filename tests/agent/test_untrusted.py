"""agent.untrusted: what hosts the trusted keys ignore announce, as a hint: live by their host
messages' leases, gone on a withdrawal, and bounded in hosts and entries. No broker."""

from __future__ import annotations

from typing import Any

from tghost.agent.untrusted import Untrusted

NOW = 1_000_000.0


def message(kind: str, name: str, host: str, status: str = "available", lease: float = 30) -> dict[str, Any]:
    """An announcement value as an ignored host sends it (only the fields the hint reads)."""
    return {"kind": kind, "name": name, "status": status, "host": {"id": host}, "lease": {"seconds": lease}}


def heard(untrusted: Untrusted, host: str, *tools: str, reason: str = "unsigned", at: float = NOW) -> None:
    untrusted.note(message("host", host, host), reason, at)
    for tool in tools:
        untrusted.note(message("tool", tool, host), reason, at)


def test_a_tool_is_served_by_the_ignored_hosts_whose_lease_runs_with_why_each_is_ignored() -> None:
    untrusted = Untrusted(max_hosts=10, max_lease=600)
    heard(untrusted, "a", "calculate")
    heard(untrusted, "b", "calculate", reason="unknown-key")
    untrusted.note(message("tool", "calculate", "c"), "unsigned", NOW)  # no host message: no lease
    assert untrusted.serving(("tool", "calculate"), NOW + 1) == {"a": "unsigned", "b": "unknown-key"}
    assert untrusted.serving(("tool", "calculate"), NOW + 31) == {}  # their leases ran out
    assert untrusted.serving(("tool-service", "calculate"), NOW) == {}


def test_a_withdrawal_ends_an_entry_and_a_withdrawn_host_all_of_its() -> None:
    untrusted = Untrusted(max_hosts=10, max_lease=600)
    heard(untrusted, "a", "calculate", "shout")
    untrusted.note(message("tool", "calculate", "a", "withdrawn"), "unsigned", NOW)
    assert untrusted.serving(("tool", "calculate"), NOW) == {}
    assert untrusted.serving(("tool", "shout"), NOW) == {"a": "unsigned"}
    untrusted.note(message("host", "a", "a", "withdrawn"), "unsigned", NOW)
    assert untrusted.serving(("tool", "shout"), NOW) == {}


def test_it_holds_at_most_its_caps_and_makes_room_for_hosts_whose_lease_ended() -> None:
    untrusted = Untrusted(max_hosts=2, max_lease=600, max_entries=3)
    heard(untrusted, "a", "t1", "t2")
    heard(untrusted, "b", "t3", "t4")  # t4 is past the entries cap: not noted
    heard(untrusted, "c", "t5")  # past the hosts cap while a and b are live: not noted
    assert [untrusted.serving(("tool", t), NOW) for t in ("t3", "t4", "t5")] == [{"b": "unsigned"}, {}, {}]
    heard(untrusted, "c", "t5", at=NOW + 60)  # a's and b's leases ended: their place is c's
    assert untrusted.serving(("tool", "t5"), NOW + 60) == {"c": "unsigned"}
    assert untrusted.serving(("tool", "t1"), NOW + 60) == {}


def test_a_value_without_the_fields_it_needs_is_skipped() -> None:
    untrusted = Untrusted(max_hosts=10, max_lease=600)
    for value in ({}, {"kind": "tool", "name": 5, "host": {"id": "a"}}, {"kind": "x", "name": "n", "host": {"id": "a"}},
                  {"kind": "tool", "name": "n", "host": "a"}, {**message("host", "a", "a"), "lease": "long"}):
        untrusted.note(value, "unsigned", NOW)
    assert untrusted.serving(("tool", "n"), NOW) == {}


def test_a_name_or_host_id_no_announcement_could_hold_is_skipped() -> None:
    # the hint reads messages nothing vouches for: a 1 MiB name or a host id with a terminal escape must neither
    # cost its size in memory, for each of the entries held, nor reach a no-provider line on a terminal
    untrusted = Untrusted(max_hosts=10, max_lease=600)
    long_name, long_host, escape = "t" * 500_000, "h" * 500_000, "evil\x1b[2J"
    heard(untrusted, "a", long_name, "bad name!")
    heard(untrusted, long_host, "calculate")
    heard(untrusted, escape, "calculate")
    assert untrusted.serving(("tool", long_name), NOW) == {}
    assert untrusted.serving(("tool", "bad name!"), NOW) == {}
    assert untrusted.serving(("tool", "calculate"), NOW) == {}
    assert sum(len(keys) for keys in untrusted._keys.values()) == 0
