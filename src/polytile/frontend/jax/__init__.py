"""The JAX frontend: jaxpr -> graph IR segments (+ JAX fallbacks) -> one callable.

``polytile.jax.jit`` is the public entry point (``api.py``); ``flatten.py`` inlines call
primitives, ``compile.py`` builds segments, and the ``lower_*.py`` modules hold one rule per
JAX primitive (``registry.py``). Importing this package imports jax.
"""
