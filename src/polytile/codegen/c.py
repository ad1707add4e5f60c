"""C renderer: a table of scalar-op templates plus a few hooks that print loops and kernels."""
from __future__ import annotations

import math
import struct
from typing import Callable

from ..affine.ir import (GROUPS, SIZE_PREFIX, Alloc, Assign, Const, Expr, Fail, For, If, Let, Load, Op, Prefetch, Program,
                         Stmt, Store, Var, buffers_used, element_type, kernel_size_params, lanes, rename_buffers, size_expr,
                         structure_key, walk_exprs)
from ..affine.transpose import interleave_mask
from .c_prelude import PRELUDE

CTYPE = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t",
         "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "bool",
         # half types are storage only (graph.low_precision): bfloat16's bits, converted by
         # pt_bf16_f32 / pt_f32_bf16; float16 as GCC's _Float16 (C casts convert it)
         "bfloat16": "uint16_t", "float16": "_Float16",
         # vectors (GCC vector extensions; aligned(4): loads and stores through them may be unaligned)
         "float32x4": "pt_f32x4", "float32x8": "pt_f32x8", "float32x16": "pt_f32x16",
         **{f"{t}x{n}": f"pt_{s}x{n}" for t, s in (("bfloat16", "bf16"), ("float16", "f16"), ("int8", "i8"),
                                                     ("uint8", "u8")) for n in (4, 8, 16)},
         # bfloat16 pairs and int8 quads (``affine.ir.GROUPS``), read as the bits of floats
         **{g: f"pt_{g[-4:]}" for g in GROUPS}, **{f"{g}x{n}": f"pt_{g[-4:]}x{n}" for g in GROUPS for n in (4, 8, 16)}}

def _f(fname: str) -> Callable[[list[str], str], str]:
    """A libm function: float variant with the f suffix, double without, ints via double."""
    def r(a: list[str], dt: str) -> str:
        if dt == "float32":
            return f"{fname}f({a[0]})"
        if dt == "float64":
            return f"{fname}({a[0]})"
        return f"({CTYPE[dt]}){fname}((double){a[0]})"
    return r


def _isfloat(dt: str) -> bool:
    return dt in ("float32", "float64")


def _sfx(dt: str) -> str:
    return "f" if dt == "float32" else ""


# one template per scalar op: (rendered args, result dtype, arg dtype) -> C expression
OPS: dict[str, Callable[[list[str], str, str], str]] = {
    "add": lambda a, d, t: f"({a[0]} + {a[1]})",
    # x - (+0) is x for every x (-0 and NaN included), so the compiler drops the subtraction and
    # splats x straight from memory (vbroadcastss m32): 0 + x is not x for x = -0, and cost a
    # scalar add and a register splat per broadcast in every register tile's reduction step
    "broadcast": lambda a, d, t: f"({a[0]} - ({CTYPE[d]}){{}})",
    # the even lanes of the concatenation of two vectors (a stride-2 row from two loads)
    "even_lanes": lambda a, d, t: (f"__builtin_shuffle({a[0]}, {a[1]}, (pt_i32x{lanes(d)}){{"
                                   + ", ".join(str(2 * x) for x in range(lanes(d))) + "})"),
    # two-vector shuffles of an in-register transpose (affine.transpose), h = 1, 2, 4, ... lanes
    **{f"interleave_{side}{h}": (lambda a, d, t, h=h, hi=side == "hi": (
        f"__builtin_shuffle({a[0]}, {a[1]}, (pt_i32x{lanes(d)}){{"
        + ", ".join(str(m) for m in interleave_mask(lanes(d), h, hi)) + "})"))
       for side in ("lo", "hi") for h in (1, 2, 4, 8, 16, 32)},
    "sub": lambda a, d, t: f"({a[0]} - {a[1]})",
    "mul": lambda a, d, t: f"({a[0]} * {a[1]})",
    "div": lambda a, d, t: f"({a[0]} / {a[1]})" if _isfloat(d) else f"pt_truncdiv_i({a[0]}, {a[1]})",
    "truncdiv": lambda a, d, t: f"trunc{_sfx(d)}({a[0]} / {a[1]})" if _isfloat(d) else f"pt_truncdiv_i({a[0]}, {a[1]})",
    "floordiv": lambda a, d, t: f"floor{_sfx(d)}({a[0]} / {a[1]})" if _isfloat(d) else f"pt_floordiv_i({a[0]}, {a[1]})",
    "remainder": lambda a, d, t: (f"pt_mod_{'f' if d == 'float32' else 'd'}({a[0]}, {a[1]})" if _isfloat(d)
                                  else f"pt_mod_i({a[0]}, {a[1]})"),
    "fmod": lambda a, d, t: f"fmod{_sfx(d)}({a[0]}, {a[1]})" if _isfloat(d) else f"(({a[1]}) == 0 ? 0 : ({a[0]}) % ({a[1]}))",
    "pow": lambda a, d, t: f"pow{_sfx(d)}({a[0]}, {a[1]})" if _isfloat(d) else f"({CTYPE[d]})pt_pow_i({a[0]}, {a[1]})",
    "atan2": lambda a, d, t: f"atan2{_sfx(d)}({a[0]}, {a[1]})",
    "maximum": lambda a, d, t: (f"({{ {CTYPE[d]} _a = {a[0]}, _b = {a[1]}; (_a != _a || _a > _b) ? _a : _b; }})"
                                if _isfloat(d) else f"({{ {CTYPE[d]} _a = {a[0]}, _b = {a[1]}; _a > _b ? _a : _b; }})"),
    "minimum": lambda a, d, t: (f"({{ {CTYPE[d]} _a = {a[0]}, _b = {a[1]}; (_a != _a || _a < _b) ? _a : _b; }})"
                                if _isfloat(d) else f"({{ {CTYPE[d]} _a = {a[0]}, _b = {a[1]}; _a < _b ? _a : _b; }})"),
    "eq": lambda a, d, t: f"({a[0]} == {a[1]})",
    "ne": lambda a, d, t: f"({a[0]} != {a[1]})",
    "lt": lambda a, d, t: f"({a[0]} < {a[1]})",
    "le": lambda a, d, t: f"({a[0]} <= {a[1]})",
    "gt": lambda a, d, t: f"({a[0]} > {a[1]})",
    "ge": lambda a, d, t: f"({a[0]} >= {a[1]})",
    "logical_and": lambda a, d, t: f"(({a[0]}) && ({a[1]}))",
    "logical_or": lambda a, d, t: f"(({a[0]}) || ({a[1]}))",
    "logical_xor": lambda a, d, t: f"((bool)({a[0]}) != (bool)({a[1]}))",
    "logical_not": lambda a, d, t: f"(!({a[0]}))",
    "bitwise_and": lambda a, d, t: f"({a[0]} & {a[1]})" if d != "bool" else f"({a[0]} && {a[1]})",
    "bitwise_or": lambda a, d, t: f"({a[0]} | {a[1]})" if d != "bool" else f"({a[0]} || {a[1]})",
    "bitwise_xor": lambda a, d, t: f"({a[0]} ^ {a[1]})" if d != "bool" else f"({a[0]} != {a[1]})",
    "bitwise_not": lambda a, d, t: f"(~{a[0]})" if d != "bool" else f"(!{a[0]})",
    "where": lambda a, d, t: f"(({a[0]}) ? ({a[1]}) : ({a[2]}))",
    "identity": lambda a, d, t: a[0],
    "neg": lambda a, d, t: f"(-{a[0]})" if d != "bool" else a[0],
    "abs": lambda a, d, t: f"fabs{_sfx(d)}({a[0]})" if _isfloat(d) else f"({a[0]} < 0 ? -{a[0]} : {a[0]})",
    "relu": lambda a, d, t: f"({{ {CTYPE[d]} _x = {a[0]}; _x < 0 ? 0 : _x; }})",
    "sigmoid": lambda a, d, t: f"(1.0{_sfx(d)} / (1.0{_sfx(d)} + exp{_sfx(d)}(-{a[0]})))",
    "reciprocal": lambda a, d, t: f"(1.0{_sfx(d)} / {a[0]})",
    "rsqrt": lambda a, d, t: f"(1.0{_sfx(d)} / sqrt{_sfx(d)}({a[0]}))",
    "sign": lambda a, d, t: f"({{ {CTYPE[d]} _x = {a[0]}; ({CTYPE[d]})((_x > 0) - (_x < 0)); }})",
    "isnan": lambda a, d, t: f"({a[0]} != {a[0]})",
    "isinf": lambda a, d, t: f"isinf({a[0]})" if _isfloat(t) else "false",
    "round": lambda a, d, t: f"nearbyint{_sfx(d)}({a[0]})" if _isfloat(d) else a[0],
    "floor": lambda a, d, t: f"floor{_sfx(d)}({a[0]})" if _isfloat(d) else a[0],
    "ceil": lambda a, d, t: f"ceil{_sfx(d)}({a[0]})" if _isfloat(d) else a[0],
    "trunc": lambda a, d, t: f"trunc{_sfx(d)}({a[0]})" if _isfloat(d) else a[0],
    "erfinv": lambda a, d, t: f"pt_erfinv_f({a[0]})",
}
for _name in ("exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tan", "tanh", "erf", "asin", "acos",
              "atan", "sinh", "cosh", "exp2", "log2", "log10"):
    OPS[_name] = (lambda f: lambda a, d, t: f(a, d))(_f(_name))
# lanes of a vector where a mask vector is nonzero, zeros elsewhere (bitwise: exact zeros
# whatever the dropped lanes held, inf and NaN included)
OPS["keep_lanes"] = lambda a, d, t: f"pt_keep_f32x{lanes(d)}({a[0]}, {a[1]})"
OPS["pick_lanes"] = lambda a, d, t: f"pt_pick_f32x{lanes(d)}({a[0]}, {a[1]}, {a[2]})"
OPS["pair_bits"] = lambda a, d, t: a[0]  # (the load of a pair already reads a float's bits)
OPS["pair_of"] = lambda a, d, t: f"pt_pair_of_x{lanes(d)}({a[0]}, {a[1]})" if lanes(d) > 1 else f"pt_pair_of({a[0]}, {a[1]})"
OPS["dot2"] = lambda a, d, t: f"pt_dot2_f32x{lanes(d)}({a[0]}, {a[1]}, {a[2]})"
# int8 quads: int32 lanes in float registers (bits), the row operand's quad unsigned (us) or signed (su)
OPS["dot4us"] = lambda a, d, t: f"pt_dot4us_x{lanes(d)}({a[0]}, {a[1]}, {a[2]})"
OPS["dot4su"] = lambda a, d, t: f"pt_dot4su_x{lanes(d)}({a[0]}, {a[1]}, {a[2]})"
OPS["quad_of"] = lambda a, d, t: (f"pt_quad_of_x{lanes(d)}({', '.join(f'(pt_u8x{lanes(d)})({x})' for x in a)})"
                                  if lanes(d) > 1 else f"pt_quad_of({', '.join(f'(uint8_t)({x})' for x in a)})")
OPS["i32_float"] = lambda a, d, t: f"__builtin_convertvector((pt_i32x{lanes(d)})({a[0]}), pt_f32x{lanes(d)})"
OPS["in_register"] = lambda a, d, t: f"PT_REG{lanes(d)}({a[0]})" if lanes(d) in (4, 8, 16) else a[0]
_scalar_exp = OPS["exp"]
OPS["exp"] = lambda a, d, t: f"pt_exp_f32x{lanes(d)}({a[0]})" if lanes(d) > 1 else _scalar_exp(a, d, t)
_scalar_exp2 = OPS["exp2"]
OPS["exp2"] = lambda a, d, t: f"pt_exp2_f32x{lanes(d)}({a[0]})" if lanes(d) > 1 else _scalar_exp2(a, d, t)


def const(v, dt: str) -> str:
    if dt == "bool":
        return "true" if v else "false"
    if dt == "bfloat16":  # its bits, rounded as pt_f32_bf16 rounds
        u = struct.unpack("<I", struct.pack("<f", float(v)))[0]
        bits = 0x7FC0 if (u & 0x7FFFFFFF) > 0x7F800000 else ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
        return f"((uint16_t){bits:#06x})"
    if dt == "float16":
        return f"((_Float16){const(v, 'float32')})"
    if _isfloat(dt):
        v = float(v)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return ("INFINITY" if v > 0 else "(-INFINITY)")
        return f"{v.hex()}{_sfx(dt)}" if v != int(v) or abs(v) > 1e15 else f"{v!r}{_sfx(dt)}"
    v = int(v)
    if dt == "int64":
        return "INT64_MIN" if v == -(2**63) else f"INT64_C({v})"
    return f"(({CTYPE[dt]}){v})"


def expr(e: Expr) -> str:
    if isinstance(e, Const):
        return const(e.value, e.dtype)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Load) and element_type(e.dtype) in GROUPS:  # (indexed in groups)
        at = f"((const {CTYPE[element_type(e.dtype)]}*)({e.buf}))[{expr(e.index)}]"
        return f"(*(const {CTYPE[e.dtype]}*)&{at})" if lanes(e.dtype) > 1 else at
    if isinstance(e, Load):
        if lanes(e.dtype) > 1:
            return f"(*(const {CTYPE[e.dtype]}*)&{e.buf}[{expr(e.index)}])"
        return f"{e.buf}[{expr(e.index)}]"
    if e.fn == "narrow":  # (a rounding the program kept: rendered as the cast it is)
        e = Op("cast", e.args, e.dtype)
    if e.fn == "cast" and lanes(e.dtype) > 1:
        return _vector_cast(e)
    if e.fn == "cast" and _bf16_round_trip(e):
        # a value rounded to bfloat16 and read on as float32 (eager's rounding between ops
        # inside a fused kernel): in 32-bit lanes only, so that gcc vectorizes the loop
        # around it (a 16-bit value in the middle of float lanes, read with a stride, stops it)
        return f"pt_round_bf16({expr(e.args[0].args[0])})"
    if e.fn == "cast":
        (x,) = e.args
        v = f"pt_bf16_f32({expr(x)})" if x.dtype == "bfloat16" else expr(x)
        if e.dtype == "bool":
            return f"(({v}) != 0)"
        if e.dtype == "bfloat16":
            return v if x.dtype == "bfloat16" else f"pt_f32_bf16((float)({v}))"
        return f"(({CTYPE[e.dtype]})({v}))"
    if e.fn in ("maximum", "minimum") and _isfloat(e.dtype) and isinstance(e.args[1], Const) \
            and not math.isnan(float(e.args[1].value)):
        # a clamp by a number (ReLU, ReLU6): a where it is above (below) it or NaN, the number
        # otherwise. gcc 12 vectorizes this form where two of the general one around bfloat16
        # rounding stop it; the general form (below) vectorizes where this one does not (a
        # max-pool's running maximum)
        keep = "<=" if e.fn == "maximum" else ">="
        return f"({{ {CTYPE[e.dtype]} _a = {expr(e.args[0])}; !(_a {keep} {expr(e.args[1])}) ? _a : {expr(e.args[1])}; }})"
    tmpl = OPS.get(e.fn)
    if tmpl is None:
        raise NotImplementedError(f"C renderer has no template for scalar op {e.fn!r}")
    args = [expr(a) for a in e.args]
    if e.fn in _COMPARES and any(_widened_float(a) for a in e.args):
        # gcc 12's vectorizer (AVX-512VL) folds x != (double)(float)x to false: the widened
        # operand goes through an empty asm, which it cannot see through (nor vectorize)
        args = [f"pt_opaque_d({x})" if _widened_float(a) else x for a, x in zip(e.args, args)]
    return tmpl(args, e.dtype, e.args[0].dtype)


def _bf16_round_trip(e: Op) -> bool:
    x = e.args[0]
    return (e.dtype == "float32" and isinstance(x, Op) and x.fn in ("cast", "narrow") and x.dtype == "bfloat16"
            and x.args[0].dtype == "float32")


def _vector_cast(e: Op) -> str:
    """A vector of a half type to float32 or back, of int8/uint8 to float32 (contraction
    operands and temps)."""
    (x,) = e.args
    n, src, dst = lanes(e.dtype), x.dtype.rpartition("x")[0], e.dtype.rpartition("x")[0]
    if (src, dst) == ("bfloat16", "float32"):
        return f"pt_bf16_f32x{n}({expr(x)})"
    if (src, dst) == ("float32", "bfloat16"):
        return f"pt_f32_bf16x{n}({expr(x)})"
    if {src, dst} == {"float16", "float32"} or (src in ("int8", "uint8") and dst == "float32"):
        return f"__builtin_convertvector({expr(x)}, {CTYPE[e.dtype]})"
    raise NotImplementedError(f"C renderer: no vector cast from {x.dtype} to {e.dtype}")


_COMPARES = ("eq", "ne", "lt", "le", "gt", "ge")
FMA_ATTRIBUTE = 'optimize("fp-contract=fast")'  # on kernels whose multiply-adds are fused


def _widened_float(e: Expr) -> bool:
    return isinstance(e, Op) and e.fn == "cast" and e.dtype == "float64" and e.args[0].dtype == "float32"


def _minmax_reduction(f: For):
    """(accumulator, 'max'|'min', value) when loop f only folds a float value into an
    accumulator with maximum/minimum (NaN-propagating): rendered as an OpenMP simd reduction
    with a NaN flag, because gcc vectorizes no NaN-propagating select by itself."""
    if len(f.body) != 1 or not isinstance(f.body[0], Assign) or f.workers:
        return None
    a = f.body[0]
    v = a.value
    if not (isinstance(v, Op) and v.fn in ("maximum", "minimum") and v.dtype in ("float32", "float64")
            and isinstance(v.args[0], Var) and v.args[0].name == a.name):
        return None
    if any(isinstance(x, Var) and x.name == a.name for x in walk_exprs(v.args[1])):
        return None
    return a.name, "max" if v.fn == "maximum" else "min", v.args[1]


def _render_minmax(f: For, red, pad: str) -> list[str]:
    acc, kind, value = red
    cmp = ">" if kind == "max" else "<"
    nan = f"{acc}_nan"
    return [f"{pad}{{ int {nan} = ({acc} != {acc});",
            f"{pad}#pragma omp simd reduction({kind}:{acc}) reduction(|:{nan})",
            f"{pad}for (int64_t {f.var} = {expr(f.lo)}; {f.var} < {expr(f.hi)}; ++{f.var}) {{",
            f"{pad}  {CTYPE[value.dtype]} _v = {expr(value)};",
            f"{pad}  {acc} = {acc} {cmp} _v ? {acc} : _v; {nan} |= (_v != _v);",
            f"{pad}}}",
            f"{pad}if ({nan}) {acc} = NAN; }}"]


_FOLD = {"add": "+", "mul": "*"}


def _fold_reduction(f: For) -> str | None:
    """``reduction(+:a) reduction(*:b)`` when loop f only folds float values into accumulators
    with + or *: OpenMP's simd reduction lets gcc reorder exactly those sums (vector partial
    sums), which it may not do elsewhere (no -fassociative-math: eager's rounding of signed
    zeros and infinities everywhere else)."""
    if f.workers or not f.body or not all(isinstance(a, Assign) for a in f.body):
        return None
    accs = {a.name for a in f.body}
    if len(accs) != len(f.body):
        return None
    clauses = []
    for a in f.body:
        v = a.value
        if not (isinstance(v, Op) and v.fn in _FOLD and v.dtype in ("float32", "float64")
                and isinstance(v.args[0], Var) and v.args[0].name == a.name):
            return None
        if any(isinstance(x, Var) and x.name in accs for x in walk_exprs(v.args[1])):
            return None
        clauses.append(f"reduction({_FOLD[v.fn]}:{a.name})")
    return " ".join(clauses)


def stmts(body: tuple[Stmt, ...], ind: int) -> list[str]:
    pad = "  " * ind
    out: list[str] = []
    for s in body:
        red = _minmax_reduction(s) if isinstance(s, For) else None
        if red is not None:
            out += _render_minmax(s, red, pad)
        elif isinstance(s, For):
            if s.workers:
                coll = f" collapse({s.workers})" if s.workers > 1 else ""
                cond = f" if({expr(s.workers_if)})" if s.workers_if is not None else ""
                red = "".join(f" reduction(+:{a}[0:{n}])" for a, n in s.reduce_arrays)
                out.append(f"{pad}#pragma omp parallel for{coll}{cond}{red} num_threads(pt_nthreads) schedule(static)")
            elif (fold := _fold_reduction(s)) is not None:
                out.append(f"{pad}#pragma omp simd {fold}")
            out.append(f"{pad}for (int64_t {s.var} = {expr(s.lo)}; {s.var} < {expr(s.hi)}; ++{s.var}) {{")
            out += stmts(s.body, ind + 1)
            out.append(pad + "}")
        elif isinstance(s, Store) and lanes(s.value.dtype) > 1:
            out.append(f"{pad}*({CTYPE[s.value.dtype]}*)&{s.buf}[{expr(s.index)}] = {expr(s.value)};")
        elif isinstance(s, Store):
            out.append(f"{pad}{s.buf}[{expr(s.index)}] = {expr(s.value)};")
        elif isinstance(s, Let):
            out.append(f"{pad}{CTYPE[s.dtype]} {s.name} = {expr(s.value)};")
        elif isinstance(s, Assign):
            out.append(f"{pad}{s.name} = {expr(s.value)};")
        elif isinstance(s, If):
            out.append(f"{pad}if ({expr(s.cond)}) {{")
            out += stmts(s.then, ind + 1)
            if s.orelse:
                out.append(pad + "} else {")
                out += stmts(s.orelse, ind + 1)
            out.append(pad + "}")
        elif isinstance(s, Fail):
            out.append(f"{pad}__atomic_store_n(pt_err, {s.code}, __ATOMIC_RELAXED);")
        elif isinstance(s, Alloc):
            out.append(f"{pad}{CTYPE[s.dtype]} {s.name}[{max(s.size, 1)}] __attribute__((aligned(64)));")
        elif isinstance(s, Prefetch):
            out.append(f"{pad}__builtin_prefetch(&{s.buf}[{expr(s.index)}], {int(s.write)}, {s.locality});")
        else:  # pragma: no cover
            raise TypeError(s)
    return out


UNIT_MARK = "/* ==== translation unit ==== */\n"


def render(p: Program, offsets: dict[str, int], entry: str = "pt_entry", units: int = 1,
           profile: bool = False, refresh: str = "pt_refresh", dynamic: tuple[str, ...] = ()) -> list[str]:
    """C sources for the program: kernels spread over ``units`` translation units (compiled in
    parallel), the entry points ``int entry(void **args, int nthreads)`` (every kernel but the
    cached ones) and ``refresh`` (the cached ones) in the last one; args are the inputs, the
    outputs, the arena, the cache (``MemoryPlan``), then, with symbolic sizes, an array of the
    sizes' values (``Program.symbols``, in that order); the temporaries named in ``dynamic`` (sized by them) are
    allocated per call. Kernels that differ only in the buffers they
    touch share one function. With ``profile``, every call is timed into the exported arrays
    ``pt_prof_ns`` / ``pt_prof_calls`` (one slot per call site, named by ``pt_prof_names``)."""
    bufs = {b.name: b for b in p.buffers}
    funcs: dict = {}  # (canonical body, param types) -> function name
    bodies: list[tuple[str, list[str]]] = []  # (prototype, lines)
    calls = []
    for k in p.kernels:
        shape, order = structure_key(k.body)
        _, writes = buffers_used(k)
        types = tuple((bufs[n].dtype, n in writes) for n in order)
        fma = k.contraction or k.origin.startswith("attention")
        sizes = kernel_size_params(k) if p.symbols else []
        key = (shape, types, fma)
        fname = funcs.get(key)
        if fname is None:
            fname = funcs[key] = k.name
            canon = rename_buffers(k.body, {n: f"b{i}" for i, n in enumerate(order)})
            params = ", ".join([f"{'' if w else 'const '}{CTYPE[dt]}* restrict b{i}" for i, (dt, w) in enumerate(types)]
                               + [f"int64_t {v}" for v in sizes])
            # contractions (and attention) multiply-add with one rounding, as eager's GEMM and
            # convolution kernels do; everywhere else a * b + c rounds twice, as eager's
            # separate elementwise kernels do (the C flags turn contraction off)
            attrs = "visibility(\"hidden\")" + (", " + FMA_ATTRIBUTE if fma else "")
            # loops over 16-bit elements: gcc sizes their vectors by the 16-bit type (32 lanes
            # in 512 bits), and the short loops of a tile (a pool's 28-column strips) then never
            # reach the vector body; PT_HALF_VECTORS halves that (see the prelude)
            half = "PT_HALF_VECTORS " if not fma and any(dt in ("bfloat16", "float16") for dt, _ in types) else ""
            proto = (f"__attribute__(({attrs})) {half}void {fname}"
                     f"(int pt_nthreads, int* pt_err{', ' if params else ''}{params})")
            bodies.append((proto, [f"/* {k.origin} */", proto + " {", *stmts(canon, 1), "}\n"]))
        call = f"{fname}(nthreads, &err{''.join(', ' + n for n in order + sizes)});"
        if profile:
            slot = len(calls)
            call = (f"{{ double pt_t0 = pt_now(); {call} pt_prof_ns[{slot}] += pt_now() - pt_t0; "
                    f"pt_prof_calls[{slot}] += 1; }}")
        calls.append(f"  {call}  /* {k.origin} */")
    units = max(1, min(units, len(bodies)))
    # balance units by generated lines
    parts: list[list[str]] = [[] for _ in range(units)]
    sizes = [0] * units
    for _, lines in sorted(bodies, key=lambda b: -len(b[1])):
        i = sizes.index(min(sizes))
        parts[i] += lines
        sizes[i] += len(lines)
    ins = sorted((b for b in p.buffers if b.kind == "input"), key=lambda b: b.index)
    outs = sorted((b for b in p.buffers if b.kind == "output"), key=lambda b: b.index)
    ent = [PRELUDE] + [proto + ";" for proto, _ in bodies] + [""]
    if profile:
        names = ", ".join('"' + (k.name + ": " + k.origin).replace("\\", "/").replace('"', "'") + '"'
                          for k in p.kernels)
        n = max(1, len(p.kernels))
        ent += ["#include <time.h>",
                "static double pt_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); "
                "return t.tv_sec * 1e9 + t.tv_nsec; }",
                f"int pt_prof_count = {len(p.kernels)};",
                f"double pt_prof_ns[{n}];", f"long long pt_prof_calls[{n}];",
                f"const char* pt_prof_names[{n}] = {{{names}}};", ""]
    head = []
    if dynamic:
        ent.append("#include <stdlib.h>")
    for pos, b in enumerate(ins + outs):
        head.append(f"  {CTYPE[b.dtype]}* {b.name} = ({CTYPE[b.dtype]}*)args[{pos}];")
    head.append(f"  char* arena = (char*)args[{len(ins) + len(outs)}];")
    head.append(f"  char* cache = (char*)args[{len(ins) + len(outs) + 1}];")
    symbols = p.symbols
    if symbols:
        head.append(f"  const int64_t* pt_sizes = (const int64_t*)args[{len(ins) + len(outs) + 2}];")
        head += [f"  int64_t {SIZE_PREFIX}{n} = pt_sizes[{k}];" for k, n in enumerate(symbols)]
    tail = []
    for b in p.buffers:
        if b.name in dynamic:  # sized by the call's sizes: its own allocation
            nbytes = f"(size_t)({expr(size_expr(b.size))}) * sizeof({CTYPE[b.dtype]})"
            head.append(f"  {CTYPE[b.dtype]}* {b.name} = ({CTYPE[b.dtype]}*)malloc({nbytes} + 64);")
            head.append(f"  if (!{b.name}) err = 2;")
            tail.append(f"  free({b.name});")
        elif b.kind in ("temp", "cache"):
            base = "arena" if b.kind == "temp" else "cache"
            head.append(f"  {CTYPE[b.dtype]}* {b.name} = ({CTYPE[b.dtype]}*)({base} + {offsets[b.name]});")
    head += ["  (void)arena; (void)cache;"]
    run, end = (["  if (!err) {"], ["  }"]) if tail else ([], [])
    # the cached kernels (``cache_static``) in a function of their own, which the runtime calls
    # only when the parameters they read have changed
    for fn, cached in ((entry, False), (refresh, True)):
        ent += [f"int {fn}(void** args, int nthreads) {{", "  int err = 0;", *head, *run,
                *[call for call, k in zip(calls, p.kernels) if k.cached == cached], *end, *tail, "  return err;",
                "}", ""]
    srcs = ["\n".join([PRELUDE, *part]) + "\n" for part in parts if part]
    return srcs + ["\n".join(ent) + "\n"]
