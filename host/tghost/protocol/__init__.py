"""protocol: what crosses the wire, as pure data: the stable wire tier of tghost's public API.

For implementers of another host, caller or directory, and for tools that read the wire: the
seed 000 descriptors, the request/response envelope with its error types and progress updates,
the announcement topics and epochs, seed 001 groups and state, the announcement models,
announcement signatures, caller signatures and caller sessions. docs/protocol.md specifies
each; every name here is stable (docs/architecture.md "The public line"), while the modules
behind it are internal and free to move: import from ``tghost.protocol`` itself.

No I/O but key files: nothing here opens a socket or a thread (the import-linter contracts in
pyproject.toml keep Pulsar out), and the only files it touches are the PEM key files named to it,
read and written by :mod:`.trust` alone (``load_private_key``, ``load_public_key``,
``write_key_pair``; ``Signer.from_file``, ``TrustedKeys.from_files`` and
``AccessPolicy.from_table`` read through them). Each name is loaded on first use, so
``tghost.protocol.epochs`` stays importable without pydantic.
"""

from typing import TYPE_CHECKING

from tghost.system import lazy

if TYPE_CHECKING:
    from tghost.protocol.access import ToolAccess
    from tghost.protocol.announcement import (
        KINDS,
        Announcement,
        Entries,
        HostInfo,
        Lease,
        announcement_key,
        parse_descriptor,
    )
    from tghost.protocol.callers import (
        CALLER,
        SIGNATURE,
        SIGNED_AT,
        Caller,
        caller_key_id,
        sign_request,
        signed_request_bytes,
        signed_within,
        verify_request,
    )
    from tghost.protocol.descriptors import (
        DEFAULT_TIMEOUT,
        Argument,
        ConfigParam,
        DescriptorError,
        ToolDescriptor,
        ToolServiceDescriptor,
        request_queue,
        response_queue,
    )
    from tghost.protocol.epochs import (
        DEFAULT_TOPIC,
        EPOCH_SECONDS,
        MAX_LEASE,
        RESTATEMENT_MARGIN,
        current_topic,
        epoch_of,
        epoch_topic,
        read_window,
    )
    from tghost.protocol.groups import DEFAULT_GROUPS, DEFAULT_STATE, WILDCARD, is_available, next_state, select
    from tghost.protocol.sessions import (
        MACS,
        MAX_LIFETIME,
        SESSION,
        SESSION_KEY,
        SESSION_SIGNATURE,
        CallerSession,
        HostSessionKey,
        OpenSession,
        fingerprint,
        mac_bytes,
        open_session,
        verify_mac,
    )
    from tghost.protocol.trust import (
        BAD_SIGNATURE,
        SIGNATURE_FIELD,
        UNKNOWN_KEY,
        UNSIGNED,
        KeyFileError,
        Signer,
        TrustedKeys,
        canonical_json,
        full_topic_name,
        key_id,
        signed_bytes,
    )
    from tghost.protocol.wire import (
        BAD_REQUEST,
        CANCEL,
        CANCELLED,
        INVALID_ARGUMENTS,
        MAX_MESSAGE,
        MISSING_CONFIG,
        NOT_ALLOWED,
        OK,
        OVERLOADED,
        PROGRESS,
        RATE_LIMITED,
        REDELIVERY_LIMIT,
        TIMEOUT,
        TOOL_SERVICE_ERROR,
        UNAUTHORIZED,
        UNAVAILABLE,
        UNKNOWN_SESSION,
        BadRequest,
        Progress,
        Request,
        Response,
        TooLarge,
        control_topic,
        decode_request,
        decode_response,
        encode_error,
        encode_progress,
        encode_request,
        encode_response,
        observation,
    )

#: Every name here by the module that defines it, imported on first access (PEP 562). Kept in
#: step with the imports above by tests/test_public_api.py.
_LAZY = {
    "ToolAccess": "tghost.protocol.access",
    **dict.fromkeys((
        "KINDS", "Announcement", "Entries", "HostInfo", "Lease", "announcement_key", "parse_descriptor",
    ), "tghost.protocol.announcement"),
    **dict.fromkeys((
        "CALLER", "SIGNATURE", "SIGNED_AT", "Caller", "caller_key_id", "sign_request", "signed_request_bytes",
        "signed_within", "verify_request",
    ), "tghost.protocol.callers"),
    **dict.fromkeys((
        "DEFAULT_TIMEOUT", "Argument", "ConfigParam", "DescriptorError", "ToolDescriptor", "ToolServiceDescriptor",
        "request_queue", "response_queue",
    ), "tghost.protocol.descriptors"),
    **dict.fromkeys((
        "DEFAULT_TOPIC", "EPOCH_SECONDS", "MAX_LEASE", "RESTATEMENT_MARGIN", "current_topic", "epoch_of",
        "epoch_topic", "read_window",
    ), "tghost.protocol.epochs"),
    **dict.fromkeys((
        "DEFAULT_GROUPS", "DEFAULT_STATE", "WILDCARD", "is_available", "next_state", "select",
    ), "tghost.protocol.groups"),
    **dict.fromkeys((
        "MACS", "MAX_LIFETIME", "SESSION", "SESSION_KEY", "SESSION_SIGNATURE", "CallerSession", "HostSessionKey",
        "OpenSession", "fingerprint", "mac_bytes", "open_session", "verify_mac",
    ), "tghost.protocol.sessions"),
    **dict.fromkeys((
        "BAD_SIGNATURE", "SIGNATURE_FIELD", "UNKNOWN_KEY", "UNSIGNED", "KeyFileError", "Signer", "TrustedKeys",
        "canonical_json", "full_topic_name", "key_id", "signed_bytes",
    ), "tghost.protocol.trust"),
    **dict.fromkeys((
        "BAD_REQUEST", "CANCEL", "CANCELLED", "INVALID_ARGUMENTS", "MAX_MESSAGE", "MISSING_CONFIG", "NOT_ALLOWED",
        "OK", "OVERLOADED", "PROGRESS", "RATE_LIMITED", "REDELIVERY_LIMIT", "TIMEOUT", "TOOL_SERVICE_ERROR",
        "UNAUTHORIZED", "UNAVAILABLE", "UNKNOWN_SESSION", "BadRequest", "Progress", "Request", "Response",
        "TooLarge", "control_topic", "decode_request", "decode_response", "encode_error", "encode_progress",
        "encode_request", "encode_response", "observation",
    ), "tghost.protocol.wire"),
}

__all__ = [
    "BAD_REQUEST",
    "BAD_SIGNATURE",
    "CALLER",
    "CANCEL",
    "CANCELLED",
    "DEFAULT_GROUPS",
    "DEFAULT_STATE",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TOPIC",
    "EPOCH_SECONDS",
    "INVALID_ARGUMENTS",
    "KINDS",
    "MACS",
    "MAX_LEASE",
    "MAX_LIFETIME",
    "MAX_MESSAGE",
    "MISSING_CONFIG",
    "NOT_ALLOWED",
    "OK",
    "OVERLOADED",
    "PROGRESS",
    "RATE_LIMITED",
    "REDELIVERY_LIMIT",
    "RESTATEMENT_MARGIN",
    "SESSION",
    "SESSION_KEY",
    "SESSION_SIGNATURE",
    "SIGNATURE",
    "SIGNATURE_FIELD",
    "SIGNED_AT",
    "TIMEOUT",
    "TOOL_SERVICE_ERROR",
    "UNAUTHORIZED",
    "UNAVAILABLE",
    "UNKNOWN_KEY",
    "UNKNOWN_SESSION",
    "UNSIGNED",
    "WILDCARD",
    "Announcement",
    "Argument",
    "BadRequest",
    "Caller",
    "CallerSession",
    "ConfigParam",
    "DescriptorError",
    "Entries",
    "HostInfo",
    "HostSessionKey",
    "KeyFileError",
    "Lease",
    "OpenSession",
    "Progress",
    "Request",
    "Response",
    "Signer",
    "TooLarge",
    "ToolAccess",
    "ToolDescriptor",
    "ToolServiceDescriptor",
    "TrustedKeys",
    "announcement_key",
    "caller_key_id",
    "canonical_json",
    "control_topic",
    "current_topic",
    "decode_request",
    "decode_response",
    "encode_error",
    "encode_progress",
    "encode_request",
    "encode_response",
    "epoch_of",
    "epoch_topic",
    "fingerprint",
    "full_topic_name",
    "is_available",
    "key_id",
    "mac_bytes",
    "next_state",
    "observation",
    "open_session",
    "parse_descriptor",
    "read_window",
    "request_queue",
    "response_queue",
    "select",
    "sign_request",
    "signed_bytes",
    "signed_request_bytes",
    "signed_within",
    "verify_mac",
    "verify_request",
]

__getattr__, __dir__ = lazy.exports(globals(), _LAZY)
