"""The call plan: what one ``predict()`` / ``enqueue()`` / Batcher request / ``capture_graph()`` runs,
decided once.

:meth:`libreyolo.engine.predictor.Predictor.plan` checks a call's options where they are declared
(:data:`libreyolo.engine.options.PREDICT_OPTIONS`, the task's own options, the family's input
size, the input budget, the device and precision) and picks the executor, and returns a frozen,
hashable :class:`CallPlan`. Plans are cached per (options, the model's settings that change the
answer) in a :class:`PlanCache`, so a repeated call (a camera loop, a server's requests) looks its
plan up instead of deciding again. The batch loop reads the plan and decides nothing: the
executor, the preprocessing, the input dtype and the device are fields of it.

Executors (:data:`EXECUTORS`):

- ``eager``: the inference copy's module (:mod:`libreyolo.engine.inference`);
- ``compiled``: its torch.compile program (:mod:`libreyolo.engine.compiled`);
- ``graphed``: the network forward replayed from a CUDA graph, postprocessing eager;
- ``pipeline``: network and device postprocessing as one graph replay (letterbox too, for
  same-size frames: :mod:`libreyolo.engine.pipeline`); a capture that fails for one input falls
  back to ``graphed`` for it (recorded in ``graph_info()``);
- ``runtime``: an artifact's own runtime (:mod:`libreyolo.runtimes`).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

EAGER, COMPILED, GRAPHED, PIPELINE, RUNTIME = "eager", "compiled", "graphed", "pipeline", "runtime"
EXECUTORS = (EAGER, COMPILED, GRAPHED, PIPELINE, RUNTIME)
_SCALARS = frozenset({int, float, str, bool, type(None), torch.device, torch.dtype})
PLANS_KEPT = 64  # plans cached per model (the oldest dropped first)


def freeze(value: Any) -> Any:
    """``value`` as a hashable key that keeps types apart (``True`` and ``1``, ``"1"`` and ``1`` differ):
    mappings become sorted item tuples, sequences tuples, sets sorted tuples."""
    if type(value) in _SCALARS:  # the usual option value: no ABC checks
        return (type(value).__name__, value)
    if isinstance(value, Mapping):
        return ("map", tuple(sorted((str(k), freeze(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(freeze(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted((freeze(v) for v in value), key=repr)))
    try:
        hash(value)
    except TypeError:  # an unhashable option value (an array, ...): keyed by identity, so never shared
        return ("id", type(value).__name__, id(value))
    return (type(value).__name__, value)


@dataclass(frozen=True)
class CallPlan:
    """Everything one call runs with, checked and decided. Equal plans run the same computation."""

    imgsz: int                 # the network input side (checked by the family)
    batch: int                 # images per forward (lowered to the input budget when not given)
    device: torch.device       # where the call runs
    half: bool                 # float16 (CUDA)
    dtype: torch.dtype         # the network input's dtype
    graph: bool | str          # the cuda_graph mode: False, True or "auto"
    executor: str              # one of EXECUTORS
    options_key: tuple         # the task options, frozen (their values are in ``task_options``)
    task_options: Any = field(compare=False, repr=False)  # the task's checked TaskOptions
    preprocessor: Any = field(compare=False, repr=False)  # the family's preprocessing at imgsz

    @property
    def graphed(self) -> bool:
        """Whether batches replay CUDA graphs (the forward, or the whole pipeline)."""
        return self.executor in (GRAPHED, PIPELINE)

    def describe(self) -> dict[str, Any]:
        return {"imgsz": self.imgsz, "batch": self.batch, "device": str(self.device), "half": self.half,
                "dtype": str(self.dtype).removeprefix("torch."), "cuda_graph": self.graph,
                "executor": self.executor, "options": dict(self.task_options)}


class PlanCache:
    """Plans by key, the newest :data:`PLANS_KEPT` kept (the first made is dropped first). A hit takes
    no lock."""

    def __init__(self, size: int = PLANS_KEPT) -> None:
        self.size = size
        self._plans: OrderedDict[Any, CallPlan] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Any, make: Callable[[], CallPlan]) -> CallPlan:
        """The plan cached under ``key``, else ``make()`` (which raises for wrong options: nothing is
        cached then)."""
        found = self._plans.get(key)
        if found is not None:
            self.hits += 1
            return found
        plan = make()
        with self._lock:
            self.misses += 1
            self._plans[key] = plan
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)
        return plan

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
