"""Scale: a fleet of hosts with 100 tools each announcing on the epoch topics
(docs/protocol.md §4), and what the fleet costs the broker and a directory. docs/internals/scale.md
extrapolates from these figures.

1. messages: the size of each announcement one host sends, built by the real Announcer
   (unsigned and signed).
2. traffic: one host's messages and bytes per second in steady state, by arithmetic on those
   sizes and by counting a simulated day of the same host. The host sends a heartbeat every
   lease/3, restates everything on each new epoch and restarts once a day.
3. live: real Announcers on the embedded broker, on a scaled clock (lease 3 s, epochs of
   15 s). For each host, the messages it sent are set against the number the simulation's model
   gives for the same span of time.
4. fleet: each fleet of ``FLEETS`` (100 to 1,000 hosts). Its announcements since the start of
   the epoch are built by the Announcer and published on the embedded broker: restatements,
   heartbeats, the restarts that fall in that time at one a day per host, and a rolling
   upgrade of 10% of the hosts in its last minute. Heartbeats then keep the hosts alive. Then
   a fresh ToolDirectory starts, each time in a process of its own, and is measured: catch-up
   time, messages read, and the process's resident memory (RSS) before and after, per tool;
   then, caught up, what each heartbeat and restatement message costs its follow path. The
   last directory on each fleet then follows a restatement of the whole fleet at once (as at
   each epoch's start): how long until it has applied it, and how many tools expired meanwhile.

Nothing here asserts anything about time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import heapq
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tghost import __version__
from tghost.agent.directory import ToolDirectory
from tghost.announcing.announcer import Announcer, HostIdentity
from tghost.author.arguments import closed_schema
from tghost.author.service import ToolService
from tghost.discovery.catalog import Catalog
from tghost.discovery.discover import catalog_of
from tghost.protocol.announcement import EPOCH_SECONDS, epoch_of, epoch_topic, read_window
from tghost.protocol.descriptors import Argument, schema_of_arguments
from tghost.protocol.trust import Signer
from tghost.pulsar.clients import PulsarSettings
from tghost.testing import Sent, publish_history

from .common import broker, report, rss_mib, since_ms, unique_topic
from .search_set import TOOLS

#: Tools each simulated host serves, all over one tool service of its own.
TOOLS_PER_HOST = 100
#: tghost's default lease (seconds): a heartbeat every third of it.
LEASE = 30.0
#: Restarts of each host a day, spread evenly over the day and over the fleet.
RESTARTS_PER_DAY = 1.0
#: Share of the hosts that a rolling upgrade restarts during the last ``UPGRADE_SECONDS`` of the history.
UPGRADE_SHARE = 0.1
UPGRADE_SECONDS = 60.0
#: A directory's default ``max_clock_skew`` (seconds, docs/protocol.md §4.6).
SKEW = 60.0
#: The history always covers at least this many seconds (the start of the epoch that began
#: this long ago, at the latest), so the rolling upgrade fits in it.
HISTORY_MIN = 90.0
DAY = 86_400.0
#: The fleets measured at full size: (hosts, fresh directories started on it).
FLEETS = [(100, 3), (300, 2), (1000, 1)]
#: Hosts whose heartbeat and restatement a caught-up directory's follow path is timed on.
FOLLOW_SAMPLE = 5
#: Seconds the fleet's process waits for a directory to catch up, and a directory for a burst to be applied.
BURST_TIMEOUT = 120.0


class TeamService(ToolService):
    """What each simulated host serves: one service, each tool one of its collections."""

    description = "A team's data service: each tool is one collection of it, asked in plain language."
    config_params = ("collection",)

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return ""  # never called: the fleet only announces


def host_catalog(h: int) -> Catalog:
    """Host ``h``'s catalog: service ``team-<h>`` and ``TOOLS_PER_HOST`` tools over it, each named,
    described and with arguments as one of the realistic tools of :mod:`bench.search_set`."""
    service = TeamService()
    service.id = f"team-{h:05d}"
    tools = []
    for i in range(TOOLS_PER_HOST):
        name, description, args = TOOLS[i % len(TOOLS)]
        arguments = [Argument(name=a, description=d) for a, d in args.items()]
        tools.append(service.tool(f"{name}-{h:05d}-{i:02d}", description, collection=name,
                                  arguments=[a.model_dump() for a in arguments],
                                  **{"input-schema": closed_schema(schema_of_arguments(arguments), False)}))
    return catalog_of([service], tools)


def host_id(h: int) -> str:
    """A host id shaped like tghost's own (``<hostname>-<12 hex digits>``)."""
    return f"node-{h:05d}-{h * 2654435761 % 16**12:012x}"


def instance(catalog: Catalog, h: int, since: float, topic: str, version: str = __version__, *,
             lease: float = LEASE, epoch_seconds: float = EPOCH_SECONDS, signer: Signer | None = None,
             instance_id: str | None = None) -> Announcer:
    """The Announcer of an instance of host ``h`` that started at unix time ``since`` (a new
    instance, or the one ``instance_id`` names)."""
    identity = HostIdentity(host_id(h), f"node-{h:05d}", 1, version)
    if instance_id is not None:
        identity = dataclasses.replace(identity, instance=instance_id)
    announcer = Announcer(catalog, identity, topic, lease, signer, epoch_seconds=epoch_seconds)
    announcer._started_at, announcer._since = since, dict.fromkeys(announcer._since, since)
    return announcer


def sent(announcer: Announcer, status: str, at: float, everything: bool) -> Iterator[Sent]:
    """What ``announcer`` sends at unix time ``at``: everything (a start, a restatement or a
    withdrawal), or the heartbeat (its host message, with the manifest)."""
    messages = (announcer._messages(status, None, at) if everything
                else [announcer._message("host", announcer.identity.id, None, None, status, at)])
    where = epoch_topic(announcer.topic, epoch_of(at, announcer.epoch_seconds))
    return ((at, where, key, json.dumps(value).encode()) for key, value in messages)


def host_history(catalog: Catalog, h: int, start: float, end: float, restarts: Iterable[tuple[float, str]],
                 topic: str, *, lease: float = LEASE, epoch_seconds: float = EPOCH_SECONDS,
                 last: dict[int, Announcer] | None = None) -> Iterator[Sent]:
    """Host ``h``'s messages from unix time ``start`` to ``end``, in order. It sends everything at
    ``start`` (its first word on that epoch's topic), a heartbeat every lease/3 and everything
    again on each new epoch. At each ``(time, version)`` of ``restarts`` it withdraws everything,
    and 1 s later a new instance running ``version`` announces everything. ``last[h]`` is set to
    the Announcer alive at ``end``."""
    t, epoch = start, None
    announcer = instance(catalog, h, start - 3600.0, topic, lease=lease, epoch_seconds=epoch_seconds)
    for restart in [*restarts, None]:
        stop = end if restart is None else restart[0]
        while t < stop:
            everything = epoch_of(t, epoch_seconds) != epoch
            epoch = epoch_of(t, epoch_seconds)
            yield from sent(announcer, "available", t, everything)
            t += lease / 3
        if restart is None:
            break
        yield from sent(announcer, "withdrawn", restart[0], True)
        t, epoch = restart[0] + 1.0, None
        announcer = instance(catalog, h, t, topic, restart[1], lease=lease, epoch_seconds=epoch_seconds)
    if last is not None:
        last[h] = announcer


def restarts_of(h: int, hosts: int, start: float, end: float) -> list[tuple[float, str]]:
    """When host ``h`` of ``hosts`` restarts between ``start`` and ``end``, and the version it
    comes back with. Each host restarts ``RESTARTS_PER_DAY`` times a day, at a time of day of its
    own. Every ``1 / UPGRADE_SHARE``-th host is also upgraded: one after another, evenly over the
    last ``UPGRADE_SECONDS`` before ``end``."""
    times = []
    every = DAY / RESTARTS_PER_DAY
    offset = (h + 0.5) / hosts * every
    at = offset + every * -(-(start + 1.0 - offset) // every)  # the first at or after start + 1 s
    while at < end - 2.0:
        times.append((at, __version__))
        at += every
    step = round(1 / UPGRADE_SHARE)
    if h % step == step - 1:
        upgraded, slot = hosts // step, h // step
        at = end - UPGRADE_SECONDS + (slot + 0.5) * (UPGRADE_SECONDS - 2.0) / upgraded
        times = [t for t in times if abs(t[0] - at) > 2.0] + [(at, f"{__version__}.post1")]
    return sorted(times)


# -- 1 and 2: the messages one host sends, and its traffic ------------------------------------


def message_sizes(catalog: Catalog) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Rows of announcement sizes (bytes, unsigned and signed) of one host serving ``catalog``,
    and the sizes the traffic arithmetic uses."""
    now = time.time()
    plain = instance(catalog, 0, now, unique_topic())
    signed = instance(catalog, 0, now, plain.topic, signer=Signer(Ed25519PrivateKey.generate()))

    def sizes_of(announcer: Announcer, status: str, prefix: str | None) -> list[int]:
        """Sizes of the messages sent as ``status`` whose key starts with ``prefix`` (``""``: all of
        them) when everything is sent; with ``prefix`` ``None``, of the heartbeat alone."""
        return [len(value) for _, _, key, value in sent(announcer, status, now, everything=prefix is not None)
                if key.startswith(prefix or "")]

    rows = []
    for label, status, prefix in (("heartbeat: host message with the manifest", "available", None),
                                  ("tool-service, available", "available", "tool-service/"),
                                  ("tool, available", "available", "tool/"),
                                  ("tool, withdrawn", "withdrawn", "tool/"),
                                  ("host, withdrawn", "withdrawn", "host/"),
                                  ("everything: start or restatement", "available", ""),
                                  ("everything: withdrawal", "withdrawn", "")):
        unsigned, with_signature = sizes_of(plain, status, prefix), sizes_of(signed, status, prefix)
        total = prefix == ""
        rows.append({"message": label, "messages": len(unsigned),
                     "bytes": sum(unsigned) if total else round(statistics.mean(unsigned)),
                     "signed_bytes": sum(with_signature) if total else round(statistics.mean(with_signature))})
    sizes = {"heartbeat": rows[0]["bytes"], "restatement": rows[5]["bytes"],
             "restatement_messages": rows[5]["messages"], "withdrawal": rows[6]["bytes"],
             "withdrawal_messages": rows[6]["messages"],
             "heartbeat_signed": rows[0]["signed_bytes"], "restatement_signed": rows[5]["signed_bytes"],
             "withdrawal_signed": rows[6]["signed_bytes"]}
    return rows, sizes


def per_host_rates(sizes: dict[str, float], signed: bool = False) -> dict[str, tuple[float, float]]:
    """(messages/s, bytes/s) of one host in steady state, by part, by arithmetic: an epoch of
    ``EPOCH_SECONDS`` has ``EPOCH_SECONDS / (LEASE / 3)`` heartbeat times, and at one of them the
    restatement (which starts with the host message) takes the heartbeat's place."""
    suffix = "_signed" if signed else ""
    beats = EPOCH_SECONDS / (LEASE / 3) - 1
    restart_messages = sizes["withdrawal_messages"] + sizes["restatement_messages"]
    restart_bytes = sizes["withdrawal" + suffix] + sizes["restatement" + suffix]
    return {"heartbeats": (beats / EPOCH_SECONDS, beats * sizes["heartbeat" + suffix] / EPOCH_SECONDS),
            "restatements": (sizes["restatement_messages"] / EPOCH_SECONDS,
                             sizes["restatement" + suffix] / EPOCH_SECONDS),
            "restarts": (RESTARTS_PER_DAY * restart_messages / DAY, RESTARTS_PER_DAY * restart_bytes / DAY)}


def counted_day(catalog: Catalog, seconds: float) -> tuple[float, float]:
    """(messages/s, bytes/s) counted over ``seconds`` of one simulated host, built message by
    message as its Announcer sends them; a span of a day or more has one restart, mid-way."""
    start = epoch_of(time.time() - seconds) * EPOCH_SECONDS
    restarts = [(start + seconds / 2, __version__)] if seconds >= DAY / RESTARTS_PER_DAY else []
    count = total = 0
    for _, _, _, value in host_history(catalog, 0, start, start + seconds, restarts, unique_topic()):
        count, total = count + 1, total + len(value)
    return count / seconds, total / seconds


def traffic(catalog: Catalog, sizes: dict[str, float], day: float, hosts: int) -> list[dict[str, Any]]:
    """Rows of steady-state traffic: per host by part, in total (arithmetic and counted), and for
    a fleet of ``hosts`` and of 10,000 hosts (the per-host total times the hosts)."""
    rows = []
    for signed in (False, True):
        parts = per_host_rates(sizes, signed)
        label = "signed" if signed else "unsigned"
        if not signed:
            rows += [{"what": f"one host: {part}", "msgs_per_s": round(m, 4), "bytes_per_s": round(b, 1)}
                     for part, (m, b) in parts.items()]
        messages, size = sum(m for m, _ in parts.values()), sum(b for _, b in parts.values())
        rows.append({"what": f"one host, {label}: total (arithmetic)", "msgs_per_s": round(messages, 4),
                     "bytes_per_s": round(size, 1)})
        if not signed:
            counted_messages, counted_bytes = counted_day(catalog, day)
            rows.append({"what": f"one host, unsigned: counted over {day / 3600:g} h simulated",
                         "msgs_per_s": round(counted_messages, 4), "bytes_per_s": round(counted_bytes, 1)})
        for fleet in dict.fromkeys((hosts, 10_000)):
            rows.append({"what": f"{fleet} hosts, {label}: announcement topics in",
                         "msgs_per_s": round(messages * fleet, 1), "bytes_per_s": round(size * fleet)})
    return rows


# -- 3: real Announcers against the model ----------------------------------------------------


async def live_check(url: str, catalogs: list[Catalog], seconds: float, lease: float,
                     epoch_seconds: float) -> dict[str, Any]:
    """Run one real Announcer per catalog for ``seconds`` (``lease``, epochs of ``epoch_seconds``)
    and set the messages each sent against the count of :func:`host_history` over the same span."""
    topic = unique_topic()
    client = await PulsarSettings(url).connect()
    announcers = [instance(catalog, h, time.time(), topic, lease=lease, epoch_seconds=epoch_seconds)
                  for h, catalog in enumerate(catalogs)]
    try:
        started = time.time()
        await asyncio.gather(*(announcer.start(client) for announcer in announcers))
        await asyncio.sleep(seconds - (time.time() - started))
        ended = time.time()
        real = [announcer.sent for announcer in announcers]
        await asyncio.gather(*(announcer.withdraw() for announcer in announcers))
    finally:
        await client.close()
    model = [sum(1 for _ in host_history(catalog, h, started, ended, [], topic, lease=lease,
                                         epoch_seconds=epoch_seconds)) for h, catalog in enumerate(catalogs)]
    return {"hosts": len(catalogs), "lease_s": lease, "epoch_s": epoch_seconds, "seconds": round(ended - started, 1),
            "epochs_begun": epoch_of(ended, epoch_seconds) - epoch_of(started, epoch_seconds),
            "real_sent_median": statistics.median(real), "real_min": min(real), "real_max": max(real),
            "model_median": statistics.median(model), "real_vs_model": round(sum(real) / sum(model), 3)}


# -- 4: the fleet and a fresh directory ------------------------------------------------------


async def keep_alive(url: str, last: dict[int, Announcer], epoch: int) -> None:
    """Every lease/3, each host's heartbeat from its live Announcer; on a new epoch, everything
    (the restatement), as live hosts do."""
    while True:
        now = time.time()
        everything, epoch = epoch_of(now) != epoch, epoch_of(now)
        await publish_history(url, [s for announcer in last.values() for s in sent(announcer, "available", now,
                                                                                    everything)])
        await asyncio.sleep(LEASE / 3)


#: A live host of the fleet, as a directory process can rebuild its Announcer: (h, instance, version, since).
LiveHost = tuple[int, str, str, float]


#: Set, in a directory's process, to the event it sets once caught up (:func:`_hold`).
_caught_up: Any = None


def _hold(caught_up: Any) -> None:
    """Initializer of a directory's process: keep the event it sets once caught up."""
    global _caught_up
    _caught_up = caught_up


def fresh_directory(url: str, topic: str, sample: list[LiveHost], marker: str | None) -> dict[str, Any]:
    """In a process of its own: a fresh ToolDirectory's catch-up on ``topic``, the process's
    RSS before it starts (everything imported) and once it has caught up, and then what
    following costs it (:func:`follow_costs`, with the ``sample`` hosts). With a ``marker``
    tool name, then :func:`burst`."""
    # The history reaches the broker long after its sent_at: the directory would warn, once per
    # host, that the host's clock is behind.
    logging.getLogger("tghost.agent.ledger").setLevel(logging.ERROR)
    return asyncio.run(_fresh_directory(url, topic, sample, marker))


async def _fresh_directory(url: str, topic: str, sample: list[LiveHost], marker: str | None) -> dict[str, Any]:
    directory = ToolDirectory(PulsarSettings(url), topic)
    gc.collect()
    before = rss_mib(os.getpid())
    now, started = time.time(), time.perf_counter()
    await directory.start()
    catch_up_ms = since_ms(started)
    gc.collect()
    after = rss_mib(os.getpid())
    tools = len(directory.tools)
    row = {"tools_seen": tools, "hosts_seen": len(directory.hosts), "epoch_phase_s": round(now % EPOCH_SECONDS),
           "epochs_read": len(read_window(now, SKEW)), "messages_read": directory.caught_up,
           "rejected": dict(directory.rejections) or 0, "catch_up_ms": round(catch_up_ms),
           "read_msgs_per_s": round(directory.caught_up / catch_up_ms * 1000),
           "rss_before_mib": before, "rss_after_mib": after,
           "kib_per_tool": round((after - before) * 1024 / tools, 2) if tools else None,
           **follow_costs(directory, topic, sample)}
    if marker is not None:
        row.update(await burst(directory, marker))
    await directory.close()
    return row


async def burst(directory: ToolDirectory, marker: str) -> dict[str, Any]:
    """Follow a restatement of the whole fleet at once (what each epoch's start brings): tell the
    fleet's process that this directory is caught up, then count the seconds until the tool
    ``marker``, published right after the restatement, is live (every message before it was
    applied), and the tools that expired meanwhile (their host's restatement still queued
    behind others when their lease ended)."""
    expired: set[str] = set()
    changes = directory.changes()

    async def watch() -> None:
        async for change in changes:
            if change.kind == "expired":
                expired.add(change.name)

    watching = asyncio.create_task(watch())
    await asyncio.sleep(0)
    _caught_up.set()
    started = time.perf_counter()
    try:
        await directory.wait_for(marker, timeout=BURST_TIMEOUT)
        applied_s: float | str = round(time.perf_counter() - started, 1)
    except TimeoutError:
        applied_s = f"> {BURST_TIMEOUT:g}"
    watching.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watching
    await changes.aclose()
    return {"burst_applied_s": applied_s, "burst_tools_expired": len(expired)}


class Received:
    """A message as the directory's follow path reads it from a topic (the three methods it calls)."""

    def __init__(self, key: str, value: bytes, published: float) -> None:
        self._key, self._value, self._published = key, value, published

    def data(self) -> bytes:
        return self._value

    def publish_timestamp(self) -> int:
        return round(self._published * 1000)

    def partition_key(self) -> str:
        return self._key


def follow_costs(directory: ToolDirectory, topic: str, sample: list[LiveHost]) -> dict[str, float]:
    """What following costs a caught-up directory, in µs per message handed to its follow path
    (``ToolDirectory._follow``: apply, expire, resolve), median of a heartbeat (three of each
    ``sample`` host) and of each message of their restatement, as their live instances build them
    now; and µs per ``Ledger.remembered`` call on a tool (the rivals' check of every resolved tool).
    The expiry due since the catch-up ended (the instances that restarts replaced) is done first,
    untimed."""
    directory._resolve(directory._expire(time.time()), "expired")
    beats, restated = [], []
    for h, instance_id, version, since in sample:
        announcer = instance(host_catalog(h), h, since, topic, version, instance_id=instance_id)
        for timings, everything in ((beats, False), (beats, False), (beats, False), (restated, True)):
            for _, _, key, value in list(sent(announcer, "available", time.time(), everything)):
                started = time.perf_counter()
                directory._follow(Received(key, value, time.time()))
                timings.append(time.perf_counter() - started)
    names = list(directory.tools)[:: max(1, len(directory.tools) // 200)]
    started = time.perf_counter()
    for name in names:
        directory.ledger.remembered(("tool", name))
    remembered = (time.perf_counter() - started) / max(1, len(names))
    return {"follow_heartbeat_us": round(statistics.median(beats) * 1e6) if beats else None,
            "follow_restatement_us": round(statistics.median(restated) * 1e6) if restated else None,
            "remembered_us": round(remembered * 1e6, 1)}


async def restate_fleet(url: str, last: dict[int, Announcer], marker: Announcer, caught_up: Any) -> dict[str, Any]:
    """Once the directory is caught up: every live host restates everything at once (as at each
    epoch's start), then ``marker``, a new host, announces its tools. Returns the seconds the
    restatement took to publish."""
    if not await asyncio.to_thread(caught_up.wait, BURST_TIMEOUT):
        return {}
    now, started = time.time(), time.perf_counter()
    await publish_history(url, [*(s for announcer in last.values() for s in sent(announcer, "available", now, True)),
                                *sent(marker, "available", now, True)])
    return {"burst_publish_s": round(time.perf_counter() - started, 1)}


async def fleet(url: str, catalogs: list[Catalog], runs: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Publish the fleet's history since the start of the epoch (at least ``HISTORY_MIN`` s),
    keep it alive, and measure ``runs`` fresh directories one after another."""
    hosts, topic = len(catalogs), unique_topic()
    end = time.time()
    start = epoch_of(end - HISTORY_MIN) * EPOCH_SECONDS
    schedule = {h: restarts_of(h, hosts, start, end) for h in range(hosts)}
    last: dict[int, Announcer] = {}
    runs_of = [host_history(catalog, h, start + h / hosts * LEASE / 3, end, schedule[h], topic, last=last)
               for h, catalog in enumerate(catalogs)]
    counted = {"messages": 0, "bytes": 0}

    def counting(history: Iterable[Sent]) -> Iterator[Sent]:
        for message in history:
            counted["messages"] += 1
            counted["bytes"] += len(message[3])
            yield message

    started = time.perf_counter()
    await publish_history(url, counting(heapq.merge(*runs_of, key=lambda message: message[0])))
    publish_s = time.perf_counter() - started
    restarted = sum(len(times) for times in schedule.values())
    upgraded = sum(1 for times in schedule.values() for _, version in times if version != __version__)
    published = {"hosts": hosts, "tools": hosts * TOOLS_PER_HOST, "history_s": round(end - start),
                 "daily_restarts": restarted - upgraded, "upgraded": upgraded, "messages": counted["messages"],
                 "mib": round(counted["bytes"] / 2**20, 1), "publish_s": round(publish_s, 1),
                 "publish_msgs_per_s": round(counted["messages"] / publish_s),
                 "publish_mib_per_s": round(counted["bytes"] / 2**20 / publish_s, 2)}
    alive = asyncio.create_task(keep_alive(url, last, epoch_of(end)))
    rows = []
    try:
        await asyncio.sleep(1.0)  # the first heartbeats, restamped now, are out
        loop, context = asyncio.get_running_loop(), get_context("spawn")
        sample = [(h, last[h].identity.instance, last[h].identity.version, last[h]._started_at)
                  for h in range(0, hosts, max(1, hosts // FOLLOW_SAMPLE))]
        for run in range(runs):
            caught_up = context.Event()
            marker = instance(host_catalog(hosts), hosts, time.time(), topic) if run == runs - 1 else None
            with ProcessPoolExecutor(1, mp_context=context, initializer=_hold, initargs=(caught_up,)) as pool:
                measured = loop.run_in_executor(pool, fresh_directory, url, topic, sample,
                                                list(marker.catalog.tools)[-1] if marker else None)
                restated = await restate_fleet(url, last, marker, caught_up) if marker else {}
                rows.append({"hosts": hosts, "run": run + 1, **await measured, **restated})
    finally:
        alive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await alive
    return published, rows


def main(quick: bool = False) -> None:
    fleets, day, live = ([(10, 1)], 3600.0, (3, 6.0, 5.0)) if quick else (FLEETS, DAY, (10, 32.0, 15.0))
    live_hosts, live_seconds, live_epoch = live
    catalogs = [host_catalog(h) for h in range(max(hosts for hosts, _ in fleets))]
    sizes_rows, sizes = message_sizes(catalogs[0])
    traffic_rows = traffic(catalogs[0], sizes, day, fleets[-1][0])
    published, directories = [], []
    with broker() as running:
        live_row = asyncio.run(live_check(running.url, catalogs[:live_hosts], live_seconds, 3.0, live_epoch))
        for hosts, runs in fleets:
            history, rows = asyncio.run(fleet(running.url, catalogs[:hosts], runs))
            published.append(history)
            directories += rows
    report("scale_messages", f"Announcements of one host serving {TOOLS_PER_HOST} tools over one service, "
           "built by the Announcer (bytes; 'everything': the sum)", sizes_rows, {"tools_per_host": TOOLS_PER_HOST})
    report("scale_traffic", f"Steady state: lease {LEASE:g} s, epochs of {EPOCH_SECONDS:g} s, "
           f"{RESTARTS_PER_DAY:g} restart(s) a host a day", traffic_rows,
           {"lease": LEASE, "epoch_seconds": EPOCH_SECONDS, "restarts_per_day": RESTARTS_PER_DAY, "counted_s": day})
    report("scale_live", "Real Announcers on a scaled clock against the model's count", [live_row],
           {"hosts": live_hosts, "seconds": live_seconds, "lease": 3.0, "epoch_seconds": live_epoch})
    report("scale_publish", f"Each fleet's history published on the embedded broker (rolling upgrade of "
           f"{UPGRADE_SHARE:.0%} in its last {UPGRADE_SECONDS:g} s)", published,
           {"fleets": fleets, "restarts_per_day": RESTARTS_PER_DAY, "upgrade_share": UPGRADE_SHARE})
    report("scale", f"A fresh directory, in its own process, on each fleet of hosts x {TOOLS_PER_HOST} tools "
           "(RSS: the whole process)", directories, {"fleets": fleets, "tools_per_host": TOOLS_PER_HOST})


if __name__ == "__main__":
    main("--quick" in sys.argv)
