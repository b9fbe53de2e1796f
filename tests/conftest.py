import os
import signal

import torch

torch.set_num_threads(1)  # results must not depend on the machine (and CI has 2 shared cores)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A gloo rank sometimes aborts with this message (a C++ thread torn down while joinable): seen in 2 of about 30
# two-rank launches on this loaded 2-core machine, never in one process. The two-rank tests retry such a launch once;
# a real failure repeats.
GLOO_ABORT = "terminate called without an active exception"


def sigkill_on_call(k: int):
    """A wrapper factory: the k-th call through any function it wraps SIGKILLs this process (a kill right there).
    `counted.calls[0]` is the number of calls so far (to learn how many points there are to kill at)."""
    n = [0]

    def counted(fn):
        def call(*a, **kw):
            n[0] += 1
            if n[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*a, **kw)
        return call
    counted.calls = n
    return counted
