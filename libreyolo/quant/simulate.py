"""Simulated (fake-quantized) Conv2d and Linear layers, and the checkpoint entry that describes them.

A quantized layer keeps its float weight untouched; its class is switched to a subclass whose
forward fake-quantizes the input and the weight (through the kernel registry, so the fastest
implementation proven equal to :mod:`libreyolo.quant.fake_quant` runs) before the float
convolution or matmul. Switching the class back (:func:`remove`) gives the float layer again,
bit for bit. State-dict keys do not change: the scales and zero points are non-persistent
float32 buffers (they follow the weight's device but never its dtype), saved in the
checkpoint's own ``quantization`` entry (:func:`to_entry`).

Recipes: ``int8``: weights symmetric int8 per output channel (``scale = max|w_c| / 127``),
inputs affine int8 per tensor (``scale = (high - low) / 255``, ``zero_point = round(-128 -
low / scale)``). ``fp8``: weights and inputs FP8 E4M3, one scale per tensor (``amax / 448``);
simulation only (no kernel runs FP8 here).
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from libreyolo import kernels
from libreyolo.errors import ArgumentError, CheckpointError
from libreyolo.quant.fake_quant import FP8_E4M3_MAX, INT8_AFFINE_RANGE, INT8_SYMMETRIC_MAX
from libreyolo.quant.options import RECIPES

SCHEMA = 1
_TINY = 1e-12  # a scale for an all-zero channel or tensor (any positive value codes zero exactly)


@dataclass(frozen=True)
class InputQuant:
    input_scale: float
    input_zero_point: int


class _Simulated:
    """Mixed into nn.Conv2d / nn.Linear by :func:`apply`; ``_float_forward(x, w)`` is the layer's op."""

    quant_recipe: str
    quant_weight_scale: torch.Tensor  # (out_channels,) int8, (1,) fp8
    quant_input_scale: torch.Tensor  # 0-dim tensors, so that no host value is copied per call
    quant_input_zero_point: torch.Tensor  # (a CUDA graph could not capture that copy)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # the scales are calibration constants: they follow the weight's device but stay float32
        # (a float16 inference copy would otherwise round them, and flush the tiny ones to zero)
        kept = {k: self._buffers.pop(k) for k in _QUANT_BUFFERS}
        try:
            result = super()._apply(fn, recurse)
        finally:
            for k, v in kept.items():
                self._buffers[k] = v.to(self.weight.device, torch.float32)
        return result

    def _quantized_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ws, xs = self.quant_weight_scale, self.quant_input_scale
        if self.quant_recipe == "fp8":
            return (kernels.call("fake_quant_fp8", x, xs),
                    kernels.call("fake_quant_fp8", self.weight, ws.reshape(())))
        return (kernels.call("fake_quant_int8_affine", x, xs, self.quant_input_zero_point),
                kernels.call("fake_quant_int8_per_channel", self.weight, ws, 0))


class QuantConv2d(_Simulated, nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, w = self._quantized_inputs(x)
        return self._conv_forward(x, w, self.bias)


class QuantLinear(_Simulated, nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, w = self._quantized_inputs(x)
        return F.linear(x, w, self.bias)


_QUANT_BUFFERS = ("quant_weight_scale", "quant_input_scale", "quant_input_zero_point")
_SIMULATED = {nn.Conv2d: QuantConv2d, nn.Linear: QuantLinear}
_FLOAT = {v: k for k, v in _SIMULATED.items()}


# --- which layers -------------------------------------------------------------------------------
def select_layers(net: nn.Module, family_patterns: tuple[str, ...], user_patterns: tuple[str, ...]
                  ) -> tuple[dict[str, nn.Module], dict[str, str]]:
    """The plain Conv2d/Linear layers to quantize and ``{excluded name: reason}``."""
    candidates = {n: m for n, m in net.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    for pattern in user_patterns:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in candidates):
            example = next(iter(candidates), "")
            raise ArgumentError(f"exclude pattern {pattern!r} matches no Conv2d/Linear layer; patterns are globs "
                                f"over module names such as {example!r} (see model.quant_info()['layers'])")
    chosen: dict[str, nn.Module] = {}
    excluded: dict[str, str] = {}
    for name, module in candidates.items():
        fam = next((p for p in family_patterns if fnmatch.fnmatchcase(name, p)), None)
        user = next((p for p in user_patterns if fnmatch.fnmatchcase(name, p)), None)
        if fam is not None:
            excluded[name] = f"family default (quant_exclude {fam!r})"
        elif user is not None:
            excluded[name] = f"exclude= pattern {user!r}"
        elif type(module) not in _SIMULATED:
            excluded[name] = f"{type(module).__name__} is not a plain Conv2d/Linear (its owner may bypass forward)"
        else:
            chosen[name] = module
    return chosen, excluded


# --- scales ---------------------------------------------------------------------------------------
def weight_scale(weight: torch.Tensor, recipe: str) -> torch.Tensor:
    w = weight.detach().float()
    if recipe == "fp8":
        return (w.abs().max() / FP8_E4M3_MAX).clamp_min(_TINY).reshape(1)
    return (w.abs().reshape(w.shape[0], -1).amax(1) / INT8_SYMMETRIC_MAX).clamp_min(_TINY)


def input_quant(low: float, high: float, recipe: str) -> InputQuant:
    if recipe == "fp8":
        return InputQuant(max(max(abs(low), abs(high)) / FP8_E4M3_MAX, _TINY), 0)
    qmin, qmax = INT8_AFFINE_RANGE
    scale = max((high - low) / (qmax - qmin), _TINY)
    zero_point = int(min(max(round(qmin - low / scale), qmin), qmax))
    return InputQuant(float(scale), zero_point)


# --- switching ------------------------------------------------------------------------------------
def apply(module: nn.Module, recipe: str, inputs: InputQuant, w_scale: torch.Tensor) -> None:
    """Make ``module`` (a plain Conv2d/Linear) a simulated layer, in place."""
    module.__class__ = _SIMULATED[type(module)]
    module.quant_recipe = recipe
    device = module.weight.device
    values = (w_scale, torch.tensor(inputs.input_scale), torch.tensor(float(inputs.input_zero_point)))
    for name, value in zip(_QUANT_BUFFERS, values, strict=True):
        module.register_buffer(name, value.to(device, torch.float32), persistent=False)


def remove(net: nn.Module) -> int:
    """Turn every simulated layer of ``net`` back into its float class; returns how many."""
    count = 0
    for module in net.modules():
        if type(module) in _FLOAT:
            module.__class__ = _FLOAT[type(module)]
            for name in _QUANT_BUFFERS:
                del module._buffers[name]
            del module.quant_recipe
            count += 1
    return count


def simulated_layers(net: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in net.named_modules() if type(m) in _FLOAT}


# --- the checkpoint entry --------------------------------------------------------------------------
def to_entry(net: nn.Module, info: dict[str, Any]) -> dict[str, Any]:
    """The versioned ``quantization`` entry of a checkpoint (docs/quantization.md)."""
    layers = {n: {"weight_scale": m.quant_weight_scale.detach().to("cpu", torch.float32, copy=True),
                  "input_scale": float(m.quant_input_scale),
                  "input_zero_point": int(m.quant_input_zero_point)}
              for n, m in simulated_layers(net).items()}
    return {"schema": SCHEMA, "recipe": info["recipe"], "method": info["method"], "samples": int(info["samples"]),
            "layers": layers, "excluded": [{"name": n, "reason": r} for n, r in info["excluded"].items()]}


def from_entry(net: nn.Module, entry: Any, where: str) -> dict[str, Any]:
    """Apply a checkpoint's ``quantization`` entry to ``net``; returns the quant_info fields."""
    if not isinstance(entry, dict) or entry.get("schema") != SCHEMA:
        got = entry.get("schema") if isinstance(entry, dict) else type(entry).__name__
        raise CheckpointError(f"{where}: 'quantization' entry has schema {got!r}; this version reads schema {SCHEMA}")
    recipe, layers = entry.get("recipe"), entry.get("layers")
    if recipe not in RECIPES or not isinstance(layers, dict):
        raise CheckpointError(f"{where}: 'quantization' entry has recipe {recipe!r} (known: {', '.join(RECIPES)}) "
                              "or no 'layers' mapping")
    modules = dict(net.named_modules())
    excluded = {e["name"]: e["reason"] for e in entry.get("excluded", []) if isinstance(e, dict) and "name" in e}
    # complete: quantize() puts every Conv2d/Linear in 'layers' or 'excluded', so one in neither
    # means the entry was cut or emptied (the model would load with float layers believed INT8)
    missing = [n for n, m in modules.items() if isinstance(m, (nn.Conv2d, nn.Linear))
               and n not in layers and n not in excluded]
    if missing:
        raise CheckpointError(f"{where}: the 'quantization' entry is incomplete: {len(missing)} Conv2d/Linear "
                              f"layer(s) of the network are neither in its 'layers' ({len(layers)} entries) nor "
                              f"excluded, e.g. {missing[0]!r}; it was cut or edited. Quantize the model again "
                              "(model.quantize(data=...)) and save it")
    for name, spec in layers.items():
        module = modules.get(name)
        if type(module) not in _SIMULATED:
            raise CheckpointError(f"{where}: quantized layer {name!r} is not a Conv2d/Linear of this network")
        ws = spec.get("weight_scale") if isinstance(spec, dict) else None
        want = 1 if recipe == "fp8" else module.weight.shape[0]
        if (not isinstance(ws, torch.Tensor) or not ws.is_floating_point() or ws.numel() != want
                or not bool((ws > 0).all()) or not bool(ws.isfinite().all())):
            raise CheckpointError(f"{where}: layer {name!r} needs {want} positive weight scale(s)")
        scale, zero_point = spec.get("input_scale"), spec.get("input_zero_point")
        if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise CheckpointError(f"{where}: layer {name!r} has input scale {scale!r}; it must be a positive number")
        low, high = INT8_AFFINE_RANGE
        if not isinstance(zero_point, int) or not low <= zero_point <= high:
            raise CheckpointError(f"{where}: layer {name!r} has input zero point {zero_point!r}; it must be an "
                                  f"integer from {int(low)} to {int(high)}")
        apply(module, recipe, InputQuant(float(scale), zero_point), ws.float().reshape(want))
    return {"recipe": recipe, "method": entry.get("method"), "samples": entry.get("samples"), "excluded": excluded}
