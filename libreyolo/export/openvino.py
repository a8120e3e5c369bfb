"""OpenVINO export: an IR folder ``<stem>_openvino_model/`` converted from our ONNX export.

Layout: ``model.xml`` (the graph), ``model.bin`` (the weights) and ``metadata.json`` (the
LibreYOLO metadata, sealed like every artifact's: ``content_sha256`` covers every other file of
the folder by relative path, ``metadata_sha256`` the entries). The folder is built in a hidden
work folder and renamed into place by the driver, replacing an older one only once it is complete.

Why from ONNX and not ``openvino.convert_model`` of the torch module: the IR is then a
translation of the very graph that ``format=onnx`` writes and ONNX Runtime validates (the same
dynamic axes, embedded NMS, constant folding, opset), through OpenVINO's ONNX frontend, its most
used one. Measured here (demo detector, 160 px, one image): ONNX -> IR converted in 26 s with the
ONNX export and a largest output error of 7.6e-5 from eager; the torch frontend took 60 s and
7.6e-5 became 1.2e-4; RT-DETR r18 gave the same outputs either way.

Precision: ``half=True`` stores the weights as float16 (``compress_to_fp16``; OpenVINO decompresses
them when it compiles); ``int8=True`` quantizes the float IR with NNCF's post-training quantization
on the INT8 plan's calibration images (the same images quantize() calibrates on; min/max activation
ranges as quantize()'s ``minmax``, no bias correction: chosen by the accuracy gate, docs/export.md),
leaving the layers quantize() keeps in float and the operations they feed (the decode) out
(:func:`float_scope`). Every artifact is validated, and so run, at the CPU inference precision
f32: OpenVINO's CPU plugin otherwise computes in bf16 on CPUs with AVX512-BF16 or AMX (its default
there), which moves boxes by pixels. The precision is recorded in the metadata (``runtime_config``)
and the runtime (:mod:`libreyolo.runtimes.openvino`) compiles with exactly that configuration; the
validation report also says what the CPU's default precision would change
(:func:`default_precision_effect`).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from libreyolo.errors import ArgumentError, require
from libreyolo.export import metadata as folder_metadata
from libreyolo.export.base import Exporter, ExportError, ExportOptions
from libreyolo.export.formats import get_format
from libreyolo.export.metadata import folder_content_sha256  # noqa: F401 - the tests read it here
from libreyolo.export.onnx import check_opset, export_onnx
from libreyolo.runtimes.openvino import BIN, EXTRA, METADATA, XML  # noqa: F401 - the folder as its runtime reads it

FOLDER_SUFFIX = get_format("openvino").suffix
# the compile configuration every artifact is validated with, and so run with (runtime_config)
VALIDATED_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}
# NNCF: activations asymmetric per tensor (as quantize()'s affine int8), weights symmetric per channel
NNCF_PRESET = "mixed"
NNCF_BIAS_CORRECTION = False
NNCF_RANGE = "MINMAX"  # activation ranges: the min and max over the calibration images, as quantize()'s minmax
# the IR operations a float layer can become (Conv/Gemm/MatMul nodes of the ONNX graph)
WEIGHTED_OPS = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData", "MatMul")


def _ov(purpose: str = "OpenVINO export") -> Any:
    return require("openvino", EXTRA, purpose)


def write_folder_metadata(folder: Path, meta: dict[str, Any], encoded: dict[str, str]) -> None:
    """``metadata.json``: the metadata as JSON (readable), with the two hashes of ``encoded``
    (:func:`libreyolo.export.metadata.write_folder_metadata`, as every folder format writes it)."""
    folder_metadata.write_folder_metadata(folder, encoded, meta)


def ir_ops(path: str | Path) -> set[str]:
    """Operation types of the IR in the folder ``path``."""
    ov = _ov("reading an OpenVINO model")
    model = ov.Core().read_model(str(Path(path) / XML))
    return {op.get_type_name() for op in model.get_ops()}


def _calibration_items(opts: ExportOptions) -> list[Any]:
    """The INT8 plan's calibration images as numpy batches of the artifact's batch size (a static
    batch takes chunks of it, the last one filled with its own last image)."""
    size = opts.batch
    items = []
    for batch in opts.calibration.batches():
        for i in range(0, batch.shape[0], size):
            chunk = batch[i:i + size]
            if chunk.shape[0] < size:
                chunk = torch.cat([chunk, chunk[-1:].expand(size - chunk.shape[0], *chunk.shape[1:])])
            items.append(chunk.float().cpu().numpy())
    return items


def float_layers(plan: Any, onnx_path: Path) -> list[str]:
    """ONNX node names of the Conv/Gemm/MatMul nodes of the layers quantize() keeps in float (the
    family's ``quant_exclude``, ``exclude=``): the one declaration every INT8 path reads."""
    import onnx

    from libreyolo.export.onnx import WEIGHT_OPS, node_module

    excluded = set(plan.quantized.quant_info()["excluded"])
    names = []
    for node in onnx.load(str(onnx_path), load_external_data=False).graph.node:
        if node.op_type in WEIGHT_OPS and node_module(node.name) in excluded:
            names.append(node.name)
    return names


def float_scope(model: Any, layers: list[str]) -> tuple[list[str], list[str]]:
    """The IR operations NNCF must leave in float, as (layer operations, operations they feed).

    Layer operations: the IR's weighted operations of the ONNX nodes ``layers``. OpenVINO's ONNX
    frontend splits a biased Conv into ``<name>/WithoutBiases`` (the convolution) and ``<name>``
    (the bias Add), so a node is matched by its name or a ``<name>/`` prefix and only weighted
    operations count: ignoring the bias Add alone leaves the convolution quantized (measured: the
    demo's 6 prediction convolutions got input quantizers that way).

    Operations they feed: every operation computed from those layers' outputs up to the next
    quantized layer (for dense detectors the whole decode: the level concat, the box/class split,
    the DFL softmax and expectation, the anchor arithmetic and the output concat). The ONNX Q/DQ
    path quantizes only the inputs of quantize()'s layers, so there the decode is float by
    construction; NNCF also quantizes Concat, Add, Multiply and ReduceSum inputs, which in the
    decode means one int8 scale for all box and class logits of every level and a quantized DFL
    expectation (the demo at 640 lost 0.060 mAP50-95 that way, 0.007 with the decode left float:
    docs/quantization.md).
    """
    weighted = {op.get_friendly_name(): op for op in model.get_ops() if op.get_type_name() in WEIGHTED_OPS}
    chosen: dict[str, Any] = {}
    for name in layers:
        found = {n: op for n, op in weighted.items() if n == name or n.startswith(name + "/")}
        if not found:
            raise ExportError(f"the layer {name!r} that stays in float has no weighted operation of that name in the "
                              "OpenVINO model, so NNCF could not leave it out; this is a bug, please report it")
        chosen.update(found)
    fed: dict[str, Any] = {}
    stack = list(chosen.values())
    while stack:
        for output in stack.pop().outputs():
            for target in output.get_target_inputs():
                op = target.get_node()
                name, kind = op.get_friendly_name(), op.get_type_name()
                if kind == "Result" or name in fed or name in chosen or kind in WEIGHTED_OPS:
                    continue  # a quantized layer's input is quantized, as in quantize(): stop there
                fed[name] = op
                stack.append(op)
    return sorted(chosen), sorted(fed)


def quantize_nncf(model: Any, onnx_path: Path, opts: ExportOptions) -> tuple[Any, dict[str, Any]]:
    """``model`` (the float IR) quantized by NNCF on the INT8 plan's calibration images; returns it
    and what was done (for the metadata)."""
    nncf = require("nncf", EXTRA, "INT8 OpenVINO export (NNCF)")
    items = _calibration_items(opts)
    layers = float_layers(opts.calibration, onnx_path)
    layer_ops, fed_ops = float_scope(model, layers)
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    advanced = AdvancedQuantizationParameters(
        disable_bias_correction=not NNCF_BIAS_CORRECTION,
        activations_range_estimator_params=getattr(RangeEstimatorParametersSet, NNCF_RANGE))
    try:
        quantized = nncf.quantize(model, nncf.Dataset(items), preset=nncf.QuantizationPreset(NNCF_PRESET),
                                  subset_size=len(items), ignored_scope=nncf.IgnoredScope(names=layer_ops + fed_ops),
                                  target_device=nncf.TargetDevice.CPU, advanced_parameters=advanced)
    except Exception as exc:
        raise ExportError(f"INT8 OpenVINO export failed in NNCF's quantization: {type(exc).__name__}: {exc}") from exc
    fq = sum(op.get_type_name() == "FakeQuantize" for op in quantized.get_ops())
    if not fq:
        raise ExportError("NNCF inserted no quantization into the OpenVINO model: there would be nothing INT8 about "
                          "this artifact; this is a bug, please report it")
    from libreyolo.export.metadata import package_version

    info = {"openvino": f"NNCF {package_version('nncf')} post-training quantization (preset {NNCF_PRESET}, CPU, "
                        f"{NNCF_RANGE.lower()} ranges, no bias correction) on the calibration images ({len(items)} "
                        f"batch(es) of {opts.batch}); the float layers and the {len(fed_ops)} operations they feed "
                        "(the decode) left out",
            "scheme": "activations int8 per-tensor (asymmetric: NNCF preset mixed), weights int8 per-output-channel "
                      "symmetric; scales chosen by NNCF",
            "nncf_fake_quantize_ops": fq, "nncf_float_layers": len(layers), "nncf_float_operations": len(fed_ops)}
    return quantized, info


def default_precision_effect(path: Path, opts: ExportOptions, runtime: Any = None) -> dict[str, Any]:
    """What OpenVINO's default CPU configuration would change: the IR at ``path`` compiled with the
    CPU plugin's defaults against the validated configuration, on the sample image and the
    validation probes. Returns the default precision, the largest raw difference per output
    (absolute and relative to the output's largest magnitude), the task matcher's comparison of
    the decoded predictions (detections matched at IoU 0.5: how many survive and how far boxes
    move) and a one-line summary."""
    from libreyolo.export.validate import probe_images, sample_batch
    from libreyolo.ops.letterbox import LetterboxMeta
    from libreyolo.runtimes.openvino import load
    from libreyolo.tasks import get_task

    validated = runtime or load(path)
    default = validated.with_config({})
    out: dict[str, Any] = {"validated_precision": validated.precision, "default_precision": default.precision}
    if default.precision == validated.precision:
        out["line"] = (f"OpenVINO's default CPU inference precision here is {default.precision}, the precision this "
                       "artifact was validated at: running it with OpenVINO's defaults changes nothing")
        return out
    family = validated.family
    task = get_task(family.task)
    vopts = task.export_validation_options(None)
    sample, metas = sample_batch(family, opts.imgsz)
    inputs = {"sample": (sample, metas), **{k: (v, [LetterboxMeta((opts.imgsz, opts.imgsz), 1.0, (0.0, 0.0))])
                                            for k, v in probe_images(opts.imgsz).items()}}
    raw: dict[str, dict[str, float]] = {}
    decoded = []
    matcher = task.matcher()
    for name, (x, m) in inputs.items():
        a, b = validated.network_outputs(x), default.network_outputs(x)
        for key, ref in a.items():
            if not ref.is_floating_point():
                continue
            diff = float((b[key].double() - ref.double()).abs().max())
            scale = float(ref.double().abs().max()) or 1.0
            entry = raw.setdefault(key, {"max_abs": 0.0, "relative": 0.0})
            entry["max_abs"], entry["relative"] = max(entry["max_abs"], diff), max(entry["relative"], diff / scale)
        ref_dec = family.postprocess(a, m, vopts)[0]
        got_dec = family.postprocess(b, m, vopts)[0]
        result = matcher(ref_dec, got_dec, score_tol=1e-6, **task.match_options(vopts), iou_min=0.5)
        decoded.append({"probe": name, **{k: v for k, v in result.items() if isinstance(v, (int, float, str, bool))}})
    out["raw"], out["decoded"] = raw, decoded
    rawline = ", ".join(f"{k} up to {v['max_abs']:.3g} ({100 * v['relative']:.2g}% of its largest value)"
                        for k, v in raw.items())
    first = decoded[0]
    if "max_box_error" in first:
        what = (f"detections on the sample image: {first['matched']} of {first['eager']} kept (same class, IoU >= 0.5; "
                f"{first['artifact']} found), boxes moved up to {first['max_box_error']:.3g} px, scores up to "
                f"{first['max_conf_diff']:.2g}")
    else:
        what = f"sample image: {first.get('line', first.get('matched'))}"
    out["line"] = (f"OpenVINO's default CPU inference precision here is {default.precision}; this artifact was "
                   f"validated at {validated.precision} and LibreYOLO runs it so. With the defaults: raw outputs "
                   f"{rawline} (sample + 3 probes); {what}")
    return out


class OpenVINOExporter(Exporter, format="openvino"):
    toolchain = ("openvino", "nncf", "onnx")

    def check(self, opts: ExportOptions) -> None:
        _ov()
        require("onnx", EXTRA, "OpenVINO export (the IR is converted from an ONNX graph)")
        if opts.int8:
            require("nncf", EXTRA, "INT8 OpenVINO export (NNCF)")
        check_opset(opts)
        if opts.device.type != "cpu":
            raise ArgumentError(f"OpenVINO models are converted and run on the CPU here; got device={opts.device}: "
                                "pass device=cpu")

    def build(self, module: torch.nn.Module, example: torch.Tensor, path: Path, opts: ExportOptions,
              work: Path) -> None:
        ov = _ov()
        onnx_path = work / "source.onnx"
        # the IR is float32 inside; an end-to-end graph keeps its uint8 pixel input
        export_onnx(module, example if opts.e2e else example.float(), onnx_path, replace(opts, half=False))
        try:
            model = ov.convert_model(str(onnx_path))
        except Exception as exc:
            raise ExportError(f"OpenVINO could not convert the ONNX graph: {type(exc).__name__}: {exc}") from exc
        if opts.int8:
            model, info = quantize_nncf(model, onnx_path, opts)
            (work / "int8.json").write_text(json.dumps(info))
        path.mkdir()
        ov.save_model(model, str(path / XML), compress_to_fp16=opts.half)

    def write_metadata(self, path: Path, encoded: dict[str, str], meta: dict[str, Any]) -> None:
        write_folder_metadata(path, meta, encoded)

    def content_sha256(self, path: Path) -> str:
        return folder_content_sha256(path)

    def runtime_config(self, opts: ExportOptions) -> dict[str, Any]:
        return dict(VALIDATED_CONFIG)

    def not_validated_reason(self, opts: ExportOptions) -> str | None:
        try:
            import openvino  # noqa: F401
        except ImportError:
            return f"openvino is not installed (pip install 'libreyolo[{EXTRA}]')"
        return None

    def int8_metadata(self, path: Path, opts: ExportOptions) -> dict[str, Any]:
        return json.loads((path.parent / "int8.json").read_text())

    def after_validation(self, path: Path, opts: ExportOptions, report: Any) -> None:
        effect = default_precision_effect(path, opts)
        report.findings["cpu_default_precision"] = effect
        report.notes.append(effect["line"])

    def graph_ops(self, path: Path) -> set[str]:
        return ir_ops(path)


EXPORTER = OpenVINOExporter()
