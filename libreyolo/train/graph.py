"""CUDA-graph capture of the training step: the network's forward and backward, replayed.

What is captured is the family's :meth:`~libreyolo.models.base.Family.train_encode` (the whole
network for YOLO and the classifiers; backbone and encoder for the DETR families, whose decoder
depends on the batch's targets). Loss, assigner or matcher, the decoder of a DETR, optimizer,
EMA, LR schedule and validation stay eager. For each input shape seen ``capture_after`` times:

1. warm-up: three forward+backward passes on a side stream (``torch.autograd.grad``, so no
   parameter's ``.grad`` is touched), letting cuDNN and the allocator settle;
2. two graphs share one memory pool: the forward (static images -> static outputs, autograd
   state kept) and the backward (static output gradients -> parameter gradients, through
   ``torch.autograd.grad``). Both are captured with ``capture_error_mode="thread_local"``, so the
   DataLoader's pin-memory thread may keep calling CUDA while the trainer's thread captures;
3. BatchNorm running statistics (every buffer of the network) are put back to their values
   before warm-up, so the first replay is exactly one eager step.

A replay is a :class:`torch.autograd.Function`: its forward copies the batch into the static
input and replays the forward graph; its backward copies the incoming gradients into the static
gradient buffers, replays the backward graph and returns *copies* of the parameter gradients.
Autograd then accumulates them into ``.grad`` as it would eager gradients, so gradient
accumulation over several batches is correct (returning the static buffers themselves would let
``.grad`` alias them, and the next replay would overwrite an accumulated gradient).

Nothing here stops a run. A capture or replay failure logs one warning and the rest of the run is
eager; :meth:`TrainGraphs.info` reports captured shapes, replays, eager batches and failures.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from libreyolo.utils.log import LOGGER

__all__ = ["GraphStepError", "TrainGraphs", "graph_unavailable", "run_steps", "synthetic_batches"]

WARMUP_STEPS = 3
_CAPTURE_LOCK = threading.Lock()  # one capture at a time per process (several models may train in threads)


class GraphStepError(RuntimeError):
    """A captured training step could not be replayed; the trainer falls back to eager."""


def graph_unavailable(family: Any, device: torch.device, distributed: bool) -> str | None:
    """Why ``cuda_graph=True`` cannot capture this run (one line), or None when it can."""
    if device.type != "cuda":
        return f"cuda_graph=True needs a CUDA device (this run is on {device.type}); training eagerly"
    if distributed:
        return ("cuda_graph=True is not used under distributed training (DDP's gradient all-reduce hooks run "
                "inside backward and are not captured here); training eagerly")
    if getattr(family, "train_capture", None) not in ("network", "encoder"):
        return f"cuda_graph=True: family {family.name!r} has no training capture spec; training eagerly"
    if not torch.cuda.is_available():
        return "cuda_graph=True: CUDA is not available; training eagerly"
    return None


class _Captured:
    """The forward and backward graphs of one input shape, with their static buffers."""

    def __init__(self, family: Any, net: nn.Module, images: torch.Tensor, amp: bool) -> None:
        self.params = [p for p in net.parameters() if p.requires_grad]
        saved = [b.detach().clone() for b in net.buffers()]
        self.static_in = images.detach().clone()

        def encode() -> Any:
            with torch.autocast("cuda", enabled=amp, cache_enabled=False):
                return family.train_encode(net, self.static_in)

        def differentiable(out: Any) -> list[torch.Tensor]:
            return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                outs = differentiable(encode())
                torch.autograd.grad(outs, self.params, grad_outputs=[torch.ones_like(t) for t in outs],
                                    allow_unused=True)
                del outs
        torch.cuda.current_stream().wait_stream(side)

        self.pool = torch.cuda.graph_pool_handle()
        self.fwd = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.fwd, pool=self.pool, capture_error_mode="thread_local"):
            static_out = encode()
        flat, self.spec = tree_flatten(static_out)
        self.flat_out = flat
        self.grad_index = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not self.grad_index:
            raise RuntimeError("train_encode returned no tensor that depends on the parameters")
        self.static_grad_out = [torch.empty_like(flat[i]) for i in self.grad_index]
        self.bwd = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.bwd, pool=self.pool, capture_error_mode="thread_local"):
            grads = torch.autograd.grad([flat[i] for i in self.grad_index], self.params,
                                        grad_outputs=self.static_grad_out, allow_unused=True)
        self.static_grads = list(grads)
        with torch.no_grad():  # warm-up ran the network in train mode: undo its BatchNorm updates
            for b, s in zip(net.buffers(), saved, strict=True):
                b.copy_(s)
        torch.cuda.synchronize()


class _Replay(torch.autograd.Function):
    """Forward: replay the forward graph. Backward: replay the backward graph, return copies."""

    @staticmethod
    def forward(ctx, cap: _Captured, images: torch.Tensor, *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.cap = cap
        cap.static_in.copy_(images)
        cap.fwd.replay()
        return tuple(cap.flat_out[i].detach() for i in cap.grad_index)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cap = ctx.cap
        try:
            for buf, g in zip(cap.static_grad_out, grads, strict=True):
                if g is None:
                    buf.zero_()
                else:
                    buf.copy_(g)
            cap.bwd.replay()
        except Exception as exc:  # surfaced to the trainer, which falls back to eager
            raise GraphStepError(f"backward graph replay failed: {exc}") from exc
        present = [g for g in cap.static_grads if g is not None]
        fresh = iter(torch._foreach_mul(present, 1.0))  # exact copies in a few fused launches, not one per tensor
        return (None, None, *[next(fresh) if g is not None else None for g in cap.static_grads])


class TrainGraphs:
    """``encode(images)``: the family's ``train_encode``, replayed from a CUDA graph once the batch
    shape has repeated ``capture_after`` times (eager before that, and for shapes beyond
    ``max_shapes``)."""

    def __init__(self, family: Any, net: nn.Module, *, amp: bool, capture_after: int = 3, max_shapes: int = 4) -> None:
        self.family, self.net, self.amp = family, net, bool(amp)
        self.capture_after = max(1, int(capture_after))
        self.max_shapes = int(max_shapes)
        self.seen: Counter[tuple] = Counter()
        self.graphs: dict[tuple, _Captured] = {}
        self.captured: list[tuple[int, ...]] = []
        self.replays = 0
        self.eager_batches = 0
        self.failures: list[str] = []
        self.disabled: str | None = None

    def _key(self, images: torch.Tensor) -> tuple:
        return tuple(images.shape), images.dtype, self.amp

    def encode(self, images: torch.Tensor) -> Any:
        net = self.net
        if self.disabled or not net.training or not torch.is_grad_enabled() or images.device.type != "cuda":
            return self._eager(images)
        key = self._key(images)
        cap = self.graphs.get(key)
        if cap is None:
            self.seen[key] += 1
            if self.seen[key] < self.capture_after or len(self.graphs) >= self.max_shapes:
                return self._eager(images)
            try:
                with _CAPTURE_LOCK:
                    cap = _Captured(self.family, net, images, self.amp)
            except Exception as exc:
                self.fail("capture", exc)
                return self._eager(images)
            self.graphs[key] = cap
            self.captured.append(key[0])
            LOGGER.info("training CUDA graph captured for input %s", list(key[0]))
        try:
            outs = _Replay.apply(cap, images, *cap.params)
        except Exception as exc:
            self.fail("replay", exc)
            return self._eager(images)
        self.replays += 1
        flat = list(cap.flat_out)
        for i, t in zip(cap.grad_index, outs, strict=True):
            flat[i] = t
        return tree_unflatten(flat, cap.spec)

    def _eager(self, images: torch.Tensor) -> Any:
        self.eager_batches += 1
        return self.family.train_encode(self.net, images)

    def fail(self, stage: str, exc: BaseException) -> None:
        """Stop using graphs for the rest of the run, with one warning."""
        message = f"{stage}: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        self.failures.append(message)
        if self.disabled is None:
            LOGGER.warning("training CUDA graph %s failed (%s); the rest of the run trains eagerly", stage, message)
        self.disabled = message
        self.graphs.clear()

    def info(self) -> dict[str, Any]:
        return {"captured_shapes": [list(k) for k in self.captured], "replays": self.replays,
                "eager_batches": self.eager_batches, "failures": list(self.failures),
                "capture_after": self.capture_after}


def run_steps(model: Any, batches: list[tuple[torch.Tensor, torch.Tensor]], *, graph: bool, amp: bool = False,
              lr: float = 0.01, capture_after: int = 1) -> dict[str, Any]:
    """A bare training loop (forward, the family's loss, backward, SGD step) over fixed batches, for
    parity checks and step timing: with ``graph`` the encode is replayed from a CUDA graph captured
    after ``capture_after`` sightings of the shape (1: on the first batch, so step 0 is a replay).

    Returns the per-step losses, the network's buffers and gradients after the first step, the final
    parameters and the graph counters (``tests/test_train_graph_gpu.py``, ``bench/train_bench.py``).
    """
    from libreyolo.train.loss import loss_for

    family, net = model.family, model.net
    net.train()
    criterion = loss_for(family.name, model.task, model.nc)
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=lr, momentum=0.9)
    graphs = TrainGraphs(family, net, amp=amp, capture_after=capture_after) if graph else None
    forward = TrainForward(family, net, graphs.encode if graphs else None)
    losses: list[torch.Tensor] = []
    first: dict[str, Any] = {}
    device = next(net.parameters()).device
    for step, (images, targets) in enumerate(batches):
        torch.manual_seed(1000 + step)  # the same random stream for every run (dropout, DETR denoising noise)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, enabled=amp):
            out = forward(images, targets)
        loss, _ = criterion(out, targets)
        loss.backward()
        if not first:
            first = {"buffers": {k: v.detach().clone() for k, v in net.named_buffers()},
                     "grads": {k: p.grad.detach().clone() for k, p in net.named_parameters() if p.grad is not None}}
        opt.step()
        losses.append(loss.detach().clone())
    return {"losses": losses, **first, "params": {k: p.detach().clone() for k, p in net.named_parameters()},
            "graph": graphs.info() if graphs else None}


def synthetic_batches(model: Any, n: int, batch: int, imgsz: int, seed: int = 0,
                      device: str = "cuda") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Seeded synthetic batches in the network's input range: images, and targets of the task."""
    from libreyolo.tasks import get_task

    task = get_task(model.task)
    g = torch.Generator().manual_seed(seed)
    scale = 255.0 * model.family.export.input_scale
    out = []
    for _ in range(n):
        images = torch.rand(batch, 3, imgsz, imgsz, generator=g) * scale
        targets = task.synthetic_batch(model, batch, imgsz, g)
        out.append((images.to(device), targets.to(device)))
    return out


class TrainForward(nn.Module):
    """``(images, targets) -> what the loss reads``: the family's ``train_encode`` (replayed from a
    CUDA graph when ``encode`` is given) then its eager ``train_decode``. This is what DDP wraps."""

    def __init__(self, family: Any, net: nn.Module, encode: Any = None) -> None:
        super().__init__()
        self.family, self.net, self.encode = family, net, encode

    def forward(self, images: torch.Tensor, targets: torch.Tensor) -> Any:
        features = self.encode(images) if self.encode is not None else self.family.train_encode(self.net, images)
        return self.family.train_decode(self.net, features, targets)
