"""trust: Ed25519 signatures on announcements, so a directory can accept only the hosts it trusts.

Pure crypto and key files: never talks to Pulsar, never reads or publishes announcements.

Signature format (docs/protocol.md §4.5, with a test vector)
-------------------------------------------------------------
A signed announcement value is the unsigned JSON object plus one field::

    "signature": {"v": 2, "key": "<key id>", "value": "<base64 of the 64-byte Ed25519 signature>"}

- Version 2 signs the *canonical JSON* of ``{"topic": <base topic>, "value": <the value
  without its signature field>}``, so a value signed for one announcement topic does not verify
  on another (:func:`signed_bytes`). Canonical JSON is ``json.dumps(value, sort_keys=True,
  separators=(",", ":"), ensure_ascii=True)`` encoded as ASCII. A verifier parses the
  message, drops ``signature`` and re-encodes the rest the same way, so a signer in another
  language must produce Python's encoding of the same value (object keys sorted by code
  point, no whitespace, non-ASCII as ``\\uXXXX``, floats as their shortest round-trip repr).
- Version 1 (no ``v``; tghost before 0.2) signed the canonical JSON of the value alone. It is
  still verified, but does not bind the topic.
- ``value`` is standard base64 (RFC 4648, with padding).
- The key id is the first 16 hex digits of SHA-256 over the 32-byte raw Ed25519 public key
  (:func:`key_id`). It names the key so a verifier can pick it; it proves nothing by itself.

Key files are PEM: the private key as unencrypted PKCS#8 (file mode 0600), the public key as
SubjectPublicKeyInfo. ``tghost keygen`` writes both (:func:`write_key_pair`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # cryptography is imported where a key is used: reading announcements needs none
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "BAD_SIGNATURE",
    "SIGNATURE_FIELD",
    "UNKNOWN_KEY",
    "UNSIGNED",
    "KeyFileError",
    "KeyPairPaths",
    "Signer",
    "TrustedKeys",
    "canonical_json",
    "full_topic_name",
    "key_id",
    "load_private_key",
    "load_public_key",
    "signed_bytes",
    "write_key_pair",
]

SIGNATURE_FIELD = "signature"
#: The signature format :class:`Signer` writes: 2 covers the base topic, 1 (no ``v``) does not.
SIGNATURE_VERSION = 2
#: Why :meth:`TrustedKeys.verify` refused a value (also the directory's rejection reasons).
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad-signature"
UNKNOWN_KEY = "unknown-key"

_KEYGEN_HINT = "create a key pair with 'tghost keygen --out PREFIX'"


class KeyFileError(ValueError):
    """A key file is missing, unreadable, not PEM, or not an Ed25519 key of the expected kind.

    The message names the file and says what to do next.
    """


def canonical_json(value: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: ``value`` without ``signature``, as canonical JSON (ASCII).

    Raises:
        TypeError, ValueError: ``value`` holds something JSON cannot encode.
        RecursionError: ``value`` is nested too deeply to encode.
    """
    unsigned = {k: v for k, v in value.items() if k != SIGNATURE_FIELD}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def signed_bytes(value: Mapping[str, Any], topic: str, version: int = SIGNATURE_VERSION) -> bytes:
    """What a signature of ``version`` covers (docs/protocol.md §4.5): for 2, the canonical JSON
    of ``{"topic": topic, "value": value}`` (``value`` without ``signature``; ``topic`` the
    base announcement topic, e.g. ``persistent://tg/config/tool-descriptors``); for 1,
    :func:`canonical_json` of ``value``.

    Raises:
        ValueError: an unknown ``version``, or ``value`` holds something JSON cannot encode.
        TypeError, RecursionError: as :func:`canonical_json`.
    """
    if version == 1:
        return canonical_json(value)
    if version != 2:
        raise ValueError(f"unknown signature version {version!r}")
    unsigned = {k: v for k, v in value.items() if k != SIGNATURE_FIELD}
    return canonical_json({"topic": full_topic_name(topic), "value": unsigned})


def full_topic_name(topic: str) -> str:
    """``topic`` as Pulsar's fully qualified name: ``tenant/ns/name`` and a bare ``name`` (in
    ``public/default``) are persistent topics, as Pulsar reads them; a full name is kept."""
    if "://" in topic:
        return topic
    return f"persistent://{topic}" if topic.count("/") == 2 else f"persistent://public/default/{topic}"


def key_id(public_key: Ed25519PublicKey) -> str:
    """The key's id: the first 16 hex digits of SHA-256 over its 32 raw bytes."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


class Signer:
    """Signs announcement values with one Ed25519 private key (see the module docstring)."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private_key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id(self.public_key)

    @classmethod
    def from_file(cls, path: Path) -> Signer:
        """A signer for the PKCS#8 PEM private key at ``path``.

        Raises:
            KeyFileError: the file is missing or not an Ed25519 private key.
        """
        return cls(load_private_key(path))

    def sign_bytes(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data`` (a request's, :mod:`tghost.protocol.callers`)."""
        return self._private_key.sign(data)

    def sign(self, value: Mapping[str, Any], topic: str) -> dict[str, Any]:
        """A copy of ``value`` with its version 2 ``signature`` field for the base announcement
        ``topic`` set (any old one is replaced)."""
        signature = self.sign_bytes(signed_bytes(value, topic))
        return {**value, SIGNATURE_FIELD: {"v": SIGNATURE_VERSION, "key": self.key_id,
                                           "value": base64.b64encode(signature).decode()}}


class TrustedKeys:
    """The public keys a directory trusts, by key id."""

    def __init__(self, keys: Iterable[Ed25519PublicKey]) -> None:
        self.keys: dict[str, Ed25519PublicKey] = {key_id(key): key for key in keys}

    @classmethod
    def from_files(cls, paths: Iterable[Path]) -> TrustedKeys:
        """Trust the SubjectPublicKeyInfo PEM public keys in ``paths``.

        Raises:
            KeyFileError: a file is missing or not an Ed25519 public key.
        """
        return cls(load_public_key(path) for path in paths)

    def verify(self, value: Mapping[str, Any], topic: str) -> str | None:
        """Check ``value``'s signature for the base announcement ``topic``: ``None`` when a
        trusted key signed it, else the reason, :data:`UNSIGNED`, :data:`UNKNOWN_KEY` or
        :data:`BAD_SIGNATURE` (also for a malformed ``signature`` field, an unknown version, a
        version 2 signature made for another topic, or a value that cannot be re-encoded).
        Never raises.
        """
        signature = value.get(SIGNATURE_FIELD)
        if signature is None:
            return UNSIGNED
        if not isinstance(signature, dict) or not all(isinstance(signature.get(f), str) for f in ("key", "value")):
            return BAD_SIGNATURE
        key = self.keys.get(signature["key"])
        if key is None:
            return UNKNOWN_KEY
        from cryptography.exceptions import InvalidSignature

        try:
            key.verify(base64.b64decode(signature["value"], validate=True),
                       signed_bytes(value, topic, signature.get("v", 1)))
        except (InvalidSignature, binascii.Error, ValueError, TypeError, RecursionError):
            return BAD_SIGNATURE
        return None


@dataclass(frozen=True)
class KeyPairPaths:
    """Where :func:`write_key_pair` put a key pair, and the key's id."""

    private: Path
    public: Path
    key_id: str


def write_key_pair(prefix: Path, force: bool = False) -> KeyPairPaths:
    """Generate an Ed25519 key pair and write ``<prefix>.key`` (PKCS#8 PEM, mode 0600) and
    ``<prefix>.pub`` (SubjectPublicKeyInfo PEM).

    Raises:
        FileExistsError: a file exists and ``force`` is false (nothing is written).
        OSError: a file could not be written.
    """
    private_path, public_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    if not force:
        for path in (private_path, public_path):
            if path.exists():
                raise FileExistsError(f"{path} exists; pass --force to overwrite it, or choose another --out")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_key = Ed25519PrivateKey.generate()
    private_pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public_pem = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    private_path.unlink(missing_ok=True)  # so the new file is created with mode 0600
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private_pem)
    public_path.write_bytes(public_pem)
    return KeyPairPaths(private_path, public_path, key_id(private_key.public_key()))


def _load(path: Path, what: str, form: str, suffix: str, parse: Callable[[bytes], Any]) -> Any:
    """``parse`` of the bytes of the key file ``path`` (the ``what``, a file in ``form`` that
    'tghost keygen' writes with ``suffix``).

    Raises:
        KeyFileError: the file is unreadable or does not parse.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read the {what} {path}: {exc.strerror or exc}; {_KEYGEN_HINT}") from None
    try:
        return parse(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not {form} ({exc}); pass the {suffix} file that 'tghost keygen' wrote, "
                           f"or {_KEYGEN_HINT}") from None


def load_private_key(path: Path, what: str = "signing key") -> Ed25519PrivateKey:
    """The Ed25519 private key in the unencrypted PKCS#8 PEM file ``path``; ``what`` names its
    use in errors (``signing key``: a host's; ``caller key``: a caller's ``--identity``).

    Raises:
        KeyFileError: the file is missing, unreadable, not PEM, encrypted, or not Ed25519.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = _load(path, what, "an unencrypted PEM private key", "'.key'",
                lambda data: serialization.load_pem_private_key(data, password=None))
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key; {_KEYGEN_HINT}")
    return key


def load_public_key(path: Path, what: str = "trusted key") -> Ed25519PublicKey:
    """The Ed25519 public key in the SubjectPublicKeyInfo PEM file ``path``; ``what`` names its
    use in errors (``trusted key``: a host's, trusted by a directory; a caller's in an ``[access]`` policy).

    Raises:
        KeyFileError: the file is missing, unreadable, not PEM, or not Ed25519.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key = _load(path, what, "a PEM public key", "'.pub'", serialization.load_pem_public_key)
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key; {_KEYGEN_HINT}")
    return key
