"""ledger: applying announcements to host instances without a broker: manifests undo forged
withdrawals, a new instance replaces an old one, two live ones are a reported clash (an old one that only
withdraws hands over), duplicates
are dropped silently and rejections are summarised. Messages are built by a real Announcer."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import tghost
from tghost.agent.ledger import DUPLICATE, OVER_LIMIT, STALE, Ledger, order
from tghost.announcing.announcer import Announcer, HostIdentity, announcement_key
from tghost.discovery.discover import catalog_of
from tghost.protocol.trust import BAD_SIGNATURE, Signer, TrustedKeys


@tghost.tool(group=["math"])
async def count(text: str) -> int:
    """Count characters."""
    return len(text)


@tghost.tool
async def shout(text: str) -> str:
    """Shout the text."""
    return text.upper()


def announcer(host: str = "h", instance: str | None = None) -> Announcer:
    identity = HostIdentity(host, "localhost", os.getpid(), **({"instance": instance} if instance else {}))
    return Announcer(catalog_of([count, shout]), identity, lease=30.0)


def feed(ledger: Ledger, *messages: tuple[str, dict[str, Any]]) -> None:
    for key, value in messages:
        ledger.apply(json.dumps(value).encode(), time.time(), key)


def live(ledger: Ledger) -> dict[tuple[str, str], list[str]]:
    """(kind, name) -> the instances claiming it now."""
    return {key: sorted(instance for _, instance in claims) for key, claims in ledger.claims.items()}


def heartbeat(host: Announcer) -> tuple[str, dict[str, Any]]:
    time.sleep(0.001)  # every message of one key is sent later than the last
    return host._message("host", host.identity.id, None, None, "available")


def test_a_forged_withdrawal_is_undone_by_the_hosts_next_heartbeat() -> None:
    ledger, host = Ledger("t"), announcer(instance="i1")
    feed(ledger, *host._messages("available"))
    assert live(ledger)[("tool", "count")] == ["i1"]
    time.sleep(0.001)
    forged = host._message("tool", "count", None, None, "withdrawn")  # the same host and instance, forged
    feed(ledger, forged)
    assert ("tool", "count") not in live(ledger)
    feed(ledger, heartbeat(host))  # the manifest still lists "count"
    assert live(ledger)[("tool", "count")] == ["i1"]
    time.sleep(0.001)
    feed(ledger, host._message("host", "h", None, None, "withdrawn"))  # forged too
    assert live(ledger) == {} and ledger.hosts == {}
    feed(ledger, heartbeat(host))
    assert sorted(live(ledger)) == [("tool", "count"), ("tool", "shout"), ("tool-service", "count"),
                                    ("tool-service", "shout")]


def test_a_genuine_withdrawal_stays_withdrawn_through_later_heartbeats() -> None:
    ledger, host = Ledger("t"), announcer()
    feed(ledger, *host._messages("available"))
    part = catalog_of([shout])
    for key in [("tool-service", "shout"), ("tool", "shout")]:
        host._since.pop(key)  # what Announcer.publish(part, "withdrawn") does before it sends
    feed(ledger, *host._messages("withdrawn", [("tool-service", "shout"), ("tool", "shout")]))
    feed(ledger, heartbeat(host), heartbeat(host))
    assert sorted(live(ledger)) == [("tool", "count"), ("tool-service", "count")]
    assert part.tools["shout"].name == "shout"


def test_a_new_instance_replaces_the_old_one_and_an_old_one_speaking_again_is_a_clash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = Ledger("t")
    old, new = announcer(instance="old"), announcer(instance="new")
    feed(ledger, *old._messages("available"))
    feed(ledger, *new._messages("available"))  # a restart after a crash: the old one never withdrew
    assert live(ledger)[("tool", "count")] == ["new"] and ledger.clashes == {}
    assert ledger.hosts["h"].instances == ("new",)
    with caplog.at_level(logging.WARNING, logger="tghost"):
        feed(ledger, heartbeat(old), heartbeat(new), heartbeat(old), heartbeat(new))
    assert ledger.clashes == {"h": ("new", "old")}
    assert live(ledger)[("tool", "count")] == ["new", "old"]  # both kept, never merged
    clash_lines = [r for r in caplog.records if "announced by 2 live processes" in r.getMessage()]
    assert len(clash_lines) == 1 and "--host-id" in clash_lines[0].getMessage()
    feed(ledger, *old._messages("withdrawn"))
    assert ledger.clashes == {} and live(ledger)[("tool", "count")] == ["new"]


def test_a_replaced_instance_holds_its_entries_until_the_new_one_claims_them_and_may_withdraw_with_no_clash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = Ledger("t")
    old, new = announcer(instance="old"), announcer(instance="new")
    feed(ledger, *old._messages("available"))
    first, *rest = new._messages("available")  # tghost run --reload: the new worker announces first
    with caplog.at_level(logging.WARNING, logger="tghost"):
        feed(ledger, first)  # its host message: its manifest lists count, whose own message has not come
        assert live(ledger)[("tool", "count")] == ["old"]  # so the old instance's claim holds: no gap
        feed(ledger, *rest)
        feed(ledger, *old._messages("withdrawn"))  # then the old one withdraws and stops
    assert ledger.clashes == {} and not [r for r in caplog.records if "live processes" in r.getMessage()]
    assert live(ledger)[("tool", "count")] == ["new"] and ledger.hosts["h"].instances == ("new",)


def test_a_byte_identical_duplicate_is_counted_silently_and_an_older_copy_is_stale(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger, host = Ledger("t", report_interval=0), announcer()
    first = list(host._messages("available"))
    beat = heartbeat(host)
    feed(ledger, *first, beat)
    with caplog.at_level(logging.WARNING, logger="tghost"):
        feed(ledger, beat, beat, first[0])
        ledger.flush_rejections(time.time())
    assert ledger.rejections == {DUPLICATE: 2, STALE: 1}
    assert [r.getMessage() for r in caplog.records] == [
        f"ignored 1 announcement(s) on t: stale (e.g. key 'host/h@h': sent at {first[0][1]['lease']['sent_at']}, "
        f"not after {beat[1]['lease']['sent_at']} (a replay?))"]


def test_rejections_are_summarised_one_line_per_reason_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = Ledger("t", report_interval=3600)
    with caplog.at_level(logging.DEBUG, logger="tghost"):
        for _ in range(433):
            ledger.apply(b"not json", time.time(), "k")
        ledger.apply(b"[]", time.time(), "k")
        ledger.flush_rejections(time.time())  # the first summary is due at once
        ledger.apply(b"{}", time.time(), "k")
        ledger.flush_rejections(time.time())  # not again within the interval
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["ignored 434 announcement(s) on t: invalid (e.g. key 'k': not JSON (Expecting value: "
                        "line 1 column 1 (char 0)))"]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 435  # each one, for --log-level debug
    assert ledger.rejections == {"invalid": 435}
    ledger.flush_rejections(time.time(), force=True)
    assert caplog.records[-1].getMessage().startswith("ignored 1 announcement(s) on t: invalid")


def feed_at(ledger: Ledger, publish_time: float, *messages: tuple[str, dict[str, Any]]) -> None:
    for key, value in messages:
        ledger.apply(json.dumps(value).encode(), publish_time, key)


def test_a_message_from_the_future_orders_by_its_publish_time_and_blocks_nothing_after_it() -> None:
    assert order(100.0, 90.0) == (90.0, 100.0)  # sent "later" than published: counts from the publish time
    assert order(80.0, 90.0) == (80.0, 80.0)  # a clock behind the broker's: by sent_at
    assert order(80.0, 0) == (80.0, 80.0)  # no publish time known
    ledger, host = Ledger("t"), announcer(instance="i1")
    now = time.time()
    feed_at(ledger, now, *host._messages("available", now=now))
    feed_at(ledger, now + 1, host._message("host", "h", None, None, "withdrawn", now + 55))  # forged, 55 s ahead
    assert ledger.hosts == {}
    feed_at(ledger, now + 2, host._message("host", "h", None, None, "available", now + 2))  # the next heartbeat
    assert list(ledger.hosts) == ["h"] and ledger.rejections == {}
    feed_at(ledger, now + 3, host._message("host", "h", None, None, "available", now - 10))  # a replay of an old one
    assert ledger.rejections == {STALE: 1}


def test_a_lease_counts_at_most_max_lease_seconds(caplog: pytest.LogCaptureFixture) -> None:
    ledger, host = Ledger("t", max_lease=60.0), Announcer(catalog_of([count]), HostIdentity("h", "x", 1), lease=600)
    now = time.time()
    with caplog.at_level(logging.WARNING, logger="tghost"):
        feed_at(ledger, now, *host._messages("available", now=now))
    assert [r.getMessage() for r in caplog.records] == [
        "host h announces a lease of 600.0s: it counts as 60.0s here (max_lease), so the host may expire between "
        "its heartbeats; give it --lease 60.0 or less"]
    assert ledger.hosts["h"].expires_at == pytest.approx(now + 60.0)
    ledger.expire(now + 61)
    assert ledger.claims == {} and ledger.hosts == {}


def test_a_host_instance_announcing_more_than_max_entries_is_refused_the_rest_and_counted() -> None:
    tools = [count.tool(f"count-{i}") for i in range(10)]
    host = Announcer(catalog_of([count], tools), HostIdentity("h", "x", 1), lease=30.0)
    ledger = Ledger("t", max_entries=5)
    feed(ledger, *host._messages("available"))
    assert ledger.rejections[OVER_LIMIT] > 0  # the manifest lists 12 entries: refused
    flood = Ledger("t", max_entries=5)
    feed(flood, *[m for m in host._messages("available") if m[1]["kind"] != "host"])
    assert len(flood.claims) == 5 and flood.rejections == {OVER_LIMIT: 7}


def test_entries_a_host_withdrew_do_not_count_against_max_entries() -> None:
    ledger, host = Ledger("t", max_entries=4), announcer(instance="i1")  # count and shout: 4 entries
    feed(ledger, *host._messages("available"))
    for key in [("tool-service", "shout"), ("tool", "shout")]:
        host._since.pop(key)
    feed(ledger, *host._messages("withdrawn", [("tool-service", "shout"), ("tool", "shout")]))
    host._since.update({("tool-service", "shout"): time.time(), ("tool", "shout"): time.time()})
    time.sleep(0.001)
    feed(ledger, *host._messages("available"), heartbeat(host), heartbeat(host))  # back again, and beating
    assert ledger.rejections == {} and len(ledger.claims) == 4 and list(ledger.hosts) == ["h"]


def test_a_value_signed_for_another_topic_is_refused() -> None:
    signer = Signer(Ed25519PrivateKey.generate())
    host = Announcer(catalog_of([count]), HostIdentity("h", "x", 1), "persistent://tg/config/team-a",
                     lease=30.0, signer=signer)
    elsewhere = Ledger("persistent://tg/config/team-b", TrustedKeys([signer.public_key]))
    feed(elsewhere, *host._messages("available"))
    assert elsewhere.claims == {} and elsewhere.rejections == {BAD_SIGNATURE: 3}
    home = Ledger("persistent://tg/config/team-a", TrustedKeys([signer.public_key]))
    feed(home, *host._messages("available"))
    assert len(home.claims) == 2 and home.rejections == {}


def test_a_host_message_announces_the_hosts_health_url_and_no_other_message_may() -> None:
    """docs/protocol.md §4.3 ``health``: an OPTIONAL field of host messages, kept per instance;
    a host without one (an older host) is as before, and on a tool message it is ``invalid``."""
    ledger, older = Ledger("t"), announcer("older")
    watched = Announcer(catalog_of([count]), HostIdentity("watched", "localhost", os.getpid()), lease=30.0,
                        health_url="http://127.0.0.1:9464/health")
    feed(ledger, *older._messages("available"), *watched._messages("available"))
    assert {v.host["id"]: v.health for v in ledger.instances()} == {"older": None,
                                                                      "watched": "http://127.0.0.1:9464/health"}
    assert "health" not in dict(older._messages("available"))["host/older@older"]
    assert ledger.instances()[1].to_json()["health"] == "http://127.0.0.1:9464/health"
    key, value = watched._message("tool", "count", None, None, "available")
    feed(ledger, (key, {**value, "health": "http://elsewhere/health", "lease": {**value["lease"],
                                                                                "sent_at": time.time() + 1}}))
    assert ledger.rejections["invalid"] == 1


def test_a_forgotten_host_leaves_nothing_in_the_index_whichever_instance_went_last() -> None:
    """The older instance announced ``count`` and is forgotten first; the newer one, which never
    did, last: no name of the host stays remembered."""
    ledger, old = Ledger("t"), announcer(instance="old")
    new = Announcer(catalog_of([shout]), HostIdentity("h", "localhost", os.getpid(), instance="new"), lease=30.0)
    feed(ledger, *old._messages("available"))
    time.sleep(0.01)  # the newer lease ends later: the older instance is forgotten first
    feed(ledger, *new._messages("available"))
    assert ledger.remembered_names("tool") == {"count", "shout"}
    ledger.expire(time.time() + 10_000)
    assert ledger.remembered_names("tool") == set() and ledger.remembered_names("tool-service") == set()


def test_withdrawn_entries_pruned_from_a_host_leave_the_index_too() -> None:
    """An instance keeps at most twice ``max_entries`` entries, withdrawn ones pruned first: a
    host that cycles through names must not grow the index of remembered names."""
    ledger = Ledger("t", max_entries=2)

    def tool(name: str, status: str) -> tuple[str, dict[str, Any]]:
        time.sleep(0.001)
        return announcement_key("tool", name, "h"), {
            "kind": "tool", "name": name, "status": status, "host": {"id": "h", "instance": "i1"}, "plugin": None,
            "lease": {"seconds": 30.0, "sent_at": time.time()},
            **({"descriptor": {"name": name, "description": "d", "service": "s"}} if status == "available" else {})}

    for batch in (["t0", "t1"], ["t2", "t3"]):
        feed(ledger, *(tool(name, "available") for name in batch), *(tool(name, "withdrawn") for name in batch))
    feed(ledger, tool("t4", "available"))  # over twice max_entries: the withdrawn ones are pruned
    assert ledger.remembered_names("tool") == {"t4"}
    assert ledger.held == len(ledger.instances()[0].entries) == 1  # what counts against max_total_entries
    ledger.expire(time.time() + 10_000)
    assert ledger.remembered_names("tool") == set() and ledger.held == 0


# -- the caps on what a directory holds (docs/protocol.md §4.7) ----------------------------------


def forged_host(host_id: str, instance: str = "i", names: int = 1000) -> tuple[str, dict[str, Any]]:
    """A forged host message whose manifest lists ``names`` tool names and nothing behind them."""
    now = time.time()
    return announcement_key("host", host_id, host_id), {
        "kind": "host", "name": host_id, "status": "available", "descriptor": None, "plugin": None,
        "host": {"id": host_id, "instance": instance}, "lease": {"seconds": 600.0, "sent_at": now}, "since": now,
        "entries": {"tool-service": [], "tool": [f"{host_id}-{i}" for i in range(names)]}}


def cap_warnings(caplog: pytest.LogCaptureFixture, cap: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and f"is over {cap}" in r.getMessage()]


def test_a_manifest_holds_nothing_for_the_names_whose_descriptors_never_came() -> None:
    """1,000 forged names cost no entry; the host's own entries, once they come, are as before."""
    ledger = Ledger("t")
    feed(ledger, forged_host("forged"))
    assert ledger.held == 0 and ledger.instances()[0].entries == () and ledger.claims == {}
    feed(ledger, *announcer()._messages("available"))
    assert ledger.held == 4 and sorted(name for _, name in ledger.claims) == ["count", "count", "shout", "shout"]


def test_new_host_ids_past_max_hosts_are_dropped_undecoded_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    ledger, hosts = Ledger("t", max_hosts=2), [announcer(f"h{i}") for i in range(2)]
    feed(ledger, *hosts[0]._messages("available"), *hosts[1]._messages("available"))
    with caplog.at_level(logging.WARNING, logger="tghost"):
        feed(ledger, *(forged_host(f"forged-{i}") for i in range(50)))
        ledger.apply(b"not even JSON", time.time(), "host/forged-x@forged-x")  # dropped before decoding
        feed(ledger, heartbeat(hosts[0]), heartbeat(hosts[1]))  # the hosts held keep their place
    assert ledger.rejections == {OVER_LIMIT: 51} and sorted(ledger.hosts) == ["h0", "h1"]
    [warning] = cap_warnings(caplog, "max_hosts")
    assert "host 'forged-0' is over max_hosts (2)" in warning and "--max-hosts" in warning, warning
    ledger.expire(time.time() + 10_000)  # every host forgotten: room again, and the next one past it is said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tghost"):
        feed(ledger, *(forged_host(f"again-{i}") for i in range(4)))
    assert sorted(ledger.hosts) == ["again-0", "again-1"] and len(cap_warnings(caplog, "max_hosts")) == 1


def test_a_host_id_with_an_at_sign_is_known_by_its_key_when_the_directory_is_full() -> None:
    ledger = Ledger("t", max_hosts=1)
    feed(ledger, forged_host("team@lab"))
    feed(ledger, forged_host("team@lab", instance="j"), forged_host("lab"))
    assert [(v.host["id"], v.host["instance"]) for v in ledger.instances()] == [("team@lab", "i"), ("team@lab", "j")]
    assert ledger.rejections == {OVER_LIMIT: 1}


def test_instances_of_one_host_id_past_max_instances_are_dropped_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One host id, 1,000 instances: the first 4 are remembered (each replacing the one before),
    the rest dropped; the instances held keep their place."""
    ledger = Ledger("t", max_instances=4)
    with caplog.at_level(logging.WARNING, logger="tghost"):
        feed(ledger, *(forged_host("h", instance=f"i{n:04d}", names=10) for n in range(1000)))
    assert [v.host["instance"] for v in ledger.instances()] == ["i0000", "i0001", "i0002", "i0003"]
    assert ledger.hosts["h"].instances == ("i0003",) and ledger.rejections == {OVER_LIMIT: 996}
    [warning] = cap_warnings(caplog, "max_instances")
    assert "host 'h' (instance 'i0004') is over max_instances (4)" in warning, warning
    feed(ledger, forged_host("h", instance="i0003", names=10), forged_host("other", instance="i0004"))
    assert ledger.rejections == {OVER_LIMIT: 996} and sorted(ledger.hosts) == ["h", "other"]


def test_entries_past_max_total_entries_are_dropped_before_validation_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two hosts of 4 entries each under a cap of 6: the first keeps all 4, the second gets 2,
    and may still announce those two again."""
    ledger, first, second = Ledger("t", max_total_entries=6), announcer("first"), announcer("second")
    feed(ledger, *first._messages("available"))
    with caplog.at_level(logging.WARNING, logger="tghost"):
        feed(ledger, *second._messages("available"))
        key, value = second._message("tool", "more", None, None, "available")
        feed(ledger, (key, {**value, "descriptor": "not even a descriptor"}))  # refused before validation
    assert ledger.held == 6 and ledger.rejections == {OVER_LIMIT: 3}
    assert len([k for k, claims in ledger.claims.items() if any(h == "first" for h, _ in claims)]) == 4
    [warning] = cap_warnings(caplog, "max_total_entries")
    assert "host 'second'" in warning and "is over max_total_entries (6)" in warning, warning
    time.sleep(0.001)
    feed(ledger, *second._messages("available"))  # what it holds is announced again: no new entry
    assert ledger.held == 6 and ledger.rejections[OVER_LIMIT] == 5


def test_a_forgotten_host_leaves_no_trace_so_a_flood_rotating_host_ids_holds_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What is said once per host (a lease past max_lease) is said again once the host was
    forgotten: nothing of it was kept."""
    ledger = Ledger("t", max_lease=10.0)
    with caplog.at_level(logging.WARNING, logger="tghost"):
        feed(ledger, forged_host("h", names=0))
        feed(ledger, forged_host("h", names=0))
        ledger.expire(time.time() + 10_000)
        feed(ledger, forged_host("h", names=0))
    assert len([r for r in caplog.records if "announces a lease of 600.0s" in r.getMessage()]) == 2
