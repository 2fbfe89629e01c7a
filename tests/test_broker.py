"""broker: the Pulsar client options (token auth, TLS) and connecting with them to the embedded broker."""

from __future__ import annotations

import pulsar

from tghost.broker import EmbeddedBroker, PulsarSettings


def test_client_kwargs_without_auth_or_tls_pass_only_the_tls_defaults() -> None:
    assert PulsarSettings("pulsar://localhost:6650").client_kwargs() == {
        "tls_allow_insecure_connection": False, "tls_validate_hostname": False}


def test_client_kwargs_map_each_option_to_the_pulsar_client_argument() -> None:
    settings = PulsarSettings("pulsar+ssl://broker:6651", token="secret-jwt", tls_trust_certs="/etc/ca.pem",
                              tls_allow_insecure=True, tls_validate_hostname=True)
    kwargs = settings.client_kwargs()
    assert isinstance(kwargs.pop("authentication"), pulsar.AuthenticationToken)
    assert kwargs == {"tls_trust_certs_file_path": "/etc/ca.pem", "tls_allow_insecure_connection": True,
                      "tls_validate_hostname": True}


def test_client_kwargs_are_accepted_by_the_pulsar_client() -> None:
    """The keywords are real ``pulsar.Client`` parameters (a typo would raise TypeError here)."""
    settings = PulsarSettings("pulsar://127.0.0.1:1", token="t", tls_trust_certs="/nonexistent/ca.pem",
                              tls_allow_insecure=True, tls_validate_hostname=True)
    client = pulsar.Client(settings.url, **settings.client_kwargs())
    client.close()


def test_the_token_stays_out_of_the_settings_repr() -> None:
    assert "secret-jwt" not in repr(PulsarSettings(token="secret-jwt"))


async def test_a_client_with_a_token_works_against_the_embedded_broker(pulsar_broker: EmbeddedBroker) -> None:
    """pulsar-lite 0.2.0 accepts any token without checking it: this proves the token is sent
    without breaking the connection, not that a broker enforces it."""
    client = await PulsarSettings(pulsar_broker.url, token="any-token").connect()
    try:
        consumer = await client.subscribe("non-persistent://tg/test/token-check", "token-check")
        producer = await client.create_producer("non-persistent://tg/test/token-check", batching_enabled=False)
        await producer.send(b"hello")
        assert (await consumer.receive()).data() == b"hello"
    finally:
        await client.close()
