"""glibc's allocator told to keep a process's big buffers instead of mapping them afresh.

Every service handles buffers of hundreds of KB: ingest a bunch's body, its event encoded and
the producer's record batch (several events, copied twice more as it is compressed); the
projector and the scheduler each fetch's record batches, decompressed, and the events sliced
from them. By default glibc maps a block over 128 KB on its own and unmaps it when freed, or,
once its threshold has risen past such sizes, takes it from the top of the heap and hands the
top back to the kernel as soon as more than twice that is free. Either way every bunch touches
fresh pages, and a first touch is a page fault (a few microseconds each on this VM; a bunch's
buffers in ingest are some 500 pages). Timed in ingest through the 1M submit (2026-12-01,
probe 8), the producer's batch build took 2.5-3.0 ms of CPU a batch of about two bunches,
against 0.3-0.4 ms for the same build outside the service: nearly all of it the copies' first
touches.

:func:`keep_big_buffers` takes blocks up to ``mmap_threshold`` from the heap and keeps
``top_pad`` of free heap at its top: the same pages serve bunch after bunch. What it costs is
that much resident memory held after a burst. :func:`services.common.gcpause.tune_for_service`
calls it in every service; docs/performance.md has the pairs that measured it.
"""

from __future__ import annotations

import ctypes
import platform

M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameters (glibc's ``malloc.h``)."""

MMAP_THRESHOLD = 32 * 1024 * 1024
"""Blocks below this come from the heap (glibc's largest threshold on 64-bit)."""
TOP_PAD = 16 * 1024 * 1024
"""Free heap kept at the top when it grows or shrinks."""


def keep_big_buffers(*, mmap_threshold: int = MMAP_THRESHOLD, top_pad: int = TOP_PAD) -> bool:
    """Set glibc's thresholds (see the module docstring); False where the C library is not
    glibc, and nothing changed."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Both or neither matter: a fixed threshold alone also fixes the trim threshold at 128 KB,
    # and a pad alone fixes the mmap threshold at 128 KB (glibc turns off its dynamic
    # thresholds once either is set).
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TOP_PAD, top_pad))
