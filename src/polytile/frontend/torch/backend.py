"""``torch.compile(model, backend="polytile", options={...})``: dynamo -> AOTAutograd -> polytile."""
from __future__ import annotations

import functools
import logging

import torch

from ... import counters as stats
from ...options import Options

log = logging.getLogger("polytile")


# ops outside the core-ATen set whose torch decompositions use only lowered ops: batch norm in
# training mode (and without running statistics: weight standardization), max-pool gradients
_EXTRA_DECOMPOSITIONS = (torch.ops.aten._native_batch_norm_legit_functional.default,
                         torch.ops.aten._native_batch_norm_legit.no_stats,
                         torch.ops.aten.max_pool2d_with_indices_backward.default)


# core-ATen decompositions polytile does not take: torch's decomposition of the CPU flash
# attention returns the probabilities where the backward op reads the logsumexp (right for
# inference only); polytile lowers the op itself (lower_nn.sdpa_flash_cpu). std's decomposition
# rounds the variance to float32 before the square root, where eager's kernel does not.
_KEPT = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, torch.ops.aten.std.correction,
         torch.ops.aten.std_mean.correction)


@functools.lru_cache(maxsize=1)
def decompositions():
    """Core-ATen decompositions and a few training ones: what AOTAutograd applies before
    polytile sees the graph."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = dict(core_aten_decompositions())
    for op in _KEPT:
        table.pop(op, None)
    table.update(get_decompositions(list(_EXTRA_DECOMPOSITIONS)))
    return table


def _static(example_inputs) -> bool:
    for x in example_inputs:
        if isinstance(x, torch.SymInt) or isinstance(x, torch.SymFloat):
            return False
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride())):
            return False
    return True


def _parameter_inputs() -> frozenset[int]:
    """Positions of the graph inputs that are the model's parameters and buffers (AOTAutograd's
    static inputs: dynamo marks them), whose derived values may be kept between calls
    (``Options.cache_weights``, applied in ``compile_graph_ir``); empty when unknown."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return frozenset(getattr(meta, "static_input_indices", None) or ())


def _fw_compiler(options: Options, forward: bool = True):
    """The compiler of AOTAutograd's forward (``forward``) or backward graphs: only the forward
    graph's inputs are the ones AOTAutograd's static input positions describe."""
    from torch._functorch.aot_autograd import make_boxed_func

    from .compile import compile_aten_graph

    def compiler(gm: torch.fx.GraphModule, example_inputs):
        params = _parameter_inputs() if forward else frozenset()
        if not _static(example_inputs):
            return make_boxed_func(_dynamic(gm, example_inputs, options, params))
        fn = compile_aten_graph(gm, example_inputs, options, params)
        return getattr(fn, "boxed", None) or make_boxed_func(fn)

    return compiler


def _signature(a):
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), tuple(a.stride()), a.dtype, a.device.type)
    return (type(a).__name__, a)


def _symbolic_contractions(gm: torch.fx.GraphModule) -> bool:
    from .symbolic import CONTRACTIONS, is_sym_value, op_name

    return any(n.op == "call_function" and op_name(n) in CONTRACTIONS and is_sym_value(n.meta.get("val"))
               for n in gm.graph.nodes)


def _dynamic(gm: torch.fx.GraphModule, example_inputs, options: Options, params: frozenset[int]):
    """A graph with symbolic sizes (see ``Options.dynamic``): compiled once with the sizes as
    parameters, or per size (for the first ``max_specializations`` sizes, when its contractions
    have symbolic sizes) and then once with parameters."""
    from ...dtypes import Unsupported
    from .compile import compile_aten_graph

    def parametric():
        try:
            fn = compile_aten_graph(gm, list(example_inputs), options, params)
            stats.bump("parametric_graphs")
            return fn
        except Unsupported as e:  # e.g. a size that is not a polynomial of the symbols
            log.info("polytile: graph compiled per size (%s)", e)
            return None
        except Exception as e:  # a bug must not crash the user's program: per-size versions then
            if not options.fallback:
                raise
            log.warning("polytile: compiling a graph with symbolic sizes failed (%s: %s); compiling it per size",
                        type(e).__name__, e)
            return None

    if options.dynamic == "specialize":
        return _specializing(gm, options, params)
    if not _symbolic_contractions(gm):
        fn = parametric()
        return fn if fn is not None else _specializing(gm, options, params)
    return _specializing(gm, options, params, limit=options.max_specializations, generic=parametric)


def _specializing(gm: torch.fx.GraphModule, options: Options, params: frozenset[int] = frozenset(),
                  limit: int | None = None, generic=None):
    """A graph with symbolic shapes: compile one static version per distinct input signature,
    on first use, with shapes made concrete; past ``limit`` versions, ``generic()`` (compiled
    once: the parametric version) serves every further signature."""
    import copy

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from .compile import compile_aten_graph

    versions: dict = {}
    fallback: list = []  # [the generic version] once made (None inside when it could not be)

    def run(*args):
        key = tuple(_signature(a) for a in args)
        fn = versions.get(key)
        if fn is None and limit is not None and len(versions) >= limit:
            if not fallback:
                fallback.append(generic())
            fn = fallback[0]
        if fn is None:
            g = copy.deepcopy(gm)
            FakeTensorProp(g, mode=FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
            fn = versions[key] = compile_aten_graph(g, list(args), options, params)
            stats.bump("specialized_versions")
        return fn(*args)

    return run


def polytile_backend(gm: torch.fx.GraphModule, example_inputs, options=None):
    """The dynamo backend: functionalize and decompose with AOTAutograd, then compile."""
    from torch._dynamo.backends.common import aot_autograd

    opts = Options.from_dict(options)
    return aot_autograd(fw_compiler=_fw_compiler(opts), bw_compiler=_fw_compiler(opts, forward=False),
                        decompositions=decompositions())(gm, example_inputs)


def register() -> None:
    """Make ``backend="polytile"`` known to dynamo (the entry point does the same lazily)."""
    try:
        from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend
    except ImportError:  # pragma: no cover
        return
    if "polytile" in _COMPILER_FNS:
        return
    if _BACKENDS.get("polytile") is not None:
        return  # dynamo found the entry point and is loading it (it registers the function itself)
    register_backend(name="polytile")(polytile_backend)
