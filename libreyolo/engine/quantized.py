"""The quantization part of the eager model (docs/quantization.md): :class:`Quantization`, behind the
model's ``quantize()`` / ``dequantize()`` / ``quant_info()`` and its quantized checkpoints.

Quantization is simulated: the master network's Conv2d/Linear layers fake-quantize their inputs
and weights (:mod:`libreyolo.quant.simulate`), so ``predict()`` shows INT8/FP8 numerics in
eager PyTorch. Both switches retire the inference copies and their CUDA graphs, as a weight
change does.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from libreyolo.errors import ArgumentError
from libreyolo.quant import simulate
from libreyolo.quant.calibrate import CALIB_BATCH, calibration_images, collect_ranges
from libreyolo.quant.options import QUANT_OPTIONS
from libreyolo.utils.log import LOGGER

ATTENTION_NOTE = ("attention score paths (q @ k^T, softmax, @ v) are not Conv2d/Linear layers: "
                  "they stay in float")


def _patterns(exclude: Any) -> tuple[str, ...]:
    if exclude is None:
        return ()
    items = [exclude] if isinstance(exclude, str) else exclude
    if not isinstance(items, Sequence) or not all(isinstance(p, str) and p for p in items):
        raise ArgumentError(f"exclude must be a module-name glob or a list of them (e.g. 'head.*'), got {exclude!r}")
    return tuple(items)


class Quantization:
    """The simulated-quantization state of one model (a part of :class:`~libreyolo.engine.model.Model`,
    usable alone): the recipe, method, sample count and excluded layers of the last calibration, or
    None for a float model. The switches act on the master network given to them and retire its
    inference copies (``copies``: :class:`~libreyolo.engine.inference.InferenceCopies`), as a weight
    change does."""

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None  # recipe, method, samples, excluded layers; None: float

    @property
    def active(self) -> bool:
        return self.state is not None

    def quantize(self, net: nn.Module, copies: Any, batches: Callable[[list], Iterator[torch.Tensor]], *,
                 family_exclude: Sequence[str] = (), recipe: str = "int8", data: Any = None, samples: int = 256,
                 method: str = "minmax", exclude: str | Sequence[str] | None = None) -> None:
        """Calibrate ``net`` on ``samples`` images of ``data`` (``batches(files)``: them preprocessed)
        and switch its Conv2d/Linear layers to simulated ``recipe`` numerics; ``family_exclude`` and
        ``exclude``: module-name globs kept in float. A quantized network is calibrated again from float."""
        opts = {k: QUANT_OPTIONS[k].check(k, v) for k, v in
                (("recipe", recipe), ("data", data), ("samples", samples), ("method", method))}
        patterns = _patterns(exclude)
        files, origin = calibration_images(opts["data"])
        files = files[:opts["samples"]]
        if len(files) < opts["samples"]:
            LOGGER.warning("quantize: %s has %d images, fewer than samples=%d; calibrating on all of them",
                           origin, len(files), opts["samples"])
        with copies.mutating():
            if simulate.remove(net):  # calibrate again from the float model
                self.state = None
                copies.invalidate("dequantized (quantize() called again)")
            layers, excluded = simulate.select_layers(net, tuple(family_exclude), patterns)
            ranges = collect_ranges(net, layers, lambda: batches(files), opts["method"])
            for name in layers:
                if name not in ranges:
                    excluded[name] = "not reached by the forward during calibration"
            for name, module in layers.items():
                if name in ranges:
                    simulate.apply(module, opts["recipe"], simulate.input_quant(*ranges[name], opts["recipe"]),
                                   simulate.weight_scale(module.weight, opts["recipe"]))
            self.state = {"recipe": opts["recipe"], "method": opts["method"], "samples": len(files),
                          "excluded": excluded}
            copies.invalidate(f"quantized ({opts['recipe']}, {opts['method']})")

    def dequantize(self, net: nn.Module, copies: Any) -> None:
        """``net`` back to float, exactly as before :meth:`quantize`."""
        with copies.mutating():
            if simulate.remove(net):
                copies.invalidate("dequantized")
            self.state = None

    def info(self, net: nn.Module) -> dict[str, Any] | None:
        """recipe, method, samples, the quantized layer names and count, the excluded names with
        the reason, and notes; None for a float model."""
        q = self.state
        if q is None:
            return None
        names = list(simulate.simulated_layers(net))
        return {"recipe": q["recipe"], "method": q["method"], "samples": q["samples"], "layers": names,
                "count": len(names), "excluded": dict(q["excluded"]), "notes": [ATTENTION_NOTE]}

    def entry(self, net: nn.Module) -> dict[str, Any] | None:
        """The checkpoint's ``quantization`` entry (None for a float model)."""
        q = self.state
        return None if q is None else simulate.to_entry(net, q)

    def restore(self, net: nn.Module, copies: Any, entry: Any, where: str) -> None:
        """Quantize ``net`` as a checkpoint's ``quantization`` entry says (checked: ``where`` names it)."""
        with copies.mutating():
            self.state = simulate.from_entry(net, entry, where)
            copies.invalidate("quantized (loaded from the checkpoint)")


def calibration_batches(pre: Any, device: torch.device, files: list) -> Iterator[torch.Tensor]:
    """The calibration images, preprocessed by ``pre`` (predict()'s letterbox at the model's imgsz) in float32."""
    from libreyolo.data.sources import load_sources

    for i in range(0, len(files), CALIB_BATCH):
        images = load_sources([str(f) for f in files[i:i + CALIB_BATCH]])
        batch, _ = pre([img.to_device(device) for img in images], dtype=torch.float32)
        yield batch
