"""tghost-amplifier: Amplifier tool modules both ways. :mod:`.serve` serves every installed
Amplifier tool module unchanged over Pulsar (a ``tghost.plugins`` entry point); :mod:`.session`
is the ``tool-tghost`` Amplifier module that mounts every live tghost tool in a session.
"""

import atexit
import gc

# amplifier-core 2.0.2 can abort the interpreter ("Fatal Python error: PyGILState_Release")
# when a ModuleCoordinator whose hooks or cleanups ran Python code is garbage-collected during
# interpreter finalization. Collecting cycles before finalization starts avoids it.
atexit.register(gc.collect)
