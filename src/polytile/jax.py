"""polytile for JAX: ``polytile.jax.jit(fn, static_argnums=..., options={...})``.

Traces ``fn`` to a jaxpr, lowers every primitive through one rule per primitive into polytile's
graph IR and runs the same pipeline and native runtime as the PyTorch frontend. Takes and
returns jax arrays (zero-copy through DLPack). Primitives without a rule run through JAX.

jax is imported on first use of this module, never by ``import polytile``.
"""
from __future__ import annotations

try:
    import jax as _jax  # noqa: F401
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError("polytile.jax needs jax: pip install jax jaxlib (see requirements-dev.txt)") from _e

from .frontend.jax.api import Jitted, jit  # noqa: E402

__all__ = ["jit", "Jitted"]
