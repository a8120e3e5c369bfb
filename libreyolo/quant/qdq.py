"""The export view of a quantized network: QuantizeLinear / DequantizeLinear with quantize()'s scales.

:func:`export_view` copies a simulated network (:mod:`libreyolo.quant.simulate`) and replaces
every simulated layer by a module that an exporter writes as standard QDQ operators:

- the layer input: ``QuantizeLinear -> DequantizeLinear`` with the layer's per-tensor int8 scale
  and zero point (ONNX rounds half to even and saturates, as the reference fake quantization);
- the weight: int8 codes ``q = clamp(round(w / s_c), -127, 127)`` (the reference per-channel
  codes, computed by the same float32 operations) stored as an int8 tensor, and a
  ``DequantizeLinear`` with the per-output-channel scales (axis 0).

A ``ConvBNAct`` whose convolution is simulated has its BatchNorm folded into the codes' scales:
``gamma_c / sqrt(var_c + eps) * (q * s_c) = q * s'_c``, with ``s'_c = s_c * gamma_c / sqrt(var_c +
eps)`` (float64, rounded once) and the sign of a negative ``s'_c`` moved into the codes, so the
artifact holds exactly the integer codes the simulation uses; only float rounding of the scale
and bias differs (as in any folded float export). In eager PyTorch the view computes the same
numbers through the reference functions, so it can also be traced by other exporters.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from libreyolo.quant.fake_quant import INT8_SYMMETRIC_MAX, fake_quant_int8_affine
from libreyolo.quant.simulate import _TINY, QuantConv2d, QuantLinear, simulated_layers


class _QDQ(torch.autograd.Function):
    """Per-tensor affine int8 quantize + dequantize of an activation."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
        return fake_quant_int8_affine(x, scale, zero_point.to(torch.float32))

    @staticmethod
    def symbolic(g: Any, x: Any, scale: Any, zero_point: Any) -> Any:
        # scale and zero point are the layer's named buffers: initializers the validator reads back
        return g.op("DequantizeLinear", g.op("QuantizeLinear", x, scale, zero_point), scale, zero_point)


class _DequantWeight(torch.autograd.Function):
    """int8 codes times per-channel scales (axis 0)."""

    @staticmethod
    def forward(ctx: Any, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        view = (-1,) + (1,) * (codes.dim() - 1)
        return codes.to(torch.float32) * scale.reshape(view)

    @staticmethod
    def symbolic(g: Any, codes: Any, scale: Any) -> Any:
        channels = codes.type().sizes()[0]
        z = g.op("Constant", value_t=torch.zeros(channels, dtype=torch.int8))
        return g.op("DequantizeLinear", codes, scale, z, axis_i=0)


# the buffers of a QDQ layer that hold quantize()'s parameters, read back from the artifact by
# :func:`libreyolo.export.int8.check_parameters` (their names are the artifact's initializer names)
QDQ_PARAMETERS = ("weight_codes", "weight_scale", "input_scale", "input_zero_point")


def expected_parameters(view: nn.Module) -> dict[str, torch.Tensor]:
    """``{module.buffer: tensor}`` of every QDQ layer of an :func:`export_view`."""
    return {f"{name}.{k}": getattr(m, k).detach().cpu() for name, m in view.named_modules()
            if isinstance(m, _QDQLayer) for k in QDQ_PARAMETERS}


class _QDQLayer(nn.Module):
    """Shared by the QDQ convolution and linear layer: codes, scales, the input quantizer."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 input_scale: float, input_zero_point: int) -> None:
        super().__init__()
        self.register_buffer("weight_codes", codes.to(torch.int8))
        self.register_buffer("weight_scale", scale.to(torch.float32))
        self.register_buffer("bias", None if bias is None else bias.to(torch.float32))
        self.register_buffer("input_scale", torch.tensor(float(input_scale), dtype=torch.float32))
        self.register_buffer("input_zero_point", torch.tensor(int(input_zero_point), dtype=torch.int8))

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # .half()/.double() must not touch the codes or the scales: they are the artifact's int8 data
        kept = {k: self._buffers.pop(k) for k in QDQ_PARAMETERS}
        try:
            return super()._apply(fn, recurse)
        finally:
            device = self.bias.device if self.bias is not None else kept["weight_codes"].device
            for k, v in kept.items():
                self._buffers[k] = v.to(device)

    def _inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        x = _QDQ.apply(x, self.input_scale, self.input_zero_point)
        w = _DequantWeight.apply(self.weight_codes, self.weight_scale)
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        b = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        return x, w, b


class QDQConv2d(_QDQLayer):
    def __init__(self, conv: nn.Conv2d, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 input_scale: float, input_zero_point: int) -> None:
        super().__init__(codes, scale, bias, input_scale, input_zero_point)
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups
        if conv.padding_mode != "zeros":
            raise NotImplementedError(f"padding_mode={conv.padding_mode!r} is not exported in int8")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, w, b = self._inputs(x)
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, self.groups)


class QDQLinear(_QDQLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, w, b = self._inputs(x)
        return F.linear(x, w, b)


def weight_codes(module: nn.Module) -> torch.Tensor:
    """The simulated layer's int8 weight codes, by the reference function's float32 operations."""
    w = module.weight.detach().float()
    s = module.quant_weight_scale.reshape((-1,) + (1,) * (w.dim() - 1))
    return torch.round(w / s).clamp(-INT8_SYMMETRIC_MAX, INT8_SYMMETRIC_MAX)


def _folded(module: nn.Module, bn: nn.BatchNorm2d | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    codes, scale = weight_codes(module), module.quant_weight_scale.detach().double()
    bias = None if module.bias is None else module.bias.detach().double()
    if bn is not None:
        factor = bn.running_var.detach().double().add(bn.eps).rsqrt()
        if bn.weight is not None:
            factor = factor * bn.weight.detach().double()
        shift = -bn.running_mean.detach().double() * factor
        if bn.bias is not None:
            shift = shift + bn.bias.detach().double()
        bias = shift if bias is None else shift + bias * factor
        scale = scale * factor
        sign = torch.where(scale < 0, -1.0, 1.0)
        codes = codes * sign.to(codes.dtype).reshape((-1,) + (1,) * (codes.dim() - 1))
        scale = scale.abs()
        zero = scale == 0  # a channel BatchNorm multiplies by 0: its output is the bias alone
        codes[zero] = 0
        scale = torch.where(zero, torch.full_like(scale, _TINY), scale)
    return codes, scale.float(), None if bias is None else bias.float()


def export_view(net: nn.Module) -> nn.Module:
    """A copy of the simulated ``net`` with QDQ layers (BatchNorm folded into quantized convolutions)."""
    from libreyolo.layers.conv import ConvBNAct

    view = copy.deepcopy(net).float().eval()
    folded: dict[int, nn.BatchNorm2d] = {}
    for block in view.modules():
        if (isinstance(block, ConvBNAct) and type(block.conv) is QuantConv2d and isinstance(block.bn, nn.BatchNorm2d)
                and block.bn.running_var is not None):
            folded[id(block.conv)] = block.bn
            block.bn = nn.Identity()
    for name, module in simulated_layers(view).items():
        if module.quant_recipe != "int8":
            raise NotImplementedError(f"layer {name!r} is simulated in {module.quant_recipe}, which no artifact "
                                      "runs; only int8 is exported")
        codes, scale, bias = _folded(module, folded.get(id(module)))
        args = (codes, scale, bias, float(module.quant_input_scale), int(module.quant_input_zero_point))
        new = QDQConv2d(module, *args) if isinstance(module, QuantConv2d) else QDQLinear(*args)
        assert isinstance(module, (QuantConv2d, QuantLinear))
        parent_name, _, child = name.rpartition(".")
        setattr(view.get_submodule(parent_name) if parent_name else view, child, new)
    return view
