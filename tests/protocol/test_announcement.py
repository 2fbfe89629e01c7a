"""announcement: a message built by announcement_value is one the directory's model parses back
to the same value, for each kind of message, with every field the format has."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tghost.protocol.announcement import Announcement, announcement_value, parse_descriptor

HOST = {"id": "laptop-3f9a2b1c0d4e", "hostname": "laptop", "pid": 4242, "version": "0.1.0",
        "instance": "9c1e5b7a2d4f6e80", "session-key": "bm90IGEga2V5"}
SERVICE = {"id": "joke-service", "request-queue": "non-persistent://tg/request/joke",
           "response-queue": "non-persistent://tg/response/joke", "config-params": [{"name": "style"}]}
TOOL = {"type": "tool-service", "name": "tell-joke", "description": "Tell a joke", "service": "joke-service",
        "style": "pun"}
PLUGIN = {"entry_point": "joke", "distribution": "tghost-joke", "version": "0.1.0"}
TIMES = {"lease": 30.0, "sent_at": 1771000000.25, "since": 1770999990.5}

#: (kind, name, status, the optional fields it carries): every kind of message a host sends.
MESSAGES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("host", HOST["id"], "available",
     {"entries": {"tool-service": ["joke-service"], "tool": ["tell-joke"]}, "health": "http://127.0.0.1:9464/health"}),
    ("host", HOST["id"], "withdrawn", {}),
    ("tool-service", "joke-service", "available", {"descriptor": SERVICE, "plugin": PLUGIN, "external": True}),
    ("tool-service", "joke-service", "available", {"descriptor": SERVICE, "plugin": PLUGIN, "access_policy": "none"}),
    ("tool-service", "joke-service", "withdrawn", {"plugin": PLUGIN}),
    ("tool", "tell-joke", "available",
     {"descriptor": TOOL, "plugin": PLUGIN, "access": {"anonymous": False, "keys": ["0123456789abcdef"]}}),
    ("tool", "tell-joke", "withdrawn", {"plugin": PLUGIN}),
]


@pytest.mark.parametrize(("kind", "name", "status", "fields"), MESSAGES, ids=lambda v: v if isinstance(v, str) else "")
def test_a_built_message_round_trips_through_the_parser(kind: str, name: str, status: str,
                                                        fields: dict[str, Any]) -> None:
    value = json.loads(json.dumps(announcement_value(kind, name, status, host=HOST, **TIMES, **fields)))
    parsed = Announcement.model_validate(value)
    assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == value
    assert (parsed.kind, parsed.name, parsed.status, parsed.host.id) == (kind, name, status, HOST["id"])
    descriptor = parse_descriptor(parsed)
    assert (descriptor.to_json_dict() if descriptor else None) == fields.get("descriptor")


def test_the_messages_carry_every_field_of_the_format_and_leave_out_the_optional_ones_not_given() -> None:
    built = [announcement_value(kind, name, status, host=HOST, **TIMES, **fields)
             for kind, name, status, fields in MESSAGES]
    format_fields = {field.alias or name for name, field in Announcement.model_fields.items()}
    assert set().union(*built) == format_fields
    assert list(built[1]) == ["kind", "name", "status", "descriptor", "host", "plugin", "lease", "since"]
