"""wire: the seed 000 envelope codec (bytes in, values out). The Pulsar path is in tests/serving/test_endpoint.py."""

from __future__ import annotations

import json

import pytest

from tghost.protocol import wire


def test_request_fields_are_parsed_from_json_strings() -> None:
    payload = json.dumps({"user": "alice", "config": '{"collection": "customers"}',
                          "arguments": '{"question": "why?"}'}).encode()
    assert wire.decode_request(payload) == wire.Request("alice", {"collection": "customers"},
                                                        {"question": "why?"})


def test_missing_user_empty_config_and_unknown_keys_are_accepted() -> None:
    request = wire.decode_request(b'{"config": "", "arguments": "{}", "flow": "x"}')
    assert request == wire.Request(wire.DEFAULT_USER, {}, {})


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [(b"\xff\xfe", "not UTF-8 JSON"), (b"{nope", "not UTF-8 JSON"), (b"[1]", "JSON object"),
     (b'{"config": 5}', "'config'"), (b'{"arguments": "[1]"}', "'arguments'"),
     (b'{"arguments": "{x"}', "'arguments' is not valid JSON"), (b'{"user": 7}', "'user'"),
     (b'{"user": false}', "'user' must be a string"), (b'{"config": 0}', "'config'"),
     ('{"config": "{}"}'.encode("utf-16"), "not UTF-8 JSON"),
     (b"[" * 100_000 + b"]" * 100_000, "request is not UTF-8 JSON: nested too deeply"),
     (b'{"arguments": "' + b'{\\"a\\": ' * 100_000 + b'1' + b'}' * 100_000 + b'"}',
      "'arguments' is not valid JSON: nested too deeply"),
     (b'{"arguments": "{\\"n\\": ' + b"9" * 5000 + b'}"}', "'arguments' is not valid JSON")],
)
def test_malformed_requests_raise_bad_request_saying_what_is_wrong(payload: bytes, complaint: str) -> None:
    with pytest.raises(wire.BadRequest, match=complaint):
        wire.decode_request(payload)


def test_encoded_request_decodes_back() -> None:
    payload = wire.encode_request("bob", {"style": "pun"}, {"topic": "cats"})
    assert wire.decode_request(payload) == wire.Request("bob", {"style": "pun"}, {"topic": "cats"})


def test_request_without_user_omits_the_key() -> None:
    assert "user" not in json.loads(wire.encode_request(None, {}, {}))


def test_success_and_error_responses_have_exactly_the_contract_keys() -> None:
    ok = json.loads(wire.encode_response("hi", end_of_stream=False))
    assert ok == {"error": None, "response": "hi", "end_of_stream": False}
    err = json.loads(wire.encode_error(wire.TIMEOUT, "slow"))
    assert err == {"error": {"type": "timeout", "message": "slow"}, "response": "", "end_of_stream": True}


def test_non_string_results_become_json() -> None:
    assert wire.observation({"a": [1, 2]}) == '{"a": [1, 2]}'
    assert wire.observation("plain") == "plain"
    with pytest.raises(TypeError):
        wire.observation(object())


def test_response_round_trip() -> None:
    assert wire.decode_response(wire.encode_error("x", "y")) == wire.Response("", True, {"type": "x", "message": "y"})
    assert wire.decode_response(wire.encode_error("x", "y", "h1", "r1")) == \
        wire.Response("", True, {"type": "x", "message": "y", "host": "h1", "request-id": "r1"})


def test_an_error_may_say_where_beside_its_type_and_message_and_a_reader_keeps_only_strings() -> None:
    assert json.loads(wire.encode_error("x", "y", "h1", "r1"))["error"] == \
        {"type": "x", "message": "y", "host": "h1", "request-id": "r1"}
    odd = b'{"error": {"type": "x", "message": "y", "host": 7, "extra": "z"}, "response": "", "end_of_stream": true}'
    assert wire.decode_response(odd).error == {"type": "x", "message": "y"}
    assert wire.decode_response(wire.encode_response("z")) == wire.Response("z", True, None)
