"""Notice, at every call and cheaply, when a module's weights stop being where a graph read them.

A CUDA graph records the addresses of the parameters and buffers it reads. So a graph stays
valid exactly as long as every tensor of the module still lives at the address it had at
capture time. We check that on every graphed call instead of trusting call sites
(``.to()``, ``half()``, ``load_state_dict(assign=True)``, a quantizer, a user's
``param.data = ...``): whatever path moved a tensor, its ``data_ptr`` changed.

Three signals, cheapest first:

1. A process-wide generation counter bumped by PyTorch's global parameter/buffer/submodule
   registration hooks: the module's *set* of tensors may have changed (a submodule or
   parameter was assigned), so the tensor list is collected again and compared.
2. The ``data_ptr`` of every tensor, compared with the one recorded (a C++ loop where
   PyTorch's CUDA build provides it, otherwise one ``map`` over the list): device moves,
   dtype changes and replaced storage. ``Module._apply`` (``.to()``, ``half()``) gives
   parameters new storage and replaces buffer objects in the same pass, so a moved
   parameter is also how replaced buffers are noticed; the list is then collected anew.
3. The autograd version counter of two sentinel tensors (first and last): in-place weight
   updates such as ``load_weights`` (``load_state_dict`` copies into every tensor, so the
   sentinels see it). An in-place update keeps addresses, so replaying would in fact read the
   new weights; we still drop the graphs, because new weights are a new model and the rule
   "weights changed -> recapture" is simpler to reason about than "usually still valid".
"""
from __future__ import annotations

import dataclasses
import operator
import threading
from dataclasses import dataclass

import torch
from torch import nn

_generation = [0]
_hooks_lock = threading.Lock()
_hooks_installed = False
_cpp_ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
_data_ptr = torch.Tensor.data_ptr
_version = operator.attrgetter("_version")


def _bump(*_args) -> None:
    _generation[0] += 1


def _install_hooks() -> None:
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        from torch.nn.modules import module as module_mod

        for name in ("register_module_parameter_registration_hook", "register_module_buffer_registration_hook",
                     "register_module_module_registration_hook"):
            register = getattr(module_mod, name, None)
            if register is not None:
                register(_bump)
        _hooks_installed = True


def ptrs_equal(tensors: list[torch.Tensor], ptrs: list[int], indices: list[int]) -> bool:
    if _cpp_ptrs_equal is not None:
        try:
            return bool(_cpp_ptrs_equal(tensors, ptrs, indices))
        except (TypeError, RuntimeError):
            pass
    return list(map(_data_ptr, tensors)) == ptrs


@dataclass(frozen=True)
class WeightSnapshot:
    """What :meth:`WeightWatch.snapshot` recorded of the watched weights (compared by ``changes``,
    kept by ``commit``)."""

    generation: int
    tensors: list[torch.Tensor]
    ids: list[int]
    ptrs: list[int]
    indices: list[int]
    sentinels: list[torch.Tensor]
    versions: list[int]
    pins: tuple[torch.Tensor, ...] = ()  # views keeping the recorded storages alive (see WeightWatch)


class WeightWatch:
    """Tracks the parameters and floating buffers of ``module``.

    While graphs exist, the runner has it *pin* the storages it recorded (:meth:`pin`: a
    ``detach()`` view of each tensor) until the state is replaced. So a graph replayed after
    the weights moved still reads live memory holding the old values, never freed or reused
    memory; that is what lets the runner check after launching a replay (overlapping the check
    with the device's work) and throw a stale result away. The cost: after a move, the old
    weights stay allocated until the next check (or ``release_graphs()``).

    Not thread-safe by itself: :meth:`changes` and :meth:`commit` are called under the runner's
    lock; :meth:`unchanged` may be called from any thread.
    """

    def __init__(self, module: nn.Module) -> None:
        _install_hooks()
        self.module = module
        self.state = self.snapshot()

    def snapshot(self) -> WeightSnapshot:
        generation = _generation[0]  # read first: a registration during collection is seen next time
        # integer buffers (BatchNorm's num_batches_tracked) are not read by an eval forward and
        # only ever move together with the floating tensors; skipping them saves a sixth of the check
        tensors = list(self.module.parameters()) + [b for b in self.module.buffers() if b.is_floating_point()]
        # inference tensors (a model built under torch.inference_mode) have no version counter
        sentinels = [t for t in (tensors[:1] + tensors[-1:]) if not t.is_inference()]
        return WeightSnapshot(generation, tensors, [id(t) for t in tensors], list(map(_data_ptr, tensors)),
                         list(range(len(tensors))), sentinels, list(map(_version, sentinels)))

    def unchanged(self) -> bool:
        """True if every tracked tensor is where (and as) it was recorded: the per-call check."""
        s = self.state
        return (_generation[0] == s.generation and ptrs_equal(s.tensors, s.ptrs, s.indices)
                and list(map(_version, s.sentinels)) == s.versions)

    def changes(self) -> tuple[str | None, WeightSnapshot | None]:
        """(why the graphs are stale or None, the state to :meth:`commit`, or None if nothing changed)."""
        if self.unchanged():
            return None, None
        old, new = self.state, self.snapshot()
        if new.ptrs != old.ptrs:
            return "parameters or buffers moved (device or dtype change, or replaced storage)", new
        if list(map(_version, old.sentinels)) != old.versions:
            return "weights were modified in place (e.g. load_weights or load_state_dict)", new
        if new.ids != old.ids:
            return "parameters, buffers or submodules of the network were replaced", new
        return None, new  # a module registration elsewhere in the process; this network is unchanged

    def commit(self, state: WeightSnapshot) -> None:
        self.state = state

    def pin(self) -> None:
        """Keep the recorded storages alive (while graphs that read them exist)."""
        if not self.state.pins:
            self.state = dataclasses.replace(self.state, pins=tuple(t.detach() for t in self.state.tensors))

    def unpin(self) -> None:
        self.state = dataclasses.replace(self.state, pins=())

    def pinned_devices(self) -> set[torch.device]:
        return {t.device for t in self.state.pins}

    @property
    def tracked(self) -> int:
        """How many tensors every check compares."""
        return len(self.state.tensors)

    def fingerprint(self) -> list[tuple[int, str, str, tuple[int, ...]]]:
        """(data_ptr, dtype, device, shape) of every tracked tensor, for diagnostics and tests."""
        return [(t.data_ptr(), str(t.dtype), str(t.device), tuple(t.shape)) for t in self.state.tensors]
