"""The JAX frontend (``polytile.jax.jit``): every primitive rule against ``jax.jit`` on the CPU,
whole models (MLP, CNN, transformer block in plain jax.numpy / lax), pytrees, caching and
recompilation, fallbacks.

Results are compared with the accuracy rule of DESIGN.md section 4 (polytile.accuracy): tol
1e-4 for single primitives, 1e-3 for models; the float64 reference is the same function under
``jax.enable_x64`` with float inputs cast to float64. Integer and bool results must be equal.
A case must also compile natively: nothing may fall back to JAX.
"""
from __future__ import annotations

import logging
import math
import subprocess
import sys
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import polytile  # noqa: E402
import polytile.jax as pj  # noqa: E402
from polytile.accuracy import assert_accurate  # noqa: E402
from polytile.bench import jaxmodels  # noqa: E402
from polytile.frontend.jax.registry import LOWERINGS, ensure_loaded  # noqa: E402

OPTS = {"threads": 2}


def _torch(tree):
    return jax.tree_util.tree_map(lambda a: torch.from_numpy(np.array(a)), tree)


def _to64(tree):
    return jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def check(fn: Callable, *args, tol: float = 1e-4, natively: bool = True, static_argnums=(), **kwargs):
    """Compile ``fn`` with polytile, compare with ``jax.jit``; returns the polytile result."""
    polytile.reset_stats()
    got = pj.jit(fn, static_argnums=static_argnums, options=OPTS)(*args, **kwargs)
    ref = jax.jit(fn, static_argnums=static_argnums)(*args, **kwargs)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(ref)
    for g in jax.tree_util.tree_leaves(got):
        assert isinstance(g, jax.Array), type(g)

    def fp64():
        with jax.enable_x64(True):
            a64 = [a if k in static_argnums else _to64(a) for k, a in enumerate(args)]
            return _torch(jax.jit(fn, static_argnums=static_argnums)(*a64, **_to64(kwargs)))

    assert_accurate(_torch(got), _torch(ref), fp64, tol)
    if natively:
        assert polytile.stats()["ops_fallen_back"] == {}
    return got


# ------------------------------------------------------------------------------ the primitive table
@dataclass(frozen=True)
class Case:
    id: str
    fn: Callable
    make: Callable[[np.random.Generator], tuple]


CASES: list[Case] = []


def case(id: str, fn: Callable, make: Callable) -> None:
    assert all(c.id != id for c in CASES), id
    CASES.append(Case(id, fn, make))


def randn(*s):
    return lambda r: jnp.asarray(r.standard_normal(s).astype(np.float32))


def pos(*s):
    return lambda r: jnp.asarray((r.random(s) * 2 + 0.1).astype(np.float32))


def args(*gens):
    return lambda r: tuple(g(r) for g in gens)


case("unary_math", lambda x, p: {
    "exp": jnp.exp(x), "exp2": jnp.exp2(x), "log": jnp.log(p), "log1p": jnp.log1p(p), "expm1": jnp.expm1(x),
    "tanh": jnp.tanh(x), "logistic": jax.nn.sigmoid(x), "erf": lax.erf(x), "erfc": lax.erfc(x),
    "rsqrt": lax.rsqrt(p), "sqrt": jnp.sqrt(p), "neg": -x, "abs": jnp.abs(x), "sign": jnp.sign(x),
    "floor": jnp.floor(x), "ceil": jnp.ceil(x), "sin": jnp.sin(x), "cos": jnp.cos(x), "tan": jnp.tan(x * 0.5),
    "square": jnp.square(x), "erf_inv": lax.erf_inv(jnp.clip(x, -0.9, 0.9) * 0.9),
    "asin": jnp.arcsin(p * 0.4), "acos": jnp.arccos(p * 0.4), "atan": jnp.arctan(x), "sinh": jnp.sinh(x),
    "cosh": jnp.cosh(x),
}, args(randn(6, 7), pos(6, 7)))
case("round", lambda x: {"even": jnp.round(x), "away": lax.round(x),
                         "ties": lax.round(jnp.array([0.5, 1.5, -2.5, 2.4], jnp.float32)) + x[0, :4] * 0},
     args(lambda r: jnp.asarray((r.standard_normal((5, 8)) * 4).astype(np.float32))))
case("binary", lambda a, c, p: {
    "add": a + c, "sub": a - c, "mul": a * c, "div": a / p, "max": jnp.maximum(a, c), "min": jnp.minimum(a, c),
    "pow": p ** c, "atan2": jnp.arctan2(a, c), "rem": lax.rem(a, p), "scalar": 2.0 * a - 1.0,
    "bcast": a + c[:1], "integer_pow": a ** 3, "integer_pow_neg": p ** -2, "clamp": lax.clamp(-0.5, a, 0.5),
}, args(randn(4, 9), randn(4, 9), pos(4, 9)))
case("compare_select", lambda a, c: {
    "eq": a == c, "ne": a != c, "lt": a < c, "le": a <= c, "gt": a > c, "ge": a >= c,
    "where": jnp.where(a > 0, a, c), "select_n3": lax.select_n(jnp.argmax(jnp.stack([a, c, -a]), 0), a, c, -a),
    "not": ~(a > c), "and": (a > 0) & (c > 0), "or": (a > 0) | (c > 0), "xor": (a > 0) ^ (c > 0),
    "is_finite": jnp.isfinite(a / jnp.where(c > 0.5, 0.0, 1.0)),
}, args(randn(5, 6), randn(5, 6)))
case("int_ops", lambda i, j: {
    "add": i + j, "mul": i * j, "div": lax.div(i, jnp.where(j == 0, 1, j)), "rem": lax.rem(i, jnp.where(j == 0, 1, j)),
    "neg": -i, "abs": jnp.abs(i), "max": jnp.maximum(i, j), "not": ~i, "and": i & j, "or": i | j, "xor": i ^ j,
    "to_float": i.astype(jnp.float32) * 0.5, "from_float": (j.astype(jnp.float32) * 1.7).astype(jnp.int32),
    "to_bool": i.astype(bool), "bool_to_int": (i > j).astype(jnp.int32), "integer_pow": i ** 2,
}, args(lambda r: jnp.asarray(r.integers(-20, 20, (4, 5)).astype(np.int32)),
        lambda r: jnp.asarray(r.integers(-5, 5, (4, 5)).astype(np.int32))))
case("reduce", lambda x: {
    "sum": jnp.sum(x, axis=1), "sum_all": jnp.sum(x), "max": jnp.max(x, axis=(0, 2)), "min": jnp.min(x, axis=-1),
    "prod": jnp.prod(x * 0.5 + 1.0, axis=2), "mean_keep": jnp.mean(x, axis=1, keepdims=True),
    "argmax": jnp.argmax(x, axis=1), "argmin": jnp.argmin(x, axis=2), "any": jnp.any(x > 1.0, axis=0),
    "all": jnp.all(x > -1.0, axis=2), "var": jnp.var(x, axis=-1), "logsumexp": jax.nn.logsumexp(x, axis=-1),
}, args(randn(3, 6, 5)))
case("softmax", lambda x: {"softmax": jax.nn.softmax(x, axis=-1), "log_softmax": jax.nn.log_softmax(x, axis=1)},
     args(randn(4, 16)))
case("activations", lambda x: {
    "relu": jax.nn.relu(x), "gelu_tanh": jax.nn.gelu(x), "gelu_exact": jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu(x), "softplus": jax.nn.softplus(x), "leaky": jax.nn.leaky_relu(x, 0.1),
    "elu": jax.nn.elu(x), "relu6": jax.nn.relu6(x * 4), "stop_gradient": lax.stop_gradient(x) * 2,
    "barrier": lax.optimization_barrier(x) + 1, "reduce_precision": lax.reduce_precision(x, 8, 23) * 3,
    "copy": jnp.array(x, copy=True) - 1,
}, args(randn(8, 12)))
case("shape", lambda x: {
    "reshape": x.reshape(6, 20), "transpose": jnp.transpose(x, (2, 0, 1)), "bcast": jnp.broadcast_to(x[:, :1], (3, 4, 10)),
    "slice": x[1:3, ::2, 3:9:3], "squeeze": x[:, 2, :], "expand": x[None, :, None, :, 0],
    "concat": jnp.concatenate([x, 2 * x[:, :2]], axis=1), "split": jnp.split(x, 2, axis=2),
    "pad": jnp.pad(x, ((1, 0), (0, 2), (3, 1))), "pad_value": lax.pad(x, 1.5, ((0, 1, 0), (2, 0, 0), (0, 0, 0))),
    "dynamic_slice": lax.dynamic_slice(x, (1, 2, 7), (2, 2, 4)), "index": x[2, -1],
    "iota": lax.broadcasted_iota(jnp.int32, (3, 5), 1) + lax.broadcasted_iota(jnp.int32, (3, 5), 0) * 10,
    "arange_f": jnp.arange(7, dtype=jnp.float32) * x[0, 0, 0],
    "convert": x.astype(jnp.int32),
}, args(randn(3, 4, 10)))
case("dot_general", lambda a, c, q, k, m: {
    "mm": a @ c, "mv": a @ c[:, 0], "vv": a[0] @ c[:, 0],
    "contract_first": lax.dot_general(c, c, (((0,), (0,)), ((), ()))),
    "batched": jnp.einsum("bld,bsd->bls", q, k),
    "batch_not_leading": jnp.einsum("lbd,sbd->bls", jnp.transpose(q, (1, 0, 2)), jnp.transpose(k, (1, 0, 2))),
    "multi_contract": jnp.einsum("ijk,jkl->il", m, m.transpose(1, 2, 0)),
    "heads": jnp.einsum("blhd,bshd->bhls", q.reshape(2, 5, 2, 4), k.reshape(2, 6, 2, 4)),
    "outer": jnp.einsum("i,j->ij", a[0], c[0]),
    "dense3d": q @ k[0].T,
}, args(randn(5, 7), randn(7, 3), randn(2, 5, 8), randn(2, 6, 8), randn(3, 4, 3)))
case("conv_nchw", lambda x, w, wg: {
    "plain": lax.conv_general_dilated(x, w, (1, 1), "SAME"),
    "strided_valid": lax.conv_general_dilated(x, w, (2, 2), "VALID"),
    "dilated": lax.conv_general_dilated(x, w, (1, 1), ((2, 2), (1, 1)), rhs_dilation=(2, 1)),
    "groups": lax.conv_general_dilated(x, wg, (1, 1), "SAME", feature_group_count=2),
    "depthwise": lax.conv_general_dilated(x, wg[:4, :1], (1, 1), "SAME", feature_group_count=4),
    # asymmetric padding (conv2d's padding_hi), also through the depthwise plane form
    "depthwise_asym": lax.conv_general_dilated(x, wg[:4, :1], (2, 2), ((0, 2), (1, 0)), feature_group_count=4),
    "asym": lax.conv_general_dilated(x[:, :, 1:], w, (2, 1), ((1, 2), (0, 3))),
}, args(randn(2, 4, 9, 9), randn(6, 4, 3, 3), randn(6, 2, 3, 3)))
case("conv_nhwc", lambda x, w: {
    "same_s1": lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
    "same_s2": lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
    "mixed": lax.conv_general_dilated(x, w, (1, 2), ((0, 1), (2, 0)), dimension_numbers=("NHWC", "HWIO", "NCHW")),
    "conv1d": lax.conv_general_dilated(x[:, 0], w[0], (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC")),
}, args(randn(2, 8, 8, 3), randn(3, 3, 3, 5)))
case("gather", lambda e, i, m: {
    "embedding": jnp.take(e, i, axis=0), "axis1": jnp.take(e, i[:2], axis=1), "index": e[m],
    "out_of_range_fill": jnp.take(e, i + 8, axis=0), "clip": jnp.take(e, i + 8, axis=0, mode="clip"),
}, args(randn(10, 4), lambda r: jnp.asarray([1, 7, 3, -2], jnp.int32),
        lambda r: jnp.asarray([[0, 9], [2, 2]], jnp.int32)))
case("calls_inlined", lambda x: {
    "jit": jax.jit(lambda y: jnp.sin(y) * 2)(x) + jax.jit(lambda y: jnp.sin(y) * 2)(x + 1),
    "custom_jvp": jax.nn.relu(x) + jax.nn.silu(x),
    "custom_vjp": _clip_grad(x),
    "checkpoint": jax.checkpoint(lambda y: jnp.tanh(y) * y)(x),
}, args(randn(4, 5)))


@jax.custom_vjp
def _clip_grad(x):
    return jnp.tanh(x) * 3


_clip_grad.defvjp(lambda x: (_clip_grad(x), x), lambda x, g: (jnp.clip(g, -1, 1),))


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_primitive(c: Case):
    rng = np.random.default_rng(zlib.crc32(c.id.encode()))
    check(c.fn, *c.make(rng))


def test_every_rule_is_exercised():
    """Each primitive of the lowering table appears in the jaxpr of some case (or is known to
    be unreachable from jax.numpy on this jax version)."""
    ensure_loaded()
    seen: set[str] = set()

    def walk(jaxpr):
        for e in jaxpr.eqns:
            seen.add(e.primitive.name)
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                walk(sub)

    for c in CASES:
        walk(jax.make_jaxpr(c.fn)(*c.make(np.random.default_rng(0))).jaxpr)
    missing = sorted(set(LOWERINGS) - seen)
    assert not missing, f"rules no case exercises: {missing}"


# ------------------------------------------------------------------------------ models
@pytest.mark.parametrize("name", list(jaxmodels.MODELS))
def test_model(name):
    apply, params, x = jaxmodels.build(name, small=True)
    check(apply, params, x, tol=1e-3)
    if name == "transformer":
        assert polytile.stats()["attention_fused"] == 1  # jax.nn.softmax between two einsums


def test_mlp_nchw_cnn_variant():
    """NCHW / OIHW layout (as haiku / hand-written lax code use) with a strided conv and bias."""
    r = np.random.default_rng(1)
    x, w1, w2 = (jnp.asarray(r.standard_normal(s).astype(np.float32)) for s in ((2, 3, 12, 12), (8, 3, 3, 3), (4, 8, 3, 3)))

    def f(x, w1, w2):
        y = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME"))
        y = lax.conv_general_dilated(y, w2, (2, 2), ((1, 1), (1, 1)))
        return jnp.max(y, axis=(2, 3))

    check(f, x, w1, w2, tol=1e-3)


# ------------------------------------------------------------------------------ pytrees, caching, api
def test_pytrees_in_and_out():
    r = np.random.default_rng(2)
    a, c = (jnp.asarray(r.standard_normal((3, 4)).astype(np.float32)) for _ in range(2))

    def f(params, xs, scale=1.0):
        y = params["w"] * xs[0] + params["b"][1]
        return {"y": y * scale, "parts": (jnp.sum(y), [xs[1] - 1.0, None])}

    out = check(f, {"w": a, "b": (c, c * 2)}, (c, a), scale=0.5)
    assert set(out) == {"y", "parts"} and out["parts"][1][1] is None


def test_static_args_and_recompile_on_new_shape():
    calls = []

    @pj.jit
    def plain(x):
        return x * 2

    @pj.jit(static_argnums=(1,), options=OPTS)
    def f(x, n):
        calls.append(n)
        return jnp.tanh(x) ** n

    x = jnp.ones((2, 3), jnp.float32)
    polytile.reset_stats()
    np.testing.assert_allclose(np.asarray(f(x, 2)), np.tanh(1.0) ** 2, rtol=1e-6)
    f(x, 2)
    assert f.cache_size == 1 and polytile.stats()["graphs_compiled"] == 1 and len(calls) == 1
    np.testing.assert_allclose(np.asarray(f(x, 3)), np.tanh(1.0) ** 3, rtol=1e-6)
    assert f.cache_size == 2 and len(calls) == 2
    y = f(jnp.zeros((5,), jnp.float32), 2)  # a new shape: traced and compiled again
    assert y.shape == (5,) and f.cache_size == 3 and polytile.stats()["graphs_compiled"] == 3
    assert np.asarray(plain(np.arange(3, dtype=np.float32))).tolist() == [0.0, 2.0, 4.0]  # numpy in, jax out
    assert plain.__name__ == "plain"
    with pytest.raises(TypeError, match="hashable"):
        f(x, [1])


def test_dtype_signature_is_part_of_the_key():
    f = pj.jit(lambda x: x + x, options=OPTS)
    assert f(jnp.ones(3, jnp.float32)).dtype == jnp.float32
    assert f(jnp.ones(3, jnp.int32)).dtype == jnp.int32
    assert f.cache_size == 2


def test_closed_over_constants_and_literal_outputs():
    table = jnp.asarray(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    check(lambda x: (x @ table.T, jnp.float32(3.0), x), jnp.ones((2, 4), jnp.float32))


def test_unsupported_primitive_falls_back_to_jax(caplog):
    """sort and cumsum have no rule: they run in JAX between two native segments."""
    def f(x):
        y = jnp.tanh(x) * 2
        z = jnp.sort(y, axis=-1)
        return jnp.cumsum(z, axis=0) + jnp.exp(z), y

    x = jnp.asarray(np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32))
    with caplog.at_level(logging.WARNING, logger="polytile"):
        check(f, x, natively=False)
    st = polytile.stats()
    assert st["ops_fallen_back"].get("jax.sort") == 1 and "jax.cumsum" in st["ops_fallen_back"]
    assert st["graphs_compiled"] == 2  # before and after the fallback
    assert any("sort" in r.getMessage() and "runs in JAX" in r.getMessage() for r in caplog.records)


def test_transposed_conv_falls_back():
    """Input (lhs) dilation has no lowering: that convolution runs in JAX, the rest natively."""
    r = np.random.default_rng(5)
    x, w = (jnp.asarray(r.standard_normal(s).astype(np.float32)) for s in ((1, 6, 6, 2), (3, 3, 2, 4)))
    check(lambda x, w: jax.nn.relu(lax.conv_transpose(x * 2, w, (2, 2), "SAME",
                                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))),
          x, w, natively=False)
    assert set(polytile.stats()["ops_fallen_back"]) == {"jax.conv_general_dilated"}


def test_fallback_off_raises():
    f = pj.jit(lambda x: jnp.sort(x), options={**OPTS, "fallback": False})
    with pytest.raises(Exception, match="sort"):
        f(jnp.ones(4, jnp.float32))


def test_rev_falls_back():
    check(lambda x: jnp.flip(jnp.tanh(x), axis=1) * 2, jnp.ones((3, 4), jnp.float32), natively=False)
    assert polytile.stats()["ops_fallen_back"] == {"jax.rev": 1}


def test_import_polytile_does_not_import_jax():
    code = "import sys, polytile; assert 'jax' not in sys.modules, 'jax imported'; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_math_helpers_sanity():
    """The fp64 reference of the checks really is float64 (the rule is not vacuous)."""
    with jax.enable_x64(True):
        assert jax.jit(lambda x: x * 2)(_to64(jnp.ones(2, jnp.float32))).dtype == jnp.float64
    assert math.isclose(float(pj.jit(jnp.sum, options=OPTS)(jnp.arange(4.0, dtype=jnp.float32))), 6.0)


def test_layout_propagation_cancels_nhwc_views():
    """An elementwise op on an NCHW -> NHWC view (plus a broadcast bias) runs in NCHW and is
    returned as the view, so that the next NHWC -> NCHW view is the buffer itself."""
    from polytile.frontend.jax import layout
    from polytile.graph.builder import GraphBuilder

    b = GraphBuilder()
    y = b.input(0, (2, 4, 3, 5), "float32")  # NCHW
    bias = b.input(1, (4,), "float32")
    v = b.permute(y, [0, 2, 3, 1])  # NHWC view
    assert layout.permutation_of(v) == [0, 2, 3, 1]
    z = layout.ew(b, "add", v, b.expand(b.reshape(bias, [1, 1, 1, 4]), [2, 3, 5, 4]))
    z = layout.ew(b, "maximum", z, b.full(0.0, "float32"))
    assert z.shape == (2, 3, 5, 4) and z.op == "view" and z.inputs[0].op == "maximum"
    back = b.permute(z, [0, 3, 1, 2])
    assert back.op == "maximum" and back.shape == (2, 4, 3, 5)
    w = b.input(2, (2, 3, 5, 4), "float32")  # a full-size contiguous operand: no rewrite
    assert layout.ew(b, "add", v, w).op == "add"


def test_bench_report_and_blocked_timing():
    calls = {"a": 0, "b": 0}
    t = jaxmodels.time_blocked({"a": lambda: calls.__setitem__("a", calls["a"] + 1),
                                "b": lambda: calls.__setitem__("b", calls["b"] + 1)}, rounds=2, block=3, warmup=1)
    assert set(t) == {"a", "b"} and calls == {"a": 1 + 2 * 4, "b": 1 + 2 * 4}
    r = {"shape": "m", "xla_ms": 2.0, "polytile_ms": 1.0, "speedup": 2.0, "xla_gflops": 1, "polytile_gflops": 2,
         "accurate": True, "max_abs_err": 0.0, "fallbacks": {}, "kernels": 1, "compile_s": 0.1}
    text = jaxmodels.render([r, {**r, "speedup": 0.5}], 2, 3)
    assert "Geomean speedup of polytile over jax.jit: 1.00x" in text and "slowest model 0.50x" in text
