"""callers: a caller's proof of who sent a request (docs/protocol.md §2.8). A caller holding an
Ed25519 key (``tghost keygen``) signs each request; the signature travels in the request's
Pulsar message properties, so the seed 000 body stays byte for byte the same and callers that
do not sign (TrustGraph's) stay anonymous.

Properties of a signed request (all strings):

- ``tghost-caller``: the key id (:func:`tghost.protocol.trust.key_id`);
- ``tghost-signed-at``: when it was signed, unix seconds as decimal text;
- ``tghost-signature``: standard base64 (RFC 4648) of the Ed25519 signature over
  :func:`signed_request_bytes`: the canonical JSON of ``{"body": <SHA-256 of the body, hex>,
  "id": <the id property>, "signed_at": <the tghost-signed-at text>, "topic": <the request
  topic>, "v": 1}``.

Pure crypto and formats: never talks to Pulsar and keeps no state (the replay window is the
host's).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tghost.protocol.trust import Signer, canonical_json

if TYPE_CHECKING:  # cryptography is imported where a signature is checked
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "CALLER",
    "SIGNATURE",
    "SIGNED_AT",
    "Caller",
    "caller_key_id",
    "sign_request",
    "signed_request_bytes",
    "signed_within",
    "verify_request",
]

CALLER = "tghost-caller"
SIGNED_AT = "tghost-signed-at"
SIGNATURE = "tghost-signature"


@dataclass(frozen=True)
class Caller:
    """A verified caller: the ``name`` a host's access policy gives its key, and the ``key_id``."""

    name: str
    key_id: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "key_id": self.key_id}


def signed_request_bytes(body: bytes, request_id: str, topic: str, signed_at: str) -> bytes:
    """What a request signature covers: the canonical JSON of the body's SHA-256, the ``id``,
    the request ``topic`` and the ``signed_at`` text (docs/protocol.md §2.8)."""
    return canonical_json({"body": hashlib.sha256(body).hexdigest(), "id": request_id, "signed_at": signed_at,
                           "topic": topic, "v": 1})


def sign_request(signer: Signer, body: bytes, request_id: str, topic: str, now: float) -> dict[str, str]:
    """The properties that prove ``signer`` sent this request (body bytes, ``id``, request
    topic) at unix time ``now`` (seconds)."""
    signed_at = f"{now:.3f}"
    signature = signer.sign_bytes(signed_request_bytes(body, request_id, topic, signed_at))
    return {CALLER: signer.key_id, SIGNED_AT: signed_at, SIGNATURE: base64.b64encode(signature).decode()}


def caller_key_id(properties: Mapping[str, str]) -> str | None:
    """The key id a request claims to be signed with, if it claims one."""
    return properties.get(CALLER)


def verify_request(key: Ed25519PublicKey, properties: Mapping[str, str], body: bytes, topic: str,
                   now: float, window: float) -> float | str:
    """Check a request's signature with the caller's public ``key``: the unix time it was signed,
    or the reason it is refused (a malformed property, a bad signature, or signed more than
    ``window`` seconds from ``now``). Never raises."""
    request_id, signed_at, signature = properties.get("id"), properties.get(SIGNED_AT), properties.get(SIGNATURE)
    if request_id is None or signed_at is None or signature is None:
        return f"a signed request needs the properties 'id', {SIGNED_AT!r} and {SIGNATURE!r}"
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(base64.b64decode(signature, validate=True),
                   signed_request_bytes(body, request_id, topic, signed_at))
    except (ValueError, binascii.Error, InvalidSignature):
        return "the request's signature does not verify (tampered, or signed for another topic)"
    return signed_within(signed_at, now, window)


def signed_within(signed_at: str, now: float, window: float) -> float | str:
    """The unix time in a ``tghost-signed-at`` text, or why it is refused: not a number, or more
    than ``window`` seconds from ``now``. Never raises."""
    try:
        when = float(signed_at)
    except ValueError:
        when = math.nan
    if not math.isfinite(when) or abs(now - when) > window:
        return (f"the request was signed at {signed_at!r}, more than {window:g}s from the host's clock "
                f"({now:.3f}): keep the caller's clock in sync (NTP)")
    return when
