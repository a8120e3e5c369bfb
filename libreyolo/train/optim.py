"""Optimizer, learning-rate schedule, weight EMA and gradient clipping for training.

Conventions follow the YOLO trainers (Ultralytics): three parameter groups so weight decay touches only
conv/linear weights, a per-iteration linear warm-up in which biases start high and fall while the other
groups rise from zero, a cosine (or linear) decay to ``lr * lrf``, and an exponential moving average of the
weights whose decay ramps up over the first few thousand updates.
"""
from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from libreyolo.errors import ArgumentError

OPTIMIZERS = ("auto", "SGD", "AdamW")


def _is_norm(module: nn.Module) -> bool:
    # any normalisation layer, including ones defined by a family (LayerNorm2d, RMSNorm...)
    return "norm" in type(module).__name__.lower()


def param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Trainable parameters split into ``weight`` (decayed), ``norm`` (normalisation-layer weights) and
    ``bias`` (every bias); each parameter appears once even when shared between modules."""
    groups: dict[str, list[nn.Parameter]] = {"weight": [], "norm": [], "bias": []}
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            if name.endswith("bias"):
                groups["bias"].append(param)
            elif _is_norm(module):
                groups["norm"].append(param)
            else:
                groups["weight"].append(param)
    return groups


def build_optimizer(model: nn.Module, name: str = "auto", lr: float = 0.01, momentum: float = 0.937,
                    weight_decay: float = 5e-4) -> torch.optim.Optimizer:
    """An optimizer over ``model``'s trainable parameters in up to three groups, each tagged with ``"name"``:
    ``weight`` with ``weight_decay``, ``norm`` and ``bias`` without (decaying them only hurts).

    ``name``: ``"SGD"`` (Nesterov, ``momentum``), ``"AdamW"`` (betas ``(momentum, 0.999)``) or ``"auto"`` (SGD);
    case-insensitive. Each group records ``initial_lr`` for :class:`LRSchedule`.
    """
    choice = {n.lower(): n for n in OPTIMIZERS}.get(str(name).lower())
    if choice is None:
        raise ArgumentError(f"unknown optimizer {name!r}: choose one of {', '.join(OPTIMIZERS)}")
    if choice == "auto":
        choice = "SGD"
    groups = [
        {"params": params, "name": group, "weight_decay": weight_decay if group == "weight" else 0.0,
         "initial_lr": lr}
        for group, params in param_groups(model).items() if params
    ]
    if not groups:
        raise ArgumentError(f"the model ({type(model).__name__}) has no trainable parameters to optimise")
    if choice == "SGD":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))


def _set_momentum(group: dict[str, Any], value: float) -> None:
    if "momentum" in group:
        group["momentum"] = value
    elif "betas" in group:
        group["betas"] = (value, *tuple(group["betas"])[1:])


class LRSchedule:
    """Per-iteration learning rate (and warm-up momentum) for every parameter group of ``optimizer``.

    ``step(global_step)`` (0-based iteration over the whole run) sets, for each group with base rate
    ``initial_lr`` (``lr`` when absent):

    - the scheduled rate ``initial_lr * f(p)``, with ``p = global_step / (epochs * steps_per_epoch - 1)`` and
      ``f`` falling from 1 at the first iteration to ``lrf`` at the last one: a half cosine when ``cos`` else
      a straight line;
    - during the warm-up, the first ``max(warmup_epochs * steps_per_epoch, 100)`` iterations (none when
      ``warmup_epochs <= 0``), a linear ramp from the group's start value to the scheduled rate instead: the
      start is ``warmup_bias_lr`` for the group named ``"bias"`` (see :func:`build_optimizer`) and 0 for the
      others; the momentum (``betas[0]`` for Adam-type optimizers) ramps from ``warmup_momentum`` to
      ``momentum`` at the same time and is held at ``momentum`` afterwards.

    As in the YOLO trainers the decay runs from the first iteration, so the warm-up ends on the scheduled (very
    slightly decayed) rate, and a run shorter than 100 iterations ends while still warming up.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, epochs: int, steps_per_epoch: int, *, lrf: float = 0.01,
                 cos: bool = True, warmup_epochs: float = 3.0, warmup_bias_lr: float = 0.1,
                 warmup_momentum: float = 0.8, momentum: float = 0.937) -> None:
        if int(epochs) < 1 or int(steps_per_epoch) < 1:
            raise ArgumentError(f"LRSchedule needs epochs >= 1 and steps_per_epoch >= 1, got {epochs} and "
                                f"{steps_per_epoch}")
        self.optimizer = optimizer
        self.epochs = int(epochs)
        self.steps_per_epoch = int(steps_per_epoch)
        self.lrf = float(lrf)
        self.cos = bool(cos)
        self.warmup_epochs = float(warmup_epochs)
        self.warmup_bias_lr = float(warmup_bias_lr)
        self.warmup_momentum = float(warmup_momentum)
        self.momentum = float(momentum)
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.last_step = -1

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def warmup_steps(self) -> int:
        if self.warmup_epochs <= 0:
            return 0
        return max(round(self.warmup_epochs * self.steps_per_epoch), 100)

    def factor(self, global_step: int) -> float:
        """The decay factor ``f`` (1 at the first iteration, ``lrf`` at the last)."""
        progress = min(max(global_step / max(self.total_steps - 1, 1), 0.0), 1.0)
        if self.cos:
            return self.lrf + (1.0 - self.lrf) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - (1.0 - self.lrf) * progress

    def step(self, global_step: int) -> list[float]:
        """Set every group's lr (and momentum during warm-up) for iteration ``global_step``; returns the lrs."""
        global_step = int(global_step)
        factor = self.factor(global_step)
        warmup = self.warmup_steps
        in_warmup = global_step < warmup
        for group in self.optimizer.param_groups:
            target = group["initial_lr"] * factor
            if in_warmup:
                start = self.warmup_bias_lr if group.get("name") == "bias" else 0.0
                group["lr"] = start + (target - start) * global_step / warmup
                _set_momentum(group, self.warmup_momentum
                              + (self.momentum - self.warmup_momentum) * global_step / warmup)
            else:
                group["lr"] = target
                _set_momentum(group, self.momentum)
        self.last_step = global_step
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        keys = ("epochs", "steps_per_epoch", "lrf", "cos", "warmup_epochs", "warmup_bias_lr", "warmup_momentum",
                "momentum", "last_step")
        state = {key: getattr(self, key) for key in keys}
        state["initial_lrs"] = [group["initial_lr"] for group in self.optimizer.param_groups]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the settings and position; the groups' rates are re-applied for ``last_step``."""
        for key, value in state.items():
            if key != "initial_lrs":
                setattr(self, key, value)
        initial = state.get("initial_lrs")
        if initial is not None:
            if len(initial) != len(self.optimizer.param_groups):
                raise ArgumentError(f"the LR schedule state has {len(initial)} parameter groups but the optimizer "
                                    f"has {len(self.optimizer.param_groups)}")
            for group, value in zip(self.optimizer.param_groups, initial, strict=True):
                group["initial_lr"] = value
        if self.last_step >= 0:
            self.step(self.last_step)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DataParallel/DistributedDataParallel and ``torch.compile`` wrappers."""
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


class ModelEMA:
    """Exponential moving average of a model's parameters and buffers, kept in fp32.

    After each optimizer step, ``update(model)`` moves every floating-point entry of the state dict towards the
    model's: ``ema = d * ema + (1 - d) * model`` with ``d = decay * (1 - exp(-updates / tau))``, so the average
    follows the fast-changing early weights closely and smooths more as training goes on. Integer buffers
    (e.g. BatchNorm's ``num_batches_tracked``) are copied. ``.module`` is the averaged copy: same device as the
    model, eval mode, no gradients, floating-point tensors in fp32 even when the model is trained under autocast
    (autocast never changes the stored weights) or held in half precision.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000, updates: int = 0) -> None:
        self.module = copy.deepcopy(unwrap_model(model)).float().eval()
        self.module.requires_grad_(False)
        self.decay_max = float(decay)
        self.tau = float(tau)
        self.updates = int(updates)

    @property
    def decay(self) -> float:
        """The decay the next update uses."""
        return self.decay_max * (1.0 - math.exp(-(self.updates + 1) / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        d = self.decay
        self.updates += 1
        averaged, targets, ema_ints, model_ints, cast = self._pairs(unwrap_model(model))
        if ema_ints:
            torch._foreach_copy_(ema_ints, model_ints)  # copy_ semantics: casts and moves as needed
        if cast:  # a model held in half precision (or elsewhere): the average stays fp32 on its device
            targets = [t.to(device=e.device, dtype=e.dtype) for t, e in zip(targets, averaged, strict=True)]
        if averaged:
            torch._foreach_lerp_(averaged, targets, 1.0 - d)  # a few fused launches, not ~1000 small ones

    def _pairs(self, model: nn.Module) -> tuple[Any, ...]:
        """(EMA floats, model floats, EMA integers, model integers, whether floats need a cast),
        matched by state-dict key.

        Built once and reused while the model holds the same parameter and buffer objects (an
        optimizer updates them in place), so a step does not walk two state dicts of ~1000
        entries nor issue one copy per integer buffer; replacing a tensor rebuilds the pairing."""
        current = _state_tensors(model)
        cached = self.__dict__.get("_pair_cache")
        if (cached is not None and cached[0] is model and len(cached[1]) == len(current)
                and all(x is y for x, y in zip(cached[1], current, strict=True))):
            return cached[2]
        source = model.state_dict(keep_vars=True)
        floats_e, floats_m, ints_e, ints_m = [], [], [], []
        for key, ema_value in self.module.state_dict().items():
            value = source[key].detach()
            if ema_value.is_floating_point():
                floats_e.append(ema_value)
                floats_m.append(value)
            else:
                ints_e.append(ema_value)
                ints_m.append(value)
        cast = any(m.dtype != e.dtype or m.device != e.device for e, m in zip(floats_e, floats_m, strict=True))
        pairs = (floats_e, floats_m, ints_e, ints_m, cast)
        self._pair_cache = (model, current, pairs)
        return pairs

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "updates": self.updates, "decay": self.decay_max,
                "tau": self.tau}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state.get("updates", 0))
        self.decay_max = float(state.get("decay", self.decay_max))
        self.tau = float(state.get("tau", self.tau))


def _state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The model's parameters and buffers, in a fixed order (identity of the state-dict tensors)."""
    return [*model.parameters(), *model.buffers()]


def clip_gradients(model: nn.Module, max_norm: float = 10.0) -> float:
    """Scale the gradients so their global L2 norm is at most ``max_norm``; returns the norm before clipping.

    A non-finite norm (inf/nan, e.g. an fp16 overflow) is returned as is and the gradients are left untouched:
    the caller should skip that optimizer step (``torch.amp.GradScaler.step`` does so by itself). With a
    GradScaler, call ``scaler.unscale_(optimizer)`` first so the norm is measured on the true gradients.
    Returns 0.0 when no parameter has a gradient.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
    if torch.isfinite(norm):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return float(norm)
