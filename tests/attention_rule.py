"""Rule 2 of the kernels design, as code: a family's attention runs fused SDPA by default only
if that is byte-exact against its manual matmul-softmax-matmul path (docs/kernels.md, "Fused
attention (SDPA)"). ViT and DeiT are the documented exception: fused by upstream convention.

Shared by ``tests/test_fused_attention_rule.py`` (small inputs, CPU and GPU) and
``bench/attention_bench.py`` (typical inputs, H200): a seeded network per family, probe inputs
of several distributions, and the fused-against-manual comparison of the whole output and of
every attention module on the inputs it saw.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from libreyolo.kernels.attention import set_fused_attention
from libreyolo.models.registry import families

# fused by default although not byte-exact: timm and the reference library run SDPA there
FUSED_BY_CONVENTION = frozenset({"vit", "deit"})

# every family whose attention modules carry a switchable ``fused_attn`` flag; the DETR families'
# flag is on the self-attention (decoder) and the encoder's attention, not on deformable attention
ATTENTION_FAMILIES = ("vit", "deit", "swin", "segformer", "swinir", "rtdetr", "dfine", "rtdetrv2", "deimv2", "rfdetr",
                      "lwdetr", "deim", "rtdetrv4")


def rule_violation(family: str, diff: float, default: bool) -> str | None:
    """Why ``family``'s default breaks the rule, or None when it follows it.

    ``diff``: the max abs difference fused against manual (0.0 means byte-exact; NaN is not);
    ``default``: whether the family's attention is fused after build.
    """
    if not default or family in FUSED_BY_CONVENTION:
        return None
    if diff == 0.0:
        return None
    return (f"{family} defaults to fused attention, but fused is not byte-exact against manual "
            f"(max abs difference {diff:.3g}); set its modules' fused_attn default to False, or add "
            f"it to the documented exceptions {sorted(FUSED_BY_CONVENTION)}")


def attention_modules(net: nn.Module) -> list[nn.Module]:
    """The modules :func:`set_fused_attention` switches (a boolean ``fused_attn``)."""
    return [m for m in net.modules() if isinstance(getattr(m, "fused_attn", None), bool)]


def default_fused(net: nn.Module) -> bool:
    """The family default: every attention module's flag, which must all agree."""
    flags = {m.fused_attn for m in attention_modules(net)}
    if len(flags) != 1:
        raise AssertionError(f"attention modules disagree on their fused_attn default: {flags}")
    return flags.pop()


def seeded_net(family: str, size: str, seed: int = 0, calibration: torch.Tensor | None = None) -> nn.Module:
    """An untrained ``family``/``size`` network in eval mode with a trained network's spread.

    Parameters: std 1/sqrt(fan_in), norm scales 0.8-1.2, biases and relative-position tables
    0.1 * N(0, 1), so attention is far from uniform. Buffers (SwinIR's stored shift masks, DETR
    anchors) and integer parameters (DEIMv2's int64 ``reg_scale``) are left as built. BatchNorm
    statistics are measured on ``calibration`` if given.
    """
    net = families()[family].build(size, 10)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if not p.is_floating_point():
                continue
            noise = torch.randn(p.shape, generator=g)
            if p.ndim > 1 and "relative_position_bias_table" not in name:
                p.copy_(noise / math.sqrt(p[0].numel()))
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.2 * (torch.rand(p.shape, generator=g) - 0.5))
            else:
                p.copy_(0.1 * noise)
        norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if calibration is not None and norms:
            for m in norms:
                m.reset_running_stats()
                m.momentum = None  # cumulative average over the calibration batch
                m.train()
            net(calibration)
            for m in norms:
                m.momentum = 0.1
    return net.eval()


def probe_batch(imgsz: int, seed: int = 0, *, large: bool = True) -> dict[str, torch.Tensor]:
    """One (1, 3, imgsz, imgsz) input per distribution, RGB in the network's [0, 1] range, plus
    (``large``) a large-magnitude one (x 100: large logits, where fused kernels' softmax rounding
    shows). Leave it out in float16: it overflows the DETR backbones, whose BatchNorm statistics
    are measured on [0, 1] inputs, before any attention runs."""
    g = torch.Generator().manual_seed(seed)
    shape = (1, 3, imgsz, imgsz)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, imgsz), torch.linspace(0, 1, imgsz), indexing="ij")
    probes = {
        "uniform": torch.rand(shape, generator=g),
        "normal": (0.5 + 0.25 * torch.randn(shape, generator=g)).clamp(0, 1),
        "ramp": (0.5 + 0.5 * torch.sin(6.28 * (2 * xx + 3 * yy)))[None, None].expand(shape).clone(),
    }
    large_probe = 100.0 * torch.rand(shape, generator=g)
    return {**probes, "large": large_probe} if large else probes


def tensors(out: Any) -> Iterator[torch.Tensor]:
    """Every tensor of a network output (tensor, dict, list or tuple, nested), in a fixed order."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for key in sorted(out):
            yield from tensors(out[key])
    elif isinstance(out, (list, tuple)):
        for item in out:
            yield from tensors(item)


def max_abs_diff(a: Any, b: Any) -> float:
    """Max abs difference over every tensor of two outputs (NaN if either holds a NaN there)."""
    worst = 0.0
    for x, y in zip(tensors(a), tensors(b), strict=True):
        if x.shape != y.shape:
            raise AssertionError(f"outputs differ in shape: {tuple(x.shape)} against {tuple(y.shape)}")
        if x.dtype == torch.bool or not x.is_floating_point():
            worst = max(worst, 0.0 if torch.equal(x, y) else math.inf)
            continue
        d = float((x.float() - y.float()).abs().max()) if x.numel() else 0.0
        worst = d if math.isnan(d) else max(worst, d)
        if math.isnan(worst):
            return worst
    return worst


def outputs_equal(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(tensors(a), tensors(b), strict=True))


@dataclass
class PathComparison:
    """Fused against manual on one input: whole output, and each attention module alone."""

    manual: Any
    fused: Any
    output_diff: float
    module_diffs: list[float] = field(default_factory=list)

    @property
    def byte_exact(self) -> bool:
        return outputs_equal(self.manual, self.fused)

    @property
    def worst_module_diff(self) -> float:
        return max(self.module_diffs, default=0.0)


def compare_paths(net: nn.Module, x: torch.Tensor) -> PathComparison:
    """Run ``net`` on ``x`` with every attention module manual, then fused; each attention module is
    also run fused alone on the inputs it saw in the manual run, so its own difference is not
    mixed with what reached it. The flags are restored to what they were."""
    modules = attention_modules(net)
    saved = [m.fused_attn for m in modules]
    seen: list[tuple[nn.Module, tuple, dict]] = []
    hooks = [m.register_forward_hook(lambda m, a, k, o: seen.append((m, a, k)), with_kwargs=True)
             for m in modules]
    try:
        with torch.inference_mode():
            set_fused_attention(net, False)
            manual = net(x)
            for h in hooks:
                h.remove()
            hooks = []
            module_diffs = []
            for module, args, kwargs in seen:
                module.fused_attn = False
                ref = module(*args, **kwargs)
                module.fused_attn = True
                module_diffs.append(max_abs_diff(ref, module(*args, **kwargs)))
            set_fused_attention(net, True)
            fused = net(x)
    finally:
        for h in hooks:
            h.remove()
        for m, flag in zip(modules, saved, strict=True):
            m.fused_attn = flag
    return PathComparison(manual, fused, max_abs_diff(manual, fused), module_diffs)
