"""Process-wide allocator settings for the long-running processes (brokers).

A broker allocates and frees buffers of 100 KiB to a few MiB all the time: request bodies (asyncio
reads the socket into a fresh 256 KiB buffer per ``recv``), segment reads for fetch responses,
msgpack's output buffers. glibc's defaults serve anything above 128 KiB with its own ``mmap`` and
give it back on ``free``, and also give back the top of the heap once 128 KiB of it is free. glibc
raises both thresholds after freeing such a buffer, but only up to that buffer's size, so whether a
given size is served from reused memory depends on what the process happened to free first: the
same broker, serving the same fetches, took 37.5 page faults per 212 KiB fetch in one run and none
in the next, ~90 us of CPU per fetch apart on this 2-core VM, where a fault on fresh memory is
expensive (``python -m broker.fetch_bench``; figures in docs/benchmarks/fetcher.md).

``keep_large_buffers`` fixes the thresholds instead, in the spirit of Kafka's start script fixing
the JVM heap (``-Xms`` = ``-Xmx``): buffers below ``mmap_threshold`` come from the heap, and up to
``trim_threshold`` of free heap is kept for reuse rather than returned to the kernel.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 16 * 1024 * 1024  # glibc accepts at most 32 MiB on 64-bit
TRIM_THRESHOLD = 64 * 1024 * 1024


def keep_large_buffers(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds for this process; False (nothing changed) where the C
    library is not glibc or refuses a value."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
