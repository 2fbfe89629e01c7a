"""serving: answer tool-service requests on Pulsar (docs/protocol.md §2). One endpoint per service,
one request state machine driven by the event loop and by the thread lane, and the executors
that run ``invoke`` in worker threads or worker processes.

What each stage may import is written as import-linter contracts in pyproject.toml.
"""
