"""sessions: the formats of docs/protocol.md §2.9, checked as another implementation would
check them: the MAC input, the pair key both sides derive, and what a host refuses."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tghost.protocol.callers import CALLER, SIGNED_AT
from tghost.protocol.sessions import (
    MACS,
    SESSION,
    SESSION_SIGNATURE,
    CallerSession,
    HostSessionKey,
    OpenSession,
    fingerprint,
    mac_bytes,
    open_session,
    verify_mac,
)
from tghost.protocol.trust import Signer, write_key_pair


def signer(tmp_path: Path, name: str) -> Signer:
    return Signer.from_file(write_key_pair(tmp_path / name).private)


def test_the_mac_covers_the_topic_id_and_time_as_netstrings_then_the_body() -> None:
    assert mac_bytes(b'{"a":1}', "r1", "persistent://tg/request/x", "1771000000.250") == (
        b"tghost session mac v1\n25:persistent://tg/request/x,2:r1,14:1771000000.250,{\"a\":1}")


def test_a_request_in_a_session_is_verified_by_the_host_it_names_and_by_no_other(tmp_path: Path) -> None:
    alice, host, other = signer(tmp_path, "alice"), HostSessionKey(), HostSessionKey()
    now = time.time()
    session = CallerSession(alice, now)
    body = b'{"arguments":{}}'
    properties = {"id": "r1", **session.properties(body, "r1", "t", now, [host.public, "not base64!"])}
    assert properties[CALLER] == alice.key_id and properties[SIGNED_AT] == f"{now:.3f}"
    assert [pair.split(":")[0] for pair in properties[MACS].split(",")] == [host.fingerprint]  # bad key skipped

    opened = open_session(host, alice.public_key, alice.key_id, properties, now)
    assert isinstance(opened, OpenSession)
    assert verify_mac(opened, host.fingerprint, properties, body, "t") is True
    assert verify_mac(opened, host.fingerprint, properties, body + b" ", "t") is False
    assert verify_mac(opened, host.fingerprint, properties, body, "another-topic") is False
    assert verify_mac(opened, other.fingerprint, properties, body, "t") is None  # no MAC for that host


def test_the_mac_is_hmac_sha256_under_the_hkdf_pair_key_of_the_spec(tmp_path: Path) -> None:
    """Recompute the MAC from the announced and bound public keys, as §2.9 describes it."""
    alice, host = signer(tmp_path, "alice"), HostSessionKey()
    now = time.time()
    properties = {"id": "r1", **CallerSession(alice, now).properties(b"{}", "r1", "t", now, [host.public])}
    binding = json.loads(base64.b64decode(properties[SESSION]))
    assert set(binding) == {"caller", "expires", "key", "v"} and binding["caller"] == alice.key_id
    caller_raw = base64.b64decode(binding["key"])
    shared = host._private.exchange(X25519PublicKey.from_public_bytes(caller_raw))
    info = b"tghost caller session v1" + caller_raw + host.public_raw
    pair_key = HKDF(hashes.SHA256(), 32, None, info).derive(shared)
    expected = base64.b64encode(hmac.digest(pair_key, mac_bytes(b"{}", "r1", "t", properties[SIGNED_AT]),
                                            "sha256")).decode()
    assert properties[MACS] == f"{fingerprint(host.public_raw)}:{expected}"
    assert host.fingerprint == hashlib.sha256(base64.b64decode(host.public)).hexdigest()[:16]


def test_a_host_refuses_a_binding_that_is_forged_for_another_caller_expired_or_too_long(tmp_path: Path) -> None:
    alice, mallory, host = signer(tmp_path, "alice"), signer(tmp_path, "mallory"), HostSessionKey()
    now = time.time()

    def refusal(session: CallerSession, key: Signer = alice, at: float = now) -> str:
        properties = session.properties(b"{}", "r", "t", at, [host.public])
        opened = open_session(host, key.public_key, key.key_id, properties, at)
        assert isinstance(opened, str)
        return opened

    assert "does not verify" in refusal(CallerSession(mallory, now))  # signed by mallory, checked with alice's key
    assert "expired" in refusal(CallerSession(alice, now - 7200))
    assert "renew sessions more often" in refusal(CallerSession(alice, now, lifetime=3 * 86400))
    tampered = CallerSession(alice, now).properties(b"{}", "r", "t", now, [host.public])
    tampered[SESSION_SIGNATURE] = "AAAA"
    assert isinstance(open_session(host, alice.public_key, alice.key_id, tampered, now), str)
    claimed = CallerSession(mallory, now).properties(b"{}", "r", "t", now, [host.public])
    assert "not a version 1 binding of this caller" in str(
        open_session(host, mallory.public_key, alice.key_id, claimed, now))  # mallory's binding, alice's key id
