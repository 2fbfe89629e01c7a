"""system: what every stage needs from the machine and the runtime: file-lock slots
(:mod:`.locks`), child processes (:mod:`.processes`), how this process ends (:mod:`.exits`),
log summaries (:mod:`.logs`) and traces (:mod:`.tracing`).

Imports nothing of tghost.
"""
