"""Hub provider for `ms_deform_attn`: the compiled Deformable DETR CUDA kernel (Apache-2.0).

Loaded at run time through the optional `kernels` package
(`pip install "libreyolo[hub-kernels]"`), pinned to an audited commit of
`kernels-community/deformable-detr`. Nothing is fetched at import: the
`kernels` package is imported and the kernel downloaded on the first call
that is eligible (CUDA, float32, eager, uniform points, bilinear sampling).
`LIBREYOLO_HUB_KERNELS=0` makes the provider decline without uninstalling.

If loading or running fails, the registry disables the provider for the
process, warns once, and the portable path answers. A failed load is
remembered, so the download is not retried on every call.

Not validated in this repository's CI: the machines cannot reach the Hub,
so only the decline and fallback paths are tested.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Sequence
from typing import Any

import torch

from libreyolo.kernels.attention.deformable import (
    SLOT,
    SpatialShapes,
    accelerated_inputs_ok,
    level_start_index,
    uniform_layout,
)
from libreyolo.kernels.context import env_disabled

__all__ = ["ENV_VAR", "HUB_REPO", "HUB_REVISION", "NAME", "HubMsDeformAttn", "PROVIDER", "register"]

NAME = "hub"
ENV_VAR = "LIBREYOLO_HUB_KERNELS"
HUB_REPO = "kernels-community/deformable-detr"
HUB_REVISION = "abfd4042216fa4f84c9c5c4e3e844a3143c70ad5"
_REQUIRED = ("ms_deform_attn_forward", "ms_deform_attn_backward")


def _im2col_step(batch: int) -> int:
    # The kernel processes the batch in chunks that must divide it.
    return batch if batch <= 64 else math.gcd(batch, 64)


class _HubFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel: Any, value, shapes, starts, locs, weights, step: int) -> torch.Tensor:
        ctx.save_for_backward(value, shapes, starts, locs, weights)
        ctx.kernel, ctx.step = kernel, step
        return kernel.ms_deform_attn_forward(value, shapes, starts, locs, weights, step)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        value, shapes, starts, locs, weights = ctx.saved_tensors
        grad_value, grad_locs, grad_weights = ctx.kernel.ms_deform_attn_backward(
            value, shapes, starts, locs, weights, grad.contiguous(), ctx.step
        )
        return None, grad_value, None, None, grad_locs, grad_weights, None


class HubMsDeformAttn:
    """Callable provider; `eligible` is its registry predicate."""

    def __init__(
        self,
        repo: str = HUB_REPO,
        revision: str = HUB_REVISION,
        *,
        package: str = "kernels",
        device_type: str = "cuda",
    ) -> None:
        self.repo, self.revision, self.package, self.device_type = repo, revision, package, device_type
        self._lock = threading.Lock()
        self._kernel: Any = None
        self._error: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self._error is not None

    def load(self) -> Any:
        """Import `kernels` and fetch the pinned kernel (once); raises RuntimeError on failure."""
        with self._lock:
            if self._kernel is not None:
                return self._kernel
            if self._error is None:
                try:
                    hub = importlib.import_module(self.package)
                    kernel = hub.get_kernel(self.repo, revision=self.revision)
                    missing = [name for name in _REQUIRED if not hasattr(kernel, name)]
                    if missing:
                        raise AttributeError(f"the loaded kernel lacks {missing}")
                    self._kernel = kernel
                    return kernel
                except Exception as exc:
                    self._error = exc
            raise RuntimeError(
                f"could not load Hub kernel {self.repo}@{self.revision} through {self.package!r}: "
                f"{self._error!r}. Check network access and the `kernels` install, or set {ENV_VAR}=0."
            ) from self._error

    def eligible(
        self,
        value: object = None,
        spatial_shapes: object = None,
        sampling_locations: object = None,
        attention_weights: object = None,
        *,
        points_per_level: Sequence[int] | None = None,
        discrete: bool = False,
    ) -> bool:
        if env_disabled(ENV_VAR) or self.failed:
            return False
        if self.device_type == "cuda" and not torch.cuda.is_available():
            return False
        if not _package_present(self.package):
            return False
        if value is None:
            return True
        return accelerated_inputs_ok(
            value,
            spatial_shapes,
            sampling_locations,
            attention_weights,
            points_per_level,
            discrete,
            allow_grad=True,
            device_type=self.device_type,
        )

    def __call__(
        self,
        value: torch.Tensor,
        spatial_shapes: SpatialShapes,
        sampling_locations: torch.Tensor,
        attention_weights: torch.Tensor,
        *,
        points_per_level: Sequence[int] | None = None,
        discrete: bool = False,
    ) -> torch.Tensor:
        if discrete:
            raise ValueError("the Hub kernel has no discrete sampling; use ms_deform_attn_portable")
        kernel = self.load()
        value = value.contiguous()
        shapes, locs, weights = uniform_layout(
            value, spatial_shapes, sampling_locations, attention_weights, points_per_level
        )
        starts = level_start_index(shapes)
        return _HubFunction.apply(kernel, value, shapes, starts, locs, weights, _im2col_step(value.shape[0]))


def _package_present(name: str) -> bool:
    from libreyolo.kernels._providers import package_present

    return package_present(name)


PROVIDER = HubMsDeformAttn()


def register() -> None:
    """Register the pinned Hub kernel for `ms_deform_attn` (it loads lazily on first eligible use)."""
    from libreyolo.kernels import _registry

    _registry.register(SLOT, PROVIDER, name=NAME, predicate=PROVIDER.eligible)
