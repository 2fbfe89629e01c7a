"""sessions: a caller proves who it is once per session and each request with an HMAC
(docs/protocol.md §2.9), so a host checks an Ed25519 signature once per caller session rather
than once per request (about 60 µs each, against 1-2 µs for an HMAC).

- A host with an ``[access]`` policy holds a :class:`HostSessionKey`, an X25519 key pair new for
  each process, and announces its public half as ``host["session-key"]`` (§4.3).
- A caller's :class:`CallerSession` is an X25519 key pair of its own, bound to its Ed25519
  identity by a signed *binding* that expires. For each host that serves the service it derives
  a pair key (X25519, then HKDF-SHA256) and MACs the request with it: HMAC-SHA256 over the
  request topic, ``id`` and ``tghost-signed-at`` as netstrings, then the body (:func:`mac_bytes`).
- A host verifies a binding once, keeps the pair key, and checks only its own MAC per request.

Properties of a request in a session (all strings), beside ``id``, ``tghost-caller`` and
``tghost-signed-at`` of §2.8:

- ``tghost-session``: standard base64 of the binding, the canonical JSON of
  ``{"caller": <key id>, "expires": <unix seconds>, "key": <base64 raw X25519 public key>, "v": 1}``;
- ``tghost-session-signature``: standard base64 of the caller's Ed25519 signature of the binding;
- ``tghost-macs``: ``<host key fingerprint>:<base64 HMAC>`` pairs joined by ``,``, one per host
  the caller knows to serve the service.

Pure crypto and formats: never talks to Pulsar; a host's cache of opened sessions is the gate's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from tghost.protocol.callers import CALLER, SIGNED_AT
from tghost.protocol.trust import Signer, canonical_json

if TYPE_CHECKING:  # cryptography is imported where a key is made or used
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

__all__ = [
    "MACS",
    "MAX_LIFETIME",
    "SESSION",
    "SESSION_KEY",
    "SESSION_SIGNATURE",
    "CallerSession",
    "HostSessionKey",
    "OpenSession",
    "fingerprint",
    "framed",
    "keyed_mac",
    "mac_bytes",
    "open_session",
    "verify_mac",
]

SESSION = "tghost-session"
SESSION_SIGNATURE = "tghost-session-signature"
MACS = "tghost-macs"
#: The ``host`` field of an announcement that carries a host's session public key (§4.3).
SESSION_KEY = "session-key"
#: Seconds: the longest a host accepts a binding for; a caller renews its session before then.
MAX_LIFETIME = 24 * 3600.0
#: Seconds a caller's session lasts by default.
LIFETIME = 3600.0

_INFO = b"tghost caller session v1"
_MAC_LABEL = b"tghost session mac v1\n"


def _raw(key: X25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public_raw: bytes) -> str:
    """A host session key's name in ``tghost-macs``: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def _pair_key(private: X25519PrivateKey, peer_raw: bytes, caller_raw: bytes, host_raw: bytes) -> bytes:
    """The 32-byte key a caller session and a host share: HKDF-SHA256 (no salt, info = the
    label, the caller's then the host's raw public key) of their X25519 shared secret."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_raw))
    return HKDF(hashes.SHA256(), 32, None, _INFO + caller_raw + host_raw).derive(shared)


def mac_bytes(body: bytes, request_id: str, topic: str, signed_at: str) -> bytes:
    """What a session MAC covers (docs/protocol.md §2.9): the ASCII label ``tghost session mac
    v1`` and a newline, then the UTF-8 request ``topic``, ``id`` and ``signed_at`` text each as a
    netstring (``<length>:<bytes>,``), then the body bytes as sent."""
    return framed(_MAC_LABEL, (topic, request_id, signed_at), body)


def framed(label: bytes, texts: Iterable[str], body: bytes) -> bytes:
    """``label``, then each of ``texts`` in UTF-8 as a netstring (``<length>:<bytes>,``), then
    ``body``: the bytes a session MAC (§2.9) or an answer's proof (§2.13) covers."""
    parts = [text.encode() for text in texts]
    return b"".join([label, *(b"%d:%s," % (len(part), part) for part in parts), body])


def _hmac(pair_key: bytes) -> hmac.HMAC:
    """An HMAC-SHA256 keyed with ``pair_key``, to :func:`keyed_mac` copies of: a copy per request
    does not set the key up again, and (unlike ``hmac.digest``) keeps the GIL for a short
    message, so the Pulsar client's threads do not take it in the middle of a call."""
    return hmac.new(pair_key, digestmod=hashlib.sha256)


def keyed_mac(keyed: hmac.HMAC, message: bytes) -> str:
    """Standard base64 of the HMAC of ``message`` under ``keyed``'s key (a copy: ``keyed`` is
    kept as it is, to MAC the next message)."""
    mac = keyed.copy()
    mac.update(message)
    return base64.b64encode(mac.digest()).decode()


class HostSessionKey:
    """A host's X25519 key pair for caller sessions: ``public`` (base64 of the raw 32 bytes, as
    announced) and its ``fingerprint``. New for every process; never written to disk."""

    def __init__(self, private: X25519PrivateKey | None = None) -> None:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        self._private = private or X25519PrivateKey.generate()
        self.public_raw = _raw(self._private.public_key())
        self.public = base64.b64encode(self.public_raw).decode()
        self.fingerprint = fingerprint(self.public_raw)

    def pair_key(self, caller_raw: bytes) -> bytes:
        """The key this host shares with the caller session whose raw public key is given.

        Raises:
            ValueError: ``caller_raw`` is not an X25519 public key.
        """
        return _pair_key(self._private, caller_raw, caller_raw, self.public_raw)


class CallerSession:
    """A caller's session under its identity ``signer``, valid until ``expires`` (unix seconds).

    :meth:`properties` gives a request's properties for the hosts whose announced session keys
    are given. Pair keys are derived once per host key and kept for the session's life.
    """

    def __init__(self, signer: Signer, now: float, lifetime: float = LIFETIME) -> None:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        self._private = X25519PrivateKey.generate()
        self._public_raw = _raw(self._private.public_key())
        self.expires = round(now + lifetime, 3)
        binding = canonical_json({"caller": signer.key_id, "expires": self.expires,
                                  "key": base64.b64encode(self._public_raw).decode(), "v": 1})
        self._binding = {CALLER: signer.key_id, SESSION: base64.b64encode(binding).decode(),
                         SESSION_SIGNATURE: base64.b64encode(signer.sign_bytes(binding)).decode()}
        self._hosts: dict[str, tuple[str, hmac.HMAC] | None] = {}

    def _host(self, public: str) -> tuple[str, hmac.HMAC] | None:
        """(fingerprint, keyed HMAC) for a host's announced key; ``None`` if it is not one."""
        if public not in self._hosts:
            try:
                raw = base64.b64decode(public, validate=True)
                self._hosts[public] = (fingerprint(raw), _hmac(_pair_key(self._private, raw, self._public_raw, raw)))
            except (ValueError, binascii.Error):
                self._hosts[public] = None
        return self._hosts[public]

    def answer_keys(self, host_keys: Iterable[str]) -> dict[str, hmac.HMAC]:
        """The keys this session shares with the hosts whose announced session keys are given,
        by fingerprint: what their answers' MACs are checked with (docs/protocol.md §2.13)."""
        return dict(host for public in host_keys if (host := self._host(public)) is not None)

    def properties(self, body: bytes, request_id: str, topic: str, now: float,
                   host_keys: Iterable[str]) -> dict[str, str]:
        """The properties of a request (payload ``body``, ``id``, request ``topic``) sent at unix
        time ``now``, with a MAC for each host in ``host_keys`` (announced session keys; any that
        do not decode are skipped)."""
        signed_at = f"{now:.3f}"
        message = mac_bytes(body, request_id, topic, signed_at)
        hosts = [host for public in host_keys if (host := self._host(public)) is not None]
        return {**self._binding, SIGNED_AT: signed_at,
                MACS: ",".join(f"{fp}:{keyed_mac(key, message)}" for fp, key in hosts)}


class OpenSession(NamedTuple):
    """A binding a host verified: an HMAC keyed with the key it shares with the session, and
    when the session expires (unix seconds)."""

    mac: hmac.HMAC
    expires: float


def open_session(host: HostSessionKey, caller_key: Ed25519PublicKey, key_id: str,
                 properties: Mapping[str, str], now: float) -> OpenSession | str:
    """Verify a request's session binding with its caller's public key (whose id is ``key_id``):
    the opened session, or why it is refused (malformed, signed by another key, for another
    caller, expired, or longer than :data:`MAX_LIFETIME`). Never raises."""
    from cryptography.exceptions import InvalidSignature

    try:
        binding = base64.b64decode(properties[SESSION], validate=True)
        caller_key.verify(base64.b64decode(properties[SESSION_SIGNATURE], validate=True), binding)
        fields = json.loads(binding)
        caller_raw = base64.b64decode(fields["key"], validate=True)
        expires = float(fields["expires"])
        if fields.get("v") != 1 or fields["caller"] != key_id or not math.isfinite(expires):
            return "the request's session binding is not a version 1 binding of this caller"
        pair_key = host.pair_key(caller_raw)
    except (KeyError, TypeError, ValueError, binascii.Error, InvalidSignature):
        return "the request's session binding does not verify (tampered, or signed by another key)"
    if expires < now:
        return f"the request's session expired at {expires:.3f} (the host's clock is {now:.3f}): start a new one"
    if expires > now + MAX_LIFETIME:
        return f"the request's session lasts past {MAX_LIFETIME:g}s from now; renew sessions more often"
    return OpenSession(_hmac(pair_key), expires)


def verify_mac(session: OpenSession, host_fingerprint: str, properties: Mapping[str, str], body: bytes,
               topic: str) -> bool | None:
    """Whether the request's MAC for this host verifies; ``None`` when it carries none for this
    host (the caller did not know it yet, and should resend with a per-request signature).
    The caller of this checks ``tghost-signed-at`` against its window. Never raises."""
    prefix = host_fingerprint + ":"
    mac = next((pair[len(prefix):] for pair in properties.get(MACS, "").split(",") if pair.startswith(prefix)), None)
    request_id, signed_at = properties.get("id"), properties.get(SIGNED_AT)
    if mac is None or request_id is None or signed_at is None:
        return None if mac is None else False
    expected = keyed_mac(session.mac, mac_bytes(body, request_id, topic, signed_at))
    return hmac.compare_digest(expected, mac)
