"""The memory of a compiled graph's cached kernels (``cache_static``): what they compute from the
model's parameters (packed weight panels, weight copies), kept between calls. One set per group
of parameter tensors the graph is called with: two instances of one architecture share a
compiled graph (dynamo passes inlined modules' parameters as inputs), and alternating them would
otherwise recompute every cached value on every call."""
from __future__ import annotations

import weakref

import torch

MAX_SETS = 4  # parameter groups a graph keeps cached values for; the least recently used goes


def stamp(t: torch.Tensor):
    """What identifies a parameter's current values: its storage and version counter (bumped by
    every in-place write through it or a view); None for a tensor without one (made under
    ``torch.inference_mode``), whose derived values are then recomputed on every call."""
    try:
        return (t.data_ptr(), t._version)
    except RuntimeError:
        return None


class _Set:
    """One group's cached values: ``buf``, computed from the tensors ``refs`` (weak: a set whose
    tensors are gone can be reused) as they were at ``key`` (None: not computed)."""

    def __init__(self, nbytes: int):
        self.buf = torch.empty(max(nbytes, 64), dtype=torch.uint8)
        self.refs: tuple[weakref.ref, ...] = ()
        self.key: tuple | None = None

    def holds(self, tensors: tuple[torch.Tensor, ...]) -> bool:
        return len(self.refs) == len(tensors) and all(r() is t for r, t in zip(self.refs, tensors))

    def alive(self) -> bool:
        return all(r() is not None for r in self.refs)


class CacheSets:
    """``select(tensors)`` -> (memory for the cached values of these parameter tensors, whether
    they must be computed into it first); ``done()`` once they have been. Not thread-safe:
    the caller holds its lock around both."""

    def __init__(self, nbytes: int, max_sets: int = MAX_SETS):
        self.nbytes, self.max_sets = nbytes, max_sets
        self._sets: list[_Set] = []  # least recently used first
        self._pending: tuple | None = None  # the key of the last ``select``

    def __len__(self) -> int:
        return len(self._sets)

    def select(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, bool]:
        key = tuple(stamp(t) for t in tensors)
        s = next((s for s in self._sets if s.holds(tensors)), None)
        if s is None:
            # the tensors of a set may have been freed (and a new tensor given the same address and
            # version): such a set is never matched again, its memory is the first reused
            self._sets.sort(key=_Set.alive)
            if len(self._sets) < self.max_sets and (not self._sets or self._sets[0].alive()):
                s = _Set(self.nbytes)
            else:
                s = self._sets.pop(0)
                s.key = None
            s.refs = tuple(weakref.ref(t) for t in tensors)
        else:
            self._sets.remove(s)
        self._sets.append(s)
        self._pending = key
        return s.buf, s.key != key or None in key

    def done(self) -> None:
        """The values for the last ``select`` are computed: valid until a tensor's version moves."""
        self._sets[-1].key = self._pending
