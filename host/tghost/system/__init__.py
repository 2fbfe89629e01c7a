"""system: what tghost asks of the operating system, for every stage: file-lock slots
(:mod:`.locks`) and child processes (:mod:`.processes`).

Imports nothing of tghost.
"""
