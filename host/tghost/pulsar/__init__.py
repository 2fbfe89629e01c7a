"""pulsar: reach Pulsar. Clients with auth and TLS, and the one hop from the C++ client's threads
into the event loop. The embedded pulsar-lite broker is :mod:`tghost.broker`'s.

Knows nothing of tools, services or the wire format.
"""
