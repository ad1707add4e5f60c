"""Element types of the IR (frontend-neutral names) and their properties."""
from __future__ import annotations

FLOATS = ("float32", "float64")
INTS = ("int64", "int32", "int16", "int8", "uint8")
ALL = FLOATS + INTS + ("bool",)

ITEMSIZE = {"float32": 4, "float64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def is_float(dt: str) -> bool:
    return dt in FLOATS


def is_int(dt: str) -> bool:
    return dt in INTS


def promote(a: str, b: str) -> str:
    """Promotion between two tensor dtypes (PyTorch's lattice restricted to our types)."""
    if a == b:
        return a
    order = ["bool", "uint8", "int8", "int16", "int32", "int64", "float32", "float64"]
    if a == "uint8" and b == "int8" or a == "int8" and b == "uint8":
        return "int16"
    return order[max(order.index(a), order.index(b))]


def from_torch(dt) -> str:
    import torch

    table = {
        torch.float32: "float32", torch.float64: "float64", torch.int64: "int64",
        torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
        torch.bool: "bool",
    }
    if dt not in table:
        raise Unsupported(f"dtype {dt} is not supported by polytile yet")
    return table[dt]


def to_torch(dt: str):
    import torch

    return getattr(torch, dt)


class Unsupported(Exception):
    """Raised when something has no lowering; the frontend turns it into a fallback."""
