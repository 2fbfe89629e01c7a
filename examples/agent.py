"""A minimal agent loop on tghost's ToolDirectory, following seed 001 section 5.2's workflow.

No LLM here: a rule picks, among the tools the directory offers for the agent's groups and
state, the one whose description shares most words with the step's intent. The state moves
only after a successful call. Start a host first, then the agent:

    tghost run --config examples/tools.toml      # the example plugins, plus query-orders
    python examples/agent.py                     # TGHOST_PULSAR_URL names the broker
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import tghost


@dataclass
class Step:
    """One step of the plan: the groups the agent asks with, what it wants, and the arguments."""

    groups: list[str]
    intent: str
    arguments: dict[str, Any]


# Seed 001 section 5.2: research with read-only knowledge tools (state -> analysis), then
# compute (state -> results). The last step asks for research again, in state "results",
# where the knowledge tools are not available: the agent says so and stops.
PLAN = [
    Step(["read-only", "knowledge"], "query the customer knowledge base",
         {"question": "Which customer is on the enterprise tier?"}),
    Step(["compute"], "evaluate an arithmetic expression", {"expression": "12 * (1250 + 80)"}),
    Step(["read-only", "knowledge"], "query the product knowledge base", {"question": "warranty"}),
]


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def choose(tools: list[tghost.ToolDescriptor], intent: str) -> tghost.ToolDescriptor | None:
    """The offered tool whose name and description share most words with the intent, if any."""
    scored = [(len(words(f"{t.name} {t.description}") & words(intent)), t.name, t) for t in tools]
    best = max(scored, default=None, key=lambda s: (s[0], s[1]))
    return best[2] if best and best[0] > 0 else None


async def run(directory: tghost.ToolDirectory) -> str:
    """Walk the plan; returns the final state."""
    state = "undefined"
    for number, step in enumerate(PLAN, 1):
        offered = directory.available(step.groups, state)
        print(f"\nstep {number}: groups {step.groups}, state {state!r}")
        print(f"  tools offered: {', '.join(t.name for t in offered) or '(none)'}")
        tool = choose(offered, step.intent)
        if tool is None:
            print(f"  no offered tool can {step.intent!r} in state {state!r}: stopping")
            break
        try:
            observation = await directory.invoke(tool.name, step.arguments, user="agent",
                                                 groups=step.groups, state=state)
            succeeded = True
        except tghost.ToolCallError as exc:
            observation, succeeded = f"failed ({exc})", False
        after = tghost.next_state(tool, state, succeeded)
        text = observation if isinstance(observation, str) else json.dumps(observation)  # a typed tool: an object
        print(f"  called {tool.name}({step.arguments}) -> {text.splitlines()[0] if text else ''!r}")
        print(f"  state {state!r} -> {after!r}")
        state = after
    return state


async def main() -> None:
    settings = tghost.PulsarSettings(os.environ.get("TGHOST_PULSAR_URL", "pulsar://localhost:6650"))
    topic = os.environ.get("TGHOST_DESCRIPTORS_TOPIC", "persistent://tg/config/tool-descriptors")
    async with tghost.ToolDirectory(settings, topic) as directory:
        print(f"discovered {len(directory.tools)} tool(s): {', '.join(sorted(directory.tools))}")
        await run(directory)


if __name__ == "__main__":
    asyncio.run(main())
