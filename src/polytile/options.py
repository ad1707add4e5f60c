"""Compiler options: one frozen dataclass, the only place that reads environment variables."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping


def _default_cache_dir() -> str:
    env = os.environ.get("POLYTILE_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return os.path.join(base, "polytile")


def _default_threads() -> int:
    env = os.environ.get("POLYTILE_THREADS")
    if env:
        return max(1, int(env))
    import torch

    return max(1, torch.get_num_threads())


def triton_interpreter() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, which Triton
    reads when it is imported): the GPU backend then takes CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


@dataclass(frozen=True)
class Options:
    """Every knob of the compiler. Pass as ``torch.compile(..., options={...})``."""

    dump_dir: str | None = field(default_factory=lambda: os.environ.get("POLYTILE_DUMP_DIR") or None)
    """Write graph IR, affine IR after each pass, and generated C here (numbered by stage)."""
    cache_dir: str = field(default_factory=_default_cache_dir)
    """Where compiled kernels are cached (must be owned by the user, mode 0700)."""
    threads: int = field(default_factory=_default_threads)
    """OpenMP thread count passed explicitly to every parallel loop."""
    cc: str = field(default_factory=lambda: os.environ.get("POLYTILE_CC") or os.environ.get("CC") or "gcc")
    """System C compiler."""
    cflags: tuple[str, ...] = ("-O3", "-march=native", "-ffp-contract=off", "-fno-trapping-math")
    """Optimization flags for the C compiler (-fopenmp -shared -fPIC -fno-math-errno are always
    added). They keep eager's IEEE semantics: NaN, infinities and signed zeros. Sums are
    reordered only inside reduction loops, which the generated code marks as OpenMP simd
    reductions; multiply-adds are fused (one rounding) only in contraction and attention
    kernels, which the generated code marks, as eager's GEMM and convolution kernels do."""
    fast_math: bool = False
    """Add ``-fassociative-math -fno-signed-zeros -ffp-contract=fast``: the C compiler may
    reorder any sum, ignore the sign of zeros (``x * -0.0`` may give +0.0, ``1 / (x * -0.0)``
    +inf) and fuse any multiply-add (``x * x + y`` then no longer overflows where eager's does)."""
    fallback: bool = True
    """When an op has no lowering or a compile stage fails, run that part through ATen (with a
    warning). With False, such a failure raises instead."""
    verify: bool = True
    """Run the IR verifiers on the graph and on the affine program before and after the passes."""
    verify_passes: bool = field(default_factory=lambda: os.environ.get("POLYTILE_VERIFY_PASSES", "") == "1")
    """Also verify the affine program after every pass (``$POLYTILE_VERIFY_PASSES=1``; the test
    suite sets it): finds the pass that broke an invariant, at about a third more compile time."""
    compile_budget_s: float = 600.0
    """Seconds the pass pipeline may take for one graph; past it (checked after every pass) the
    graph runs through ATen, with a warning. Each isl query also has its own operation budget."""
    parallel_min_work: int = 16384
    """A nest with fewer scalar iterations than this runs on one thread."""
    fusion: bool = True
    """Fuse loop nests (all kinds below); False turns every fusion pass off."""
    fuse_producers: bool = True
    """Recompute cheap elementwise producers inside their consumers (buffers disappear)."""
    fuse_epilogues: bool = True
    """Write an elementwise consumer's result at the store of its producer (reduction,
    matmul or convolution epilogues: bias, activation, residual add)."""
    fuse_loops: bool = True
    """Producer-consumer loop fusion at a depth, intermediates shrunk to local arrays
    (reduce -> reduce chains: softmax, layer norm)."""
    fuse_siblings: bool = True
    """Fuse nests that read the same data and share their outer loops."""
    fuse_attention: bool = True
    """Rewrite attention (q.k^T, scale/mask steps, softmax, .v; from scaled_dot_product_attention
    or written out) into one online-softmax kernel that never stores the score matrix."""
    tile_contractions: bool = True
    """Register-tile and pack matmul-like nests (vector accumulators, packed operand panels)."""
    prefetch: bool = True
    """Software prefetches in the register tiles of contractions that read their row operand in
    place: the next row tile's rows are fetched to the L2 while the current tile runs."""
    profile: bool = False
    """Time every kernel call inside the generated entry point (clock_gettime around each
    call); read the totals with ``polytile.profile()`` / ``polytile.format_profile()``."""
    reuse_outputs: bool = True
    """Graph outputs of 256 KB and more live in memory that the graph keeps and reuses once the
    caller has dropped them (at most two calls' worth held), instead of fresh pages from malloc
    that fault on first write. Their storage cannot be resized."""
    cache_weights: bool = False
    """Opt-in, like Inductor's ``freezing``: values computed from parameters and buffers alone
    (weight panels packed for the register tiles, a weight's transposed copy) are kept between
    calls and recomputed only when such an input's storage or version counter changes (any
    in-place update through the tensor, e.g. an optimizer step or ``load_state_dict``). A write
    through ``.data`` bypasses the version counter and is NOT seen (the old values are used):
    turn this on only for code that never updates weights that way."""
    mm_conv_precision: str | None = None
    """The precision of fp32 matmul and convolution products. GPU: None follows torch
    (``torch.set_float32_matmul_precision`` for matmuls, ``torch.backends.cudnn.allow_tf32`` for
    convolutions); ``"ieee"`` or ``"tf32"`` force one; ``"fp16"`` / ``"bf16"`` round the operands to
    half precision for the tensor cores (accumulating in fp32): faster, less accurate. CPU:
    ``"bf16"`` / ``"fp16"`` round the operands the same way (bfloat16 pair dot products where the
    machine has them, about 2x the float32 rate), anything else keeps float32 (no tf32 unit)."""
    emulate_precision_casts: bool = False
    """bfloat16/float16 ops fused into one kernel keep their intermediate values in float32 and
    round once, at the store (as Inductor does: more accurate than eager, whose separate ops round
    every result; results differ from eager's where those roundings matter). True rounds every
    op's result to the half type as eager does: eager's bits, slower. Named after Inductor's
    option of the same meaning."""
    cuda_graphs: bool = True
    """GPU target: from the second call on, run the graph's kernels as one captured CUDA graph
    (inputs copied into fixed buffers, outputs copied out): one launch instead of one per
    kernel, which dominates at small batch."""
    dynamic: str = "parametric"
    """Graphs with symbolic sizes (dynamo's dynamic shapes: a KV cache that grows, prompts of
    different lengths, ``torch.compile(dynamic=True)``, ``mark_dynamic``). ``"parametric"``: ops
    on symbolic shapes compile once, with the sizes as parameters of the loop nests, and every
    size runs that code; graphs whose matmuls or convolutions have a symbolic size (a prefill)
    get a version specialized per size for the first ``max_specializations`` sizes, then the
    parametric one. ``"specialize"``: one version per size, without limit."""
    max_specializations: int = 4
    """With ``dynamic="parametric"``: how many per-size versions a graph with symbolic
    contraction sizes gets before its parametric version serves every further size."""
    half_types: str = "compile"
    """Ops on bfloat16/float16 tensors: ``"compile"`` compiles them (float32 arithmetic, rounded
    to the half type at every stored result, see ``emulate_precision_casts``; matmuls and
    convolutions read their half operands in place, bfloat16 ones as pair dot products where the
    machine has them); ``"aten"`` leaves them to ATen's half-precision kernels."""
    row_blocks: bool = True
    """With ``dynamic="parametric"``, CPU target: the kernels of a parametric graph over a
    symbolic number of rows that include a matmul run in static blocks of rows compiled as
    static graphs are (fused, register-tiled, packed weights cached), the rows left over in
    one zero-padded block; False: plain loops for every row."""
    target: str | None = None
    """The backend that compiles the graph (``"cpu"`` or ``"gpu"``, see ``polytile.backends``);
    None: the one for the device of the graph's inputs (``"gpu"`` for CUDA tensors)."""
    machine: Any = None
    """Overrides of the target's machine description, which its cost models read: for the CPU
    the fields of ``polytile.backends.cpu.machine.CPUMachine``, e.g. ``{"vector_bytes": 16}``,
    and ``"preset"`` to start from a named machine instead of the detected one
    (``{"preset": "zen3"}``; presets in ``PRESETS`` there). A dict given as ``target`` (the
    older spelling) means the same."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "Options":
        if d is None:
            return cls()
        if isinstance(d, Options):
            return d
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - valid)
        if unknown:
            raise ValueError(
                f"polytile: unknown option(s) {unknown}; valid options are {sorted(valid)}"
            )
        kw = dict(d)
        if "cflags" in kw and isinstance(kw["cflags"], str):
            kw["cflags"] = tuple(kw["cflags"].split())
        elif "cflags" in kw:
            kw["cflags"] = tuple(kw["cflags"])
        if isinstance(kw.get("target"), Mapping):
            if kw.get("machine") is not None:
                raise ValueError("polytile: give the machine description as 'machine' only")
            kw["machine"] = kw.pop("target")
        if kw.get("target") is not None or kw.get("machine") is not None:
            from .backends import BACKENDS, _load_builtin

            _load_builtin()
            name = kw.get("target") or "cpu"
            if name not in BACKENDS:
                raise ValueError(f"polytile: unknown target {name!r}; targets are {sorted(BACKENDS)}")
            if kw.get("machine") is not None:
                kw["machine"] = dict(kw["machine"])
                BACKENDS[name].machine(kw["machine"])  # unknown fields fail here, with the valid ones
        if kw.get("mm_conv_precision") not in (None, "ieee", "tf32", "fp16", "bf16"):
            raise ValueError(f"polytile: option 'mm_conv_precision' is one of None, 'ieee', 'tf32', 'fp16', 'bf16'; "
                             f"got {kw['mm_conv_precision']!r}")
        if kw.get("dynamic", "parametric") not in ("parametric", "specialize"):
            raise ValueError(f"polytile: option 'dynamic' is 'parametric' or 'specialize'; got {kw['dynamic']!r}")
        if kw.get("half_types", "compile") not in ("aten", "compile"):
            raise ValueError(f"polytile: option 'half_types' is 'aten' or 'compile'; got {kw['half_types']!r}")
        if int(kw.get("max_specializations", 0)) < 0:
            raise ValueError("polytile: option 'max_specializations' must be >= 0")
        if "threads" in kw:
            kw["threads"] = int(kw["threads"])
            if kw["threads"] < 1:
                raise ValueError("polytile: option 'threads' must be >= 1")
        return cls(**kw)

    def replace(self, **kw: Any) -> "Options":
        return dataclasses.replace(self, **kw)

    def cache_key(self) -> str:
        """The parts of the options that change generated code (not where it is written)."""
        return repr((self.threads, self.cc, self.cflags, self.fast_math, self.parallel_min_work, self.fusion, self.fuse_producers,
                     self.fuse_epilogues, self.fuse_loops, self.fuse_siblings, self.fuse_attention,
                     self.tile_contractions, self.prefetch, self.cache_weights,
                     self.profile, self.target, self.mm_conv_precision, self.emulate_precision_casts,
                     sorted((self.machine or {}).items())))
