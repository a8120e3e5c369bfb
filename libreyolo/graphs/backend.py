"""The capture/replay layer under :class:`~libreyolo.graphs.runner.GraphRunner`.

:class:`CudaGraphBackend` is the real one. :class:`EmulatedGraphBackend` replays by calling
the function again and writing into the same static output buffer, so the runner's keys,
locks, LRU, invalidation and copy-out run unchanged on a machine without a GPU (tests and
``python -m libreyolo.graphs.parity --emulate``). It proves nothing about CUDA itself.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

GraphFn = Callable[[Any], torch.Tensor]  # takes a tensor, or a tuple of tensors for several inputs


def _first(static_input: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    return static_input[0] if isinstance(static_input, tuple) else static_input


class Fence(Protocol):
    """Orders device work of one model across streams, without host synchronisation."""

    def current(self) -> Any: ...
    def join(self, stream: Any) -> None: ...
    def mark(self, stream: Any) -> None: ...


class GraphBackend(Protocol):
    name: str
    # True when replays are real CUDA graphs: then a captured function must never wait for the
    # device (the whole-pipeline graph is only offered where its postprocessing is capture-safe)
    real: bool

    def unavailable(self, device: torch.device) -> str | None:
        """Why graphs cannot run for tensors on ``device``, or None."""

    def new_pool(self, device: torch.device) -> Any: ...

    def capture(self, fn: GraphFn, static_input: Any, pool: Any) -> tuple[Any, torch.Tensor]:
        """Warm up, capture ``fn(static_input)`` (a tensor, or a tuple of them); return (graph, static output)."""

    def replay(self, graph: Any) -> None: ...

    def fence(self, device: torch.device) -> Fence: ...

    def trim(self) -> None:
        """Give cached memory back after graphs were released."""

    def quiesce(self, devices: set[torch.device]) -> None:
        """Wait until work already launched on ``devices`` is done (rare: stale graphs dropped)."""


class CudaStreamFence:
    """Keeps replay sections of one model in order on the device, across CUDA streams.

    ``current()`` is the caller's raw stream handle (an int: no Stream object per call). While
    every caller uses one stream, the stream itself orders the work and nothing else happens.
    When a caller arrives on another stream, ``join`` makes its stream wait for everything
    already enqueued on the last stream used (``wait_stream``: an event recorded now, waited
    on by the device), so it never overwrites a static input still being read nor replays a
    graph whose pool memory another replay is still using. No host synchronisation.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._last: torch.cuda.Stream | None = None
        self._last_raw: int | None = None
        self._lock = threading.Lock()

    def current(self) -> int:
        if self._raw is not None:
            return self._raw(self._index)
        return torch.cuda.current_stream(self.device).cuda_stream

    def join(self, stream: int) -> None:
        with self._lock:
            if self._last is not None and stream != self._last_raw:
                torch.cuda.current_stream(self.device).wait_stream(self._last)

    def mark(self, stream: int) -> None:
        with self._lock:
            if stream != self._last_raw:
                self._last = torch.cuda.current_stream(self.device)
                self._last_raw = stream


def _autocast_without_cache(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast's weight-cast cache must be off while capturing (cached casts are freed on exit)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=False)
    return contextlib.nullcontext()


class CudaGraphBackend:
    """``torch.cuda.CUDAGraph`` capture with a side-stream warm-up and thread-local error mode."""

    name = "cuda"
    real = True

    def __init__(self, warmup: int = 2) -> None:
        self.warmup = warmup

    def unavailable(self, device: torch.device) -> str | None:
        if device.type == "cuda":
            return None
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine"
        return f"the model runs on {device}, not on a CUDA device"

    def new_pool(self, device: torch.device) -> Any:
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    def capture(self, fn: GraphFn, static_input: Any, pool: Any) -> tuple[Any, torch.Tensor]:
        device = _first(static_input).device
        with torch.cuda.device(device), _autocast_without_cache("cuda"):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            # warm-up off the caller's stream: lazy cuDNN/cuBLAS initialisation and workspace
            # allocations happen here, not inside the capture where they would be illegal
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    fn(static_input)
            graph = torch.cuda.CUDAGraph()
            # thread_local: only this thread is barred from unsafe CUDA calls during capture, so
            # other threads serving requests (or a DataLoader's pin-memory thread) are unaffected
            with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
                static_output = fn(static_input)
            torch.cuda.current_stream(device).wait_stream(side)
        return graph, static_output

    def replay(self, graph: Any) -> None:
        graph.replay()

    def fence(self, device: torch.device) -> CudaStreamFence:
        return CudaStreamFence(device)

    def trim(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def quiesce(self, devices: set[torch.device]) -> None:
        for device in devices:
            if device.type == "cuda":
                torch.cuda.synchronize(device)


class _NoFence:
    def current(self) -> None:
        return None

    def join(self, stream: Any) -> None:
        pass

    def mark(self, stream: Any) -> None:
        pass


class _EmulatedGraph:
    def __init__(self, fn: GraphFn, static_input: torch.Tensor, static_output: torch.Tensor) -> None:
        self.fn, self.static_input, self.static_output = fn, static_input, static_output
        self.active = 0
        # a real graph replays what was recorded whatever the caller's autograd mode; so do we
        self.inference = torch.is_inference_mode_enabled()
        self.grad = torch.is_grad_enabled()


class EmulatedGraphBackend:
    """A stand-in that "replays" by calling the function on the static input.

    Like a real graph it writes every replay into the *same* output buffer, so a runner that
    handed out the static buffer, or let two threads share one key's buffers, gives wrong
    results here too. It records what the runner asked for (``captures``, ``replays``,
    ``max_overlap``: the most replays of one graph seen running at once) and can fail chosen
    captures (``fail_when(static_input) -> bool``). ``on_replay(graph)`` runs inside each replay.
    """

    name = "emulated"
    real = False

    def __init__(self, *, fail_when: Callable[[torch.Tensor], bool] | None = None,
                 on_replay: Callable[[Any], None] | None = None, yield_gil: bool = True) -> None:
        self.fail_when = fail_when
        self.on_replay = on_replay
        self.yield_gil = yield_gil
        self.captures: list[tuple[int, ...]] = []
        self.capture_attempts = 0
        self.replays = 0
        self.max_overlap = 0
        self.pools = 0
        self.quiesced = 0
        self._lock = threading.Lock()

    def unavailable(self, device: torch.device) -> str | None:
        return None

    def new_pool(self, device: torch.device) -> int:
        self.pools += 1
        return self.pools

    def capture(self, fn: GraphFn, static_input: Any, pool: Any) -> tuple[_EmulatedGraph, torch.Tensor]:
        with self._lock:
            self.capture_attempts += 1
        if self.fail_when is not None and self.fail_when(static_input):
            raise RuntimeError(f"emulated capture failure for shape {tuple(_first(static_input).shape)}")
        fn(static_input)  # warm-up, as the CUDA backend does
        static_output = fn(static_input)
        with self._lock:
            self.captures.append(tuple(_first(static_input).shape))
        return _EmulatedGraph(fn, static_input, static_output), static_output

    def replay(self, graph: _EmulatedGraph) -> None:
        with self._lock:
            graph.active += 1
            self.replays += 1
            self.max_overlap = max(self.max_overlap, graph.active)
        try:
            if self.on_replay is not None:
                self.on_replay(graph)
            with torch.inference_mode(graph.inference), torch.set_grad_enabled(graph.grad):
                result = graph.fn(graph.static_input)
                if self.yield_gil:
                    time.sleep(0)  # give other threads the GIL between reading the input and writing the output
                graph.static_output.copy_(result)
        finally:
            with self._lock:
                graph.active -= 1

    def fence(self, device: torch.device) -> _NoFence:
        return _NoFence()

    def trim(self) -> None:
        pass

    def quiesce(self, devices: set[torch.device]) -> None:
        self.quiesced += 1
