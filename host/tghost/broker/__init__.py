"""broker: the embedded pulsar-lite broker, beside the Pulsar clients (:mod:`tghost.pulsar`) that
reach any broker: one pulsar-lite process (:mod:`.process`), the ``tghost broker`` process that
owns it, in the foreground or detached (:mod:`.control`), what is known of a broker from its data
dir (:mod:`.status`), its store on disk (:mod:`.store`) and its log (:mod:`.log`). The names below
are the package's; import them from here.

Knows nothing of tools, services or the wire format, and never opens a Pulsar client.
"""

from tghost.broker.control import NOTE, ensure_broker, run_until_stopped, start_detached, stop_broker
from tghost.broker.process import LOG_LEVELS, WATCH_INTERVAL, EmbeddedBroker
from tghost.broker.status import (
    DEFAULT_PORT,
    BrokerRecord,
    BrokerStatus,
    broker_status,
    default_data_dir,
    local_disk_trouble,
    running_data_dir,
)

__all__ = [
    "DEFAULT_PORT",
    "LOG_LEVELS",
    "NOTE",
    "WATCH_INTERVAL",
    "BrokerRecord",
    "BrokerStatus",
    "EmbeddedBroker",
    "broker_status",
    "default_data_dir",
    "ensure_broker",
    "local_disk_trouble",
    "run_until_stopped",
    "running_data_dir",
    "start_detached",
    "stop_broker",
]
