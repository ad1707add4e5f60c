"""Element types of the IR (frontend-neutral names) and their properties."""
from __future__ import annotations

LOW = ("bfloat16", "float16")  # storage types: computed in float32, rounded where eager rounds
FLOATS = ("float32", "float64") + LOW
INTS = ("int64", "int32", "int16", "int8", "uint8")
ALL = FLOATS + INTS + ("bool",)

ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
            "uint8": 1, "bool": 1,
            # (groups of bfloat16 or 8-bit elements read as one 32-bit element: affine.ir.GROUPS,
            # inside contractions only)
            "bf16pair": 4, "u8quad": 4, "i8quad": 4}


def is_float(dt: str) -> bool:
    return dt in FLOATS


def is_int(dt: str) -> bool:
    return dt in INTS


def promote(a: str, b: str) -> str:
    """Promotion between two tensor dtypes (PyTorch's lattice restricted to our types)."""
    if a == b:
        return a
    if a == "uint8" and b == "int8" or a == "int8" and b == "uint8":
        return "int16"
    if {a, b} == set(LOW):
        return "float32"
    low = next((x for x in (a, b) if x in LOW), None)
    if low is not None:  # with an integer or bool: the half type; with a wider float: that one
        other = b if a == low else a
        return other if other in ("float32", "float64") else low
    order = ["bool", "uint8", "int8", "int16", "int32", "int64", "float32", "float64"]
    return order[max(order.index(a), order.index(b))]


def from_torch(dt) -> str:
    import torch

    table = {
        torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16",
        torch.int64: "int64",
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
