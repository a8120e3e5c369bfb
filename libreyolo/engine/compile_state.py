"""The torch.compile part of the eager model: :class:`Compilation` holds what ``model.compile()`` asked
for and the counters of compiled programs retired, and finds (or makes) the compiled program of an
inference copy (:class:`~libreyolo.engine.compiled.CompiledForward`, attached to the copy, released
with it). Usable alone (tests/test_model_parts.py); docs/inference.md."""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from libreyolo.engine.graphed import COMPILED, COMPILED_IN_GRAPH, GRAPHS_COMPILED
from libreyolo.engine.inference import InferenceCopy


class Compilation:
    """``mode``: False (off), True (torch.compile's default choice per device) or a mode name,
    checked by :meth:`set_mode`."""

    def __init__(self) -> None:
        self.mode: bool | str = False
        self.totals: dict[str, Any] = {"retired": 0, "last_retired": None}
        self._lock = threading.Lock()

    @property
    def on(self) -> bool:
        return self.mode is not False

    def set_mode(self, mode: bool | str, copies: Iterable[InferenceCopy] = ()) -> None:
        """Check ``mode`` and switch to it; the compiled programs (and the graphs holding them) of the
        live ``copies`` are dropped when it changes."""
        from libreyolo.engine.options import COMPILE_OPTION

        mode = COMPILE_OPTION.check("compile", mode)
        if mode != self.mode:
            self.mode = mode
            for c in copies:
                for name in (COMPILED, GRAPHS_COMPILED, COMPILED_IN_GRAPH):
                    c.detach(name)

    def program(self, copy: InferenceCopy, family: Any, *, in_graph: bool = False) -> Any:
        """The copy's :class:`~libreyolo.engine.compiled.CompiledForward`, or None when compile is off;
        ``in_graph``: the one our CUDA graphs capture (a mode without Inductor's CUDA graphs)."""
        requested = self.mode
        if requested is False:
            return None
        from libreyolo.engine.compiled import CompiledForward, in_graph_mode, resolve_mode

        device = copy.key.device
        mode = resolve_mode(requested, device)
        name = COMPILED_IN_GRAPH if in_graph else COMPILED
        if in_graph:
            mode = in_graph_mode(mode)
        found = copy.attached(name, lambda module: CompiledForward(module, family, device, mode))
        if found.mode != mode:  # switched by compile() in another thread meanwhile
            copy.detach(name)
            found = copy.attached(name, lambda module: CompiledForward(module, family, device, mode))
        return found

    def retire(self, copies: Iterable[InferenceCopy], reason: str) -> None:
        """Copies were dropped (``reason``: why): count those that held a compiled program."""
        with self._lock:
            for c in copies:
                if c.attachment(COMPILED) is not None or c.attachment(COMPILED_IN_GRAPH) is not None:
                    self.totals["retired"] += 1
                    self.totals["last_retired"] = reason

    def info(self, copies: Iterable[InferenceCopy]) -> dict[str, Any]:
        """``compile_info()``: the mode, the rule for ``cuda_graph=True``, per live copy its programs, and
        the retired count."""
        from libreyolo.engine.compiled import CUDA_GRAPH_RULE

        found_programs = []
        for c in copies:
            for name, used_by in ((COMPILED, "predict(cuda_graph=False)"), (COMPILED_IN_GRAPH, "CUDA graphs")):
                found = c.attachment(name)
                if found is not None:
                    found_programs.append({**c.key.describe(), "used_by": used_by, **found.info()})
        return {"mode": self.mode, "cuda_graph": CUDA_GRAPH_RULE, "copies": found_programs,
                "retired": self.totals["retired"], "last_retired": self.totals["last_retired"]}

    def __deepcopy__(self, memo: dict[int, Any]) -> Compilation:
        new = Compilation()
        new.mode, new.totals = self.mode, dict(self.totals)
        return new
