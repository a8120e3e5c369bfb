"""``libreyolo export``: the command-line side of :func:`libreyolo.export.export`.

The lead's ``libreyolo/cli.py`` parses the command line and calls :func:`run_export` with a
dict of options (unknown keys are an error):

============================  =========  ==================================================
option                        default    meaning
============================  =========  ==================================================
``model``                     required   checkpoint (``LibreYOLO9t.pt``), ``*.yaml`` or Hub name
``format``                    ``onnx``   a format of :mod:`libreyolo.export.formats` (or an alias)
``imgsz``                     model's    input size, a multiple of the stride (32)
``batch``                     ``1``      batch size (``tensorrt`` + ``dynamic``: the largest)
``dynamic``                   ``False``  dynamic batch (and height/width for ONNX)
``half``                      ``False``  float16 (ONNX: needs ``device=cuda``)
``opset``                     ``17``     ONNX opset (13..20), ONNX and TensorRT only
``simplify``                  ``False``  run onnxslim on the graph (extra ``onnx-simplify``)
``nms``                       ``False``  embed NMS: outputs ``detections``, ``num_detections``
``e2e``                       ``False``  uint8 RGB input, normalisation (+ NMS) inside the graph
``device``                    model's    ``cpu`` or ``cuda[:i]`` to trace on
``output``                    see below  artifact path (or an existing folder)
``name``                      ``None``   file name in the default folder (instead of output)
``workspace``                 ``4``      TensorRT builder workspace in GiB
``autotune``                  ``False``  ``aoti`` on CUDA: Inductor max-autotune (long compile)
``max_batch``                 ``8``      ``triton``: the config's max_batch_size
``preferred_batch``           none       ``triton``: dynamic_batching preferred_batch_size (``4,8``)
``queue_delay_us``            ``100``    ``triton``: dynamic_batching max_queue_delay_microseconds
``instances``                 ``1``      ``triton``: instance_group count (kind KIND_AUTO)
``validate``                  ``True``   compare the artifact with eager (``False``: warning)
``require_validation``        ``False``  fail unless the artifact was actually validated here
============================  =========  ==================================================

Default output: next to the checkpoint with the format's suffix (``LibreYOLO9t.onnx``), or
``<family><size>.<ext>`` in the current folder for a model built from a YAML. ``triton``:
``output`` is the model repository (default ``model_repository`` next to the checkpoint) and
``name`` the model folder in it (default the checkpoint's stem).
Boolean options accept ``True``/``False`` or the strings ``true``/``false``/``1``/``0``
(anything else is an error: ``"false"`` must never read as true).

Exit codes: 0 when the artifact is written (validated, or not validatable here and
``require_validation`` is off); user mistakes raise :class:`libreyolo.errors.LibreYOLOError`
subclasses, which the CLI prints in one line and turns into a non-zero exit.
"""
from __future__ import annotations

from typing import Any

from libreyolo.errors import ArgumentError


def normalise(args: dict[str, Any]) -> dict[str, Any]:
    """Options with defaults filled in and CLI strings converted (:data:`EXPORT_OPTIONS`)."""
    from libreyolo.export.options import EXPORT_OPTIONS, check_output_folder

    known = ("model", *EXPORT_OPTIONS)
    unknown = sorted(k for k in args if k.replace("-", "_") not in known)
    if unknown:
        raise ArgumentError(f"unknown export option(s): {', '.join(unknown)}; known: {', '.join(known)}")
    given = {k.replace("-", "_"): v for k, v in args.items() if v is not None}
    if not given.get("model"):
        raise ArgumentError("export needs model=<checkpoint .pt, .yaml or Hub name>")
    opts = {"model": given.pop("model")}
    for key, opt in EXPORT_OPTIONS.items():
        if key != "verbose":
            opts[key] = opt.check(key, given.get(key, opt.default))
    check_output_folder(opts["output"])  # before the model loads
    return opts


def run_export(args: dict[str, Any]) -> int:
    """Export as the CLI does; prints the artifact, its size, the validation and the next command."""
    from libreyolo.api import LibreYOLO

    opts = normalise(args)
    model = LibreYOLO(opts.pop("model"))
    if not hasattr(model, "export"):
        raise ArgumentError(f"{type(model).__name__} is already an exported artifact; export from a checkpoint")
    fmt = opts.pop("format")
    report = model.export(format=fmt, verbose=False, **opts)
    print(report.text())
    return 0
