"""groups: seed 001's filtering and state rules, scenario by scenario (sections 4, 5 and 9)."""

from __future__ import annotations

from typing import Any

import pytest

from tghost import ToolDescriptor
from tghost.protocol.groups import is_available, next_state, select


def tool(name: str, **fields: Any) -> ToolDescriptor:
    return ToolDescriptor.model_validate({"name": name, "description": name, "service": "svc", **fields})


# Seed 001 section 5.1, the five configured tools.
KNOWLEDGE_QUERY = tool("knowledge-query", group=["read-only", "knowledge", "basic"], state="analysis",
                       available_in_states=["undefined", "research"])
GRAPH_UPDATE = tool("graph-update", group=["write", "knowledge", "admin"],
                    available_in_states=["analysis", "modification"])
TEXT_COMPLETION = tool("text-completion", group=["read-only", "text", "basic"], state="undefined")
COMPLEX_ANALYSIS = tool("complex-analysis", group=["advanced", "compute", "expensive"], state="results",
                        available_in_states=["analysis"])
RESET_WORKFLOW = tool("reset-workflow", group=["admin"], state="undefined",
                      available_in_states=["analysis", "results"])
SECTION_5 = [KNOWLEDGE_QUERY, GRAPH_UPDATE, TEXT_COMPLETION, COMPLEX_ANALYSIS, RESET_WORKFLOW]
PLAIN = tool("plain")  # no group, no states


def names(groups: list[str] | None, state: str | None, tools: list[ToolDescriptor] = SECTION_5) -> list[str]:
    return [t.name for t in select(tools, groups, state)]


# -- section 4.2 / 2.2: defaults, wildcard, empty --------------------------------------------

def test_a_tool_without_group_is_in_default_and_a_request_without_group_asks_for_default() -> None:
    assert is_available(PLAIN) and is_available(PLAIN, ["default"])
    assert not is_available(PLAIN, ["admin"])
    assert not is_available(KNOWLEDGE_QUERY)  # in read-only/knowledge/basic, not default


def test_wildcard_in_the_request_grants_every_group() -> None:
    assert names(["*"], "undefined") == ["knowledge-query", "text-completion"]  # still state-filtered
    assert is_available(PLAIN, ["*"])


def test_empty_group_list_grants_no_tools() -> None:
    assert names([], "undefined", [*SECTION_5, PLAIN]) == []


def test_group_match_is_an_intersection_and_case_sensitive() -> None:
    assert is_available(GRAPH_UPDATE, ["nothing", "admin"], "analysis")
    assert not is_available(GRAPH_UPDATE, ["Admin"], "analysis")


def test_missing_state_means_undefined() -> None:
    assert names(["knowledge"], None) == names(["knowledge"], "undefined") == ["knowledge-query"]


def test_tool_without_available_in_states_or_with_wildcard_is_available_in_every_state() -> None:
    anywhere = tool("anywhere", available_in_states=["*"])
    for state in ("undefined", "analysis", "whatever"):
        assert is_available(PLAIN, None, state) and is_available(anywhere, None, state)


# -- section 5.2: the three request examples and the workflow --------------------------------

def test_initial_research_request() -> None:
    assert names(["read-only", "knowledge"], "undefined") == ["knowledge-query", "text-completion"]


def test_analysis_phase_request() -> None:
    # Seed 001 section 5.2 also lists reset-workflow here, but its only group is "admin", which
    # this request does not ask for; section 4.2's rule (which we implement) excludes it.
    assert names(["advanced", "compute", "write"], "analysis") == ["graph-update", "complex-analysis"]


def test_results_phase_request() -> None:
    assert names(["admin"], "results") == ["reset-workflow"]


def test_state_moves_only_after_a_successful_call() -> None:
    state = "undefined"
    state = next_state(KNOWLEDGE_QUERY, state, succeeded=True)
    assert state == "analysis"
    assert next_state(COMPLEX_ANALYSIS, state, succeeded=False) == "analysis"  # a failure keeps it
    state = next_state(COMPLEX_ANALYSIS, state, succeeded=True)
    assert state == "results"
    state = next_state(RESET_WORKFLOW, state, succeeded=True)
    assert state == "undefined"
    assert next_state(GRAPH_UPDATE, "analysis", succeeded=True) == "analysis"  # no state: no change
    assert next_state(PLAIN, None, succeeded=True) == "undefined"


def test_complete_workflow_of_section_9_3_filters_each_step() -> None:
    groups = ["knowledge", "compute", "admin", "read-only"]
    state, seen = "undefined", []
    for pick in ("knowledge-query", "complex-analysis", "reset-workflow"):
        available = names(groups, state)
        assert pick in available
        seen.append((state, available))
        state = next_state(next(t for t in SECTION_5 if t.name == pick), state, succeeded=True)
    assert state == "undefined"  # the workflow can repeat
    assert [s for s, _ in seen] == ["undefined", "analysis", "results"]
    assert "complex-analysis" not in seen[0][1] and "knowledge-query" not in seen[1][1]


# -- section 9.3: multi-tenant -----------------------------------------------------------------

@pytest.mark.parametrize(
    ("groups", "state", "expected"),
    [(["read-only"], "undefined", ["knowledge-query", "text-completion"]),  # user A
     (["write"], "analysis", ["graph-update"])],  # user B
)
def test_multi_tenant_users_see_their_groups_in_their_states(groups: list[str], state: str,
                                                             expected: list[str]) -> None:
    assert names(groups, state) == expected
