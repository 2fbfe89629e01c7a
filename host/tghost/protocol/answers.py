"""answers: a host's proof that an answer is its own, made for the request and the caller
that asked (docs/protocol.md §2.13), so a caller with an identity accepts no response, stream
chunk, progress update or error from anyone else on the broker.

Every message a host sends for a request that carries a caller's proof (§2.8, §2.9), or that
asks for one (``tghost-prove-answers``), carries, beside ``id``:

- ``tghost-seq``: its number among the messages this host sent for the request, from ``0``;
- ``tghost-signed-at``: the request's (§2.8; absent for an anonymous request), so the answers
  to a request resent with a new signature are told from those to the first;
- for a request in a caller session: ``tghost-host`` (the host's session key fingerprint, as in
  ``tghost-macs``) and ``tghost-answer-mac``, standard base64 of HMAC-SHA256 under the key the
  host shares with the session (§2.9) of :func:`answer_bytes`;
- otherwise, from a host with a signing key (§4.5): ``tghost-answer-signer`` (its key id) and
  ``tghost-answer-signature``, standard base64 of the Ed25519 signature of :func:`answer_bytes`.

Pure crypto and formats: never talks to Pulsar.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Collection, Mapping
from typing import NamedTuple

from tghost.protocol.callers import SIGNED_AT
from tghost.protocol.sessions import framed, keyed_mac
from tghost.protocol.trust import Signer, TrustedKeys

__all__ = ["ANSWER_MAC", "ANSWER_SIGNATURE", "ANSWER_SIGNER", "HOST", "PROVE", "SEQ", "AnswerProof",
           "answer_bytes", "body_digest", "proven_by"]

SEQ = "tghost-seq"
HOST = "tghost-host"
ANSWER_MAC = "tghost-answer-mac"
ANSWER_SIGNER = "tghost-answer-signer"
ANSWER_SIGNATURE = "tghost-answer-signature"
#: A request property (any value): an anonymous caller asks for signed answers.
PROVE = "tghost-prove-answers"

_LABEL = b"tghost answer v1\n"


def answer_bytes(payload: bytes, request_id: str, topic: str, seq: int, caller: str, signed_at: str,
                 request: str) -> bytes:
    """What an answer's MAC or signature covers (docs/protocol.md §2.13): the ASCII label
    ``tghost answer v1`` and a newline, then the UTF-8 request ``topic``, the request's ``id``,
    the decimal ``seq``, the ``caller``'s key id and the request's ``signed_at`` text (both empty
    for an anonymous caller) and ``request``, the hex SHA-256 of the request's body, each as a
    netstring (``<length>:<bytes>,``), then the payload bytes as sent."""
    return framed(_LABEL, (topic, request_id, str(seq), caller, signed_at, request), payload)


def body_digest(body: bytes) -> str:
    """The hex SHA-256 of a request's body, as an answer's proof binds it."""
    return hashlib.sha256(body).hexdigest()


class AnswerProof(NamedTuple):
    """How a host proves its answers to one request: under the session key it shares with the
    caller (``mac``: an HMAC keyed with it, and the host's ``host`` fingerprint), or with its
    ``signer``. ``topic`` is the request topic, ``caller`` the key id the request claims and
    ``signed_at`` its ``tghost-signed-at`` (both "" for an anonymous request), ``request`` the
    hex SHA-256 of its body: an answer proven for one request proves nothing for another."""

    topic: str
    caller: str
    signed_at: str
    request: str
    host: str = ""
    mac: hmac.HMAC | None = None
    signer: Signer | None = None

    def properties(self, payload: bytes, request_id: str, seq: int) -> dict[str, str]:
        """The properties that prove the answer ``payload``, the ``seq``-th for ``request_id``."""
        message = answer_bytes(payload, request_id, self.topic, seq, self.caller, self.signed_at, self.request)
        which = {SEQ: str(seq), SIGNED_AT: self.signed_at} if self.signed_at else {SEQ: str(seq)}
        if self.mac is not None:
            return {**which, HOST: self.host, ANSWER_MAC: keyed_mac(self.mac, message)}
        assert self.signer is not None
        return {**which, ANSWER_SIGNER: self.signer.key_id,
                ANSWER_SIGNATURE: base64.b64encode(self.signer.sign_bytes(message)).decode()}


def proven_by(properties: Mapping[str, str], payload: bytes, request_id: str, topic: str, caller: str,
              request: str, sent: Collection[str], hosts: Mapping[str, hmac.HMAC],
              trusted: TrustedKeys | None) -> tuple[str, str, int] | None:
    """Who proved an answer, to which sending and its ``seq``: (``host`` fingerprint or signer
    key id, ``signed_at``, seq), when it answers one of the request's sendings (``sent``: their
    ``tghost-signed-at`` texts; ``{""}`` for an anonymous request) whose body has the hex SHA-256
    ``request``, and its MAC verifies under the
    key shared with one of ``hosts`` (fingerprint -> keyed HMAC) or its signature under a
    ``trusted`` key; else ``None``. Never raises."""
    signed_at = properties.get(SIGNED_AT, "")
    try:
        seq = int(properties[SEQ])
    except (KeyError, ValueError):
        return None
    if signed_at not in sent:
        return None
    message = answer_bytes(payload, request_id, topic, seq, caller, signed_at, request)
    host, mac = properties.get(HOST, ""), properties.get(ANSWER_MAC)
    if mac is not None and host in hosts:
        return (host, signed_at, seq) if hmac.compare_digest(keyed_mac(hosts[host], message), mac) else None
    signer, signature = properties.get(ANSWER_SIGNER, ""), properties.get(ANSWER_SIGNATURE)
    key = trusted.keys.get(signer) if trusted is not None else None
    if signature is None or key is None:
        return None
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(base64.b64decode(signature, validate=True), message)
    except (InvalidSignature, binascii.Error, ValueError):
        return None
    return signer, signed_at, seq
