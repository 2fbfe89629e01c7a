"""protocol: what crosses the wire, as pure data: seed 000/001 descriptors, the request/response
envelope, the announcement format, seed 001 groups and Ed25519 signatures.

No I/O: nothing here opens a socket, a file or a thread (the import-linter contracts in
pyproject.toml keep it so).
"""
