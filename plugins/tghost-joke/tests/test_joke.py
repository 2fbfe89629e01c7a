"""tghost-joke: joke matching, then the service over a real embedded broker, then discovery."""

from __future__ import annotations

import random

import pytest
from tghost_joke import GENERAL, JOKES, STYLES, JokeService, find_topic, pick_joke

import tghost
from tghost import ToolCallError, discover
from tghost.protocol import encode_request
from tghost.testing import EmbeddedBroker, LocalHost, RawWire


@pytest.fixture
def service() -> JokeService:
    return JokeService()


def test_every_topic_has_at_least_two_distinct_jokes_in_every_style() -> None:
    assert len(JOKES) >= 7 and GENERAL in JOKES
    for topic, styles in JOKES.items():
        assert set(styles) == set(STYLES), topic
        for style, jokes in styles.items():
            assert len(set(jokes)) >= 2, (topic, style)


def test_every_cat_pun_mentions_cats() -> None:
    assert all("cat" in joke.lower() for joke in JOKES["cats"]["pun"])


@pytest.mark.parametrize("text", ["cats", "Cats", "cat", "CAT", "kittens", "Kitty", "funny cats please"])
def test_topic_matching_ignores_case_and_plurals(text: str) -> None:
    assert find_topic(text) == "cats"


@pytest.mark.parametrize(
    ("text", "topic"),
    [("Dogs", "dogs"), ("puppies", "dogs"), ("animals", "animals"), ("programming", "programming"),
     ("Coding", "programming"), ("food", "food"), ("music", "music"), ("outer space", "space")],
)
def test_each_topic_is_found_by_its_name_or_an_alias(text: str, topic: str) -> None:
    assert find_topic(text) == topic


@pytest.mark.parametrize("text", ["", "quantum chromodynamics", "catalogue", "   "])
def test_unknown_topic_matches_nothing(text: str) -> None:
    assert find_topic(text) is None


def test_pick_joke_chooses_randomly_among_all_matches() -> None:
    rng = random.Random()
    picks = {pick_joke("cats", "pun", rng) for _ in range(200)}
    assert picks == {(joke, "cats") for joke in JOKES["cats"]["pun"]}


def test_pick_joke_falls_back_to_a_general_joke_for_an_unknown_topic() -> None:
    joke, matched = pick_joke("tax law", "one-liner", random.Random())
    assert matched is None and joke in JOKES[GENERAL]["one-liner"]


def test_pick_joke_refuses_an_unknown_style_as_invalid_config() -> None:
    with pytest.raises(tghost.ToolError) as info:
        pick_joke("cats", "limerick", random.Random())
    assert info.value.error_type == "invalid-config"
    assert "'limerick'" in str(info.value) and all(style in str(info.value) for style in STYLES)


async def test_tell_joke_over_pulsar_greets_the_user_in_the_configured_style(
    pulsar_broker: EmbeddedBroker, service: JokeService
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        answer = await host.call("joke-service", {"topic": "Cats"}, config={"style": "knock-knock"}, user="alice")
    prefix = "Hey alice! Here's a knock-knock for you:\n\n"
    assert answer.startswith(prefix)
    assert answer.removeprefix(prefix) in JOKES["cats"]["knock-knock"]


async def test_style_defaults_to_pun_when_the_config_has_none(
    pulsar_broker: EmbeddedBroker, service: JokeService
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        answer = await host.call("joke-service", {"topic": "space"}, user="bob")
    prefix = "Hey bob! Here's a pun for you:\n\n"
    assert answer.startswith(prefix) and answer.removeprefix(prefix) in JOKES["space"]["pun"]


async def test_unknown_topic_over_pulsar_says_it_is_a_general_joke(
    pulsar_broker: EmbeddedBroker, service: JokeService
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        answer = await host.call("joke-service", {"topic": "tax law"}, config={"style": "pun"})
    assert "I don't know any jokes about 'tax law'" in answer
    assert any(answer.endswith(joke) for joke in JOKES[GENERAL]["pun"])


async def test_unknown_style_over_pulsar_is_an_invalid_config_error(
    pulsar_broker: EmbeddedBroker, service: JokeService
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("joke-service", {"topic": "cats"}, config={"style": "limerick"})
    assert info.value.error_type == "invalid-config" and "limerick" in info.value.message


async def test_reply_on_the_wire_echoes_the_id_with_exactly_the_contract_fields(
    pulsar_broker: EmbeddedBroker, service: JokeService
) -> None:
    async with LocalHost(pulsar_broker.url, [service]), RawWire(pulsar_broker.url, service.descriptor) as raw:
        await raw.send(encode_request("carol", {"style": "one-liner"}, {"topic": "food"}), {"id": "joke-1"})
        [(properties, body)] = await raw.replies("joke-1")
    assert properties["id"] == "joke-1"
    assert set(body) == {"error", "response", "end_of_stream"}
    assert body["error"] is None and body["end_of_stream"] is True
    assert body["response"].removeprefix("Hey carol! Here's a one-liner for you:\n\n") in JOKES["food"]["one-liner"]


def test_installed_plugin_is_discovered_with_the_seed_descriptors() -> None:
    catalog = discover(strict=False)
    descriptor = catalog.descriptors["joke-service"]
    assert descriptor.request_queue == "non-persistent://tg/request/joke"
    assert descriptor.response_queue == "non-persistent://tg/response/joke"
    assert descriptor.config_params == (tghost.ConfigParam(name="style", required=False),)
    tool = catalog.tools["tell-joke"]
    assert (tool.service, tool.config, tool.description) == ("joke-service", {"style": "pun"},
                                                             "Tell a joke on a given topic")
    assert [argument.name for argument in tool.arguments] == ["topic"]
    assert catalog.service_origin["joke-service"].name == "joke"
