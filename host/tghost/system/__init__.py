"""system: what every stage needs from the machine and the runtime: file-lock slots
(:mod:`.locks`), child processes (:mod:`.processes`) and log summaries (:mod:`.logs`).

Imports nothing of tghost.
"""
