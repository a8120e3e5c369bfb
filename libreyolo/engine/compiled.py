"""``compile=True``: torch.compile of an inference copy, validated against that copy before it serves.

``LibreYOLO(..., compile=True)`` (or ``model.compile()``) makes ``predict(cuda_graph=False)`` run
the inference copy (:mod:`libreyolo.engine.inference`) through ``torch.compile`` instead of
calling it eagerly. Like an exported artifact, the compiled program is another program for the
same network, so it is not trusted before it was compared with the eager copy:

- built lazily, per inference copy (device, dtype, folding, memory format), and attached to it
  (:meth:`~libreyolo.engine.inference.InferenceCopy.attached`), so it is dropped with the copy
  when the master's weights change;
- compiled with fixed shapes (``dynamic=False``): each new input shape (batch size, imgsz) is a
  new compilation by torch.compile's own guards, and the first batch of each shape is run
  through the eager copy and the compiled program and compared with the export validator's
  tolerance model (:func:`check_against_eager`: per output group, each element within
  ``ELEMENT_MULTIPLE`` times the eager copy's own float32 error against a float64 copy, plus the
  fp16 term for a float16 copy; :mod:`libreyolo.utils.tolerance`, through :mod:`libreyolo.comparison.programs`);
- where compiling raises or the comparison fails, one warning says why, the reason is kept in
  ``compile_info()``, and that copy is served eagerly from then on.

Modes that record CUDA graphs inside Inductor (``reduce-overhead``, ``max-autotune`` on CUDA)
overwrite their outputs at the next replay, so outputs are copied out and calls on one copy are
serialized; the first batch of a shape is run :data:`RECORD_CALLS` times (warm-up, recording,
replay) and every run is checked, so the replayed graph is what was validated.

With ``predict(cuda_graph=True)`` our own CUDA graphs (whole pipeline, letterbox included where
it runs inside) capture a second ``CompiledForward`` of the same copy, compiled in the mode's
counterpart without Inductor's CUDA graphs (:func:`in_graph_mode`); its first call of a shape (the
capture's warm-up, off the capture) compiles and validates it the same way, so what is captured
is a program that passed. Where it falls back, the graph captures the eager copy.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from libreyolo.comparison.programs import check_program
from libreyolo.utils.log import LOGGER

ATTACHMENT = "compiled"  # the name a copy's CompiledForward is attached under (docs/inference.md)
RECORD_CALLS = 3  # Inductor's CUDA graph trees warm up, record, then replay: validate all three
_WARN_LOCK = threading.Lock()  # one fallback warning per compiled program, whichever thread finds it
_COUNT_LOCK = threading.Lock()
CUDA_GRAPH_RULE = ("predict(cuda_graph=False) calls the compiled network in the resolved mode; predict(cuda_graph="
                   "True) replays our own CUDA graphs with the network compiled in that mode's counterpart without "
                   "Inductor CUDA graphs (reduce-overhead -> default, max-autotune -> max-autotune-no-cudagraphs), "
                   "validated against the eager copy before it is captured")
# Inductor's own CUDA graphs cannot be recorded inside ours: the mode a network captured in our graphs compiles in
_IN_GRAPH = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def resolve_mode(requested: bool | str, device: torch.device) -> str | None:
    """The torch.compile mode for a copy on ``device``: None when off; ``True`` is reduce-overhead on
    CUDA (Inductor's own CUDA graphs, what makes batch 1 fast) and default elsewhere."""
    if requested is False:
        return None
    if requested is True:
        return "reduce-overhead" if device.type == "cuda" else "default"
    return requested


def in_graph_mode(mode: str) -> str:
    """The torch.compile mode of a network that our own CUDA graphs capture: ``mode`` without
    Inductor's CUDA graphs (they would be recorded inside a capture, which CUDA refuses)."""
    return _IN_GRAPH.get(mode, mode)


def uses_cudagraphs(mode: str, device: torch.device) -> bool:
    """Whether Inductor records CUDA graphs in ``mode`` on ``device``."""
    if device.type != "cuda":
        return False
    from torch._inductor import list_mode_options

    return bool(list_mode_options(mode).get("triton.cudagraphs", False))


def torch_compile(module: nn.Module, mode: str) -> Callable[[torch.Tensor], Any]:
    """``module`` through torch.compile with fixed shapes (it compiles at the first call of each shape)."""
    return torch.compile(module, mode=mode, dynamic=False)


def end_compile_workers() -> bool:
    """End Inductor's pool of compile worker processes, which stays alive after compiling (torch starts
    it again at the next compilation). Returns whether there was a pool to end.

    Measured on the H200 (``bench/compile_bench.py``, YOLOv9-t fp16, graphs holding the compiled
    network): while the pool lives, a batch-1 ``predict()`` took 7.97 ms; after it ended, 2.93 ms.
    :meth:`libreyolo.serve.Batcher.warmup` calls this once its sizes are compiled; it affects every
    compilation of the process, so call it yourself only when nothing else is compiling.
    """
    try:
        from torch._inductor import async_compile
    except ImportError:  # a torch without Inductor: nothing to end
        return False
    stop = getattr(async_compile, "shutdown_compile_workers", None)
    if stop is None or not getattr(async_compile, "_pool_set", True):
        return False
    stop()
    return True


def _signature(batch: torch.Tensor) -> tuple:
    return tuple(batch.shape), tuple(batch.stride()), batch.dtype, batch.device


def _why(exc: BaseException, device: torch.device) -> str:
    """One line saying why compiling failed, with what to do when a toolchain is missing."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " ".join(f"{type(e).__name__}: {e}" for e in chain)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    line = f"{type(exc).__name__}: {first}"[:300]
    if device.type == "cpu" and ("InvalidCxxCompiler" in text or "C++ compiler" in text):
        return line + ("; Inductor on the CPU needs a working C++ compiler (g++ or clang++, "
                       "torch._inductor.config.cpp.cxx): install one, or use compile=False")
    if device.type == "cuda" and "triton" in text.lower() and ("not found" in text.lower() or "No module" in text):
        return line + "; Inductor on CUDA needs Triton (the triton package matching your torch), or use compile=False"
    return line


class CompiledForward:
    """torch.compile of one inference copy's module, checked against the eager copy per input shape.

    Called like the copy (a batch in, the family's named outputs out); serves the eager copy for a
    shape until it passed, and for every shape once the copy fell back.
    """

    def __init__(self, module: nn.Module, family: Any, device: torch.device, mode: str) -> None:
        self.module = module
        self.family = family
        self.device = device
        self.mode = mode
        self.cudagraphs = uses_cudagraphs(mode, device)
        self.fallback: str | None = None
        self.released = False
        self.calls = {"compiled": 0, "eager": 0}
        self._fn: Callable[[torch.Tensor], Any] | None = None
        self._shapes: dict[tuple, dict[str, Any]] = {}  # input signature -> what its validation found
        self._lock = threading.Lock()

    # --- calling ---------------------------------------------------------------------------
    def __call__(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.fallback is None:
            sig = _signature(batch)
            if sig in self._shapes:
                if self.cudagraphs:  # one replay at a time: its outputs live in the graph's pool
                    with self._lock:
                        out = self._run(batch)
                else:
                    out = self._run(batch)
            else:
                with self._lock:
                    out = self._first(batch, sig)
            if out is not None:
                self._count("compiled")
                return out
        self._count("eager")
        return self.family.named_outputs(self.module(batch))

    def _count(self, kind: str) -> None:
        with _COUNT_LOCK:  # calls from several threads: exact counts
            self.calls[kind] += 1

    def _call(self, fn: Callable[[torch.Tensor], Any], batch: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.family.named_outputs(fn(batch))
        if self.cudagraphs:  # the next replay overwrites them
            out = {k: v.clone() for k, v in out.items()}
        return out

    def _run(self, batch: torch.Tensor) -> dict[str, torch.Tensor] | None:
        fn = self._fn
        if fn is None:  # released, or fell back in another thread
            return None
        try:
            return self._call(fn, batch)
        except Exception as exc:  # e.g. a recompilation that fails: the eager copy still serves
            self._give_up(f"torch.compile failed ({_why(exc, self.device)})")
            return None

    def _first(self, batch: torch.Tensor, sig: tuple) -> dict[str, torch.Tensor] | None:
        """Compile for this shape, check against eager, and return the checked output (or None)."""
        if self.fallback is not None or self.released:
            return None
        if sig in self._shapes:  # validated by another thread meanwhile
            return self._run(batch)
        try:
            fn = self._fn
            if fn is None:
                fn = self._fn = torch_compile(self.module, self.mode)
            t0 = time.perf_counter()
            runs = [self._call(fn, batch)]
            if batch.device.type == "cuda":
                torch.cuda.synchronize(batch.device)
            seconds = time.perf_counter() - t0
            runs += [self._call(fn, batch) for _ in range(RECORD_CALLS - 1 if self.cudagraphs else 0)]
        except Exception as exc:
            self._give_up(f"torch.compile failed ({_why(exc, self.device)})")
            return None
        t1 = time.perf_counter()
        try:
            verdict = check_against_eager(self.module, self.family, batch, runs)
        except Exception as exc:  # e.g. an op without float64 support, or no memory for the reference
            self._give_up(f"its outputs could not be checked against the eager copy ({type(exc).__name__}: "
                          f"{str(exc).strip()[:200]})")
            return None
        if not verdict["passed"]:
            self._give_up(f"its outputs for input {tuple(batch.shape)} differ from the eager copy's beyond the "
                          f"validation bar ({verdict['line']})")
            return None
        self._shapes[sig] = {"shape": list(batch.shape), "compile_seconds": round(seconds, 3),
                             "validate_seconds": round(time.perf_counter() - t1, 3),
                             "worst_ratio": verdict["ratio"], "checked_runs": len(runs)}
        return runs[-1]

    def _give_up(self, reason: str) -> None:
        with _WARN_LOCK:
            if self.fallback is not None:
                return
            self.fallback = reason
            self._fn = None
        LOGGER.warning("compile=%r on %s: %s; predict() runs the eager inference copy there from now on "
                       "(compile_info() has the reason)", self.mode, self.device, reason)

    # --- lifetime and state ----------------------------------------------------------------
    def release(self) -> None:
        """Drop the compiled program (the copy was retired or compile was switched off)."""
        self.released = True
        self._fn = None

    def info(self) -> dict[str, Any]:
        shapes = list(self._shapes.values())
        return {"mode": self.mode, "inductor_cuda_graphs": self.cudagraphs,
                "compiled": self.fallback is None and bool(shapes), "fallback": self.fallback,
                "shapes": shapes, "compile_seconds": round(sum(s["compile_seconds"] for s in shapes), 3),
                "calls": dict(self.calls)}


# --- the check ------------------------------------------------------------------------------
def check_against_eager(module: nn.Module, family: Any, batch: torch.Tensor,
                        candidates: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Whether each of ``candidates`` passes the export validator's raw-output comparison against the
    eager ``module`` (:func:`libreyolo.comparison.programs.check_program`, the one comparison)."""
    return check_program(module, family, batch, candidates)
