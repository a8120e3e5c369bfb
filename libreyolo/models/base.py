"""The contract a family declares once; everything else (predict, graphs, export, runtimes) reads it.

A family is one folder under ``libreyolo/models/`` with a :class:`Family` subclass registered
by :func:`libreyolo.models.registry.register_family`. No code outside the family's folder
branches on family names.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from libreyolo.models.contract import ExportContract
from libreyolo.ops.letterbox import Letterbox, LetterboxMeta
from libreyolo.utils.checks import check_stride_imgsz


class Family:
    """Base class of a model family adapter. Subclasses set the class attributes and ``build``."""

    name: ClassVar[str]
    task: ClassVar[str]
    sizes: ClassVar[tuple[str, ...]]
    default_size: ClassVar[str]
    default_imgsz: ClassVar[int] = 640
    stride: ClassVar[int] = 32
    # checkpoint file names this family recognises, e.g. r"LibreYOLO9(?P<size>[tsmc])"
    filename_pattern: ClassVar[str]
    # what the reference checkpoints store next to the state dict for this family
    extra_meta: ClassVar[dict[str, Any]] = {}
    # what an exported artifact looks like: a contract of the kind the family's base class names in
    # ``contract_kind`` (libreyolo.models.contract; checked when the family registers)
    export: ClassVar[ExportContract]
    contract_kind: ClassVar[type[ExportContract]]
    SUPPORTS_CUDA_GRAPH: ClassVar[bool] = False
    # one CUDA graph from the letterboxed batch to padded detections (forward + device_postprocess);
    # set only once the pipeline parity check passes (libreyolo.graphs.parity, docs/graphs.md)
    SUPPORTS_PIPELINE_GRAPH: ClassVar[bool] = False
    # the parity harness's seeded weights: state-dict name prefixes whose values it scales
    # (libreyolo.graphs.parity.seed_weights), for outputs that must stay in fp16 range
    parity_seed_gains: ClassVar[dict[str, float]] = {}
    # training: "module:attr" of the loss factory (libreyolo.train.loss), called as factory(nc=...,
    # **hyperparameters it accepts); None while the family cannot be trained. ``training_items``
    # names the loss components the factory's loss returns (progress bar, results.csv)
    training: ClassVar[str | None] = None
    training_items: ClassVar[tuple[str, ...]] = ("loss",)
    # what a training CUDA graph captures (libreyolo.train.graph): "network" (forward and
    # backward of ``train_encode``, which is the whole network), "encoder" (``train_encode`` is
    # only the front of the network; ``train_decode`` runs the rest eagerly, e.g. a DETR decoder
    # whose query count depends on the batch's targets), or None (no capture spec: trains eagerly)
    train_capture: ClassVar[str | None] = None
    # training options this family needs other defaults for (``model.train(...)`` arguments the
    # user did not pass), e.g. the DETR recipe's AdamW at a low learning rate
    train_defaults: ClassVar[dict[str, Any]] = {}
    # the weight EMA's (decay, tau) (libreyolo.train.optim.ModelEMA): decay * (1 - exp(-updates / tau))
    train_ema: ClassVar[tuple[float, float]] = (0.9999, 2000.0)
    # the one input size the network takes (e.g. a fixed position embedding), or None for any
    # multiple of ``stride``
    fixed_imgsz: ClassVar[int | None] = None
    # predict runs at each image's own size (padded to ``stride``), not resized to imgsz (restoration)
    native_resolution: ClassVar[bool] = False
    # state-dict key whose first dimension is the number of classes: a checkpoint's 'nc' is
    # checked against it before the network is built (None: no such check for this family)
    nc_key: ClassVar[str | None] = None
    # state-dict keys whose values may hold +/-inf by design (e.g. the anchor table of DETR
    # families marks invalid anchors with inf): the finite-weights check of checkpoint loading
    # skips their infinities (NaN is never accepted)
    infinite_ok_keys: ClassVar[tuple[str, ...]] = ()
    # state-dict key prefixes of modules that only training builds (e.g. a distillation projector)
    # which checkpoints of this family may carry: loading drops them (:meth:`inference_state`);
    # any other key the network does not have is still refused
    training_only_prefixes: ClassVar[tuple[str, ...]] = ()
    # quantization (model.quantize()): module-name globs (fnmatch, over ``net.named_modules()``)
    # of Conv2d/Linear layers kept in float by default: the final class/box prediction layers,
    # whose outputs are compared against thresholds and decoded, lose the most from int8
    quant_exclude: ClassVar[tuple[str, ...]] = ()

    # --- network ---------------------------------------------------------------------
    def build(self, size: str, nc: int) -> nn.Module:
        raise NotImplementedError(f"family {self.name!r} does not define build()")

    # --- training ----------------------------------------------------------------------
    def loss_kwargs(self, nc: int) -> dict[str, Any]:
        """Keyword arguments this family's loss factory (``training``) needs besides ``nc``, e.g. a
        class head laid out wider than ``nc`` (passed as they are; default none)."""
        return {}

    def train_encode(self, net: nn.Module, images: torch.Tensor) -> Any:
        """The part of a training step that depends on the images only: what a training CUDA
        graph captures (forward and backward). Returns a tensor or a nest of tensors."""
        return net(images)

    def network_input(self, images: torch.Tensor) -> torch.Tensor:
        """A training or validation batch of 8-bit RGB images (B, 3, S, S), already letterboxed by
        the dataset, as the network's float input (default: scaled by ``export.input_scale``)."""
        return images.float() / 255.0 * (255.0 * self.export.input_scale)

    def train_decode(self, net: nn.Module, features: Any, targets: torch.Tensor) -> Any:
        """The eager rest of the training forward, given :meth:`train_encode`'s output and the
        batch's targets ``(M, 6)`` rows ``(image, class, x1, y1, x2, y2)`` in input pixels (or class
        ids for classify). Its result is what the family's loss is called on."""
        return features

    def export_outputs(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        """The network's outputs reduced to the tensors named in ``export.output_names``."""
        return (outputs["predictions"],)

    def named_outputs(self, outputs: Any) -> dict[str, torch.Tensor]:
        """Network outputs as {output name: tensor}; what postprocessing consumes."""
        return dict(zip(self.export.output_names, self.export_outputs(outputs), strict=True))

    def tie_evidence(self, outputs: Any) -> dict[str, torch.Tensor]:
        """For each output with an ``exclusive`` group (only the best channel of a column holds a
        value): the same output from the network's ``outputs`` with every channel's value. Export
        validation runs it on the float64 reference and excuses an artifact's channel flip only
        where the two channels are within their allowance of a tie there
        (:func:`libreyolo.utils.tolerance.align_exclusive`). Default: none (a count rule instead)."""
        return {}

    def default_imgsz_for(self, size: str) -> int:
        """The input size of a ``size`` model whose checkpoint or YAML does not say (default: ``default_imgsz``)."""
        return self.default_imgsz

    def finite_check_view(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` without the ``infinite_ok_keys`` entries whose only non-finite values are infinities."""
        if not self.infinite_ok_keys:
            return state
        return {k: v for k, v in state.items()
                if not (k in self.infinite_ok_keys and isinstance(v, torch.Tensor) and not bool(v.isnan().any()))}

    def inference_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` without the keys under ``training_only_prefixes`` (what the network loads)."""
        if not self.training_only_prefixes:
            return state
        return {k: v for k, v in state.items() if not k.startswith(self.training_only_prefixes)}

    def state_nc(self, state: dict[str, Any]) -> int | None:
        """The number of classes a state dict's head was trained for, if the family declares ``nc_key``."""
        t = state.get(self.nc_key) if self.nc_key else None
        return int(t.shape[0]) if isinstance(t, torch.Tensor) and t.ndim >= 1 else None

    # --- pre/post ----------------------------------------------------------------------
    def letterbox(self, imgsz: int) -> Letterbox:
        """The family's preprocessor for one input size (detectors letterbox, classifiers
        resize + crop, see :class:`libreyolo.ops.classify.ResizeCrop`). Whatever it returns is
        called as ``pre(images, dtype=..., out=None) -> (batch, metas)`` and has ``size``,
        ``neutral_input`` (a network input value for a blank image) and ``describe()`` (the
        dict stored in an artifact's metadata and checked by the runtimes)."""
        return Letterbox(imgsz)

    def check_imgsz(self, value: Any) -> int:
        """The input size to run at, or an ArgumentError saying what is allowed (default: a
        multiple of ``stride``). Families with a fixed input size override this."""
        return check_stride_imgsz(value, self.stride)

    def request_work(self, height: int, width: int, imgsz: int, opts: Any) -> int:
        """The network input pixels one ``height`` x ``width`` image costs at ``imgsz`` with the
        predict options ``opts`` (a mapping): what a server bounds per request (``max_work``).
        Default: the preprocessor's square, ``imgsz**2``, whatever the image's size."""
        return imgsz * imgsz

    def postprocess(self, outputs: dict[str, torch.Tensor], metas: list[LetterboxMeta], opts: Any = None,
                    **kw: Any) -> list[dict]:
        """Per-image predictions (the dicts the family's task turns into its Results payload).
        ``opts``: the call's :class:`~libreyolo.tasks.TaskOptions` (``predict()`` passes one);
        direct callers may give the task's options as keywords instead (:meth:`task_options`)."""
        raise NotImplementedError(f"family {self.name!r} does not define postprocess()")

    def postprocess_later(self, outputs: dict[str, torch.Tensor], metas: list[LetterboxMeta], opts: Any = None,
                          **kw: Any) -> Callable[[], list[dict]]:
        """:meth:`postprocess` enqueued now, its per-image predictions returned by the call it
        returns (the one wait for the device happens there). ``predict()`` enqueues the next batch
        in between. Default: all of it now. A family that overrides it keeps ``postprocess`` as
        ``postprocess_later(...)()``, so the two are one implementation."""
        preds = self.postprocess(outputs, metas, opts, **kw)
        return lambda: preds

    def forward_bytes(self, size: str, shape: tuple[int, ...], opts: Any = None) -> int | None:
        """Estimated peak memory (bytes) of :meth:`run_network` on a batch of ``shape`` under
        ``opts``, checked against the device's free memory before the forward
        (:func:`libreyolo.utils.checks.check_forward_memory`). None: not estimated (the input
        budget, :data:`libreyolo.options.MAX_INPUT_PIXELS`, bounds a fixed-size network)."""
        return None

    def run_network(self, forward: Any, batch: torch.Tensor, opts: Any = None) -> dict[str, torch.Tensor]:
        """The named outputs of ``forward`` (a batch tensor in, named outputs out: the eager copy, a
        graph replay or an artifact's runtime) for one preprocessed ``batch``, under the call's task
        options. Default: one call. A family whose options change how the network is run (restore:
        tiling) overrides this; predict() on every backend comes through here."""
        return forward(batch)

    def task_options(self, opts: Any = None, kw: dict[str, Any] | None = None) -> Any:
        """``opts`` as given, or the task's options from keywords (checked, defaults filled in)."""
        if opts is not None and not kw:
            return opts
        from libreyolo.tasks import get_task

        given = {**(dict(opts) if opts is not None else {}), **(kw or {})}
        return get_task(self.task).predict_options(given)

    def device_postprocess(self) -> Any:
        """The fixed-shape, sync-free form of :meth:`postprocess` a whole-pipeline CUDA graph captures,
        or None. It has ``params(metas, opts, nc=, device=) -> tensor`` (everything per call that
        is not a shape; ``opts`` the call's task options), ``static(opts) -> ((name, value), ...)``
        (the options that fix shapes, one graph per value), ``__call__(outputs, params, **static)
        -> {name: tensor}`` (the captured stage), ``read(padded) -> list[dict]`` (what
        :meth:`postprocess` returns), ``read_later(padded)`` (the same in two steps) and
        ``capture_safe(device) -> str | None``; see
        :class:`libreyolo.ops.postprocess.DetectPostprocess`."""
        return None

    # --- names -------------------------------------------------------------------------
    def match_filename(self, stem: str) -> str | None:
        """The size encoded in a checkpoint file stem (``LibreYOLO9t`` -> ``t``), else None."""
        m = re.fullmatch(self.filename_pattern, stem, flags=re.IGNORECASE)
        return m.group("size").lower() if m else None

    def filename(self, size: str) -> str:
        """Canonical checkpoint stem for a size (the Hub repo/file name the reference uses)."""
        raise NotImplementedError
