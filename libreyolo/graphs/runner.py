"""One CUDA graph per input key: capture on demand, replay, copy out, evict, invalidate.

A :class:`GraphRunner` wraps ``fn(batch) -> {name: tensor}`` (a family's network forward)
for one module; other :class:`GraphProgram` s over the same module (the whole detection
pipeline: forward, decoding, candidate selection and NMS) run through the same runner, with
several inputs and options that are part of the key. Keys, locks and memory:

- **Key**: the program and its options; every input's shape, strides, dtype and device; the
  autocast state (enabled + dtype) of the input's device type; grad mode and inference mode;
  the module's identity and its ``training`` flag. Anything that changes which kernels run, or
  what they read, is in the key.
  The module's weights are not: they are watched (:mod:`libreyolo.graphs.watch`) and any move
  drops every graph of this runner. On a hit the check runs right *after* the replay is
  launched, so its host time (one ``data_ptr`` per tensor) overlaps the device's work; a
  replay that turns out stale read the old weights, which the watch keeps alive, and its
  result is discarded and the call runs again against the current weights.
- **Memory**: all graphs of a runner capture into one memory pool per device
  (``torch.cuda.graph_pool_handle()``), so the activations of different shapes share memory.
  At most ``max_graphs`` graphs are kept (least recently used evicted first).
- **Locks**: a runner-level table lock guards the key table, LRU order and counters (held for
  dictionary work only). Each graph has its own lock, held across copy-in, replay and
  copy-out, because its static input and output are single buffers: two callers of the
  same key must take turns, callers of different keys need not. Because graphs share a pool,
  one graph's replay may write where another graph keeps its output; so "replay, then copy
  the output out" is one short section under a runner-level replay lock, never interleaved
  with another graph's replay. Copy-in (and everything before and after: preprocessing, NMS)
  runs outside it, so different shapes overlap everywhere except the replay launch itself.
  Across CUDA streams the same order is kept on the device: a caller on a new stream first
  waits for the last stream used (:class:`~libreyolo.graphs.backend.CudaStreamFence`);
  nothing synchronises the host. Freeing graphs (eviction, invalidation, release) waits for
  launched work first, so no buffer is freed under a running replay.
- **Captures** are serialised process-wide (CUDA allows one capture at a time per process).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from libreyolo.errors import ArgumentError, LibreYOLOError
from libreyolo.graphs.backend import CudaGraphBackend, Fence, GraphBackend
from libreyolo.graphs.outputs import OutputLayout, dtype_name
from libreyolo.graphs.watch import WeightWatch

AUTO_CAPTURE_AT = 2       # cuda_graph="auto" captures a key the 2nd time it is seen
DEFAULT_MAX_GRAPHS = 16
INFO_SCHEMA = 2  # 2: graphs name their program (and options); graph_info() reports the pipeline
_CAPTURE_LOCK = threading.Lock()


class GraphCaptureError(LibreYOLOError, RuntimeError):
    """Capturing the forward for one input key failed (recorded; that key is not retried)."""


class GraphNotSupportedError(LibreYOLOError, NotImplementedError):
    """The family has not been verified for CUDA graphs (``SUPPORTS_CUDA_GRAPH`` is False)."""


class GraphUnavailableError(ArgumentError):
    """``cuda_graph=True`` was asked for where graphs cannot run (no CUDA, model on the CPU)."""


@dataclass(frozen=True, eq=False)
class GraphProgram:
    """What a graph runs: ``fn(*inputs) -> {name: tensor}``, named by ``name`` and ``options``.

    ``name`` and ``options`` (a tuple of ``(key, value)`` pairs, hashable) are part of every
    graph key: two programs with the same name and options must compute the same function.
    """

    name: str
    fn: Callable[..., dict[str, torch.Tensor]]
    options: tuple[tuple[str, Any], ...] = ()


@dataclass(eq=False)
class _Entry:
    key: tuple
    graph: Any
    static_inputs: tuple[torch.Tensor, ...]
    static_output: torch.Tensor
    layout: OutputLayout
    fence: Fence
    capture_ms: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    replays: int = 0

    @property
    def static_input(self) -> torch.Tensor:
        return self.static_inputs[0]


def describe_key(key: tuple) -> dict[str, Any]:
    program, options, inputs, autocast, grad, inference, training, _module = key
    shape, _stride, dtype, device = inputs[0]
    d = {"shape": list(shape), "dtype": dtype_name(dtype), "device": str(device),
         "autocast": None if autocast is None else dtype_name(autocast),
         "grad_enabled": grad, "inference_mode": inference, "training": training, "program": program}
    if options:
        d["options"] = dict(options)
    if len(inputs) > 1:
        d["inputs"] = [{"shape": list(i[0]), "dtype": dtype_name(i[2])} for i in inputs]
    return d


def _short(key: tuple) -> str:
    d = describe_key(key)
    return f"input {tuple(d['shape'])} {d['dtype']} on {d['device']}"


class GraphRunner:
    """Graph capture/replay for ``fn`` over ``module``. ``runner(x, mode)`` returns fresh outputs."""

    def __init__(self, module: nn.Module, fn: Callable[[torch.Tensor], dict[str, torch.Tensor]], *,
                 backend: GraphBackend | None = None, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        self.module = module
        self.fn = fn
        self.forward = GraphProgram("forward", fn)
        self.backend: GraphBackend = backend if backend is not None else CudaGraphBackend()
        self._max_graphs = check_max_graphs(max_graphs)
        self._watch = WeightWatch(module)
        self._lock = threading.Lock()          # key table, LRU, counters
        self._replay_lock = threading.Lock()   # replay + copy-out of any graph sharing the pool
        self._table: OrderedDict[tuple, _Entry] = OrderedDict()
        self._failed: dict[tuple, str] = {}
        self._sightings: OrderedDict[tuple, int] = OrderedDict()
        self._fallbacks: dict[str, int] = {}
        self._pools: dict[torch.device, Any] = {}
        self._fences: dict[torch.device, Fence] = {}
        self._epoch = 0  # bumped (under the table lock) whenever the graphs are dropped as stale
        self.captures = 0
        self.evictions = 0
        self.invalidations = 0
        self.last_invalidation: str | None = None

    # --- configuration -------------------------------------------------------------------
    @property
    def max_graphs(self) -> int:
        return self._max_graphs

    def set_max_graphs(self, value: int) -> None:
        value = check_max_graphs(value)
        with self._lock:
            self._max_graphs = value
            self._evict_over_limit()

    # --- the call ------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor | tuple[torch.Tensor, ...], mode: bool | str = True,
                 program: GraphProgram | None = None) -> dict[str, torch.Tensor]:
        """Run ``program`` (default: ``fn``) on ``x`` (a tensor or a tuple of tensors) from a graph.

        ``mode``: True (capture on first sight) or "auto" (on 2nd); False runs it eagerly.
        """
        program = program or self.forward
        x = x if isinstance(x, tuple) else (x,)
        if mode is False:
            return program.fn(*x)
        why_not = self.backend.unavailable(x[0].device)
        if why_not is not None:
            if mode is True:
                raise GraphUnavailableError(
                    f"cuda_graph=True needs a CUDA device: {why_not}. Run the model on a GPU "
                    "(device='cuda' or model.to('cuda')), or use cuda_graph='auto' to run eagerly "
                    "where graphs are unavailable, or cuda_graph=False")
            if self._table:
                self.check_weights()  # e.g. moved to the CPU: free the graphs and the pinned GPU weights
            self._note_fallback(why_not)
            return program.fn(*x)
        return self._run(program, x, mode, retry=True)

    def _run(self, program: GraphProgram, x: tuple[torch.Tensor, ...], mode: bool | str,
             retry: bool) -> dict[str, torch.Tensor]:
        key = self._key(program, x)
        with self._lock:
            entry = self._table.get(key)
            if entry is not None:
                self._table.move_to_end(key)
            epoch = self._epoch
        if entry is None:
            self.check_weights()  # capture (or run eagerly) against the weights as they are now
            entry = self._entry(key, program, x, mode)
            return program.fn(*x) if entry is None else self._replay(entry, x)
        out = self._replay(entry, x)
        # The weight check runs after the launch, so its host time overlaps the device's work.
        # A graph whose weights moved before this replay read the old weights (pinned by the
        # watch, so live memory): the epoch then differs and the result is thrown away.
        if not self._watch.unchanged():
            self.check_weights()
        if self._epoch == epoch:
            return out
        return self._run(program, x, mode, retry=False) if retry else program.fn(*x)

    def capture(self, x: torch.Tensor | tuple[torch.Tensor, ...],
                program: GraphProgram | None = None) -> dict[str, Any]:
        """Capture ``x``'s key now (no-op if present); returns that graph's info."""
        program = program or self.forward
        x = x if isinstance(x, tuple) else (x,)
        why_not = self.backend.unavailable(x[0].device)
        if why_not is not None:
            raise GraphUnavailableError(f"capture_graph() needs a CUDA device: {why_not}")
        self.check_weights()
        entry = self._entry(self._key(program, x), program, x, True)
        assert entry is not None  # mode True raises instead of returning None
        return self._describe(entry)

    def _key(self, program: GraphProgram, x: tuple[torch.Tensor, ...]) -> tuple:
        dev = x[0].device.type
        autocast = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        inputs = tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in x)
        return (program.name, program.options, inputs, autocast, torch.is_grad_enabled(),
                torch.is_inference_mode_enabled(), self.module.training, id(self.module))

    def _entry(self, key: tuple, program: GraphProgram, x: tuple[torch.Tensor, ...],
               mode: bool | str) -> _Entry | None:
        with self._lock:
            entry = self._table.get(key)
            if entry is not None:
                self._table.move_to_end(key)
                return entry
            if not self._may_capture(key, mode):
                return None
        return self._capture(key, program, x, mode)

    def _may_capture(self, key: tuple, mode: bool | str) -> bool:
        """Under the table lock: False means run eager; raises for a failed key under True."""
        failure = self._failed.get(key)
        if failure is not None:
            if mode is True:
                raise GraphCaptureError(
                    f"CUDA graph capture for {_short(key)} failed earlier: {failure}. It is not retried "
                    "until release_graphs(); use cuda_graph='auto' (eager fallback) or cuda_graph=False")
            self._fallbacks_add(f"capture failed for {_short(key)}: {failure}")
            return False
        if mode == "auto":
            seen = self._sightings.pop(key, 0) + 1
            if seen < AUTO_CAPTURE_AT:
                self._sightings[key] = seen
                while len(self._sightings) > max(16, 4 * self._max_graphs):
                    self._sightings.popitem(last=False)
                return False
        return True

    def _capture(self, key: tuple, program: GraphProgram, x: tuple[torch.Tensor, ...],
                 mode: bool | str) -> _Entry | None:
        with _CAPTURE_LOCK:
            with self._lock:  # another thread may have captured (or failed) this key meanwhile
                entry = self._table.get(key)
                if entry is not None:
                    self._table.move_to_end(key)
                    return entry
                if key in self._failed and not self._may_capture(key, mode):
                    return None
                device = x[0].device
                pool = self._pools.get(device)
                if pool is None:
                    pool = self._pools[device] = self.backend.new_pool(device)
                fence = self._fences.get(device)
                if fence is None:
                    fence = self._fences[device] = self.backend.fence(device)
            static_inputs = tuple(torch.empty_like(t).copy_(t) for t in x)
            packer = _Packer(program.fn)
            start = time.perf_counter()
            try:
                # a single-input program sees its tensor, as backends and their tests expect
                graph, static_output = self.backend.capture(
                    packer, static_inputs[0] if len(static_inputs) == 1 else static_inputs, pool)
            except Exception as exc:  # noqa: BLE001 - any capture failure is recorded for this key only
                reason = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self._failed[key] = reason
                    self._sightings.pop(key, None)
                if mode is True:
                    raise GraphCaptureError(
                        f"CUDA graph capture for {_short(key)} failed: {reason}. This shape will not be "
                        "retried until release_graphs(); use cuda_graph='auto' (eager fallback) or "
                        "cuda_graph=False") from exc
                self._note_fallback(f"capture failed for {_short(key)}: {reason}")
                return None
            entry = _Entry(key, graph, static_inputs, static_output, packer.layout, fence,
                           (time.perf_counter() - start) * 1e3)
            with self._lock:
                self._watch.pin()  # a graph now reads these storages: keep them alive (see _run)
                self._table[key] = entry
                self._sightings.pop(key, None)
                self.captures += 1
                self._evict_over_limit()
            return entry

    def _replay(self, entry: _Entry, x: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        fence = entry.fence
        with entry.lock:
            stream = fence.current()
            fence.join(stream)  # a replay of this graph on another stream is done reading the input
            for static, value in zip(entry.static_inputs, x, strict=True):
                static.copy_(value)
            with self._replay_lock:
                fence.join(stream)
                self.backend.replay(entry.graph)
                packed = entry.static_output.clone()  # the one device-to-device copy-out
                fence.mark(stream)
            entry.replays += 1
        return entry.layout.unpack(packed)

    # --- invalidation, eviction, release ----------------------------------------------------
    def check_weights(self) -> None:
        """Drop every graph if the module's parameters or buffers moved or changed since capture."""
        with self._lock:
            reason, new = self._watch.changes()
            if new is None:
                return
            if reason is not None:
                self._epoch += 1  # before the new state is visible: see _run
                if self._table or self._failed or self._sightings:
                    self.invalidations += 1
                    self.last_invalidation = reason
                # replays launched before this point may still read the pinned old weights and
                # the graphs' buffers: let them finish before either is freed
                self.backend.quiesce(self._watch.pinned_devices() | self._devices())
                self._table.clear()
                self._failed.clear()
                self._sightings.clear()
                self._pools.clear()
            self._watch.commit(new)
            if self._table:  # an unrelated registration: same storages, keep them pinned
                self._watch.pin()

    def _evict_over_limit(self) -> None:
        """Under the table lock. Freeing a graph waits for launched work (rare: captures, resizes)."""
        if len(self._table) > self._max_graphs:
            self.backend.quiesce(self._devices())
        while len(self._table) > self._max_graphs:
            self._table.popitem(last=False)
            self.evictions += 1

    def _devices(self) -> set[torch.device]:
        return {e.static_input.device for e in self._table.values()}

    def release(self) -> None:
        """Free every graph, its buffers and its pool; forget failures and pending "auto" sightings."""
        self.check_weights()  # also unpins weights that moved since the last call
        with self._lock:
            had = bool(self._table)
            self.backend.quiesce(self._devices())
            self._table.clear()
            self._watch.unpin()
            self._failed.clear()
            self._sightings.clear()
            self._pools.clear()
        if had:
            self.backend.trim()

    # --- reporting -----------------------------------------------------------------------
    def _fallbacks_add(self, reason: str) -> None:
        self._fallbacks[reason] = self._fallbacks.get(reason, 0) + 1

    def _note_fallback(self, reason: str) -> None:
        with self._lock:
            self._fallbacks_add(reason)

    def _describe(self, entry: _Entry) -> dict[str, Any]:
        d = describe_key(entry.key)
        d.update(replays=entry.replays, capture_ms=round(entry.capture_ms, 3), outputs=entry.layout.describe())
        return d

    def info(self) -> dict[str, Any]:
        """The documented ``graph_info()`` schema (docs/graphs.md); plain JSON-serialisable data."""
        self.check_weights()
        with self._lock:
            return {
                "schema": INFO_SCHEMA,
                "backend": self.backend.name,
                "max_graphs": self._max_graphs,
                "auto_capture_at": AUTO_CAPTURE_AT,
                "graphs": [self._describe(e) for e in self._table.values()],  # least recently used first
                "captures": self.captures,
                "evictions": self.evictions,
                "invalidations": self.invalidations,
                "last_invalidation": self.last_invalidation,
                "failures": [dict(describe_key(k), reason=r) for k, r in self._failed.items()],
                "eager_fallbacks": [{"reason": r, "count": n} for r, n in self._fallbacks.items()],
                "pending": [dict(describe_key(k), sightings=n) for k, n in self._sightings.items()],
            }


class _Packer:
    """The captured function: ``fn``'s outputs packed into one tensor (see outputs.py)."""

    def __init__(self, fn: Callable[..., dict[str, torch.Tensor]]) -> None:
        self.fn = fn
        self.layout: OutputLayout | None = None

    def __call__(self, x: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
        outputs = self.fn(*x) if isinstance(x, tuple) else self.fn(x)
        self.layout = OutputLayout(outputs)
        return self.layout.pack(outputs)


def check_max_graphs(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"max_graphs must be a positive integer, got {value!r}")
    return value
