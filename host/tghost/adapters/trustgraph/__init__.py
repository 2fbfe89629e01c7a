"""trustgraph: meet TrustGraph where its agents read their tools, its config service.

:mod:`.config_service` speaks the config service's wire (trustgraph-base 2.11) with
pulsar-client alone; :mod:`.sync` keeps a workspace's ``tool-service``/``tool`` items in step
with the live directory. Never imports trustgraph-base or trustgraph-flow.
"""

from tghost.adapters.trustgraph.config_service import ConfigPush, ConfigServiceClient, ConfigServiceError, pulsar_topic
from tghost.adapters.trustgraph.sync import MARKER, ItemChange, TrustGraphSync, desired_items, plan

__all__ = [
    "MARKER",
    "ConfigPush",
    "ConfigServiceClient",
    "ConfigServiceError",
    "ItemChange",
    "TrustGraphSync",
    "desired_items",
    "plan",
    "pulsar_topic",
]
