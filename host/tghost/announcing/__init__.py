"""announcing: tell every directory what this host serves (docs/protocol.md §4): the host
identity, its lease and heartbeat, and withdrawal.
"""
