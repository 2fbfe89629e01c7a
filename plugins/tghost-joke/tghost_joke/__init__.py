"""tghost-joke: a class-based tool service, as TrustGraph's ``DynamicToolService`` joke example.

Serves ``joke-service`` (topic ``joke``) and its ``tell-joke`` tool; the jokes live in ``jokes.json``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from importlib.resources import files
from typing import Any

import tghost

__all__ = ["DEFAULT_STYLE", "GENERAL", "JOKES", "STYLES", "JokeService", "find_topic", "joke_service", "pick_joke"]

#: The styles a tool may choose with its ``style`` config value.
STYLES = ("pun", "one-liner", "knock-knock")
DEFAULT_STYLE = "pun"
#: The topic used when the requested one is unknown.
GENERAL = "general"


def _singular(word: str) -> str:
    """``"kitties"`` -> ``"kitty"``, ``"Cats"`` -> ``"cat"``: good enough to match topic words."""
    word = word.lower()
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _load() -> tuple[dict[str, dict[str, tuple[str, ...]]], dict[str, str]]:
    """Read ``jokes.json``: ``{topic: {"aliases": [...], style: [joke, ...], ...}}``.

    Returns the jokes by topic and style, and an index from singular topic word to topic.
    Raises KeyError if a topic lacks one of :data:`STYLES`.
    """
    data = json.loads(files(__name__).joinpath("jokes.json").read_text(encoding="utf-8"))
    jokes = {topic: {style: tuple(entry[style]) for style in STYLES} for topic, entry in data.items()}
    index = {_singular(word): topic for topic, entry in data.items() for word in [topic, *entry["aliases"]]}
    return jokes, index


#: ``JOKES[topic][style]`` is a tuple of jokes.
JOKES, _TOPIC_WORDS = _load()


def find_topic(text: str) -> str | None:
    """The bundled topic that ``text`` names, or ``None``.

    Matching ignores case and plurals, and any word may name the topic: ``"Cats"``,
    ``"cat"`` and ``"funny kittens"`` all give ``"cats"``.
    """
    for word in re.findall(r"[a-z]+", text.lower()):
        if (topic := _TOPIC_WORDS.get(_singular(word))) is not None:
            return topic
    return None


def pick_joke(topic: str, style: str, rng: random.Random) -> tuple[str, str | None]:
    """Choose a random joke in ``style`` (one of :data:`STYLES`) on ``topic`` (free text).

    Returns:
        ``(joke, matched_topic)``; ``matched_topic`` is ``None`` when no bundled topic
        matches ``topic`` and the joke is a general one.

    Raises:
        tghost.ToolError: ``style`` is unknown (error type ``invalid-config``).
    """
    if style not in STYLES:
        choices = ", ".join(repr(s) for s in STYLES)
        raise tghost.ToolError(f"unknown style {style!r}; choose one of {choices}", "invalid-config")
    matched = find_topic(topic)
    return rng.choice(JOKES[matched or GENERAL][style]), matched


class JokeService(tghost.ToolService):
    """Tells a joke on the topic the agent asks for, in the style its tool's config chooses."""

    id = "joke-service"
    topic = "joke"
    description = "Tells a joke on a given topic: a pun, a one-liner or a knock-knock joke."
    config_params = (tghost.ConfigParam(name="style", required=False),)
    arguments = (
        tghost.Argument(
            name="topic", type="string", description="The topic for the joke (e.g., programming, animals, food)"
        ),
    )

    def __init__(self) -> None:
        self.rng = random.Random()

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        """Answer ``{"topic": str}`` with ``"Hey <user>! Here's a <style> for you:\\n\\n<joke>"``.

        ``config["style"]`` is one of :data:`STYLES` (default ``"pun"``; case and ``_``/space
        for ``-`` are forgiven). An unknown topic gets a general joke and a note saying so.
        It is ``async`` because it only reads memory; blocking work belongs in a plain ``def``.

        Raises:
            tghost.ToolError: the style is unknown (error type ``invalid-config``).
        """
        style = str(config.get("style") or DEFAULT_STYLE).strip().lower().replace("_", "-").replace(" ", "-")
        topic = str(arguments.get("topic") or "").strip()
        joke, matched = pick_joke(topic, style, self.rng)
        if matched is None and topic:
            joke = f"(I don't know any jokes about {topic!r} yet, so here's a general one.)\n\n{joke}"
        return f"Hey {user}! Here's a {style} for you:\n\n{joke}"


#: The one instance this plugin serves.
joke_service = JokeService()


@tghost.hookimpl
def tghost_register_services(register: Callable[[tghost.ToolService], None]) -> None:
    """Register :data:`joke_service`."""
    register(joke_service)


@tghost.hookimpl
def tghost_register_tools(register: Callable[[tghost.ToolDescriptor], None]) -> None:
    """Register the ``tell-joke`` tool: ``joke-service`` with ``style="pun"``, as in seed 000."""
    register(joke_service.tool("tell-joke", "Tell a joke on a given topic", style="pun"))
