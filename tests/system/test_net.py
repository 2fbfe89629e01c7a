"""net: which host names are this machine's loopback, and a free TCP port on it."""

from __future__ import annotations

import socket

import pytest

from tghost.system.net import free_port, is_loopback


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True),
    ("0.0.0.0", False), ("10.0.0.7", False), ("broker.example", False), ("[::1]", False), ("", False),
])
def test_loopback_is_localhost_every_127_address_and_ipv6_without_brackets(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_free_port_can_be_bound_on_loopback() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
