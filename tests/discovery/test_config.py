"""config: tools declared in TOML are added over served services; bad entries name file and key."""

from __future__ import annotations

from pathlib import Path

import tghost
from tghost.discovery.catalog import Catalog
from tghost.discovery.config import load_config_tools
from tghost.discovery.discover import catalog_of


@tghost.tool(service="kb", config=["collection"])
def search(question: str, collection: str) -> str:
    """Search a collection.

    Args:
        question: What to look for.
    """
    return f"{collection}: {question}"


def catalog() -> Catalog:
    return catalog_of([search], [search.tool("query-customers", collection="customers")])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tools.toml"
    path.write_text(text)
    return path


def test_a_config_tool_is_added_with_its_config_and_the_services_arguments(tmp_path: Path) -> None:
    path = write(tmp_path, """
[tools.query-orders]
service = "kb"
description = "Query the order knowledge base"
collection = "orders"
group = ["sales"]
state = "ordering"
""")
    cat = catalog()
    report = load_config_tools(cat, path)
    tool = cat.tools["query-orders"]
    assert report.tools == ["query-orders"] and not report.errors
    assert tool.config == {"collection": "orders"} and tool.group == ("sales",) and tool.state == "ordering"
    assert [a.name for a in tool.arguments] == ["question"]  # from the plugin tool of the same service
    assert tool.input_schema == cat.tools["query-customers"].input_schema
    assert cat.tool_origin["query-orders"] is report and report in cat.plugins


def test_bad_entries_name_the_file_and_key_and_the_rest_still_load(tmp_path: Path) -> None:
    path = write(tmp_path, """
[tools.good]
service = "kb"
description = "Fine"
collection = "x"

[tools.no-description]
service = "kb"
collection = "x"

[tools.no-collection]
service = "kb"
description = "Lacks its required config"

[tools.elsewhere]
service = "not-served"
description = "Unknown service"

[tools.query-customers]
service = "kb"
description = "Collides with a plugin tool"
collection = "y"
""")
    cat = catalog()
    report = load_config_tools(cat, path)
    assert report.tools == ["good"]
    errors = "\n".join(report.errors)
    assert f"{path}: [tools.no-description]: field 'description'" in errors
    assert f"{path}: [tools.no-collection]: lacks required config param(s) ['collection']" in errors
    assert f"{path}: [tools.elsewhere]: service 'not-served' is not served here" in errors
    assert "tool name 'query-customers' is already provided by plugin 'local'" in errors
    assert cat.tools["query-customers"].config == {"collection": "customers"}  # not replaced


def test_an_unparseable_file_is_one_error_and_adds_nothing(tmp_path: Path) -> None:
    cat = catalog()
    report = load_config_tools(cat, write(tmp_path, "[tools.x\nservice = "))
    assert len(report.errors) == 1 and "cannot read" in report.errors[0]
    assert set(cat.tools) == {"query-customers"}
