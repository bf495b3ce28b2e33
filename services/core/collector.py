"""Python's cyclic garbage collector in a long-lived gpuplan process: the API's processes, a task worker's pool
processes, and the planner benchmark, which measures plans as those processes run them."""

from __future__ import annotations

import gc

# Tracked objects allocated, net of those freed, before a collection of the young generation (CPython's default
# is 700). A plan keeps its search's objects alive until it returns, and every collection of an older generation
# walks all of them again: a 70B full plan over 5,000 offers made 61 young and 5.5 middle collections per plan at
# the default, about a tenth of its CPU time (measured by benchmarks/planner/collector.py, which prints the counts
# and the time at both thresholds). At this threshold one plan's objects mostly die by reference counting before
# a collection sees them; young garbage in cycles waits for at most this many allocations.
YOUNG_GENERATION_THRESHOLD = 50_000


def settle() -> None:
    """Collect once, freeze what exists now out of later collections (modules, schemas, tables: they live as long
    as the process; a full collection holds the GIL, and with them in it one took about 0.5 s while a large
    request's objects were alive), and collect the young generation every YOUNG_GENERATION_THRESHOLD objects.
    The older generations keep their thresholds."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, oldest)
