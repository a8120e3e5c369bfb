"""Training: ``model.train(data=...)``, ``libreyolo train`` (validation: :mod:`libreyolo.train.val`).

One loop for every family with a training contract (a loss in :mod:`libreyolo.train.loss`, the
task's dataset in :mod:`libreyolo.train.data`, the task's metrics in :mod:`libreyolo.train.metrics`):

- data: a YOLO-format dataset YAML (detect) or an image-folder root (classify), loaded by a
  DataLoader with workers and pinned memory (CUDA);
- optimisation: SGD or AdamW with three parameter groups, linear warm-up then cosine (or linear)
  decay per iteration, automatic mixed precision on CUDA, gradient accumulation to a nominal
  batch of 64, gradient clipping, an EMA of the weights (which is what is validated and saved);
- each epoch: validation (mAP50-95 and mAP50 through faster-coco-eval or pycocotools; top-1 and
  top-5 for classify), ``last.pt`` and ``best.pt`` written atomically in the reference checkpoint
  format (plus a ``train_state`` entry for resuming), a row in ``results.csv``/``results.json``
  and, at the end, ``results.png``;
- ``resume=True`` continues a run from its ``last.pt``;
- distributed: under ``torchrun`` (``WORLD_SIZE`` > 1) the network is wrapped in
  DistributedDataParallel (gloo on the CPU, NCCL on CUDA); only rank 0 validates, writes and logs.

``cuda_graph=True`` captures the network's forward and backward once the batch shape has
repeated three times (:mod:`libreyolo.train.graph`); it never stops a run: where it cannot be used
(CPU, distributed, a family without a capture spec) it logs one line and trains eagerly, and a
capture or replay failure mid-run logs one warning and the rest of the run is eager.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from libreyolo.errors import ArgumentError, LibreYOLOError, TrainingDiverged
from libreyolo.train.args import TrainArgs
from libreyolo.train.evaluate import validate
from libreyolo.train.graph import GraphStepError, TrainForward
from libreyolo.utils.log import LOGGER

MAX_AMP_SKIPS = 3  # consecutive non-finite losses tolerated under AMP (fp16 overflow) before the run stops


# --- distributed -----------------------------------------------------------------------------------
def _dist_env() -> tuple[int, int, int]:
    """(rank, local rank, world size) from torchrun's environment (0, 0, 1 when not distributed)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")), world


class Trainer:
    """One training run of ``model`` (a :class:`~libreyolo.engine.model.Model`) with ``args``."""

    def __init__(self, model: Any, args: TrainArgs) -> None:
        from libreyolo.tasks import get_task
        from libreyolo.utils.checks import resolve_device

        self.args = args
        self.task = get_task(model.task)  # datasets, targets, metrics and fitness are the task's
        self.rank, self.local_rank, self.world = _dist_env()
        device = resolve_device(args.device) if args.device is not None else training_device(model.device)
        if self.world > 1 and device.type == "cuda":
            device = torch.device("cuda", self.local_rank)
        self.device = device
        self.model = model
        self.amp = bool(args.amp) and device.type == "cuda"
        self.epoch = 0
        self.best_fitness: float | None = None
        self.save_dir: Path | None = None
        self.graph_note: str | None = None
        self.graphs = None  # libreyolo.train.graph.TrainGraphs while capturing

    # --- set-up ------------------------------------------------------------------------------------
    def _data(self):
        from libreyolo.train.val import load_dataset

        return load_dataset(self.model.task, self.args.data)

    def _adapt_classes(self, cfg) -> None:
        """Make the model's classes the dataset's: a new head when the number differs (weights of
        every other layer are kept), the dataset's names either way."""
        model = self.model
        if cfg.nc != model.nc:
            LOGGER.info("the dataset has %d classes, the model %d: building a new %d-class head (the other "
                        "layers keep their weights)", cfg.nc, model.nc, cfg.nc)
            fresh = type(model)(model.family, model.size, nc=cfg.nc, names=cfg.names, imgsz=model.imgsz)
            own = fresh.net.state_dict()
            kept = {k: v for k, v in model.net.state_dict().items() if k in own and own[k].shape == v.shape}
            own.update(kept)
            fresh.load_weights(own)
            model.net, model.nc = fresh.net, cfg.nc
        model.names = dict(cfg.names)

    def _loaders(self, cfg, imgsz: int):
        from libreyolo.train import data as D
        from libreyolo.train.val import val_dataset

        a = self.args
        distributed = self.world > 1
        pin = bool(a.pin_memory) and self.device.type == "cuda"
        per_rank = max(1, a.batch // self.world)
        train, collate = self.task.train_dataset(self.model, cfg, imgsz, a)
        val = val_dataset(self.model, cfg, imgsz)[0] if cfg.val else None  # what model.val() reads too
        train_loader = D.build_dataloader(train, per_rank, shuffle=True, workers=a.workers, pin_memory=pin,
                                          seed=a.seed + self.rank, collate_fn=collate, distributed=distributed)
        val_loader = None
        if val is not None and self.rank == 0:
            val_loader = D.build_dataloader(val, per_rank * 2, shuffle=False, workers=a.workers, pin_memory=pin,
                                            seed=a.seed, collate_fn=collate)
        return train, train_loader, val_loader

    def _run_dir(self) -> Path:
        a = self.args
        base = Path(a.project) / a.name
        if a.exist_ok or not base.exists():
            return base
        for i in range(2, 10_000):
            candidate = Path(a.project) / f"{a.name}{i}"
            if not candidate.exists():
                return candidate
        raise LibreYOLOError(f"no free run folder under {a.project} for name={a.name!r}")

    # --- the run -----------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        from libreyolo.train.data import set_loader_epoch
        from libreyolo.train.loss import loss_for
        from libreyolo.train.optim import LRSchedule, ModelEMA, build_optimizer, clip_gradients
        from libreyolo.train.records import MetricsLog

        a = self.args
        torch.manual_seed(a.seed + self.rank)
        if self.world > 1 and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        resume_state = self._resume_state()
        cfg = self._data()
        self._adapt_classes(cfg)
        model = self.model
        imgsz = a.imgsz or model.imgsz
        _check_train_imgsz(model.family, imgsz)
        from libreyolo.options import check_input_budget

        check_input_budget(max(1, a.batch // self.world), imgsz, explicit=True)
        model.imgsz = imgsz
        model.to(self.device)
        net = model.net
        net.train()
        self._graph_flag(net)
        criterion = loss_for(model.family.name, model.task, model.nc, **self.task.loss_hyp(a))
        train_set, train_loader, val_loader = self._loaders(cfg, imgsz)
        steps = len(train_loader)
        accumulate = max(1, round(a.nbs / max(1, a.batch)))
        decay = a.weight_decay * a.batch * accumulate / a.nbs
        optimizer = build_optimizer(net, a.optimizer, lr=a.lr0, momentum=a.momentum, weight_decay=decay)
        schedule = LRSchedule(optimizer, a.epochs, steps, lrf=a.lrf, cos=a.cos_lr, warmup_epochs=a.warmup_epochs,
                              momentum=a.momentum)
        ema = ModelEMA(net, *model.family.train_ema) if a.ema else None
        scaler = torch.amp.GradScaler("cuda", enabled=self.amp)
        start_epoch = 0
        if resume_state is not None:
            optimizer.load_state_dict(resume_state["optimizer"])
            if ema is not None and resume_state.get("ema") is not None:
                ema.module.load_state_dict(resume_state["ema"])
                ema.updates = int(resume_state.get("ema_updates", 0))
            if resume_state.get("scaler"):
                scaler.load_state_dict(resume_state["scaler"])
            start_epoch = int(resume_state["epoch"]) + 1
            self.best_fitness = resume_state.get("best_fitness")
            LOGGER.info("resuming %s from epoch %d of %d", self.save_dir, start_epoch + 1, a.epochs)
            if start_epoch >= a.epochs:
                raise ArgumentError(f"{self.save_dir} already finished its {a.epochs} epochs; nothing to resume "
                                    "(start a new run, or pass a larger epochs=)")
        train_net: nn.Module = TrainForward(model.family, net, self.graphs.encode if self.graphs else None)
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            train_net = nn.parallel.DistributedDataParallel(train_net, device_ids=ids)
        log = MetricsLog(self.save_dir, resume=resume_state is not None) if self.rank == 0 else None
        summary: dict[str, Any] = {"save_dir": str(self.save_dir), "epochs": a.epochs}
        batches_done = amp_skips = 0
        for epoch in range(start_epoch, a.epochs):
            self.epoch = epoch
            t0 = time.perf_counter()
            set_loader_epoch(train_loader, epoch, a.epochs)  # sampler shuffling, mosaic closing
            net.train()
            totals: torch.Tensor | None = None
            wait = [0.0]  # seconds this epoch spent waiting for the loader
            bar = self._bar(_timed(train_loader, wait), epoch, steps)
            optimizer.zero_grad(set_to_none=True)
            for i, batch in enumerate(bar):
                step = epoch * steps + i
                schedule.step(step)
                images, targets = self._to_device(batch)
                try:
                    loss, items = self._step(train_net, criterion, scaler, images, targets)
                except GraphStepError as exc:  # a replay failed mid-step: drop this window's gradients, go eager
                    self.graphs.fail("replay", exc)
                    optimizer.zero_grad(set_to_none=True)
                    loss, items = self._step(train_net, criterion, scaler, images, targets)
                if loss is None:
                    amp_skips += 1
                    if not self.amp or amp_skips > MAX_AMP_SKIPS:
                        raise TrainingDiverged(self._diverged(f"the loss is {items}", epoch, i, step))
                    LOGGER.warning("epoch %d batch %d: non-finite loss (%s) under mixed precision; this batch is "
                                   "skipped", epoch + 1, i, items)
                    optimizer.zero_grad(set_to_none=True)
                    continue
                amp_skips = 0
                batches_done += 1
                if (i + 1) % accumulate == 0 or i + 1 == steps:
                    scaler.unscale_(optimizer)
                    norm = clip_gradients(net, a.clip)
                    if math.isfinite(norm):
                        scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad(set_to_none=True)
                    if ema is not None:
                        ema.update(net)
                items = items.detach().float().cpu()
                totals = items if totals is None else totals + items
                if hasattr(bar, "set_postfix"):
                    mean = totals / (i + 1)
                    bar.set_postfix({**self._loss_names(mean), "lr": f"{optimizer.param_groups[0]['lr']:.2e}"})
            if hasattr(bar, "close"):
                bar.close()
            if self.rank != 0:
                continue
            eval_net = ema.module if ema is not None else net
            metrics = self._validate(eval_net, val_loader) if (a.val and val_loader is not None) else {}
            fitness = self._fitness(metrics)
            improved = self.best_fitness is None or (fitness is not None and fitness >= self.best_fitness)
            if improved and fitness is not None:
                self.best_fitness = fitness
            mean = (totals / max(1, steps)) if totals is not None else torch.zeros(0)
            row = {"epoch": epoch + 1, **{f"train/{k}": round(float(v), 5) for k, v in
                                          self._loss_names(mean, raw=True).items()},
                   **{f"metrics/{k}": round(float(v), 5) for k, v in metrics.items()},
                   "lr": optimizer.param_groups[0]["lr"], "seconds": round(time.perf_counter() - t0, 2),
                   "data_seconds": round(wait[0], 2)}
            state = {"epoch": epoch, "optimizer": optimizer.state_dict(), "best_fitness": self.best_fitness,
                     "ema": ema.module.state_dict() if ema is not None else None,
                     "ema_updates": ema.updates if ema is not None else 0,
                     "scaler": scaler.state_dict() if self.amp else None, "train_args": self._args_dict(),
                     "metrics": row}
            weights = self.save_dir / "weights"
            weights.mkdir(parents=True, exist_ok=True)
            self._save(eval_net, weights / "last.pt", state)
            if improved:
                self._save(eval_net, weights / "best.pt", None)
            log.append(row)
            LOGGER.info("epoch %d/%d: %s", epoch + 1, a.epochs,
                        ", ".join(f"{k.split('/')[-1]} {v:.4g}" for k, v in row.items()
                                  if isinstance(v, float) and k != "lr"))
            summary.update(last_metrics=row)
        if self.world > 1 and torch.distributed.is_initialized():
            summary["ranks_agree"] = self._ranks_agree(net)  # the trained weights, before rank 0 takes the EMA's
        if self.rank == 0:
            if a.plots and log is not None:
                log.plot()
            best = self.save_dir / "weights" / "best.pt"
            summary.update(best=str(best) if best.exists() else None, last=str(self.save_dir / "weights" / "last.pt"),
                           best_fitness=self.best_fitness, graph=self.graph_info(batches_done))
            # the model the user holds ends as the averaged (validated, saved) weights
            if ema is not None:
                model.load_weights({k: v.detach().clone() for k, v in ema.module.state_dict().items()})
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()
        net.eval()
        return summary

    # --- pieces ------------------------------------------------------------------------------------
    def _step(self, train_net: nn.Module, criterion, scaler, images: torch.Tensor, targets: torch.Tensor):
        """Forward, loss and backward of one batch: (loss, items), or (None, value) for a non-finite loss."""
        with torch.autocast(self.device.type, enabled=self.amp):
            out = train_net(images, targets)
        loss, items = criterion(out, targets)
        if not torch.isfinite(loss):
            return None, float(loss.detach())
        scaler.scale(loss).backward()
        # detached: a live loss keeps last step's autograd graph (and its AccumulateGrad nodes, bound
        # to the stream they ran on) alive into the next step, where a CUDA-graph capture would trip on it
        return loss.detach(), items

    def _ranks_agree(self, net: nn.Module) -> bool:
        """Whether every rank ends with bit-identical parameters (logged by rank 0)."""
        dist = torch.distributed
        flat = torch.cat([p.detach().float().flatten() for p in net.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(gathered, flat)
        agree = all(torch.equal(gathered[0], g) for g in gathered[1:])
        if self.rank == 0:
            if agree:
                LOGGER.info("all %d ranks hold bit-identical final weights (%d values)", self.world, flat.numel())
            else:
                worst = max(float((gathered[0] - g).abs().max()) for g in gathered[1:])
                LOGGER.warning("ranks disagree on the final weights (max difference %.3g)", worst)
        return agree

    def _graph_flag(self, net: nn.Module) -> None:
        if not self.args.cuda_graph:
            return
        from libreyolo.train.graph import TrainGraphs, graph_unavailable

        self.graph_note = graph_unavailable(self.model.family, self.device, self.world > 1)
        if self.graph_note is None:
            self.graphs = TrainGraphs(self.model.family, net, amp=self.amp, capture_after=self.args.graph_after)
        elif self.rank == 0:
            LOGGER.info(self.graph_note)

    def graph_info(self, batches: int) -> dict[str, Any]:
        """What ``train_graph_info()`` reports: captured shapes, replays, eager batches, failures."""
        info = {"requested": bool(self.args.cuda_graph), "captured_shapes": [], "replays": 0,
                "eager_batches": batches, "failures": [], "reason": self.graph_note}
        if self.graphs is not None:
            info.update(self.graphs.info())
        return info

    def _bar(self, loader, epoch: int, total: int):
        if self.rank != 0:
            return loader
        import sys

        from tqdm import tqdm

        return tqdm(loader, total=total, desc=f"epoch {epoch + 1}/{self.args.epochs}", unit="batch",
                    file=sys.stderr, disable=None, leave=False, dynamic_ncols=True)

    def _to_device(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        images = batch[0]
        non_blocking = self.device.type == "cuda"
        images = images.to(self.device, non_blocking=non_blocking)
        if images.dtype == torch.uint8:
            images = self.model.family.network_input(images)
        targets = self.task.batch_targets(batch)
        return images, targets.to(self.device, non_blocking=non_blocking)

    def _loss_names(self, mean: torch.Tensor, raw: bool = False) -> dict[str, Any]:
        names = self.model.family.training_items
        return {n: (float(v) if raw else f"{float(v):.4f}") for n, v in zip(names, mean.tolist(), strict=False)}

    def _fitness(self, metrics: dict[str, float]) -> float | None:
        return self.task.fitness(metrics)

    def _validate(self, net: nn.Module, loader) -> dict[str, float]:
        return validate(self.model, net, loader, device=self.device, conf=self.args.conf, iou=self.args.iou,
                        max_det=self.args.max_det)

    def _diverged(self, what: str, epoch: int, batch: int | None, step: int | None) -> str:
        where = f"epoch {epoch + 1} batch {batch} (step {step})" if batch is not None else f"epoch {epoch + 1}"
        last = self.save_dir / "weights" / "last.pt" if self.save_dir is not None else None
        kept = (f"{last} still holds the last good epoch (nothing was written over it)"
                if last is not None and last.exists() else "no checkpoint was written")
        return (f"training diverged at {where}: {what}; the run stopped and {kept}. Try a lower lr0, "
                "amp=False, or check the dataset's labels")

    def _save(self, net: nn.Module, path: Path, state: dict[str, Any] | None) -> None:
        from libreyolo.checkpoint import save_checkpoint
        from libreyolo.utils.checks import nonfinite_keys

        bad, count = nonfinite_keys(net.state_dict())
        if bad:  # never write a checkpoint of non-finite weights over a good one
            raise TrainingDiverged(self._diverged(f"{count} weight tensor(s) hold NaN or Inf ({', '.join(bad)})",
                                                  self.epoch, None, None))
        m = self.model
        save_checkpoint(path, net, family=m.family, size=m.size, nc=m.nc, names=m.names, imgsz=m.imgsz,
                        extra={"train_state": state} if state is not None else None)

    def _args_dict(self) -> dict[str, Any]:
        d = asdict(self.args)
        d["save_dir"] = str(self.save_dir)
        return d

    def _resume_state(self) -> dict[str, Any] | None:
        """With ``resume=True``: the train state of the model's checkpoint (its ``last.pt``); the
        run folder and arguments come from it, except those given again (epochs, device...)."""
        a = self.args
        if not a.resume:
            self.save_dir = self._run_dir() if self.rank == 0 else Path(a.project) / a.name
            return None
        source = getattr(self.model, "source", None)
        state = _read_train_state(source)
        if state is None:
            raise ArgumentError("resume=True needs the model loaded from a run's last.pt (e.g. "
                                "LibreYOLO('runs/train/exp/weights/last.pt').train(resume=True)); "
                                f"{source or 'this model'} holds no training state")
        saved = state.get("train_args", {})
        self.save_dir = Path(saved.get("save_dir") or Path(source).parent.parent)
        for k in ("data", "imgsz", "batch", "nbs", "optimizer", "lr0", "lrf", "momentum", "weight_decay",
                  "warmup_epochs", "cos_lr", "mosaic", "close_mosaic", "seed", "label_smoothing", "ema", "clip",
                  "degrees", "translate", "scale", "shear", "fliplr", "flipud", "hsv_h", "hsv_s", "hsv_v"):
            if k in saved and getattr(a, k) == getattr(TrainArgs, k, None):
                setattr(a, k, saved[k])
        if a.data is None:
            a.data = saved.get("data")
        if a.epochs == TrainArgs.epochs and "epochs" in saved:
            a.epochs = saved["epochs"]
        return state


def training_device(model_device: torch.device) -> torch.device:
    """``device=None``: the model's device if it is a GPU, else the first CUDA GPU when there is one
    (as Ultralytics does: a model loaded on the CPU still trains on the GPU), else the model's."""
    if model_device.type == "cpu" and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return model_device


_default_device = training_device  # the name the tests use


def _timed(loader, wait: list[float]):
    """Iterate ``loader``, adding the time spent waiting for each batch to ``wait[0]``."""
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        wait[0] += time.perf_counter() - t
        yield batch


def _check_train_imgsz(family: Any, imgsz: Any) -> None:
    fixed = getattr(family, "fixed_imgsz", None)
    if isinstance(imgsz, bool) or not isinstance(imgsz, int) or imgsz <= 0:
        raise ArgumentError(f"imgsz must be a positive integer, got {imgsz!r}")
    if fixed and imgsz != fixed:
        raise ArgumentError(f"{family.name} takes {fixed}x{fixed} inputs only; train with imgsz={fixed}")
    if imgsz % family.stride:
        raise ArgumentError(f"imgsz must be a multiple of {family.stride} for {family.name}, got {imgsz}")


def _read_train_state(path: str | None) -> dict[str, Any] | None:
    if not path or not str(path).endswith(".pt") or not Path(path).is_file():
        return None
    raw = torch.load(path, map_location="cpu", weights_only=True)  # tensors, numbers, strings: nothing executable
    return raw.get("train_state") if isinstance(raw, dict) else None


def train(model: Any, **kwargs: Any) -> dict[str, Any]:
    """``model.train(...)``: see :class:`TrainArgs` for the options (a family may change some
    defaults: ``Family.train_defaults``)."""
    from libreyolo.tasks import get_task

    get_task(model.task).require_trainable()  # e.g. restoration: one line saying so, before any argument
    args = TrainArgs.from_kwargs({**model.family.train_defaults, **kwargs})
    from libreyolo.train.options import require_train_extra

    require_train_extra(model.task, validating=args.val)
    trainer = Trainer(model, args)
    with _quiet_tqdm_monitor():
        return trainer.train()


@contextlib.contextmanager
def _quiet_tqdm_monitor():
    """tqdm's monitor thread is not needed for our bars (and is one more thread in DDP workers)."""
    from tqdm import tqdm

    saved = tqdm.monitor_interval
    tqdm.monitor_interval = 0
    try:
        yield
    finally:
        tqdm.monitor_interval = saved
