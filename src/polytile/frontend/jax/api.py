"""``polytile.jax.jit``: trace with ``jax.make_jaxpr``, compile once per input signature, run.

Like ``jax.jit``, a compiled version is cached per pytree structure of the arguments, the
shape / dtype / weak type of every array leaf, and the values of the static arguments.
Arguments on a non-CPU device run through ``jax.jit`` (polytile targets the CPU).
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp

from ... import counters as stats
from ...options import Options
from .compile import compile_jaxpr
from .convert import on_cpu

log = logging.getLogger("polytile")


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (int, str)):
        return (x,)
    return tuple(x)


class _Compiled:
    """One cached version: the runner over flat arrays and the output pytree structure."""

    def __init__(self, run: Callable, out_tree, jaxpr):
        self.run = run
        self.out_tree = out_tree
        self.jaxpr = jaxpr

    def __call__(self, leaves: list):
        return jax.tree_util.tree_unflatten(self.out_tree, self.run(leaves))


class Jitted:
    """A function compiled by polytile on first call for each input signature."""

    def __init__(self, fn: Callable, static_argnums: Iterable[int] = (), static_argnames: Iterable[str] = (),
                 options: Any = None):
        self._fn = fn
        self._static_nums = tuple(sorted(int(i) for i in _as_tuple(static_argnums)))
        self._static_names = frozenset(_as_tuple(static_argnames))
        self._options = Options.from_dict(options)
        self._cache: dict = {}
        self._xla: Callable | None = None
        functools.update_wrapper(self, fn)

    # ------------------------------------------------------------------ public
    def __call__(self, *args, **kwargs):
        nums = [i if i >= 0 else i + len(args) for i in self._static_nums]
        static = tuple((i, args[i]) for i in nums if i < len(args)) + tuple(
            sorted((k, v) for k, v in kwargs.items() if k in self._static_names))
        try:
            hash(static)
        except TypeError as e:
            raise TypeError(f"polytile.jax.jit: static arguments must be hashable ({e})") from None
        dyn = (tuple(a for i, a in enumerate(args) if i not in nums),
               {k: v for k, v in kwargs.items() if k not in self._static_names})
        leaves, tree = jax.tree_util.tree_flatten(dyn)
        leaves = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in leaves]
        if not all(on_cpu(x) for x in leaves):
            return self._jax_jit()(*args, **kwargs)
        key = (tree, tuple((x.shape, x.dtype, getattr(x, "weak_type", False)) for x in leaves), static)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = self._compile(tree, leaves, dict(static), len(args))
        return entry(leaves)

    @property
    def cache_size(self) -> int:
        """How many input signatures have been compiled."""
        return len(self._cache)

    def clear_cache(self) -> None:
        self._cache.clear()

    def jaxpr_for(self, *args, **kwargs):
        """The jaxpr that polytile compiles (or compiled) for these arguments."""
        self(*args, **kwargs)
        return list(self._cache.values())[-1].jaxpr

    # ------------------------------------------------------------------ internals
    def _jax_jit(self) -> Callable:
        if self._xla is None:
            self._xla = jax.jit(self._fn, static_argnums=self._static_nums, static_argnames=tuple(self._static_names))
        return self._xla

    def _compile(self, tree, leaves: list, static: dict, nargs: int) -> Callable:
        out_box: list = []
        fn = self._fn

        def flat_fn(*flat):
            dargs, dkw = jax.tree_util.tree_unflatten(tree, list(flat))
            it = iter(dargs)
            full = [static[i] if i in static else next(it) for i in range(nargs)]
            kw = dict(dkw)
            kw.update({k: v for k, v in static.items() if isinstance(k, str)})
            out_leaves, out_tree = jax.tree_util.tree_flatten(fn(*full, **kw))
            out_box.append(out_tree)
            return out_leaves

        closed = jax.make_jaxpr(flat_fn)(*leaves)  # errors in the user's function propagate, as in jax.jit
        try:
            run = compile_jaxpr(closed, self._options)
        except Exception as e:
            if not self._options.fallback:
                raise
            log.warning("polytile: compiling %s failed, running it with jax.jit: %s: %s",
                        getattr(fn, "__name__", "function"), type(e).__name__, e)
            stats.bump("graphs_failed")
            xla = jax.jit(jax.extend.core.jaxpr_as_fun(closed))
            run = lambda flat_args: list(xla(*flat_args))  # noqa: E731
        return _Compiled(run, out_box[-1], closed)


def jit(fn: Callable | None = None, *, static_argnums: Iterable[int] | int = (),
        static_argnames: Iterable[str] | str = (), options: Any = None):
    """Compile ``fn`` (jax arrays in, jax arrays out) with polytile; usable as a decorator,
    bare or with arguments. ``options`` are polytile's (``polytile.Options`` fields)."""
    if fn is None:
        return functools.partial(jit, static_argnums=static_argnums, static_argnames=static_argnames, options=options)
    return Jitted(fn, static_argnums=static_argnums, static_argnames=static_argnames, options=options)
