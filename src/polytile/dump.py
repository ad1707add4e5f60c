"""Numbered dumps of every stage (graph IR, affine IR after each pass, generated C)."""
from __future__ import annotations

import itertools
import os

_graph_ids = itertools.count()


class Dumper:
    def __init__(self, root: str, name: str):
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self._n = itertools.count()

    def write(self, stage: str, text: str) -> str:
        path = os.path.join(self.dir, f"{next(self._n):02d}_{stage}")
        with open(path, "w") as f:
            f.write(text)
        return path


def next_graph_name() -> str:
    return f"graph{next(_graph_ids)}"


def dumper_for(dump_dir: str | None, name: str) -> Dumper | None:
    return Dumper(dump_dir, name) if dump_dir else None
