"""Tools for ``torch.utils.data.DataLoader`` objects, one concern each:

* :mod:`.pickling`: what spawn-started workers cannot receive;
* :mod:`.processes`: stopping worker processes;
* :mod:`.rebuild`: worker settings, rebuilding a loader with other ones;
* :mod:`.probe`: fetching the first batches through real workers;
* :mod:`.inflight_memory`: memory of the batches in flight;
* :mod:`.diagnosis`: the verdict on a loader's workers;
* :mod:`.allocator`: letting a loading process reuse the memory it frees.

None of them imports a hook, so preflight and tools use them too.
"""
from .diagnosis import Diagnosis, diagnose_loader  # noqa: F401
from .inflight_memory import (DEFAULT_PREFETCH,  # noqa: F401
                              available_memory, budget_bytes,
                              inflight_bytes, local_processes, nbytes,
                              workers_that_fit)
from .pickling import PICKLING_START_METHODS, find_unpicklable  # noqa: F401
from .processes import shutdown_iterator, shutdown_loader  # noqa: F401
from .rebuild import rebuild_loader, start_method  # noqa: F401
