"""Suite-wide settings: one intra-op thread.

The tests run many small-tensor chains; on a 2-core machine a second OpenMP thread costs far
more in synchronisation than it gains (measured 8-20 ms vs microseconds per small op).
"""

import os

import torch

torch.set_num_threads(1)

# NNSGHMC's default background compile would switch a run from eager to compiled steps at a
# moment that depends on the machine (same results only up to float rounding) and load the
# two cores with compiles: the suite samples eagerly unless a test asks for compile=True.
os.environ.setdefault("METASAMPLER_COMPILE", "0")


def pytest_sessionfinish(session, exitstatus):
    # A compiled step still building when the suite ends would outlive it (its package
    # goes to a test's temporary directory): stop it.
    from metasampler.learned import aot

    aot.stop_builds()
