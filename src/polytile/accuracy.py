"""The accuracy rule of DESIGN.md section 4 (PyTorch's ``torch._dynamo.utils.same``).

A floating-point result must first have its NaNs and infinities (with their signs) exactly where
eager has them: an RMSE over a tensor holding a NaN is NaN and would hide every other element.
Over the remaining (finite) elements it passes if ``allclose(compiled, eager, atol=rtol=tol)``.
Otherwise it is compared with a float64 reference over the same elements: it passes if

    RMSE(compiled, fp64) <= m * RMSE(eager, fp64) + tol / 10

with m = 2 for float32 and m = 3 for float16/bfloat16 and for tiny tensors (fewer than 1000
elements, or a 4-d tensor whose last two dims are 1, as in ``same``). Integer and boolean
results must match exactly. Outputs may be nested: tensors, tuples/lists, dicts, HF
``ModelOutput`` (a dict subclass), python scalars and None.

Used by the tests and by the model benchmark suite.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, Callable

import torch

__all__ = ["check_accuracy", "assert_accurate", "fp64_reference", "rmse"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """Root mean squared error, computed in float64."""
    d = a.detach().to(torch.float64) - b.detach().to(torch.float64)
    if d.numel() == 0:
        return 0.0
    return float(torch.sqrt(torch.mean(d * d)))


def _multiplier(ref: torch.Tensor, res: torch.Tensor) -> float:
    if res.dtype in _LOW_PRECISION:
        return 3.0
    if ref.numel() < 1000 or (ref.dim() == 4 and ref.shape[-1] == ref.shape[-2] == 1):
        return 3.0  # tiny tensors: noise dominates the error metric
    return 2.0


def _items(x: Any) -> dict | None:
    """Key -> value view of a mapping (HF ModelOutput included), else None."""
    if isinstance(x, Mapping):
        return {k: x[k] for k in x.keys()}
    return None


class _Lazy:
    """The fp64 reference, computed at most once and only when some leaf needs it."""

    def __init__(self, value: Any):
        self._value = value
        self._done = not callable(value)

    def get(self) -> Any:
        if not self._done:
            self._value = self._value()
            self._done = True
        return self._value


def _sub(ref64: Any, key) -> Any:
    if ref64 is None:
        return None
    items = _items(ref64)
    if items is not None:
        return items.get(key)
    if isinstance(ref64, (list, tuple)):
        return ref64[key] if key < len(ref64) else None
    return None


def _compare(res: Any, ref: Any, fp64: Callable[[], Any], tol: float, path: str, details: list[str]) -> bool:
    ref_items, res_items = _items(ref), _items(res)
    if ref_items is not None:
        if res_items is None:
            details.append(f"{path}: expected a mapping ({type(ref).__name__}), got {type(res).__name__}")
            return False
        if set(ref_items) != set(res_items):
            details.append(f"{path}: keys differ: compiled {sorted(res_items)} vs eager {sorted(ref_items)}")
            return False
        ok = True
        for k in ref_items:
            ok &= _compare(res_items[k], ref_items[k], lambda k=k: _sub(fp64(), k), tol, f"{path}[{k!r}]", details)
        return ok
    if isinstance(ref, (list, tuple)):
        if not isinstance(res, (list, tuple)):
            details.append(f"{path}: expected a sequence, got {type(res).__name__}")
            return False
        if len(res) != len(ref):
            details.append(f"{path}: length {len(res)} vs eager {len(ref)}")
            return False
        ok = True
        for k, (a, b) in enumerate(zip(res, ref)):
            ok &= _compare(a, b, lambda k=k: _sub(fp64(), k), tol, f"{path}[{k}]", details)
        return ok
    if isinstance(ref, torch.Tensor):
        return _compare_tensor(res, ref, fp64, tol, path, details)
    if isinstance(ref, float) and isinstance(res, (float, int)):
        if math.isclose(res, ref, rel_tol=tol, abs_tol=tol) or (math.isnan(ref) and math.isnan(res)):
            return True
        details.append(f"{path}: {res!r} vs eager {ref!r}")
        return False
    if res != ref or type(res) is not type(ref):
        details.append(f"{path}: {res!r} vs eager {ref!r}")
        return False
    return True


def _compare_tensor(res: Any, ref: torch.Tensor, fp64: Callable[[], Any], tol: float, path: str,
                    details: list[str]) -> bool:
    if not isinstance(res, torch.Tensor):
        details.append(f"{path}: expected a tensor, got {type(res).__name__}")
        return False
    if res.dtype != ref.dtype:
        details.append(f"{path}: dtype {res.dtype} vs eager {ref.dtype}")
        return False
    if res.shape != ref.shape:
        details.append(f"{path}: shape {list(res.shape)} vs eager {list(ref.shape)}")
        return False
    res, ref = res.detach(), ref.detach()
    if ref.layout != res.layout:
        details.append(f"{path}: layout {res.layout} vs eager {ref.layout}")
        return False
    if ref.layout != torch.strided:  # sparse results: their values, densely
        res, ref = res.to_dense(), ref.to_dense()
    if not (ref.is_floating_point() or ref.is_complex()):
        if torch.equal(res, ref):
            return True
        bad = int((res != ref).sum())
        details.append(f"{path}: {bad} of {ref.numel()} elements differ (exact match required for {ref.dtype})")
        return False
    if ref.is_complex():
        res, ref = torch.view_as_real(res.resolve_conj()), torch.view_as_real(ref.resolve_conj())
    if not _special_values_match(res, ref, path, details):
        return False
    finite = torch.isfinite(ref)
    if torch.allclose(res[finite], ref[finite], atol=tol, rtol=tol):
        return True
    ref64 = fp64()
    maxdiff = float((res[finite].to(torch.float64) - ref[finite].to(torch.float64)).abs().max())
    if not isinstance(ref64, torch.Tensor):
        details.append(f"{path}: not allclose (max abs diff {maxdiff:.3g}, tol {tol}) and no fp64 reference")
        return False
    if ref64.layout != torch.strided:
        ref64 = ref64.to_dense()
    if ref64.is_complex():
        ref64 = torch.view_as_real(ref64.resolve_conj())
    if ref64.shape != ref.shape:
        details.append(f"{path}: fp64 reference has shape {list(ref64.shape)}")
        return False
    # where the fp64 reference itself is not finite, eager's rounding decides (already compared)
    keep = finite & torch.isfinite(ref64)
    res_err, ref_err = rmse(res[keep], ref64[keep]), rmse(ref[keep], ref64[keep])
    m = _multiplier(ref, res)
    if res_err <= m * ref_err + tol / 10:
        return True
    details.append(
        f"{path}: RMSE(compiled, fp64)={res_err:.3g} > {m:g} * RMSE(eager, fp64)={ref_err:.3g} + tol/10 "
        f"(tol {tol}, max abs diff vs eager {maxdiff:.3g}, shape {list(ref.shape)})")
    return False


def _special_values_match(res: torch.Tensor, ref: torch.Tensor, path: str, details: list[str]) -> bool:
    """NaN positions, and infinity positions with their signs, equal to eager's."""
    bad = torch.isnan(res) != torch.isnan(ref)
    bad |= torch.isposinf(res) != torch.isposinf(ref)
    bad |= torch.isneginf(res) != torch.isneginf(ref)
    if not bool(bad.any()):
        return True
    k = int(bad.nonzero()[0].tolist()[0]) if bad.dim() == 1 else tuple(bad.nonzero()[0].tolist())
    details.append(f"{path}: {int(bad.sum())} of {ref.numel()} elements are NaN or infinite where eager's are "
                   f"not (or the reverse), first at {k}: compiled {res[k].item()} vs eager {ref[k].item()}")
    return False


def check_accuracy(compiled_out: Any, eager_out: Any, fp64_out: Any, tol: float) -> tuple[bool, list[str]]:
    """The DESIGN.md accuracy rule over (possibly nested) outputs.

    ``fp64_out`` is the float64 reference with the same structure, or a zero-argument callable
    producing it (only called when some floating-point leaf is not allclose), or None (then a
    leaf that is not allclose fails). Returns ``(ok, details)``; ``details`` lists every
    failing leaf with its path and the numbers that decided it.
    """
    lazy = _Lazy(fp64_out)
    details: list[str] = []
    ok = _compare(compiled_out, eager_out, lazy.get, tol, "out", details)
    return ok, details


def assert_accurate(compiled_out: Any, eager_out: Any, fp64_out: Any, tol: float) -> None:
    ok, details = check_accuracy(compiled_out, eager_out, fp64_out, tol)
    assert ok, "accuracy check failed:\n  " + "\n  ".join(details)


def _to64(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64) if x.is_floating_point() else x
    if isinstance(x, tuple):
        return tuple(_to64(v) for v in x)
    if isinstance(x, list):
        return [_to64(v) for v in x]
    if isinstance(x, Mapping):
        return {k: _to64(v) for k, v in x.items()}
    return x


def fp64_reference(model: Callable, inputs: Any) -> Any:
    """Run a float64 deep copy of ``model`` on ``inputs`` cast to float64 where floating point.

    ``inputs``: a tuple/list of positional arguments, a dict of keyword arguments, or a single
    tensor. The model itself is not modified. Runs under ``torch.no_grad()``.
    """
    m = copy.deepcopy(model)
    if isinstance(m, torch.nn.Module):
        m = m.to(torch.float64)
    with torch.no_grad():
        if isinstance(inputs, Mapping):
            return m(**_to64(dict(inputs)))
        if isinstance(inputs, (tuple, list)):
            return m(*_to64(tuple(inputs)))
        return m(_to64(inputs))


def matching_gradients(res: dict, ref: dict) -> tuple[dict, dict]:
    """Gradient dicts (parameter name -> gradient) without the parameters that one side left
    with no gradient and the other gave an all-zero one: a parameter outside the loss has
    none in eager (autograd never reaches it), while a compiled graph that also returns the
    unused output gives it zeros (AOTAutograd's gradient of an output no one differentiated).
    Any other difference in the keys stays, and fails the comparison."""
    def zero(g) -> bool:
        return g is not None and not bool(g.any())

    drop = {k for k in set(res) ^ set(ref) if zero(res.get(k)) or zero(ref.get(k))}
    return ({k: v for k, v in res.items() if k not in drop}, {k: v for k, v in ref.items() if k not in drop})
