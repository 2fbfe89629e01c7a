"""``tghost inspect`` in a real browser: Debian's Chromium driven by Playwright, against
``tghost run`` hosts on the embedded broker. Each test does what a person does on the page.

Run with ``tox -e browser`` (``.ci/run`` installs Chromium); without Playwright or Chromium
these tests skip. With ``TGHOST_SCREENSHOTS=DIR`` the stream and two-host tests also save the
screenshots docs/guides/inspector.md shows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import CHROMIUM, TIMEOUT_MS, Page
from tests.conftest import READY, HostProcess, PluginDir
from tests.test_docs import commands
from tghost.broker import EmbeddedBroker
from tghost.system.net import free_port

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (tox -e browser)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")

sync_api.expect.set_options(timeout=TIMEOUT_MS)  # a loaded CI machine: wait for the page, never time it

SHAPES = '''
import json
import time
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, Field

import tghost


class Traveller(BaseModel):
    name: str = Field(description="Who travels")
    age: int | None = Field(None, description="Years")


class Stop(BaseModel):
    city: str = Field(description="Where to stop")
    nights: int = Field(1, description="Nights there")


@tghost.tool(name="plan-trip")
def plan_trip(traveller: Traveller, stops: list[Stop], mode: Literal["train", "car"] = "train",
              tags: list[str] = [], direct: bool = False) -> str:
    """Plan a trip: answers with the arguments the host received, as JSON."""
    return json.dumps({"traveller": traveller.model_dump(), "stops": [s.model_dump() for s in stops],
                       "mode": mode, "tags": tags, "direct": direct}, sort_keys=True)


@tghost.tool(name="count-down")
def count_down(start: int) -> Iterator[str]:
    """Count down from start, one line every 0.4 s, then lift off."""
    for number in range(start, 0, -1):
        yield f"{number}\\n"
        time.sleep(0.4)
    yield "liftoff\\n"


@tghost.tool
def survey(sites: int, ctx: tghost.Context) -> str:
    """Survey sites, 0.4 s each, reporting progress."""
    for site in range(1, sites + 1):
        time.sleep(0.4)
        ctx.progress(site, sites, f"site {site}")
    return f"surveyed {sites} sites"


class Echo(tghost.ToolService):
    """Answers with the arguments it received, as JSON; one is named as JavaScript's prototype."""

    id = "echo-args"
    description = "Echo the arguments back, as JSON."
    arguments = [tghost.Argument(name="__proto__", type="string", description="A name objects treat apart"),
                 tghost.Argument(name="note", type="string", description="Anything")]

    def invoke(self, user, config, arguments):
        return json.dumps(arguments, sort_keys=True)


echo = Echo()
FORGOTTEN = []


class Forget(tghost.ToolService):
    """A destructive tool: says how many calls reached it."""

    id = "forget"
    description = "Forget a key and its value."
    arguments = [tghost.Argument(name="key", type="string", description="The key to forget")]

    def invoke(self, user, config, arguments):
        FORGOTTEN.append(arguments["key"])
        return f"forgot {arguments['key']} (call {len(FORGOTTEN)})"


class Stock(tghost.ToolService):
    """A read-only tool with a structured result."""

    id = "stock"
    description = "How many of an item are in stock, and where."
    arguments = [tghost.Argument(name="item", type="string", description="The item to look up")]

    def invoke(self, user, config, arguments):
        return json.dumps({"item": arguments["item"], "in_stock": True, "count": 12, "price": 3.5, "note": None,
                           "warehouses": [{"city": "Lyon", "count": 7}, {"city": "Turin", "count": 5}],
                           "supplier": {"id": 7, "name": "Acme", "tags": []}})


STOCK_SCHEMA = {"type": "object", "required": ["item", "in_stock", "count"], "properties": {
    "item": {"type": "string"}, "in_stock": {"type": "boolean"}, "count": {"type": "integer"},
    "price": {"type": "number"}, "note": {"type": ["string", "null"]},
    "warehouses": {"type": "array", "items": {"type": "object"}}, "supplier": {"type": "object"}}}
forget, stock = Forget(), Stock()


@tghost.hookimpl
def tghost_register_services(register):
    register(plan_trip)
    register(count_down)
    register(survey)
    register(echo)
    register(forget)
    register(stock)


@tghost.hookimpl
def tghost_register_tools(register):
    register(echo.tool("echo-args", "Echo the arguments back, as JSON."))
    register(echo.tool("echo-structured", "Echo the arguments back, as a structured result.",
                       **{"output-schema": {"type": "object"}}))
    register(forget.tool("forget-key", title="Forget a key",
                         annotations={"read-only": False, "destructive": True, "idempotent": True}))
    register(stock.tool("check-stock", title="Check stock", annotations={"read-only": True, "open-world": False},
                        **{"output-schema": STOCK_SCHEMA}))
'''


@pytest.fixture
def env(plugin_dir: PluginDir, pulsar_broker: EmbeddedBroker, tmp_path: Path) -> dict[str, str]:
    """A user's environment: the calculator, the joke plugin and a test plugin on a fresh topic."""
    plugin_dir.add("shapes", SHAPES)
    return plugin_dir.env(TGHOST_PULSAR_URL=pulsar_broker.url, XDG_CONFIG_HOME=str(tmp_path / "config"),
                          TGHOST_DESCRIPTORS_TOPIC=f"persistent://tg/config/inspect-{uuid.uuid4().hex[:8]}",
                          TGHOST_LOAD_PLUGINS="calculator,shapes")


#: The command of docs/guides/inspector.md, run here on a free port.
GUIDE_COMMAND = "tghost inspect                # then open http://localhost:8766/, or pass --open"


@pytest.fixture
def inspector(env: dict[str, str], host_process: Callable[..., HostProcess]) -> str:
    """A ``tghost run`` host and the guide's ``tghost inspect`` on a free port; gives the page's URL."""
    host = host_process(env=env)
    host.wait_for(READY)
    [(argv, _)] = commands("docs/guides/inspector.md", GUIDE_COMMAND)
    assert argv[:4] == [sys.executable, "-m", "tghost", "inspect"], argv
    inspect = host_process(*argv[4:], "--port", str(free_port()), env=env, command=("inspect",))
    line = inspect.wait_for(r"tghost inspect: the live directory")
    return re.search(r"(http://\S+/)", line).group(1)  # type: ignore[union-attr]


def screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("TGHOST_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / name))


def pick(page: Page, tool: str) -> None:
    page.get_by_role("button", name=tool, exact=True).click()
    sync_api.expect(page.get_by_role("heading", name=tool, exact=True)).to_be_visible()


def log_of(page: Page) -> Any:
    return page.get_by_role("log")


def test_calculate_answers_14_in_the_log(page: Page, inspector: str) -> None:
    page.goto(inspector)
    pick(page, "calculate")
    page.get_by_label("expression").fill("2*7")
    with page.expect_request("**/api/call") as sent:
        page.get_by_role("button", name="Call", exact=True).click()
    sync_api.expect(log_of(page).locator(".observation")).to_have_text("14")
    assert sent.value.all_headers()["origin"] == inspector.rstrip("/")  # the inspector checks it: its own
    sync_api.expect(page.locator("#timing")).to_contain_text("first chunk")
    sync_api.expect(page.get_by_role("list", name="History")).to_contain_text('calculate {"expression":"2*7"}')


def test_solve_steps_streams_one_step_per_chunk(page: Page, inspector: str) -> None:
    page.goto(inspector)
    pick(page, "solve-steps")
    page.get_by_label("expression").fill("(1+2)*(3+4)")
    page.get_by_role("button", name="Call", exact=True).click()
    sync_api.expect(log_of(page).locator(".chunk")).to_have_text(["(1 + 2) * (3 + 4)\n", "= 3 * 7\n", "= 21\n"])
    sync_api.expect(page.locator("#timing")).to_contain_text("3 chunks")


def test_a_slow_stream_arrives_chunk_by_chunk(page: Page, inspector: str) -> None:
    page.goto(inspector)
    pick(page, "count-down")
    page.evaluate("""() => {
        window.arrivals = [];
        new MutationObserver(() => window.arrivals.push([document.querySelectorAll('.chunk').length,
                                                         performance.now()]))
            .observe(document.getElementById('log'), {childList: true, subtree: true});
    }""")
    page.get_by_label("start").fill("4")
    page.get_by_role("button", name="Call", exact=True).click()
    page.wait_for_function("document.querySelectorAll('#log .chunk').length >= 2")
    screenshot(page, "inspector-stream.png")
    sync_api.expect(log_of(page).locator(".observation")).to_have_text("4\n3\n2\n1\nliftoff\n")
    arrivals = page.evaluate("window.arrivals")
    seen = {count: at for count, at in reversed(arrivals)}  # when each count of chunks was first on the page
    assert len([count for count in range(1, 6) if count in seen]) >= 3, arrivals  # not all at once
    assert seen[5] - min(seen.values()) > 1000  # the 4 lines came 0.4 s apart, not all at the end
    sync_api.expect(page.locator("#timing")).to_contain_text("5 chunks")


def test_progress_shows_as_a_bar_that_fills_as_the_tool_reports(page: Page, inspector: str) -> None:
    page.goto(inspector)
    pick(page, "survey")
    page.evaluate("""() => {
        window.seen = [];  // (progress shown, observation so far) at each change of the log
        new MutationObserver(() => window.seen.push([
            document.querySelector('#log .progress span')?.textContent ?? null,
            document.querySelector('#log .observation')?.textContent ?? null]))
            .observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true});
    }""")
    page.get_by_label("sites").fill("4")
    page.get_by_role("button", name="Call", exact=True).click()
    sync_api.expect(log_of(page).locator(".observation")).to_have_text("surveyed 4 sites")
    sync_api.expect(log_of(page).locator(".progress")).to_have_text("4/4 (100%) site 4")
    assert log_of(page).get_by_role("progressbar", name="progress").evaluate("bar => bar.value") == 1
    while_running = {shown for shown, observation in page.evaluate("window.seen") if shown and not observation}
    assert len(while_running) >= 2, while_running  # it filled step by step before the answer came


def test_errors_show_their_type_and_message_and_where(page: Page, inspector: str) -> None:
    page.goto(inspector)
    pick(page, "calculate")
    page.get_by_label("expression").fill("1/0")
    page.get_by_role("button", name="Call", exact=True).click()
    sync_api.expect(log_of(page).locator(".error")).to_have_text(re.compile(r"^invalid-arguments: division by zero"))
    where = re.compile(r"^host \S+ · request [0-9a-f]{32}$")  # the host and the request id its log names
    sync_api.expect(log_of(page).locator(".error .where")).to_have_text(where)
    page.get_by_label("expression").fill("")
    page.get_by_role("button", name="Call", exact=True).click()  # the required field left out
    sync_api.expect(log_of(page).locator(".error")).to_contain_text("invalid-arguments")
    sync_api.expect(log_of(page).locator(".error")).to_contain_text("expression")


def test_a_second_hosts_tools_appear_and_disappear_without_a_reload(
    page: Page, inspector: str, env: dict[str, str], host_process: Callable[..., HostProcess]
) -> None:
    page.goto(inspector)
    sync_api.expect(page.get_by_role("button", name="calculate", exact=True)).to_be_visible()
    sync_api.expect(page.get_by_role("button", name="tell-joke", exact=True)).to_have_count(0)
    second = host_process(env={**env, "TGHOST_LOAD_PLUGINS": "joke"})
    second.wait_for(READY)
    joke = page.get_by_role("button", name="tell-joke", exact=True)
    sync_api.expect(joke).to_be_visible()
    sync_api.expect(page.locator("li.tool.added")).to_contain_text("tell-joke")  # marked as new
    sync_api.expect(page.locator("#counters")).to_contain_text("2 live hosts")
    pick(page, "tell-joke")
    joke.scroll_into_view_if_needed()  # below the test plugin's tools: the picture shows it, marked
    screenshot(page, "inspector-two-hosts.png")
    second.process.send_signal(signal.SIGINT)
    assert second.finish() == 0
    sync_api.expect(joke).to_have_count(0)
    sync_api.expect(page.locator("#tool-gone")).to_be_visible()
    sync_api.expect(page.locator("#counters")).to_contain_text("1 live host")


def test_a_form_for_a_nested_object_and_arrays_sends_what_it_shows(page: Page, inspector: str) -> None:
    page.goto(inspector)
    pick(page, "plan-trip")
    page.get_by_label("name").fill("Ada")
    page.get_by_label("age").fill("36")
    add_stop = page.get_by_role("button", name="Add stops item")
    add_stop.click()
    add_stop.click()
    page.get_by_label("city").nth(0).fill("Lyon")
    page.get_by_label("city").nth(1).fill("Turin")
    page.get_by_label("nights").nth(1).fill("3")
    page.get_by_label("mode").select_option(label="car")
    page.get_by_role("button", name="Add tags item").click()
    page.get_by_label("tags[0]").fill("food")
    page.get_by_label("direct").check()
    page.get_by_role("button", name="Call", exact=True).click()
    observation = log_of(page).locator(".observation")
    sync_api.expect(observation).not_to_be_empty()
    assert json.loads(observation.inner_text()) == {
        "traveller": {"name": "Ada", "age": 36}, "mode": "car", "tags": ["food"], "direct": True,
        "stops": [{"city": "Lyon", "nights": 1}, {"city": "Turin", "nights": 3}]}
    page.get_by_label("Edit as JSON").check()  # the raw-JSON view shows the same arguments
    raw = json.loads(page.get_by_label("arguments (JSON)").input_value())
    assert raw["stops"][1] == {"city": "Turin", "nights": 3} and raw["mode"] == "car"


def test_an_argument_named_proto_shows_empty_and_is_sent_as_typed(page: Page, inspector: str) -> None:
    """``__proto__`` is a name like any other: the form must not read it off a plain object
    (``{}["__proto__"]`` is the prototype, shown as ``[object Object]``) nor drop it when
    building the call's arguments."""
    page.goto(inspector)
    pick(page, "echo-args")
    proto = page.get_by_label("__proto__")
    sync_api.expect(proto).to_have_value("")
    proto.fill("typed here")
    page.get_by_label("note").fill("n")
    page.get_by_role("button", name="Call", exact=True).click()
    observation = log_of(page).locator(".observation")
    sync_api.expect(observation).not_to_be_empty()
    assert json.loads(observation.inner_text()) == {"__proto__": "typed here", "note": "n"}
    page.get_by_label("Edit as JSON").check()  # to JSON and back: the form keeps the value
    assert json.loads(page.get_by_label("arguments (JSON)").input_value()) == {"__proto__": "typed here", "note": "n"}
    page.get_by_label("Edit as JSON").uncheck()
    sync_api.expect(proto).to_have_value("typed here")
    pick(page, "calculate")
    page.get_by_role("list", name="History").get_by_role("button").first.click()  # the call again, from history
    sync_api.expect(page.get_by_label("__proto__")).to_have_value("typed here")


def tool_item(page: Page, button: str) -> Any:
    """The tool list's entry whose button reads ``button`` (the tool's title, else its name)."""
    return page.get_by_role("listitem").filter(has=page.get_by_role("button", name=button, exact=True))


def test_a_tool_shows_its_title_beside_its_name_and_its_hints_as_badges(page: Page, inspector: str) -> None:
    page.goto(inspector)
    forget, stock = tool_item(page, "Forget a key"), tool_item(page, "Check stock")
    sync_api.expect(forget.locator(".tool-id")).to_have_text("forget-key")
    # read-only false is MCP's default, so not shown; open-world false is not, so it is
    sync_api.expect(forget.locator(".chip.hint")).to_have_text(["destructive", "idempotent"])
    sync_api.expect(stock.locator(".chip.hint")).to_have_text(["read-only", "not open-world"])
    sync_api.expect(tool_item(page, "calculate").locator(".tool-id, .chip.hint")).to_have_count(0)  # as before
    pick(page, "Forget a key")
    sync_api.expect(page.locator("#tool-id")).to_have_text("forget-key")
    sync_api.expect(page.locator("#tool-hints .chip")).to_have_text(["destructive", "idempotent"])
    pick(page, "calculate")
    sync_api.expect(page.locator("#tool-id")).to_be_hidden()
    sync_api.expect(page.locator("#tool-hints")).to_be_hidden()
    page.get_by_label("Filter tools").fill("check stock")  # the filter reads titles too
    sync_api.expect(page.locator("#tool-list .tool-name")).to_have_text(["Check stock"])


def test_a_destructive_tools_call_asks_to_confirm_and_calls_only_once_confirmed(page: Page, inspector: str) -> None:
    requests: list[Any] = []  # every request the page makes
    page.on("request", lambda request: requests.append(request))  # Playwright takes no bound builtin
    page.goto(inspector)
    pick(page, "Forget a key")
    key, call = page.get_by_label("key", exact=True), page.get_by_role("button", name="Call", exact=True)
    confirm = page.get_by_role("group", name=re.compile("hinted destructive"))
    key.fill("alpha")
    call.click()
    asked = re.compile(r'forget-key is hinted destructive: .* Call it with \{"key":"alpha"\}\?')
    sync_api.expect(confirm).to_have_text(asked)
    sync_api.expect(page.get_by_role("button", name="Cancel")).to_be_focused()  # Enter now calls nothing
    sync_api.expect(call).to_be_disabled()
    page.get_by_role("button", name="Cancel").click()
    sync_api.expect(confirm).to_be_hidden()
    call.click()
    key.fill("beta")  # a changed form drops the question: what was asked is no longer what would be sent
    sync_api.expect(confirm).to_be_hidden()
    call.click()
    sync_api.expect(confirm).to_contain_text('{"key":"beta"}')
    page.get_by_role("button", name="Confirm call").click()
    sync_api.expect(log_of(page).locator(".observation")).to_have_text("forgot beta (call 1)")  # the host's first call
    calls = [request.post_data_json for request in requests if request.url.endswith("/api/call")]
    assert [body["arguments"] for body in calls] == [{"key": "beta"}]
    pick(page, "calculate")  # a tool not hinted destructive calls at once
    page.get_by_label("expression").fill("6*7")
    page.get_by_role("button", name="Call", exact=True).click()
    sync_api.expect(log_of(page).locator(".observation")).to_have_text("42")
    sync_api.expect(confirm).to_be_hidden()


#: (path, value as shown, type) of each leaf of a result's tree, the path by the keys down to it.
TREE_LEAVES = """tree => [...tree.querySelectorAll('.leaf')].map(leaf => {
    const path = [];
    for (let entry = leaf; entry; entry = entry.parentElement.closest('.entry'))
        path.unshift(entry.querySelector(':scope > .key, :scope > details > summary > .key').textContent);
    return [path.join('/'), leaf.querySelector('.value').textContent, leaf.querySelector(':scope > .type').textContent];
})"""


#: A JSON value's type by its Python type (int and float: "number").
JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[list[str]]:
    """What :data:`TREE_LEAVES` should read off the tree of ``value``: its scalars, empty
    objects and empty arrays, each with its JSON text (a string quoted) and JSON type."""
    for key, item in value.items() if isinstance(value, dict) else enumerate(value):
        if isinstance(item, dict | list) and item:
            yield from leaves(item, (*path, str(key)))
            continue
        yield ["/".join((*path, str(key))), json.dumps(item), JSON_TYPES.get(type(item), "number")]


def test_a_structured_result_is_a_tree_of_the_json_with_a_raw_json_view(page: Page, inspector: str) -> None:
    page.goto(inspector)
    pick(page, "Check stock")
    sync_api.expect(page.locator("#tool-facts")).to_contain_text("structured: a JSON object (output-schema)")
    page.get_by_label("item", exact=True).fill("bolts")
    page.get_by_role("button", name="Call", exact=True).click()
    tree = log_of(page).get_by_role("list", name="structured result, object · 7 keys")
    sync_api.expect(tree).to_be_visible()
    screenshot(page, "inspector-structured.png")
    raw = log_of(page).locator(".observation")
    sync_api.expect(raw).to_be_hidden()
    expected = json.loads(raw.text_content() or "")
    assert expected["item"] == "bolts"
    assert sorted(tree.evaluate(TREE_LEAVES)) == sorted(leaves(expected))
    sync_api.expect(tree.locator("summary")).to_have_text(
        ["warehouses: array · 2 items", "0: object · 2 keys", "1: object · 2 keys", "supplier: object · 3 keys"])
    tree.locator("summary").first.click()  # folds the warehouses
    sync_api.expect(tree.get_by_text("Turin")).to_be_hidden()
    page.get_by_label("raw JSON").check()
    sync_api.expect(raw).to_be_visible()
    sync_api.expect(tree).to_be_hidden()


def test_a_structured_result_keeps_a_key_named_proto(page: Page, inspector: str) -> None:
    page.goto(inspector)
    pick(page, "echo-structured")
    page.get_by_label("__proto__").fill("typed here")
    page.get_by_label("note").fill("n")
    page.get_by_role("button", name="Call", exact=True).click()
    tree = log_of(page).get_by_role("list", name="structured result, object · 2 keys")
    sync_api.expect(tree).to_be_visible()
    assert sorted(tree.evaluate(TREE_LEAVES)) == [["__proto__", '"typed here"', "string"], ["note", '"n"', "string"]]


def test_the_page_has_no_serious_or_critical_accessibility_violations(page: Page, inspector: str) -> None:
    """axe on the call form of nested objects and arrays, then on the page with titles, hints, a
    structured result's tree and a destructive call waiting to be confirmed: no serious or
    critical violation, and the second finds no kind of violation the first did not."""
    axe = pytest.importorskip("axe_playwright_python.sync_playwright", reason="axe-playwright-python is not installed")
    page.goto(inspector)
    pick(page, "plan-trip")
    page.get_by_role("button", name="Add stops item").click()
    before = accessibility_violations(axe, page)
    pick(page, "Check stock")
    page.get_by_label("item", exact=True).fill("bolts")
    page.get_by_role("button", name="Call", exact=True).click()
    sync_api.expect(log_of(page).locator(".json-tree")).to_be_visible()
    pick(page, "Forget a key")
    page.get_by_label("key", exact=True).fill("alpha")
    page.get_by_role("button", name="Call", exact=True).click()
    sync_api.expect(page.get_by_role("button", name="Confirm call")).to_be_visible()
    after = accessibility_violations(axe, page)
    assert set(after) <= set(before), json.dumps({key: after[key] for key in set(after) - set(before)}, indent=1)


def accessibility_violations(axe: Any, page: Page) -> dict[str, Any]:
    """axe's violations on the page now (rule id -> its help and first nodes), asserting none is
    serious or critical."""
    found = {v["id"]: {"impact": v["impact"], "help": v["help"], "nodes": [n["target"] for n in v["nodes"]][:5]}
             for v in axe.Axe().run(page).response["violations"]}
    serious = {key: v for key, v in found.items() if v["impact"] in ("serious", "critical")}
    assert not serious, json.dumps(serious, indent=1)
    return found
