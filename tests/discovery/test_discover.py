"""discover: entry points are loaded one at a time; failures and collisions are reported, not fatal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import PluginDir
from tghost.discovery.discover import PluginLoadError, PluginSelection, discover

GOOD = """
import tghost

@tghost.tool(group=["math"])
def double(x: int) -> int:
    '''Double a number.'''
    return 2 * x

@tghost.hookimpl
def tghost_register_services(register):
    register(double)
"""

KB = """
import tghost

@tghost.tool(service="kb", config=["collection"])
def search(question: str, collection: str) -> str:
    '''Search a collection.'''
    return collection + ":" + question

@tghost.hookimpl
def tghost_register_services(register):
    register(search)

@tghost.hookimpl
def tghost_register_tools(register):
    register(search.tool("query-a", collection="a"))
    register({"type": "tool-service", "name": "query-b", "description": "B", "service": "kb",
              "collection": "b"})
"""


def test_a_good_plugin_contributes_its_service_and_tool_with_its_origin(plugin_dir: PluginDir) -> None:
    plugin_dir.add("good", GOOD, version="2.5")
    catalog = discover(plugin_dir.entry_points())
    [report] = catalog.plugins
    assert (report.name, report.distribution, report.version) == ("good", "tghost-test-good", "2.5")
    assert report.services == ["double"] and report.tools == ["double"] and not report.errors
    assert catalog.descriptors["double"].version == "2.5"
    assert catalog.tools["double"].group == ("math",)
    assert catalog.tool_origin["double"] is report


def test_tools_registered_through_the_tools_hook_carry_config_values(plugin_dir: PluginDir) -> None:
    plugin_dir.add("kb", KB)
    catalog = discover(plugin_dir.entry_points())
    assert catalog.tools["query-a"].config == {"collection": "a"}
    assert catalog.tools["query-b"].config == {"collection": "b"}
    # A required config param means no default tool: it would have no collection.
    assert "search" not in catalog.tools


def test_import_failure_is_reported_and_the_others_are_served(plugin_dir: PluginDir) -> None:
    plugin_dir.add("broken", "import does_not_exist_anywhere\n")
    plugin_dir.add("good", GOOD)
    catalog = discover(plugin_dir.entry_points())
    broken = next(r for r in catalog.plugins if r.name == "broken")
    assert broken.failed and "ModuleNotFoundError" in broken.errors[0]
    assert "does_not_exist_anywhere" in broken.tracebacks[0]
    assert list(catalog.services) == ["double"]


def test_a_hook_that_raises_skips_the_whole_plugin(plugin_dir: PluginDir) -> None:
    plugin_dir.add("raiser", GOOD.replace("register(double)", "register(double)\n    raise RuntimeError('boom')"))
    plugin_dir.add("kb", KB)
    catalog = discover(plugin_dir.entry_points())
    raiser = next(r for r in catalog.plugins if r.name == "raiser")
    assert raiser.failed and "RuntimeError: boom" in raiser.errors[0]
    assert "double" not in catalog.services  # registered before the raise, still dropped
    assert set(catalog.services) == {"kb"}


def test_an_invalid_descriptor_names_the_plugin_and_field(plugin_dir: PluginDir) -> None:
    plugin_dir.add("badtool", KB.replace('"description": "B", ', ""))
    plugin_dir.add("good", GOOD)
    catalog = discover(plugin_dir.entry_points())
    bad = next(r for r in catalog.plugins if r.name == "badtool")
    assert bad.failed
    assert "plugin 'badtool': tool 'query-b': field 'description'" in bad.errors[0]
    assert "double" in catalog.services


@pytest.mark.parametrize(("register", "named"), [
    ('register(search.tool("bad name", collection="a"))',
     "plugin 'badname': service 'kb': tool 'bad name': field 'name'"),
    ('register({"name": "bad name", "description": "B", "service": "kb", "collection": "b"})',
     "plugin 'badname': tool 'bad name': field 'name'"),
    # A plugin that catches the error is reported all the same.
    ('try:\n        register({"name": "bad name", "description": "B", "service": "kb"})\n'
     '    except ValueError:\n        pass', "plugin 'badname': tool 'bad name': field 'name'"),
    ("register(42)", "plugin 'badname': register() takes a ToolService, @tghost.tool function or ToolSet, got 42"),
])
def test_a_descriptor_error_is_one_line_naming_plugin_tool_and_field_however_registered(
    plugin_dir: PluginDir, caplog: pytest.LogCaptureFixture, register: str, named: str,
) -> None:
    hook = "tghost_register_services" if "42" in register else "tghost_register_tools"
    source = KB.replace("@tghost.hookimpl\ndef tghost_register_tools(register):", "def unused(register):")
    plugin_dir.add("badname", source + f"\n@tghost.hookimpl\ndef {hook}(register):\n    {register}\n"
                   if hook == "tghost_register_tools" else GOOD.replace("register(double)", register))
    with caplog.at_level("ERROR", logger="tghost.discovery.discover"):
        [report] = discover(plugin_dir.entry_points()).plugins
    [error] = report.errors
    assert error.startswith(named) and "\n" not in error
    assert "raised" not in error and report.tracebacks == []  # the plugin's own code raised nothing
    assert [r.getMessage() for r in caplog.records] == [error]  # the log line is the same one line


def test_a_plugin_that_raises_is_reported_as_raised_with_its_traceback(plugin_dir: PluginDir) -> None:
    plugin_dir.add("raiser", GOOD.replace("register(double)", "raise KeyError('oops')"))
    [report] = discover(plugin_dir.entry_points()).plugins
    assert report.errors == ["tghost_register_services raised KeyError: 'oops'"] and report.tracebacks


def test_registering_something_that_is_not_a_service_is_reported(plugin_dir: PluginDir) -> None:
    plugin_dir.add("notservice", GOOD.replace("register(double)", "register(42)"))
    [report] = discover(plugin_dir.entry_points()).plugins
    assert report.failed and "ToolService" in report.errors[0]


def test_service_id_collision_keeps_the_first_by_name_and_reports_the_second(plugin_dir: PluginDir) -> None:
    plugin_dir.add("a-first", GOOD)
    plugin_dir.add("b-second", GOOD)
    catalog = discover(plugin_dir.entry_points())
    second = next(r for r in catalog.plugins if r.name == "b-second")
    assert catalog.service_origin["double"].name == "a-first"
    assert second.failed
    assert "service id 'double' is already provided by plugin 'a-first'" in second.errors[0]


def test_tool_name_collision_is_reported_not_overwritten(plugin_dir: PluginDir) -> None:
    plugin_dir.add("kb", KB)
    plugin_dir.add("kb2", KB.replace('service="kb"', 'service="kb2"').replace('"service": "kb"', '"service": "kb2"'))
    catalog = discover(plugin_dir.entry_points())
    assert catalog.tools["query-a"].service == "kb"
    kb2 = next(r for r in catalog.plugins if r.name == "kb2")
    assert "tool name 'query-a' is already provided by plugin 'kb'" in kb2.errors[0]


def test_a_tool_for_an_unknown_service_or_without_required_config_is_skipped(plugin_dir: PluginDir) -> None:
    plugin_dir.add("kb", KB.replace("def tghost_register_tools(register):\n", """def tghost_register_tools(register):
    register(search.tool("no-collection"))
    register({"name": "elsewhere", "description": "E", "service": "nowhere"})
"""))
    catalog = discover(plugin_dir.entry_points())
    [report] = catalog.plugins
    assert set(catalog.tools) == {"query-a", "query-b"} and report.services == ["kb"]
    assert any("'elsewhere' references service 'nowhere'" in e for e in report.errors)
    assert any("'no-collection' lacks required config param(s) ['collection']" in e for e in report.errors)


def test_strict_mode_makes_any_failure_fatal(plugin_dir: PluginDir, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin_dir.add("broken", "raise ImportError('nope')\n")
    monkeypatch.setenv("TGHOST_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="broken: cannot load"):
        discover(plugin_dir.entry_points())
    monkeypatch.setenv("TGHOST_STRICT_PLUGINS", "0")
    assert discover(plugin_dir.entry_points()).plugins[0].failed


def test_selection_unset_loads_all_and_an_empty_load_list_loads_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TGHOST_LOAD_PLUGINS", raising=False)
    monkeypatch.delenv("TGHOST_DISABLE_PLUGINS", raising=False)
    assert PluginSelection.from_settings().blocked_reason("any") is None
    monkeypatch.setenv("TGHOST_LOAD_PLUGINS", "")
    assert PluginSelection.from_settings().blocked_reason("any") == "TGHOST_LOAD_PLUGINS is empty"


def test_selection_reads_comma_lists_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TGHOST_LOAD_PLUGINS", " a, b ,,")
    monkeypatch.setenv("TGHOST_DISABLE_PLUGINS", "b")
    selection = PluginSelection.from_settings()
    assert selection.load == {"a", "b"} and selection.disable == {"b"}
    assert selection.blocked_reason("a") is None
    assert selection.blocked_reason("b") == "disabled by TGHOST_DISABLE_PLUGINS"
    assert selection.blocked_reason("c") == "not listed in TGHOST_LOAD_PLUGINS"


def test_selection_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TGHOST_LOAD_PLUGINS", "a")
    monkeypatch.setenv("TGHOST_DISABLE_PLUGINS", "c")
    selection = PluginSelection.from_settings(load="c", disable="")
    assert selection.blocked_reason("c") is None
    assert selection.blocked_reason("a") == "not listed in --load-plugins"
    assert PluginSelection.from_settings(disable="a").blocked_reason("a") == "disabled by --disable-plugins"


def test_names_that_no_entry_point_has_are_reported_missing() -> None:
    selection = PluginSelection(load=frozenset({"good", "typo"}), disable=frozenset({"gone"}))
    missing = {r.name: r for r in selection.missing(["good", "other"])}
    assert set(missing) == {"typo", "gone"}
    assert missing["typo"].status == "missing"
    assert "TGHOST_LOAD_PLUGINS names entry point 'typo', but no installed plugin has it" in missing["typo"].errors[0]
    assert "TGHOST_DISABLE_PLUGINS names entry point 'gone'" in missing["gone"].errors[0]


def test_a_blocked_plugin_is_never_imported_and_is_reported_blocked(plugin_dir: PluginDir) -> None:
    plugin_dir.add("good", GOOD)
    plugin_dir.add("explosive", "raise SystemExit('imported although blocked')\n")
    selection = PluginSelection(disable=frozenset({"explosive"}), disable_source="--disable-plugins")
    catalog = discover(plugin_dir.entry_points(), selection=selection)
    reports = {r.name: r for r in catalog.plugins}
    assert reports["explosive"].status == "blocked" and not reports["explosive"].errors
    assert reports["explosive"].to_json()["blocked"] == "disabled by --disable-plugins"
    assert reports["explosive"].distribution == "tghost-test-explosive"
    assert "tghost_test_explosive" not in sys.modules
    assert reports["good"].status == "loaded" and list(catalog.services) == ["double"]


def test_a_load_list_serves_only_the_named_plugins_and_reports_unknown_names(plugin_dir: PluginDir) -> None:
    plugin_dir.add("good", GOOD)
    plugin_dir.add("kb", KB)
    catalog = discover(plugin_dir.entry_points(), selection=PluginSelection(load=frozenset({"kb", "kbb"})))
    assert {r.name: r.status for r in catalog.plugins} == {"good": "blocked", "kb": "loaded", "kbb": "missing"}
    assert set(catalog.services) == {"kb"}


HOOKS_DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "plugin-hooks.md"


def documented_example(hook: str) -> str:
    """The first Python block under a hook's heading in docs/reference/plugin-hooks.md (tests run it)."""
    section = HOOKS_DOC.read_text().split(f"## {hook}(", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


GREETER = documented_example("tghost_register_plugins")

#: A plugin system whose plugins can fail at load time, fail in their hooks, or serve; each one
#: records its shutdown in SHUT (the module's list), and ``greeter-*`` added plugins are not involved.
FAMILY = """
import tghost

SHUT = []

@tghost.tool(name="member-ok")
def member_ok() -> str:
    '''Answer ok.'''
    return "ok"

class Member:
    def __init__(self, name, fail_in_hook=False):
        self.name, self.fail_in_hook = name, fail_in_hook

    @tghost.hookimpl
    def tghost_register_services(self, register):
        if self.fail_in_hook:
            raise RuntimeError(f"{self.name}: mount() raised")
        register(member_ok)

    @tghost.hookimpl
    def tghost_shutdown(self):
        SHUT.append(self.name)

def cannot_load():
    raise ImportError("the member's module is broken")

@tghost.hookimpl
def tghost_register_plugins(register):
    register("member-ok", lambda: Member("member-ok"), kind="family", value="family:ok", version="1.2")
    register("member-raises", lambda: Member("member-raises", fail_in_hook=True), kind="family", value="family:raises")
    register("member-broken", cannot_load, kind="family", value="family:broken")

@tghost.hookimpl
def tghost_shutdown():
    SHUT.append("family")
"""


def test_added_plugins_are_listed_with_their_kind_and_adder_and_serve_what_they_register(
    plugin_dir: PluginDir,
) -> None:
    plugin_dir.add("greeter", GREETER)
    catalog = discover(plugin_dir.entry_points(), config={"greeter": {"greetings": ["hello", "hi"]}})
    reports = {r.name: r for r in catalog.plugins}
    assert set(reports) == {"greeter", "greeter-hello", "greeter-hi"}
    hello = reports["greeter-hello"]
    assert (hello.kind, hello.added_by, hello.value, hello.status) == (
        "greeter", "greeter", "greeting 'hello'", "loaded")
    assert hello.services == hello.tools == ["greet-hello"]
    assert reports["greeter"].kind == "tghost" and reports["greeter"].added_by is None
    assert catalog.services["greet-hi"].invoke("u", {}, {"name": "Ada"}) == "hi, Ada!"
    assert hello.to_json()["kind"] == "greeter" and hello.to_json()["added_by"] == "greeter"


def test_the_config_file_reaches_the_hook_and_defaults_to_empty(plugin_dir: PluginDir) -> None:
    plugin_dir.add("greeter", GREETER)
    assert set(discover(plugin_dir.entry_points()).services) == {"greet-hello"}


def test_one_added_plugin_failing_to_load_or_in_its_hook_skips_it_alone(plugin_dir: PluginDir) -> None:
    plugin_dir.add("family", FAMILY)
    catalog = discover(plugin_dir.entry_points())
    reports = {r.name: r for r in catalog.plugins}
    assert reports["member-ok"].status == "loaded" and reports["member-ok"].version == "1.2"
    assert reports["member-raises"].status == "failed"
    assert "tghost_register_services raised RuntimeError: member-raises: mount() raised" in reports[
        "member-raises"].errors[0]
    assert reports["member-broken"].status == "failed"
    assert reports["member-broken"].errors[0] == (
        "cannot load family plugin 'family:broken': ImportError: the member's module is broken")
    assert reports["family"].status == "loaded" and not reports["family"].errors
    assert list(catalog.services) == ["member-ok"]


def test_shutdown_runs_every_loaded_plugins_hook_once_latest_first_even_after_one_raises(
    plugin_dir: PluginDir,
) -> None:
    plugin_dir.add("family", FAMILY.replace('SHUT.append("family")', 'SHUT.append("family")\n    raise OSError("x")'))
    catalog = discover(plugin_dir.entry_points())
    shut = sys.modules["tghost_test_family"].SHUT
    catalog.shutdown(["member-ok"])
    assert shut == ["member-ok"]
    catalog.shutdown()
    assert shut == ["member-ok", "member-raises", "family"]  # the one that failed to register is released too
    catalog.shutdown()
    assert len(shut) == 3


def test_a_blocked_added_plugin_is_never_loaded_and_a_load_list_may_name_its_adder(plugin_dir: PluginDir) -> None:
    plugin_dir.add("family", FAMILY)
    disabled = discover(plugin_dir.entry_points(), selection=PluginSelection(disable=frozenset({"member-broken"})))
    broken = next(r for r in disabled.plugins if r.name == "member-broken")
    assert broken.status == "blocked" and broken.blocked == "disabled by TGHOST_DISABLE_PLUGINS" and not broken.errors
    by_adder = discover(plugin_dir.entry_points(), selection=PluginSelection(load=frozenset({"family"})))
    assert {r.name: r.status for r in by_adder.plugins}["member-ok"] == "loaded"
    by_name = discover(plugin_dir.entry_points(), selection=PluginSelection(load=frozenset({"family", "member-ok"}),
                                                                          disable=frozenset({"member-raises"})))
    statuses = {r.name: r.status for r in by_name.plugins}
    assert statuses == {"family": "loaded", "member-ok": "loaded", "member-raises": "blocked",
                        "member-broken": "failed"}  # the adder is listed: its plugins load; names are not "missing"


def test_an_added_plugin_name_already_taken_fails_its_adder_and_loads_none_of_its_plugins(
    plugin_dir: PluginDir,
) -> None:
    plugin_dir.add("good", GOOD)
    plugin_dir.add("family", FAMILY.replace('register("member-ok"', 'register("good"'))
    catalog = discover(plugin_dir.entry_points())
    family = next(r for r in catalog.plugins if r.name == "family")
    assert family.errors == ["tghost_register_plugins added plugin name(s) ['good'] that are already taken; "
                             "none of its plugins loaded"]
    assert [r.name for r in catalog.plugins] == ["family", "good"]


def test_strict_mode_releases_the_plugins_before_it_raises(plugin_dir: PluginDir) -> None:
    plugin_dir.add("family", FAMILY)
    with pytest.raises(PluginLoadError, match="member-broken: cannot load family plugin"):
        discover(plugin_dir.entry_points(), strict=True)
    assert sorted(sys.modules["tghost_test_family"].SHUT) == ["family", "member-ok", "member-raises"]
