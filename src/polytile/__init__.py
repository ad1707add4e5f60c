"""polytile: a code-generating compiler for AI models (PyTorch graph -> affine loop nests -> C)."""
__version__ = "0.1.0"

from .options import Options  # noqa: E402
from .counters import reset_stats, stats  # noqa: E402
from .profiling import format_profile, profile  # noqa: E402


def _register() -> None:
    from .frontend.torch.backend import register

    register()


_register()

__all__ = ["Options", "stats", "reset_stats", "profile", "format_profile", "compile_graph", "__version__"]


def compile_graph(gm, example_inputs, options=None):
    """Compile an ATen-level FX GraphModule (as AOTAutograd produces) for ``example_inputs``.

    Returns a callable ``f(*tensors) -> list[tensor]`` that checks its inputs."""
    from .frontend.torch.compile import compile_aten_graph

    return compile_aten_graph(gm, example_inputs, Options.from_dict(options))
