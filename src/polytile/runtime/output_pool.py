"""Large graph outputs reuse the memory of earlier calls' outputs once the caller has dropped them.

A fresh multi-megabyte buffer from malloc is fresh pages from the kernel: every 4 KB page faults
on its first write, inside the first kernel that writes it. In a virtual machine a fault costs
microseconds, so the faults on a model's 25 MB of logits add a sizeable part of an LM head's
GEMM time to every call. ``OutputPool`` keeps the backing memory of large outputs: each output
tensor is a view of a block the pool owns, and when the last tensor (or view, or numpy array) on
that memory dies, a finalizer hands the block back for the next call. Liveness is exact: a block
is reused only after its storage is gone, never by guessing from reference counts.

Such tensors have non-resizable storage (``resize_`` to a larger size raises); everything else
about them is an ordinary contiguous CPU tensor.
"""
from __future__ import annotations

import ctypes
import threading
import weakref

import torch

MIN_POOLED_BYTES = 256 << 10
"""Outputs smaller than this come from torch's allocator: malloc serves them from its heap, whose
pages are already mapped, and the pool's bookkeeping (a few microseconds) would not pay."""


class OutputPool:
    """Free blocks by exact byte size, at most ``keep_bytes`` of them held while unused."""

    def __init__(self, keep_bytes: int):
        self.keep_bytes = keep_bytes
        self._free: dict[int, list[torch.Tensor]] = {}
        self._free_bytes = 0
        # reentrant: a finalizer may run inside the locked region of this thread (a cyclic GC
        # pass started by an allocation there) and hand a block back itself
        self._lock = threading.RLock()
        self.reused = 0  # blocks handed out again (for tests and stats)

    def empty(self, shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype,
              nbytes: int) -> torch.Tensor:
        with self._lock:
            blocks = self._free.get(nbytes)
            block = blocks.pop() if blocks else None
            if block is not None:
                self._free_bytes -= nbytes
                self.reused += 1
        if block is None:
            block = torch.empty(nbytes, dtype=torch.uint8)
        view = (ctypes.c_char * nbytes).from_address(block.data_ptr())
        done = weakref.finalize(view, self._give_back, block)
        done.atexit = False
        # frombuffer keeps ``view`` alive exactly as long as the storage: its finalizer is the signal
        out = torch.frombuffer(view, dtype=torch.uint8)
        return out.view(dtype).as_strided(shape, strides)

    def _give_back(self, block: torch.Tensor) -> None:
        n = block.numel()
        with self._lock:
            if self._free_bytes + n <= self.keep_bytes:
                self._free.setdefault(n, []).append(block)
                self._free_bytes += n

    @property
    def free_bytes(self) -> int:
        return self._free_bytes
