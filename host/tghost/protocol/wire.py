"""wire: the TrustGraph tool-service envelope (seed 000), encoded and decoded as UTF-8 JSON bytes.

Both the server and the client use this module, so the contract lives in one place.
Never does I/O: bytes in, bytes or values out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeGuard

from tghost.protocol.descriptors import ADDED_TOOL_KEYS

__all__ = [
    "ALIVE",
    "BAD_REQUEST",
    "CANCEL",
    "CANCELLED",
    "CONTENT_TYPE",
    "DRAINING",
    "HOLDS",
    "INVALID_ARGUMENTS",
    "JSON_CONTENT",
    "MAX_MESSAGE",
    "MISSING_CONFIG",
    "NOT_ALLOWED",
    "OK",
    "OVERLOADED",
    "PROBE",
    "PROBES",
    "PROGRESS",
    "RATE_LIMITED",
    "REDELIVERY_LIMIT",
    "RESENDS",
    "RESEND_PAUSE",
    "STARTED",
    "TIMEOUT",
    "TOOL_SERVICE_ERROR",
    "UNAUTHORIZED",
    "UNAVAILABLE",
    "UNKNOWN_SESSION",
    "BadRequest",
    "Progress",
    "Request",
    "Response",
    "TooLarge",
    "control_topic",
    "decode_request",
    "decode_response",
    "encode_error",
    "encode_progress",
    "encode_request",
    "encode_response",
    "observation",
]

# Stable error types. ``tool-service-error`` is TrustGraph's own, for exceptions in invoke.
TOOL_SERVICE_ERROR = "tool-service-error"
BAD_REQUEST = "bad-request"
INVALID_ARGUMENTS = "invalid-arguments"
MISSING_CONFIG = "missing-config"
TIMEOUT = "timeout"
OVERLOADED = "overloaded"
NOT_ALLOWED = "not-allowed"
UNAVAILABLE = "unavailable"
#: A request on a persistent topic delivered more often than the host's redelivery limit.
REDELIVERY_LIMIT = "redelivery-limit"
#: A host's access policy refuses the call: a caller it does not know or allow, or a bad,
#: stale or replayed caller signature (docs/protocol.md §2.8).
UNAUTHORIZED = "unauthorized"
#: The verified caller is over its rate on this host; the text says when to retry.
RATE_LIMITED = "rate-limited"
#: The caller cancelled the call (docs/protocol.md §2.11): the host stopped it; nothing more comes.
CANCELLED = "cancelled"
#: The property that marks a message on a service's control topic as a cancel (docs/protocol.md §2.11).
CANCEL = "tghost-cancel"
#: The property that marks a message on a service's control topic as a liveness probe; its value
#: is the ``id`` of the request the caller waits on (docs/protocol.md §2.15).
PROBE = "tghost-probe"
#: The property that marks a response-topic message as a host's answer to a liveness probe, whose
#: ``id`` it carries (docs/protocol.md §2.15).
ALIVE = "tghost-alive"
#: The key of a host message's ``host`` object by which a host says it answers liveness probes
#: (``true``; docs/protocol.md §4.3): callers probe only services whose hosts all do.
PROBES = "probes"
#: On a probe's answer: ``1`` if the host holds the request the probe names (waiting or running),
#: else ``0``.
HOLDS = "tghost-holds"
#: On a probe's answer: ``1`` if the host is stopping (it withdrew the service and drains), so a
#: caller does not count it among the hosts that serve it (docs/protocol.md §2.15).
DRAINING = "tghost-draining"
#: The request property by which a caller asks for progress updates (docs/protocol.md §2.12).
PROGRESS = "tghost-progress"
#: The reply property that says how to read the observation (docs/protocol.md §2.14): only
#: :data:`JSON_CONTENT` so far, on every reply of a tool with an ``output-schema``.
CONTENT_TYPE = "tghost-content-type"
#: The observation is the JSON text of one object that matches the tool's ``output-schema``.
JSON_CONTENT = "application/json"
#: A request in a caller session carries no MAC for the host that received it (the caller did
#: not yet know the host): nothing ran, and the caller resends it signed (docs/protocol.md §2.9).
UNKNOWN_SESSION = "unknown-session"
#: The status of a call answered without error, on both sides' call records (any other
#: status is an error type).
OK = "ok"

#: TrustGraph's DynamicToolService uses this user when the request names none.
DEFAULT_USER = "trustgraph"


#: Bytes: the largest message pulsar-client sends (its default, and Apache Pulsar's default
#: ``maxMessageSize``: 5 MiB); a larger one is refused at send.
MAX_MESSAGE = 5 * 1024 * 1024


class TooLarge(ValueError):
    """A response too large to send as one Pulsar message (:data:`MAX_MESSAGE`)."""


class BadRequest(ValueError):
    """A request payload that is not a valid envelope. The message says which part is wrong."""


@dataclass(frozen=True, slots=True)
class Request:
    """A decoded request envelope: ``user`` and the parsed ``config`` and ``arguments`` objects."""

    user: str
    config: dict[str, Any]
    arguments: dict[str, Any]


class Progress(NamedTuple):
    """How far a running call has got (docs/protocol.md §2.12): ``done`` units of ``total``
    (``None``: unknown), and a short ``message`` for a person (or ``None``)."""

    done: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Response:
    """A decoded response envelope. ``error`` is ``{"type", "message"}`` or ``None``, with the
    answering host's ``host`` id and the ``request-id`` when the reply names them (docs/protocol.md
    §2.6); ``progress`` is set on a progress update (an empty chunk, §2.12). ``started`` is the
    error's ``started`` key (§2.6): ``False`` when the host says the call did not start, so the
    caller may send it again; ``None`` when it does not say."""

    response: str
    end_of_stream: bool
    error: dict[str, str] | None = None
    progress: Progress | None = None
    started: bool | None = None


def _loads(raw: str, complaint: str) -> Any:
    """``json.loads``, with every way it can fail (bad JSON, nesting deeper than the interpreter's
    recursion limit, integers longer than its digit limit) raised as ``BadRequest(complaint: why)``."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise BadRequest(f"{complaint}: {reason}") from None


def _json_object(envelope: dict[str, Any], key: str) -> dict[str, Any]:
    raw = envelope.get(key)
    if raw is None or raw == "" or raw == "{}":
        return {}
    if not isinstance(raw, str):
        raise BadRequest(f"'{key}' must be a JSON object encoded as a string, got {type(raw).__name__}")
    value = _loads(raw, f"'{key}' is not valid JSON")
    if not isinstance(value, dict):
        raise BadRequest(f"'{key}' must encode a JSON object, got {type(value).__name__}")
    return value


def decode_request(payload: bytes) -> Request:
    """Decode a seed 000 request envelope.

    ``{"user": str?, "config": "<JSON object>", "arguments": "<JSON object>"}``; unknown keys
    are ignored, an empty or missing ``config``/``arguments`` means ``{}`` and a missing,
    null or empty ``user`` means ``"trustgraph"``. The config keys of
    :data:`~tghost.protocol.descriptors.ADDED_TOOL_KEYS` are dropped: a directory of tghost's
    first release sends a tool's ``title``, ``annotations`` and ``output-schema`` as config
    values (docs/protocol.md §3.3).

    Raises:
        BadRequest: the payload is not UTF-8 JSON (or nests too deeply to parse), not an object,
            or a field has a wrong type. Never any other exception, whatever the bytes.
    """
    try:
        text = payload.decode()
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request is not UTF-8 JSON: {exc}") from None
    envelope = _loads(text, "request is not UTF-8 JSON")
    if not isinstance(envelope, dict):
        raise BadRequest(f"request must be a JSON object, got {type(envelope).__name__}")
    user = envelope.get("user")
    if user is None or user == "":
        user = DEFAULT_USER
    elif not isinstance(user, str):
        raise BadRequest(f"'user' must be a string, got {type(user).__name__}")
    config = _json_object(envelope, "config")
    if not ADDED_TOOL_KEYS.isdisjoint(config):
        config = {key: value for key, value in config.items() if key not in ADDED_TOOL_KEYS}
    return Request(user, config, _json_object(envelope, "arguments"))


def encode_request(user: str | None, config: dict[str, Any], arguments: dict[str, Any]) -> bytes:
    """Encode a seed 000 request envelope; ``user=None`` omits the key, as newer TrustGraph does."""
    envelope: dict[str, Any] = {"config": json.dumps(config), "arguments": json.dumps(arguments)}
    if user is not None:
        envelope["user"] = user
    return json.dumps(envelope).encode()


def observation(result: Any) -> str:
    """The observation string for a plugin result: strings as they are, anything else JSON.

    Raises:
        TypeError: the result is neither a string nor JSON-serialisable.
    """
    return result if isinstance(result, str) else json.dumps(result)


def encode_response(text: str, end_of_stream: bool = True) -> bytes:
    """Encode a success response: ``{"error": null, "response": text, "end_of_stream": bool}``
    (the bytes ``json.dumps`` gives for that dict, put together without building it).

    Raises:
        TooLarge: the encoded response is over :data:`MAX_MESSAGE` bytes.
    """
    payload = b"".join((_RESPONSE_HEAD, json.dumps(text).encode(), _END_OF_STREAM[end_of_stream]))
    if len(payload) > MAX_MESSAGE:
        raise TooLarge(f"the {'result' if end_of_stream else 'chunk'} is {len(payload)} bytes encoded, over "
                       f"Pulsar's message limit of {MAX_MESSAGE} bytes; return less, or stream it in smaller chunks")
    return payload


_RESPONSE_HEAD = b'{"error": null, "response": '
_END_OF_STREAM = {True: b', "end_of_stream": true}', False: b', "end_of_stream": false}'}


def encode_progress(update: Progress) -> bytes:
    """Encode a progress update: an empty chunk (seed 000 callers join ``""``) with a
    ``progress`` object, ``{"done", "total", "message"}`` (docs/protocol.md §2.12)."""
    progress = {"done": update.done, "total": update.total, "message": update.message}
    return json.dumps({"error": None, "response": "", "end_of_stream": False, "progress": progress}).encode()


#: The keys of an error object that say where it happened (docs/protocol.md §2.6): the answering
#: host's id and the request's ``id``, beside seed 000's ``type`` and ``message``.
ERROR_WHERE = ("host", "request-id")


#: The key of an error object by which a host says whether the call started (docs/protocol.md §2.6).
STARTED = "started"
#: Times a tghost caller sends a call again after an ``unavailable`` that did not start, the
#: pause before each doubling from :data:`RESEND_PAUSE` seconds (0.63 s in all, the longest
#: pause 0.32 s): a host that stays subscribed to its end waits out the longest pause
#: (docs/protocol.md §2.6).
RESENDS = 6
RESEND_PAUSE = 0.01


def encode_error(error_type: str, message: str, host: str | None = None, request_id: str | None = None,
                 started: bool | None = None) -> bytes:
    """Encode an error response; always the last message of its stream. ``host`` (the answering
    host's id) and ``request_id`` (the request's ``id``) go in the error object when given, and
    ``started`` (whether the call started) when not ``None``."""
    error: dict[str, str | bool] = {"type": error_type, "message": message}
    for key, value in zip(ERROR_WHERE, (host, request_id), strict=True):
        if value:
            error[key] = value
    if started is not None:
        error[STARTED] = started
    return json.dumps({"error": error, "response": "", "end_of_stream": True}).encode()


def decode_response(payload: bytes) -> Response:
    """Decode a response envelope.

    Raises:
        BadRequest: the payload is not a JSON object with the seed 000 response fields.
    """
    try:
        envelope = json.loads(payload)
        error = envelope.get("error")
        response = Response(
            response=envelope.get("response") or "",
            end_of_stream=bool(envelope.get("end_of_stream", True)),
            error=_error(error),
            progress=_progress(envelope.get("progress")),
            started=_started(error),
        )
    except (ValueError, AttributeError, TypeError) as exc:
        raise BadRequest(f"response is not a valid envelope: {exc}") from None
    return response


def _error(error: Any) -> dict[str, str] | None:
    """A response's error object as strings: ``type`` and ``message``, and the keys of
    :data:`ERROR_WHERE` that it gives as strings (``None``: no error).

    Raises:
        AttributeError: it is not an object.
    """
    if not error:
        return None
    read = {"type": str(error.get("type", "")), "message": str(error.get("message", ""))}
    return read | {key: error[key] for key in ERROR_WHERE if isinstance(error.get(key), str)}


def _started(error: Any) -> bool | None:
    """An error object's ``started`` key, when it is a boolean."""
    started = error.get(STARTED) if error else None
    return started if isinstance(started, bool) else None


def _progress(value: Any) -> Progress | None:
    """The progress update in a response's ``progress`` key; ``None`` when absent or malformed
    (a malformed one is dropped, never an error: it carries nothing the call needs)."""
    if not isinstance(value, dict):
        return None
    done, total, message = value.get("done"), value.get("total"), value.get("message")
    if not _number(done) or not (total is None or _number(total)):
        return None
    return Progress(done, total, message if isinstance(message, str) else None)


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def control_topic(request_queue: str) -> str:
    """The topic where callers send cancels and liveness probes for a service's calls:
    non-persistent, in the request topic's namespace, named ``<request topic name>.control``;
    e.g. ``non-persistent://tg/request/joke-service.control`` (docs/protocol.md §2.11, §2.15)."""
    return "non-persistent://" + request_queue.split("://", 1)[-1] + ".control"
