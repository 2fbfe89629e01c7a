"""pulsar: reach Pulsar. Clients with auth and TLS, the one hop from the C++ client's threads
into the event loop, and the embedded pulsar-lite broker: its life (embedded), its data on disk
(store) and its log (broker_log).

Knows nothing of tools, services or the wire format.
"""
