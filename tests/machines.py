"""Machine descriptions for the tests (``polytile.backends.cpu.machine.PRESETS``).

A test that asserts the structure of generated code (tile sizes, packing, loop order) names
the machine it asserts it for, ``pinned()``, so that it asserts the same thing on every host.
Numerical tests run for ``NUMERIC``: every description is compiled and run on whatever host
runs the tests (code for wider vectors than the host has still runs: the C compiler splits
the vectors) and compared against eager."""
PINNED = "zen4"  # AVX-512, 32 vector registers, 32 KiB L1d, 1 MiB L2, 2 cores
NUMERIC = ("zen4", "xeon-avx512", "zen3", "sse", "neon")  # 64-, 32- and 16-byte vectors; 16 and 32 registers


def pinned(**fields) -> dict:
    """``Options.machine`` for the pinned machine with ``fields`` changed."""
    return {"preset": PINNED, **fields}
