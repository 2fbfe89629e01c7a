"""trustgraph.config_service: the wire of TrustGraph's config service (trustgraph-base 2.11's
``ConfigRequest``/``ConfigResponse``/``ConfigPush``), spoken with pulsar-client alone: requests
with an ``id`` property, responses routed back by it, pushes followed. Never imports
trustgraph-base and never decides what to write (that is :mod:`tghost.adapters.trustgraph.sync`).

The bytes are what trustgraph-base's Pulsar backend sends: ``json.dumps`` of the dataclass as a
dict (``dataclasses.asdict``), every field present, UTF-8, ``BytesSchema`` (no schema registry).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pulsar
import pulsar.asyncio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tghost.pulsar import hop
from tghost.system.tasks import cancel_and_wait

__all__ = [
    "PUSH_QUEUE",
    "REQUEST_QUEUE",
    "RESPONSE_QUEUE",
    "ConfigPush",
    "ConfigResponse",
    "ConfigServiceClient",
    "ConfigServiceError",
    "encode_request",
    "pulsar_topic",
]

log = logging.getLogger(__name__)

#: trustgraph-base 2.11 ``schema/config.py``: ``queue('config', cls='request')`` and so on, in
#: TrustGraph's ``class:topicspace:topic`` queue ids. The system request queue takes the
#: workspace in the request body; TrustGraph's own processors use it (``AsyncProcessor``).
REQUEST_QUEUE = "request:tg:config"
RESPONSE_QUEUE = "response:tg:config"
PUSH_QUEUE = "notify:tg:config"

#: A config item's address: (type, key), e.g. ``("tool", "tell-joke")``.
ItemKey = tuple[str, str]


def pulsar_topic(queue: str) -> str:
    """The Pulsar topic of a TrustGraph queue id, as trustgraph-base 2.11's Pulsar backend maps
    it (``AsyncPulsarBackend._map_topic``): ``flow:tg:x`` -> ``persistent://tg/flow/x``;
    ``request``, ``response`` and ``notify`` classes -> ``non-persistent://tg/<class>/x``.
    A full topic (``...://...``) is returned as it is.

    Raises:
        ValueError: ``queue`` is neither a topic nor ``class:topicspace:topic`` with a known class.
    """
    if "://" in queue:
        return queue
    parts = queue.split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{queue!r} is not a Pulsar topic nor a TrustGraph queue id class:topicspace:topic")
    cls, topicspace, topic = parts
    if cls == "flow":
        return f"persistent://{topicspace}/flow/{topic}"
    if cls in ("request", "response", "notify"):
        return f"non-persistent://{topicspace}/{cls}/{topic}"
    raise ValueError(f"{queue!r}: unknown queue class {cls!r} (flow, request, response or notify)")


class ConfigServiceError(RuntimeError):
    """The config service answered with an error (``error_type``: ``bad-request``,
    ``bad-operation``, ``config-error``)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message


def encode_request(
    operation: str, workspace: str = "", *, keys: Iterable[ItemKey] = (), type: str = "",
    values: Mapping[ItemKey, str] | None = None,
) -> bytes:
    """A ``ConfigRequest`` as trustgraph-base 2.11 puts it on the wire: the JSON object
    ``{"operation", "workspace", "keys": [{"type", "key"}], "type", "values": [{"type", "key",
    "value", "workspace"}]}`` with every field, in the dataclass's field order."""
    body = {
        "operation": operation,
        "workspace": workspace,
        "keys": [{"type": t, "key": k} for t, k in keys],
        "type": type,
        "values": [{"type": t, "key": k, "value": v, "workspace": ""} for (t, k), v in (values or {}).items()],
    }
    return json.dumps(body).encode()


class _Error(BaseModel):
    type: str = ""
    message: str = ""


class _Value(BaseModel):
    type: str = ""
    key: str = ""
    value: str | None = None
    workspace: str = ""


class ConfigResponse(BaseModel):
    """trustgraph-base 2.11 ``ConfigResponse``: unknown fields are ignored, missing ones default."""

    version: int = 0
    values: list[_Value] = Field(default_factory=list)
    directory: list[str] = Field(default_factory=list)
    error: _Error | None = None


class ConfigPush(BaseModel):
    """trustgraph-base 2.11 ``ConfigPush``, sent after every change: the config ``version`` and
    ``changes``, config type -> workspaces touched. Empty ``changes`` is the config service's
    start-up poke ("everything")."""

    model_config = ConfigDict(frozen=True)

    version: int = 0
    changes: dict[str, list[str]] = Field(default_factory=dict)

    def touches(self, workspace: str, types: Iterable[str]) -> bool:
        """Whether config of one of ``types`` in ``workspace`` may have changed."""
        return not self.changes or any(workspace in self.changes.get(t, ()) for t in types)


class ConfigServiceClient:
    """Requests to TrustGraph's config service, and its pushes.

    ``await ConfigServiceClient(client).start()``, then :meth:`list`, :meth:`get`, :meth:`put`
    and :meth:`delete` (every request answered within ``timeout`` seconds), and
    :meth:`pushes`. Queues are topics or TrustGraph queue ids (:func:`pulsar_topic`); the
    defaults are trustgraph-base 2.11's. ``push_queue=None`` follows no pushes.

    Responses go to every subscriber of the response topic; each request carries a fresh
    ``id`` property and only the response with that ``id`` answers it (as trustgraph-base's
    ``RequestResponseClient`` does). The topics are non-persistent: a request sent while no
    config service is subscribed is lost, and times out.

    :meth:`get`, :meth:`put` and :meth:`delete` send at most ``batch`` items per request, in
    the order given, so that no message nears Pulsar's 5 MB default limit (a tool item is
    about 1-2 KB).
    """

    def __init__(
        self, client: pulsar.asyncio.Client, request_queue: str = REQUEST_QUEUE,
        response_queue: str = RESPONSE_QUEUE, push_queue: str | None = PUSH_QUEUE, timeout: float = 10.0,
        batch: int = 200,
    ) -> None:
        self._client = client
        self.batch = batch
        self.request_topic = pulsar_topic(request_queue)
        self.response_topic = pulsar_topic(response_queue)
        self.push_topic = None if push_queue is None else pulsar_topic(push_queue)
        self.timeout = timeout
        self._pending: dict[str, asyncio.Future[ConfigResponse]] = {}
        self._producer: pulsar.asyncio.Producer | None = None
        self._responses: pulsar.asyncio.Consumer | None = None
        self._pushes: pulsar.asyncio.Consumer | None = None
        self._route_task: asyncio.Task[None] | None = None

    async def start(self) -> ConfigServiceClient:
        """Subscribe to the response (and push) topics, then create the request producer.

        Raises:
            pulsar.asyncio.PulsarException: the broker refused a subscription or the producer.
        """
        name = f"tghost-trustgraph-{uuid.uuid4().hex}"
        self._responses = await self._client.subscribe(self.response_topic, name,
                                                       consumer_type=pulsar.ConsumerType.Exclusive)
        if self.push_topic is not None:
            self._pushes = await self._client.subscribe(self.push_topic, name,
                                                        consumer_type=pulsar.ConsumerType.Exclusive)
        self._producer = await self._client.create_producer(self.request_topic, batching_enabled=False)
        self._route_task = asyncio.create_task(self._route(), name=f"responses {self.response_topic}")
        return self

    async def close(self) -> None:
        """Stop routing responses; pending requests fail with ``asyncio.CancelledError``."""
        await cancel_and_wait(self._route_task)
        for future in self._pending.values():
            future.cancel()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.close()
        for consumer in (self._responses, self._pushes):
            if consumer is not None:
                await hop.leave(consumer)

    async def _route(self) -> None:
        assert self._responses is not None
        while True:
            message = await _receive(self._responses, self.response_topic)
            if message is None:
                return
            future = self._pending.get(message.properties().get("id", ""))
            if future is None or future.done():
                continue  # another client's response: the topic is shared
            try:
                future.set_result(ConfigResponse.model_validate_json(message.data()))
            except ValidationError as exc:
                future.set_exception(ConfigServiceError("bad-response", str(exc).splitlines()[0]))

    async def request(self, payload: bytes) -> ConfigResponse:
        """Send one encoded request (:func:`encode_request`) and wait for its response.

        Raises:
            RuntimeError: before :meth:`start`.
            TimeoutError: no response within ``timeout`` seconds (no config service subscribed,
                or the broker is away).
            ConfigServiceError: the response carries an error.
            pulsar.asyncio.PulsarException: the send failed.
        """
        if self._producer is None:
            raise RuntimeError("ConfigServiceClient.request() before start()")
        request_id = str(uuid.uuid4())
        future: asyncio.Future[ConfigResponse] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            async with asyncio.timeout(self.timeout):
                await self._producer.send(payload, properties={"id": request_id})
                response = await future
        except TimeoutError:
            raise TimeoutError(f"TrustGraph's config service did not answer on {self.request_topic} within "
                               f"{self.timeout}s") from None
        finally:
            self._pending.pop(request_id, None)
        if response.error is not None:
            raise ConfigServiceError(response.error.type, response.error.message)
        return response

    async def list(self, workspace: str, type: str) -> list[str]:
        """The keys of every item of ``type`` in ``workspace`` (operation ``list``)."""
        return (await self.request(encode_request("list", workspace, type=type))).directory

    async def get(self, workspace: str, keys: Sequence[ItemKey]) -> dict[ItemKey, str | None]:
        """The values of ``keys`` in ``workspace``, ``None`` for a missing item (operation ``get``)."""
        values: dict[ItemKey, str | None] = {}
        for chunk in _chunks(keys, self.batch):
            response = await self.request(encode_request("get", workspace, keys=chunk))
            values.update({(v.type, v.key): v.value for v in response.values})
        return values

    async def put(self, workspace: str, values: Mapping[ItemKey, str]) -> None:
        """Write ``values`` (item -> value string) in ``workspace``, in their order (operation
        ``put``; the config service pushes one change per request)."""
        for chunk in _chunks(list(values), self.batch):
            await self.request(encode_request("put", workspace, values={key: values[key] for key in chunk}))

    async def delete(self, workspace: str, keys: Sequence[ItemKey]) -> None:
        """Delete ``keys`` in ``workspace``, in their order (operation ``delete``)."""
        for chunk in _chunks(keys, self.batch):
            await self.request(encode_request("delete", workspace, keys=chunk))

    async def pushes(self) -> AsyncIterator[ConfigPush]:
        """Yield every config push from now on (an undecodable one is logged and skipped).

        Raises:
            RuntimeError: built with ``push_queue=None``, or before :meth:`start`.
        """
        if self._pushes is None:
            raise RuntimeError("no push queue is followed: start() first, with a push_queue")
        while (message := await _receive(self._pushes, self.push_topic or "")) is not None:
            try:
                yield ConfigPush.model_validate_json(message.data())
            except ValidationError as exc:
                log.warning("ignored a config push that is not a ConfigPush: %s", str(exc).splitlines()[0])


def _chunks(items: Sequence[ItemKey], size: int) -> Iterator[Sequence[ItemKey]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


async def _receive(consumer: pulsar.asyncio.Consumer, topic: str) -> Any:
    """The next message (acknowledged), or ``None`` once ``consumer`` is closed; other receive
    errors are logged and retried (the client reconnects by itself after a broker restart)."""
    while True:
        try:
            message = await consumer.receive()
        except pulsar.asyncio.PulsarException as exc:
            if exc.error() == pulsar.Result.AlreadyClosed:
                return None
            log.warning("receive on %s failed (%s); retrying", topic, exc)
            await asyncio.sleep(0.5)
            continue
        with contextlib.suppress(pulsar.asyncio.PulsarException):
            await consumer.acknowledge(message)
        return message
