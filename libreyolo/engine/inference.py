"""Inference copies: the modules ``predict()`` runs, derived from the master network, never written back.

A :class:`~libreyolo.engine.model.Model` keeps one *master* network (``model.net``): float32
weights under the reference state-dict keys, the thing training, ``save()``, ``state_dict()``
and export read. ``predict()`` never runs it and never changes it. It runs an
:class:`InferenceCopy` keyed by ``(device, dtype, fold_bn, channels_last)``:

- built lazily, the first time a call needs that key, from the master's current weights;
- Conv-BN folded (:func:`fold_conv_bn`, a module transform over the shared
  :class:`~libreyolo.layers.conv.ConvBNAct` blocks: no family-specific code), computed in
  float64 and rounded once to the copy's dtype;
- converted to the copy's dtype (float16 for ``half=True``) and, where it pays, to the
  channels-last memory format (float16 on CUDA by default);
- cached, and retired as a whole when the master's weights change: the master is watched with
  :class:`libreyolo.graphs.watch.WeightWatch` (moves, dtype changes, replaced tensors or
  submodules, in-place updates seen through autograd version counters), and the model's own
  mutators (``to()``, ``float()``, ``load_weights()``, ``inference_options()``) retire the
  copies explicitly.

Thread safety: a copy is never modified after it is built, so any number of threads may run
it; switching precision or device selects another copy instead of converting a module that
another thread is running. Retiring only drops the cache's reference: a call already running
on a retired copy finishes on it (Python references keep its tensors alive).

Anything derived from one copy (CUDA graphs captured on it, a whole-pipeline graph) is
*attached* to it (:meth:`InferenceCopy.attached`) and released with it, so it can never outlive
the weights it reads.

Exactness: an unfolded copy of the same dtype is bit-for-bit the master's forward. A folded
copy is not: ``conv(x, w) * s + b`` and ``conv(x, w * s) + b'`` round differently. On the
compatibility fixtures the difference is of the same size as the difference between two
machines (documented in docs/inference.md, measured by tests/test_inference_copies.py).
"""
from __future__ import annotations

import copy as _copy
import dataclasses
import itertools
import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from libreyolo.graphs.watch import WeightSnapshot, WeightWatch
from libreyolo.kernels import KernelBinding, bind

_version = operator.attrgetter("_version")
CHANNELS_LAST_CHOICES = (True, False, "auto")


@dataclass(frozen=True)
class CopyKey:
    """What distinguishes one inference copy from another."""

    device: torch.device
    dtype: torch.dtype
    fold_bn: bool
    channels_last: bool

    def describe(self) -> dict[str, Any]:
        return {"device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
                "fold_bn": self.fold_bn, "channels_last": self.channels_last}


# --- the transforms ---------------------------------------------------------------------------
def conv_bn_pairs(module: nn.Module) -> list[tuple[nn.Module, nn.Conv2d, nn.BatchNorm2d]]:
    """Every ``ConvBNAct`` block whose ``conv`` (Conv2d) feeds its ``bn`` (BatchNorm2d, eval statistics)."""
    from libreyolo.layers.conv import ConvBNAct

    pairs = []
    for block in module.modules():
        if not isinstance(block, ConvBNAct):
            continue
        conv, bn = block.conv, block.bn
        if (type(conv) is nn.Conv2d and isinstance(bn, nn.BatchNorm2d) and bn.running_mean is not None
                and bn.running_var is not None and conv.out_channels == bn.num_features):
            pairs.append((block, conv, bn))
    return pairs


def fold_conv_bn(module: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Fold each ``ConvBNAct``'s BatchNorm into its convolution, in place; returns how many were folded.

    ``y = (conv(x, w) - mean) / sqrt(var + eps) * gamma + beta`` becomes ``conv(x, w * s) + b``
    with ``s = gamma / sqrt(var + eps)`` and ``b = beta - mean * s`` (plus ``s * bias`` when the
    convolution has one), computed in float64 and rounded once. The BatchNorm is replaced by
    ``nn.Identity``, so the block runs convolution then activation. Eval semantics only: use it
    on a private copy (the master keeps its BatchNorms for training and ``state_dict()``).

    ``dtype``: the dtype the folded weights will be run in (default: the convolution's); they
    are created in it, so that they are rounded once. A block whose folded weights would not be
    finite in it (a tiny running variance overflowing float16) is left unfolded.
    """
    count = 0
    for block, conv, bn in conv_bn_pairs(module):
        target = dtype or conv.weight.dtype
        with torch.no_grad():
            w = conv.weight.detach().double()
            scale = bn.running_var.detach().double().add(bn.eps).rsqrt()
            if bn.weight is not None:
                scale = scale * bn.weight.detach().double()
            bias = -bn.running_mean.detach().double() * scale
            if bn.bias is not None:
                bias = bias + bn.bias.detach().double()
            if conv.bias is not None:
                bias = bias + conv.bias.detach().double() * scale
            w = w * scale.view(-1, *([1] * (w.ndim - 1)))
            limit = torch.finfo(target).max
            if not (bool(torch.isfinite(w).all()) and float(w.abs().max()) <= limit
                    and float(bias.abs().max()) <= limit):
                continue
            fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                              conv.dilation, conv.groups, bias=True, padding_mode=conv.padding_mode,
                              device=conv.weight.device, dtype=target)
            fused.weight.copy_(w.to(target))  # rounded once, from float64 to the dtype it runs in
            fused.bias.copy_(bias.to(target))
        fused.requires_grad_(False)
        block.conv = fused
        block.bn = nn.Identity()
        count += 1
    return count


def _detached_clone(master: nn.Module, device: torch.device) -> nn.Module:
    """A deep copy of ``master`` whose tensors are copied straight to ``device``: the master's own
    device never holds a second copy, and no tensor of the master is shared or touched."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(master.parameters(), master.buffers()):
        if id(t) in memo:
            continue
        data = t.detach().to(device=device, copy=True)
        memo[id(t)] = nn.Parameter(data, requires_grad=False) if isinstance(t, nn.Parameter) else data
    clone = _copy.deepcopy(master, memo)
    clone.eval()
    clone.requires_grad_(False)
    return clone


def build_copy(master: nn.Module, key: CopyKey) -> tuple[nn.Module, int]:
    """The inference module for ``key`` (a new module sharing nothing with ``master``) and how many
    Conv-BN pairs were folded."""
    clone = _detached_clone(master, key.device)
    folded = fold_conv_bn(clone, key.dtype) if key.fold_bn else 0
    clone.to(dtype=key.dtype)
    if key.channels_last:
        clone.to(memory_format=torch.channels_last)
    return clone, folded


# --- one copy ---------------------------------------------------------------------------------
class InferenceCopy:
    """One derived module plus the things attached to it (graph runners), released with it."""

    def __init__(self, key: CopyKey, module: nn.Module, folded: int, generation: int) -> None:
        self.key = key
        self.module = module
        self.folded = folded
        self.generation = generation  # the cache generation (master state) it was built from
        self.retired = False
        self._attached: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._kernels: KernelBinding | None = None

    def kernels(self) -> KernelBinding:
        """The kernel slots resolved for this copy (:func:`libreyolo.kernels.bind`): the same binding
        while the registrations and the selector variables stay as they were, else a new one. Run the
        module inside ``copy.kernels().active()``."""
        found = self._kernels
        if found is None or not found.current():
            found = self._kernels = bind(found)
        return found

    def attached(self, name: str, factory: Callable[[nn.Module], Any]) -> Any:
        """The object attached under ``name``, made by ``factory(self.module)`` on first use.

        When the copy is retired, every attachment that has a ``release()`` method is released.
        """
        found = self._attached.get(name)
        if found is None:
            with self._lock:
                found = self._attached.get(name)
                if found is None:
                    found = factory(self.module)
                    self._attached = {**self._attached, name: found}
        return found

    def attachment(self, name: str) -> Any | None:
        return self._attached.get(name)

    def detach(self, name: str) -> None:
        """Remove and release the attachment ``name`` (e.g. a compiled program when compile is switched)."""
        with self._lock:
            found = self._attached.get(name)
            if found is None:
                return
            self._attached = {k: v for k, v in self._attached.items() if k != name}
        release = getattr(found, "release", None)
        if callable(release):
            release()

    def retire(self) -> None:
        with self._lock:
            self.retired = True
            attached, self._attached = self._attached, {}
        for obj in attached.values():
            release = getattr(obj, "release", None)
            if callable(release):
                release()

    def describe(self) -> dict[str, Any]:
        return {**self.key.describe(), "folded": self.folded,
                "parameters": sum(p.numel() for p in self.module.parameters())}


class _MasterWatch(WeightWatch):
    """The graphs' weight watch with more version sentinels: a copy goes stale on *any* in-place
    update, not only one that happens to touch the first or the last tensor."""

    SENTINELS = 64

    def snapshot(self) -> WeightSnapshot:
        s = super().snapshot()
        live = [t for t in s.tensors if not t.is_inference()]
        step = max(1, len(live) // self.SENTINELS)
        sentinels = live[::step] + live[-1:]
        return dataclasses.replace(s, sentinels=sentinels, versions=list(map(_version, sentinels)))


# --- the cache --------------------------------------------------------------------------------
class InferenceCopies:
    """The copies derived from one master network, by :class:`CopyKey`.

    ``on_retire(reason, copies)`` is called (under the cache lock, before the copies release
    their attachments) whenever copies are dropped because the master changed.
    """

    def __init__(self, master: nn.Module, *, fold_bn: bool | str = "auto", channels_last: bool | str = "auto",
                 on_retire: Callable[[str, list[InferenceCopy]], None] | None = None) -> None:
        self.master = master
        self.fold_bn = fold_bn
        self.channels_last = channels_last
        self.on_retire = on_retire
        self._watch = _MasterWatch(master)
        self._copies: dict[CopyKey, InferenceCopy] = {}
        self._lock = threading.RLock()
        self.generation = 0
        self.builds = 0

    # --- keys --------------------------------------------------------------------------------
    def key(self, device: torch.device | str, dtype: torch.dtype) -> CopyKey:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.channels_last == "auto":  # measured: pays for float16 on CUDA (docs/inference.md)
            cl = device.type == "cuda" and dtype == torch.float16
        else:
            cl = bool(self.channels_last)
        # "auto": fold on CUDA, where it pays; on the CPU predict() keeps the checkpoint's exact
        # arithmetic, so CPU numbers equal the reference library's (the compatibility contract)
        fold = device.type == "cuda" if self.fold_bn == "auto" else bool(self.fold_bn)
        return CopyKey(device, dtype, fold, cl)

    # --- lookup ------------------------------------------------------------------------------
    def get(self, device: torch.device | str, dtype: torch.dtype) -> InferenceCopy:
        """The current copy for ``(device, dtype)``, built if needed (one master check per call)."""
        if not dtype.is_floating_point:
            raise TypeError(f"an inference copy needs a floating dtype, got {dtype}")
        key = self.key(device, dtype)
        if self._watch.unchanged():
            found = self._copies.get(key)
            if found is not None:
                return found
        with self._lock:
            self._sync_locked()
            found = self._copies.get(key)
            if found is None:
                module, folded = build_copy(self.master, key)
                found = InferenceCopy(key, module, folded, self.generation)
                self._copies = {**self._copies, key: found}  # readers without the lock see old or new
                self.builds += 1
            return found

    def live(self) -> list[InferenceCopy]:
        """The copies that are current (after checking the master)."""
        self.sync()
        return list(self._copies.values())

    # --- invalidation ------------------------------------------------------------------------
    def sync(self) -> None:
        """Retire every copy if the master's weights changed since they were built."""
        if self._watch.unchanged():
            return
        with self._lock:
            self._sync_locked()

    def _sync_locked(self) -> None:
        reason, new = self._watch.changes()
        if new is None:
            return
        self._watch.commit(new)
        if reason is not None:
            self._retire_all(reason)

    def invalidate(self, reason: str) -> None:
        """Retire every copy now (the model's own mutators call this)."""
        with self._lock:
            self._watch.commit(self._watch.snapshot())
            self._retire_all(reason)

    def mutating(self) -> threading.RLock:
        """Hold while changing the master, so that no copy is built from a half-changed master."""
        return self._lock

    def set_options(self, *, fold_bn: bool | None = None, channels_last: bool | str | None = None) -> None:
        with self._lock:
            changed = False
            if fold_bn is not None and fold_bn != self.fold_bn:
                self.fold_bn, changed = fold_bn, True
            if channels_last is not None and channels_last != self.channels_last:
                self.channels_last, changed = channels_last, True
            if changed:
                self._retire_all("inference options changed")

    def _retire_all(self, reason: str) -> None:
        old = list(self._copies.values())
        self._copies = {}
        self.generation += 1
        if not old:
            return
        if self.on_retire is not None:
            self.on_retire(reason, old)
        for c in old:
            c.retire()

    def release(self) -> None:
        """Drop every copy (e.g. when the model's master network is replaced)."""
        with self._lock:
            old = list(self._copies.values())
            self._copies = {}
            self.generation += 1
        for c in old:
            c.retire()
