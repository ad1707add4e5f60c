"""The seam between the target-neutral compiler and the code generators of each kind of chip.

``compiler.compile_graph_ir`` runs the same steps for every target: graph passes (attention
fusion), affine construction (``affine.build``), the shared pass prefix of
``transform.pipeline.SHARED_PASSES`` (dead code, fusion), and then hands the program to a
``Backend``, which owns everything that depends on the chip:

- ``machine``: its machine description (cache sizes, vector width, ... for a CPU), from the
  detected hardware and ``Options.machine``;
- ``op_lowerings``: affine lowerings of graph ops whose loop structure is chosen for the
  target (the CPU builds attention as a tiled online-softmax nest sized from its caches);
- ``passes``: its scheduling passes, run after the shared prefix (register tiling, packing,
  parallel loops for the CPU);
- ``emit``: rendering, building and loading: a callable graph with the interface of
  ``runtime.loader.NativeGraph`` (``check``, ``run``, specs), which the frontends call.

Graph IR, affine construction and the shared passes import nothing from here. A backend is
picked by ``Options.target`` (a name in ``BACKENDS``) or, by default, by the device of the
graph's inputs.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..dtypes import Unsupported

Pass = tuple[str, Callable[[Any], Any]]  # (name, Program -> Program)


class Backend(ABC):
    name: str = ""
    device: str = ""  # the torch device type whose tensors its compiled graphs take

    def accepts(self, device: str) -> bool:
        """Whether its compiled graphs take tensors of this torch device type."""
        return device == self.device

    @abstractmethod
    def machine(self, overrides: Mapping[str, Any] | None) -> Any:
        """The machine description the cost models read: detected, with ``overrides`` applied."""

    def op_lowerings(self, machine: Any, options: Any) -> Mapping[str, Callable]:
        """Graph op name -> ``fn(builder, node)`` that emits the op's nests (``affine.build``)."""
        return {}

    def graph_passes(self, machine: Any, options: Any) -> list[Callable[[Any], Any]]:
        """Graph rewrites (Graph -> Graph) the target's options ask for, before affine construction."""
        return []

    @abstractmethod
    def passes(self, machine: Any, options: Any) -> list[Pass]:
        """The scheduling passes after the shared prefix, in order."""

    def symbolic_passes(self, machine: Any, options: Any) -> list[Pass]:
        """The scheduling passes for a program with symbolic sizes (``graph.symbols``), after
        the shared prefix for such programs; Unsupported where the backend has none (the
        frontend then compiles one version per size)."""
        raise Unsupported(f"the {self.name} backend does not compile symbolic sizes")

    @abstractmethod
    def emit(self, prog: Any, request: "EmitRequest") -> Any:
        """Render, build and load ``prog``: the compiled graph the frontends call."""


@dataclass(frozen=True)
class EmitRequest:
    """What ``Backend.emit`` needs besides the program."""

    input_specs: list      # runtime.loader.TensorSpec per graph input
    output_specs: list     # ... per graph output
    options: Any           # polytile.options.Options
    machine: Any           # the backend's machine description
    name: str              # for messages
    input_labels: list | None = None
    dumper: Any = None     # dump.Dumper when Options.dump_dir is set


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def select(target: str | None, device: str = "cpu") -> Backend:
    """The backend named ``target``, or the one for ``device`` when ``target`` is None.
    Unsupported (the graph then runs through ATen) when there is none or they disagree."""
    _load_builtin()
    if target is None:
        for b in BACKENDS.values():
            if b.device == device:
                return b
        raise Unsupported(f"polytile has no backend for {device} tensors (backends: {sorted(BACKENDS)})")
    if target not in BACKENDS:
        raise ValueError(f"polytile: unknown target {target!r}; targets are {sorted(BACKENDS)}")
    b = BACKENDS[target]
    if not b.accepts(device):
        raise Unsupported(f"target {target!r} runs on {b.device} tensors, the graph's inputs are on {device}")
    return b


def _load_builtin() -> None:
    if "cpu" not in BACKENDS:
        from .cpu import CPUBackend

        register(CPUBackend())
    if "gpu" not in BACKENDS:
        from .gpu import GPUBackend

        register(GPUBackend())
