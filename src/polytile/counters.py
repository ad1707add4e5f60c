"""Process-wide counters of what polytile compiled (read with ``polytile.stats()``)."""
from __future__ import annotations

import collections
import copy
import threading

_lock = threading.Lock()
_counters: dict = {}


def reset_stats() -> None:
    with _lock:
        _counters.clear()
        _counters.update(graphs_compiled=0, ops_compiled=0, ops_fallen_back=collections.Counter(),
                         kernels_generated=0, cache_hits=0, cache_misses=0, graphs_failed=0,
                         compile_seconds=0.0, intermediate_bytes=0, arena_bytes=0, attention_fused=0,
                         cached_kernels=0, cache_bytes=0, cache_refreshes=0,
                         input_relayouts=0, eager_runs=0, parametric_graphs=0, specialized_versions=0, isl_gave_up=0, gpu_dot_kernels=0, gpu_lane_kernels=0,
                         gpu_row_kernels=0, gpu_flash_kernels=0, gpu_scratch_arrays=0,
                         cuda_graphs=0,
                         compile_phases=collections.Counter())


def bump(key: str, n: int | float = 1) -> None:
    with _lock:
        _counters[key] += n


def add_phase(name: str, seconds: float) -> None:
    with _lock:
        _counters["compile_phases"][name] += seconds


def fell_back(op_name: str, n: int = 1) -> None:
    with _lock:
        _counters["ops_fallen_back"][op_name] += n


def stats() -> dict:
    """Counters since import (or the last ``reset_stats()``):

    graphs_compiled, ops_compiled, ops_fallen_back (op name -> count), kernels_generated,
    cache_hits / cache_misses (compiled shared objects), graphs_failed, compile_seconds,
    attention_fused (attention patterns rewritten into one online-softmax kernel),
    intermediate_bytes (sum of the sizes of the intermediate buffers left in memory after fusion)
    and arena_bytes (the memory plan's arena that holds them, with reuse), cached_kernels and
    cache_bytes (kernels that read only parameters, and what they compute, kept between calls:
    ``Options.cache_weights``), cache_refreshes (how many times such kernels ran: once, then once
    per change of the parameters they read), input_relayouts (inputs whose strides differed from
    the compiled ones, copied into the compiled layout), eager_runs (calls of a compiled graph or
    segment run through ATen instead: an input layout no copy could repair, or a failed kernel
    build at first call), isl_gave_up (dependence or slice queries that exceeded their budget
    and were answered conservatively: a nest left unfused or sequential), compile_phases
    (seconds per compile phase: lowering, attention rewrite, affine build, each pass, render,
    C compile and load, slowest first).
    """
    with _lock:
        d = copy.deepcopy(_counters)
    d["ops_fallen_back"] = dict(d["ops_fallen_back"])
    d["compile_phases"] = {k: round(v, 3) for k, v in d["compile_phases"].most_common()}
    return d


reset_stats()
