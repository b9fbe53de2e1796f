"""Process-wide settings for the many small CPU runs a sweep makes: torch's thread count, and glibc's malloc.

  configure_cpu(threads)   torch intra-op threads, then `keep_freed_memory()`

Why malloc: the toy's activations are tensors of 0.1-2 MB, allocated and freed hundreds of times per step. glibc
serves blocks above its mmap threshold (128 KB at start) with fresh mmaps, and gives freed heap memory back to the
OS once the free top of the heap passes its trim threshold, so the next tensor of that size touches new pages: a
page fault (and a zeroed page) per 4 KB, thousands per step. `keep_freed_memory` raises the trim threshold and top
pad, and pins the mmap threshold at its largest value (32 MB), so freed blocks stay in the heap for reuse.
`python -m experiments.speed --sections step` counts the minor page faults per headline step beside its time
(docs/speed.md). It changes where memory comes from, never a number: the
results are bit-identical. Linux with glibc only; elsewhere it does nothing.
"""
import ctypes
import ctypes.util

import torch

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc <malloc.h>
SETTINGS = {M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 64 << 20, M_MMAP_THRESHOLD: 32 << 20}


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse (see the module docstring). True when it took effect."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        return False
    return mallopt is not None and all(mallopt(k, v) == 1 for k, v in SETTINGS.items())


def configure_cpu(threads: int) -> None:
    torch.set_num_threads(threads)
    keep_freed_memory()
