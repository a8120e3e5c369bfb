"""``quantize()`` / ``dequantize()`` / ``quant_info()`` of the eager model (docs/quantization.md).

Quantization is simulated: the master network's Conv2d/Linear layers fake-quantize their inputs
and weights (:mod:`libreyolo.quant.simulate`), so ``predict()`` shows INT8/FP8 numerics in
eager PyTorch. Both switches retire the inference copies and their CUDA graphs, as a weight
change does.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

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


class Quantizable:
    """Mixed into :class:`libreyolo.engine.model.Model`."""

    _quant: dict[str, Any] | None = None  # recipe, method, samples, excluded layers; None: float

    def quantize(self, recipe: str = "int8", data: Any = None, samples: int = 256, method: str = "minmax",
                 exclude: str | Sequence[str] | None = None) -> Any:
        """Calibrate on ``samples`` images of ``data`` and switch to simulated ``recipe`` numerics.

        ``recipe``: ``int8`` or ``fp8``. ``method``: ``minmax``, ``percentile`` or ``entropy``
        (:mod:`libreyolo.quant.calibrate`). ``exclude``: module-name globs kept in float, on top
        of the family's ``quant_exclude``. A quantized model is calibrated again from float.
        Returns the model.
        """
        opts = {k: QUANT_OPTIONS[k].check(k, v) for k, v in
                (("recipe", recipe), ("data", data), ("samples", samples), ("method", method))}
        patterns = _patterns(exclude)
        files, origin = calibration_images(opts["data"])
        files = files[:opts["samples"]]
        if len(files) < opts["samples"]:
            LOGGER.warning("quantize: %s has %d images, fewer than samples=%d; calibrating on all of them",
                           origin, len(files), opts["samples"])
        copies = self._copies()
        with copies.mutating():
            if simulate.remove(self.net):  # calibrate again from the float model
                self._quant = None
                copies.invalidate("dequantized (quantize() called again)")
            layers, excluded = simulate.select_layers(self.net, tuple(self.family.quant_exclude), patterns)
            ranges = collect_ranges(self.net, layers, lambda: self._calibration_batches(files), opts["method"])
            for name in layers:
                if name not in ranges:
                    excluded[name] = "not reached by the forward during calibration"
            for name, module in layers.items():
                if name in ranges:
                    simulate.apply(module, opts["recipe"], simulate.input_quant(*ranges[name], opts["recipe"]),
                                   simulate.weight_scale(module.weight, opts["recipe"]))
            self._quant = {"recipe": opts["recipe"], "method": opts["method"], "samples": len(files),
                           "excluded": excluded}
            copies.invalidate(f"quantized ({opts['recipe']}, {opts['method']})")
        return self

    def dequantize(self) -> Any:
        """Back to the float model, exactly as before :meth:`quantize`. Returns the model."""
        copies = self._copies()
        with copies.mutating():
            if simulate.remove(self.net):
                copies.invalidate("dequantized")
            self._quant = None
        return self

    @property
    def is_quantized(self) -> bool:
        return self._quant is not None

    def quant_info(self) -> dict[str, Any] | None:
        """recipe, method, samples, the quantized layer names and count, the excluded names with
        the reason, and notes; None for a float model."""
        q = self._quant
        if q is None:
            return None
        names = list(simulate.simulated_layers(self.net))
        return {"recipe": q["recipe"], "method": q["method"], "samples": q["samples"], "layers": names,
                "count": len(names), "excluded": dict(q["excluded"]), "notes": [ATTENTION_NOTE]}

    def _quant_entry(self) -> dict[str, Any] | None:
        q = self._quant
        return None if q is None else simulate.to_entry(self.net, q)

    def _restore_quantization(self, entry: Any, where: str) -> None:
        copies = self._copies()
        with copies.mutating():
            self._quant = simulate.from_entry(self.net, entry, where)
            copies.invalidate("quantized (loaded from the checkpoint)")

    def _calibration_batches(self, files: list) -> Iterator[torch.Tensor]:
        """The calibration images, preprocessed exactly as predict() does at ``imgsz`` (float32)."""
        from libreyolo.data.sources import load_sources

        pre = self._preprocessor(self.imgsz)
        for i in range(0, len(files), CALIB_BATCH):
            images = load_sources([str(f) for f in files[i:i + CALIB_BATCH]])
            batch, _ = pre([img.to_device(self.device) for img in images], dtype=torch.float32)
            yield batch
