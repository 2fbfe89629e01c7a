"""view: one agent's view of a directory on the embedded broker. Its tools are those its groups
and current state may use, narrowed by name globs and the read-only hint; a successful call moves
its state (seed 001 §4.2), a failed one does not; a tool outside its selection is refused saying
why; a fork starts again at the starting state."""

from __future__ import annotations

from typing import Any

import pytest

import tghost
from tghost.broker import EmbeddedBroker
from tghost.testing import LocalHost


class Shop(tghost.ToolService):
    id = "shop"
    description = "A tiny shop."
    config_params = (tghost.ConfigParam(name="step", required=True),)

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        if config["step"] == "fail":
            raise tghost.ToolError("the till is closed")
        return f"{config['step']} done for {user or 'nobody'}"


TOOLS = [
    {"name": "shop-login", "description": "Log in to the shop", "service": "shop", "step": "login",
     "group": ["shop"], "state": "in", "annotations": {"read-only": True}},
    {"name": "shop-browse", "description": "Browse the shop's goods", "service": "shop", "step": "browse",
     "group": ["shop"], "available_in_states": ["in"], "annotations": {"read-only": True}},
    {"name": "shop-buy", "description": "Buy the goods in the basket", "service": "shop", "step": "buy",
     "group": ["shop"], "available_in_states": ["in"]},
    {"name": "shop-broken", "description": "A tool whose till is closed", "service": "shop", "step": "fail",
     "group": ["shop"], "state": "lost"},
    {"name": "weather", "description": "Say the weather", "service": "shop", "step": "weather"},
]


@pytest.fixture
async def directory(pulsar_broker: EmbeddedBroker) -> Any:
    async with (LocalHost(pulsar_broker.url, [Shop()], tools=TOOLS, announce_as="shop-host"),
                tghost.ToolDirectory(tghost.PulsarSettings(pulsar_broker.url)) as directory):
        for tool in TOOLS:
            await directory.wait_for(tool["name"])
        yield directory


def names(view: tghost.ToolView) -> list[str]:
    return [d.name for d in view.tools()]


async def test_a_successful_call_moves_the_state_and_the_tools_follow(directory: Any) -> None:
    view = tghost.ToolView(directory, groups=["shop"], user="alice")
    assert names(view) == ["shop-broken", "shop-login"]
    assert not view.offers("shop-browse")
    assert await view.invoke("shop-login", {}) == "login done for alice"
    assert view.state == "in" and names(view) == ["shop-broken", "shop-browse", "shop-buy", "shop-login"]
    assert view.offers("shop-browse") and not view.offers("weather")
    assert await view.invoke("shop-browse", {}) == "browse done for alice" and view.state == "in"


async def test_a_failed_call_leaves_the_state_where_it_was(directory: Any) -> None:
    view = tghost.ToolView(directory, groups=["shop"], state="in")
    with pytest.raises(tghost.ToolCallError) as failed:
        await view.invoke("shop-broken", {})
    assert failed.value.error_type == "tool-service-error" and view.state == "in"


async def test_a_tool_the_state_does_not_allow_is_refused_by_the_directory(directory: Any) -> None:
    view = tghost.ToolView(directory, groups=["shop"])
    with pytest.raises(tghost.ToolCallError) as refused:
        await view.invoke("shop-buy", {})
    assert refused.value.error_type == "not-allowed" and view.state is None


async def test_globs_and_the_read_only_hint_narrow_the_tools_and_refuse_the_rest(directory: Any) -> None:
    view = tghost.ToolView(directory, groups=["*"], state="in", include=["shop-*"], exclude=["*-broken"],
                           read_only=True)
    assert names(view) == ["shop-browse", "shop-login"]
    assert {found.tool.descriptor.name for found in view.search("shop goods")} == {"shop-browse", "shop-login"}
    assert view.refusal("weather") == "its name matches none of the included 'shop-*'"
    for name, why in [("shop-buy", "not hinted read-only"), ("shop-broken", "excluded '*-broken'")]:
        with pytest.raises(tghost.ToolCallError) as refused:
            await view.invoke(name, {})
        assert refused.value.error_type == "not-allowed" and why in refused.value.message


async def test_a_fork_starts_at_the_starting_state_with_the_same_settings(directory: Any) -> None:
    view = tghost.ToolView(directory, groups=["shop"], exclude=["*-broken"], user="bob")
    await view.invoke("shop-login", {})
    fresh = view.fork()
    assert (fresh.state, fresh.user, names(fresh)) == (None, "bob", ["shop-login"])
    assert view.state == "in"


async def test_reachable_is_every_tool_its_calls_can_make_available(directory: Any) -> None:
    view = tghost.ToolView(directory, groups=["shop"])
    assert [d.name for d in view.reachable()] == ["shop-broken", "shop-browse", "shop-buy", "shop-login"]
    assert view.state is None  # a look ahead, not a move
    # Only the view's own tools move it: without shop-login, "in" is never reached.
    narrowed = tghost.ToolView(directory, groups=["shop"], exclude=["shop-login"])
    assert [d.name for d in narrowed.reachable()] == ["shop-broken"]
