"""The graph part of a predictor: which backend captures and replays its CUDA graphs, how many graphs
each runner keeps, and the counters of runners already gone (docs/graphs.md).

:class:`GraphState` is declared by the eager :class:`~libreyolo.engine.model.Model` and by the
AOTInductor runtime, and is usable alone: it makes the :class:`~libreyolo.graphs.GraphRunner` of a
network (``new_runner``), applies ``graph_options()`` to live runners, folds retired runners'
counters in (``retire``) and merges the runners' ``info()`` into ``graph_info()``'s fields. The
runners themselves live on the inference copies they capture (:mod:`libreyolo.engine.graphed`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

_COUNTERS = ("captures", "evictions", "invalidations")
_LISTS = ("graphs", "failures", "eager_fallbacks", "pending")


class GraphState:
    """A predictor's graph settings and cumulative counters. ``backend``: None for real CUDA graphs,
    else a :class:`~libreyolo.graphs.GraphBackend` (e.g. the emulated one of the parity harness and the
    CPU tests); set it with :meth:`set_backend` before the first graphed call (runners made before keep
    the backend they were made with). A copy shares the backend (a strategy, not state) and copies
    the rest."""

    def __init__(self, backend: Any = None, max_graphs: int | None = None) -> None:
        self._backend = backend
        self._max_graphs = max_graphs  # None: the runner's default (DEFAULT_MAX_GRAPHS)
        self._lock = threading.Lock()
        self.totals: dict[str, Any] = {"captures": 0, "evictions": 0, "invalidations": 0, "last_invalidation": None}

    @property
    def backend(self) -> Any:
        """The backend set (None: real CUDA graphs); part of a call plan's key."""
        return self._backend

    def set_backend(self, backend: Any) -> None:
        self._backend = backend

    def active_backend(self) -> Any:
        """The backend runners capture through: the one set, else real CUDA graphs."""
        if self._backend is not None:
            return self._backend
        from libreyolo.graphs import CudaGraphBackend

        return CudaGraphBackend()

    @property
    def max_graphs(self) -> int:
        from libreyolo.graphs import DEFAULT_MAX_GRAPHS

        return self._max_graphs or DEFAULT_MAX_GRAPHS

    def new_runner(self, module: nn.Module, network: Callable[[torch.Tensor], dict[str, torch.Tensor]]) -> Any:
        """A :class:`~libreyolo.graphs.GraphRunner` capturing ``network`` (``module``: the weights it watches)
        with this state's backend and graph limit."""
        from libreyolo.graphs import GraphRunner

        return GraphRunner(module, network, backend=self._backend, max_graphs=self.max_graphs)

    def set_max_graphs(self, max_graphs: int, runners: Iterable[Any] = ()) -> None:
        """Graphs kept per runner (LRU), for new runners and the live ``runners``; checked."""
        from libreyolo.graphs.runner import check_max_graphs

        self._max_graphs = check_max_graphs(max_graphs)
        for runner in runners:
            runner.set_max_graphs(max_graphs)

    def retire(self, runners: Iterable[Any], reason: str) -> None:
        """Runners dropped with their inference copies (``reason``: why): keep their counters, and count
        one invalidation where they held graphs, failures or pending captures."""
        had_graphs = False
        with self._lock:
            for runner in runners:
                info = runner.info()
                had_graphs |= bool(info["graphs"] or info["failures"] or info["pending"])
                for k in _COUNTERS:
                    self.totals[k] += info[k]
            if had_graphs:
                self.totals["invalidations"] += 1
                self.totals["last_invalidation"] = reason

    def merged_info(self, infos: list[dict[str, Any]]) -> dict[str, Any]:
        """The runners' ``info()`` (at least one) as one: the lists joined, the counters summed with
        those of retired runners, the latest invalidation reason."""
        merged = dict(infos[0])
        for key in _LISTS:
            merged[key] = [item for i in infos for item in i[key]]
        for key in _COUNTERS:
            merged[key] = self.totals[key] + sum(i[key] for i in infos)
        last = [i["last_invalidation"] for i in infos if i["last_invalidation"]]
        merged["last_invalidation"] = last[-1] if last else self.totals["last_invalidation"]
        return merged

    def __deepcopy__(self, memo: dict[int, Any]) -> GraphState:
        new = GraphState(self._backend, self._max_graphs)
        new.totals = dict(self.totals)
        return new
