"""Tile sizes of the CPU attention nest (``attention.lower_attention``) from the machine
description: the cost model's part, kept apart from the construction of the nest."""
from __future__ import annotations

from .machine import CPUMachine


def _pow2_at_most(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def tile_sizes(t: CPUMachine, L: int, S: int, D: int, Dv: int, tasks_outside: int, threads: int) -> dict:
    """BR, BC, register rows RQ (scores) and RV (output), lanes VW, padded Dv."""
    vw = t.lanes(4)
    dvp = -(-Dv // vw) * vw
    bc = (t.l1d_bytes * 4 // 3) // ((D + dvp) * 4) // vw * vw
    bc = max(vw, min(4 * vw, bc, -(-S // vw) * vw))
    nq, nv = bc // vw, dvp // vw
    rq = min(4, _pow2_at_most(max(1, (t.vector_registers - nq - 2) // nq)))
    rv = min(4, _pow2_at_most(max(1, (t.vector_registers - nv - 2) // nv)))
    step = max(rq, rv)
    br = 64
    while br > step and br * (D + bc + dvp) * 4 > t.l2_bytes // 4:
        br //= 2
    br = min(br, -(-L // step) * step)
    while br > step and tasks_outside * -(-L // br) < 2 * threads:
        br //= 2
    br = max(step, br // step * step)
    # balance the row tiles: L = 197 in tiles of 52, not 64 + 64 + 64 + 5
    tiles = -(-L // br)
    br = max(step, -(-(-(-L // tiles)) // step) * step)
    return {"BR": br, "BC": bc, "RQ": rq, "RV": rv, "VW": vw, "DVP": dvp}


COLS_MIN_ROWS = 32  # from this many query rows the score tile is held key-major (see cols_tile_sizes)


def cols_tile_sizes(t: CPUMachine, L: int, S: int, D: int, Dv: int, tasks_outside: int, threads: int) -> dict:
    """The key-major form: BR query rows (a multiple of the lanes: queries run along the
    vectors), BC keys, RK key rows of the score register tile, RV query rows of the output one."""
    ts = tile_sizes(t, L, S, D, Dv, tasks_outside, threads)
    vw = ts["VW"]
    # up to 4 query vectors; the fewest padded rows, weighted by how much slower the narrower
    # register tiles are
    slower = {1: 1.4, 2: 1.05, 3: 1.02, 4: 1.0}
    br = min((k * vw for k in range(4, 0, -1)), key=lambda b: -(-L // b) * b * slower[b // vw])
    while br > vw and tasks_outside * -(-L // br) < 2 * threads:
        br -= vw
    nq = br // vw
    rk = min(8, _pow2_at_most(max(1, (t.vector_registers - nq - 1) // nq)))
    return {**ts, "BR": br, "RK": min(rk, ts["BC"]), "RV": min(ts["RV"], br)}


PV_CHUNK = 4  # vectors of V's columns per output register tile


def _pv_chunks(nv: int, rv: int, br: int, regs: int) -> list[tuple[int, int, int]]:
    """(first vector, vectors, rows) of each register tile pass of o += p . V over V's DVP
    columns: with more than PV_CHUNK vectors (Dv = 128: eight) the columns go in chunks of
    PV_CHUNK, each a loop over all the row groups, so the chunk of the V tile (BC x 64 floats)
    stays in L1 while the rows pass over it, and the tile has more rows than 2 x 8 vectors
    (unchunked: one V load per broadcast, the V tile from L2 for every pair of rows)."""
    if nv <= PV_CHUNK:
        return [(0, nv, rv)]
    out = []
    for c0 in range(0, nv, PV_CHUNK):
        k = min(PV_CHUNK, nv - c0)
        rows = min(4, _pow2_at_most(max(1, (regs - k - 2) // k)))
        while br % rows:
            rows //= 2
        out.append((c0, k, max(rows, 1)))
    return out
