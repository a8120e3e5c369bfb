"""The contract a family declares once; everything else (predict, graphs, export, runtimes) reads it.

A family is one folder under ``libreyolo/models/`` with a :class:`Family` subclass registered
by :func:`libreyolo.models.registry.register_family`. No code outside the family's folder
branches on family names.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from libreyolo.ops.letterbox import Letterbox, LetterboxMeta
from libreyolo.utils.checks import check_stride_imgsz
from libreyolo.utils.tolerance import OutputGroup


@dataclass(frozen=True)
class ExportContract:
    """What an exported artifact of this family looks like, and how closely it must match eager.

    The export driver, the validator and every runtime read only this; none branches on a
    family name.
    """

    input_name: str = "images"
    input_layout: str = "NCHW"  # float32 RGB in [0, 1]
    input_color: str = "RGB"
    input_scale: float = 1.0 / 255.0  # network input = 8-bit pixel * input_scale (then mean/std, if any)
    # True: the network input is the 8-bit image times input_scale, so image-typed inputs
    # (CoreML ImageType) carry it exactly; False: a normalised float tensor (the preprocessor
    # applies a per-channel mean/std), fed to every format as a tensor
    image_input: bool = True
    output_names: tuple[str, ...] = ("predictions",)
    # axes of each output that follow the input's dynamic axes: {output: {axis: name}}
    output_axes: dict[str, dict[int, str]] = field(
        default_factory=lambda: {"predictions": {0: "batch", 2: "anchors"}})
    dynamic_batch: bool = True
    dynamic_spatial: bool = False
    # how each output is judged by export validation: slices sharing a unit (box coordinates,
    # scores, logits, maps, images), each allowed a multiple of the eager model's own float32
    # error against float64 (libreyolo.utils.tolerance); an output no group names is judged
    # as one "logit" group. Default: YOLO-style (B, 4 + nc, anchors) predictions
    groups: tuple[OutputGroup, ...] = (OutputGroup("predictions", "box", axis=1, start=0, stop=4),
                                       OutputGroup("predictions", "score", axis=1, start=4))
    # minimum cosine similarity of raw outputs per precision
    min_cosine: dict[str, float] = field(default_factory=lambda: {"fp32": 0.99999, "fp16": 0.999})
    # embedded NMS (export option nms=True): the output holding (B, 4 + nc, N) xyxy boxes in
    # input pixels followed by class scores, or None when the family cannot embed NMS; and the
    # "module:attribute" of the decoder that turns the NMS outputs into detections at predict time
    nms_input: str | None = None
    nms_decoder: str = "libreyolo.export.nms:EmbeddedNmsDecoder"
    # why the family's decoding has no NMS at all (e.g. a one-to-one head: one box per object), or
    # None; export refuses nms=True for such a family with this reason instead of "not supported"
    nms_free: str | None = None
    # outputs whose size along one axis follows the number of classes: {output: (axis, offset)}
    # meaning shape[axis] == nc + offset; runtimes check an artifact's 'nc' against its graph
    class_axes: dict[str, tuple[int, int]] = field(default_factory=dict)
    # "module:attribute" of the function that compares decoded predictions (the dicts the
    # family's postprocess returns) of eager and artifact during validation; it returns a dict
    # with at least "passed" (see libreyolo.comparison.matching); None: the task's own matcher
    # (libreyolo.tasks: detect match_detections, classify match_classes, semantic match_masks)
    decoded_match: str | None = None
    # outputs whose axis 1 holds one row per query of a set prediction (DETR): rows of these
    # outputs are compared jointly, and rows that only traded places between eager and artifact
    # (a near-tie in the top-k query selection decided by one ulp) are matched before comparing,
    # at most ``max_moved_rows`` per image
    row_sets: tuple[str, ...] = ()
    max_moved_rows: int = 0
    # the submodule whose output's maximum over the last axis scores the candidates that the query
    # top-k keeps (DETR's encoder score head): near-ties at the edge of that selection let another
    # float32 program keep another candidate in the last rows (libreyolo.comparison.selection); None: no selection
    selection: str | None = None
    # "module:attribute" of the network cut at that selection (head program -> the selection on the host ->
    # tail program, e.g. libreyolo.models.rtdetr.split:SPLIT): formats that have no top-k/gather (NCNN,
    # Format.selection_on_host) export the two programs and run the eager model's own selection between
    # them; None with a selection: such formats refuse the family
    host_selection: str | None = None
    # the largest rank (batch axis included) of a tensor the traced forward builds: 4 for
    # convolutional networks, 5 for attention that splits q/k/v along a new axis, 6 for window
    # attention and deformable sampling; a format whose tensors hold fewer axes
    # (Exporter.max_tensor_rank) refuses the family before anything is built (checked against the
    # trace in tests/test_export_ncnn.py)
    tensor_rank: int = 4

    def cosine_floor(self, fmt: str, precision: str, device: str = "cpu") -> float:
        """The minimum cosine for one format, precision and device type (most specific key wins);
        the validator lowers it where the eager model's own drift would not meet it."""
        for key in (f"{fmt}:{device}:{precision}", f"{fmt}:{precision}", precision):
            if key in self.min_cosine:
                return self.min_cosine[key]
        if precision == "int8":  # no INT8 bar of its own: the fp16 one (the validator lowers it to the
            return self.cosine_floor(fmt, "fp16", device)  # quantized eager model's own measured drift)
        raise KeyError(f"no cosine floor for {fmt} {precision} on {device}")


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
    export: ClassVar[ExportContract] = ExportContract()
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
