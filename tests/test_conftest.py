"""conftest: the two test speeds hold by construction. A test is marked ``broker`` exactly when it
requests a broker fixture, and one that does not cannot start a broker or connect to one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import UNASKED, BrokerGuard, OwnBrokers
from tghost.broker import EmbeddedBroker
from tghost.pulsar.clients import BrokerUnavailable, PulsarSettings, is_reachable
from tghost.system.net import free_port


def test_a_test_without_a_broker_fixture_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("broker") is None


def test_a_test_with_a_broker_fixture_is_marked(request: pytest.FixtureRequest, own_brokers: OwnBrokers) -> None:
    assert request.node.get_closest_marker("broker") is not None


#: EmbeddedBroker.start as tghost defines it (this module is imported outside any test).
START = EmbeddedBroker.__dict__["start"]


@pytest.fixture(scope="module")
def start_seen_by_a_module_fixture() -> object:
    return EmbeddedBroker.__dict__["start"]


def test_a_module_fixture_set_up_for_a_test_without_a_broker_fixture_is_guarded_too(
        start_seen_by_a_module_fixture: object) -> None:
    assert start_seen_by_a_module_fixture is not START


def test_without_a_broker_fixture_starting_a_broker_fails_at_once_naming_the_fixture(tmp_path: Path) -> None:
    guard = BrokerGuard()
    with pytest.MonkeyPatch.context() as patch:
        guard.install(patch)
        with pytest.raises(pytest.fail.Exception, match="request the pulsar_broker fixture"):
            EmbeddedBroker(tmp_path, free_port()).start()
    assert not (tmp_path / "broker.log").exists()  # refused before anything started
    with pytest.raises(pytest.fail.Exception, match="request the pulsar_broker fixture"):
        guard.check()  # even had the code under test swallowed the refusal


async def test_without_a_broker_fixture_connecting_where_none_answers_fails_as_ever() -> None:
    url = f"pulsar://127.0.0.1:{free_port()}"
    with pytest.raises(BrokerUnavailable, match=f"no Pulsar broker answers at {url}"):
        await PulsarSettings(url, connect_timeout=0).connect()


async def test_connecting_to_a_broker_is_refused_once_it_answers(own_brokers: OwnBrokers) -> None:
    """As in a test without a broker fixture (this one needs a broker to show it)."""
    broker = own_brokers.start()
    guard = BrokerGuard()
    with pytest.MonkeyPatch.context() as patch:
        guard.install(patch)
        with pytest.raises(pytest.fail.Exception) as refused:
            await PulsarSettings(broker.url).connect()
    assert str(refused.value) == UNASKED and guard.refused == 1


def test_own_brokers_stops_every_broker_it_started_or_took_in(tmp_path: Path, own_brokers: OwnBrokers) -> None:
    first, second = own_brokers.start(), own_brokers.start()
    second.stop()  # a test may stop one itself: stopping it again is no error
    own_brokers.detached(free_port(), tmp_path / "nothing-here")  # nor is stopping a detached one that is gone
    own_brokers.stop_all()
    assert all(broker.process is not None and broker.process.poll() is not None for broker in (first, second))
    assert not is_reachable(first.url)
