"""system: what every stage needs from the machine and the runtime: file-lock slots
(:mod:`.locks`), child processes (:mod:`.processes`), how this process ends (:mod:`.exits`),
loopback names and free ports (:mod:`.net`), log summaries (:mod:`.logs`), traces
(:mod:`.tracing`), stopping an asyncio task (:mod:`.tasks`), and the public packages' names
loaded on first use (:mod:`.lazy`).

Imports nothing of tghost.
"""
