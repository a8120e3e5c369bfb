"""The ``libreyolo`` command. Arguments work as ``key=value`` or ``--key value`` (``--flag`` for booleans).

User mistakes print one line on stderr and exit with status 2; failures of the work itself
(e.g. an export that does not validate) exit with status 1.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from libreyolo.errors import LibreYOLOError


class UsageError(LibreYOLOError):
    pass


def _bool(v: str) -> bool:
    from libreyolo.utils.checks import FALSE_STRINGS, TRUE_STRINGS

    low = v.strip().lower()
    if low in TRUE_STRINGS:
        return True
    if low in FALSE_STRINGS:
        return False
    raise UsageError(f"expected true or false (or 1/0), got {v!r}")


def _device(v: str) -> str:
    from libreyolo.utils.checks import resolve_device

    resolve_device(v)  # cpu, cuda, cuda:N, mps: checked before any model is loaded
    return v


def _imgsz(v: str) -> int:
    from libreyolo.utils.checks import MAX_IMGSZ

    value = int(v)
    if not 1 <= value <= MAX_IMGSZ:
        raise UsageError(f"expected a size from 32 to {MAX_IMGSZ} (a multiple of the model stride, e.g. 640), "
                         f"got {v!r}")
    return value


def _graph_mode(v: str) -> bool | str:
    return "auto" if v.lower() == "auto" else _bool(v)


def _int_list(v: str) -> list[int]:
    try:
        return [int(x) for x in v.replace(",", " ").split()]
    except ValueError:
        raise UsageError(f"expected class ids like 0,2,5, got {v!r}") from None


@dataclass(frozen=True)
class Opt:
    type: Callable[[str], Any]
    default: Any
    help: str
    flag_value: Any = None  # value when given as a bare --flag


PREDICT_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt), architecture (.yaml) or artifact (.onnx/.pte/...)"),
    "source": Opt(str, None, "image file or directory (default: the bundled sample image)"),
    "conf": Opt(float, 0.25, "confidence threshold"),
    "iou": Opt(float, 0.45, "NMS IoU threshold"),
    "max_det": Opt(int, 300, "maximum detections per image"),
    "imgsz": Opt(_imgsz, None, "network input size (multiple of 32; default from the model)"),
    "classes": Opt(_int_list, None, "keep only these class ids, e.g. 0,2"),
    "device": Opt(_device, None, "cpu, cuda, cuda:N or mps"),
    "half": Opt(_bool, False, "fp16 inference (CUDA)", True),
    "batch": Opt(int, None, "images per forward"),
    "cuda_graph": Opt(_graph_mode, False, "replay the forward from CUDA graphs: true or auto", True),
    "save": Opt(_bool, True, "save annotated images", True),
    "save_dir": Opt(str, "runs/predict", "where annotated images and JSON go"),
    "json": Opt(_bool, False, "also write predictions (detections, top-5 classes) as JSON next to each image", True),
    "verify": Opt(_bool, True, "refuse artifacts changed since export and checkpoints with NaN/Inf weights", True),
}

EXPORT_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) or architecture (.yaml)"),
    "format": Opt(str, "onnx", "onnx, executorch, coreml, tensorrt or aoti (AOTInductor .pt2)"),
    "imgsz": Opt(_imgsz, None, "input size (multiple of 32; default from the model)"),
    "batch": Opt(int, 1, "batch size of the exported input"),
    "dynamic": Opt(_bool, False, "dynamic batch (and spatial where supported)", True),
    "half": Opt(_bool, False, "fp16 weights and input (CUDA export)", True),
    "opset": Opt(int, None, "ONNX opset"),
    "simplify": Opt(_bool, False, "simplify the ONNX graph (needs libreyolo[onnx-simplify])", True),
    "nms": Opt(_bool, False, "embed NMS in the exported graph", True),
    "device": Opt(_device, None, "device used for export: cpu, cuda, cuda:N"),
    "output": Opt(str, None, "artifact path"),
    "workspace": Opt(float, None, "TensorRT workspace in GiB"),
    "autotune": Opt(_bool, False, "aoti on CUDA: Inductor max-autotune (much longer compile)", True),
    "validate": Opt(_bool, True, "validate the artifact against the eager model", True),
    "require_validation": Opt(_bool, False, "fail when the artifact cannot be validated here", True),
}


def parse_args(tokens: Sequence[str], opts: dict[str, Opt], command: str) -> dict[str, Any]:
    """``key=value`` / ``--key value`` / ``--key=value`` / ``--flag`` into typed values."""
    out = {k: o.default for k, o in opts.items()}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            body = tok[2:]
            if "=" in body:
                key, value = body.split("=", 1)
            else:
                key, value = body, None
                nxt = tokens[i + 1] if i + 1 < len(tokens) else None
                takes_value = opts.get(key.replace("-", "_"), Opt(str, None, "")).flag_value is None
                if nxt is not None and not nxt.startswith("--") and "=" not in nxt:
                    if takes_value or nxt.lower() in ("true", "false", "auto", "0", "1", "yes", "no"):
                        value, i = nxt, i + 1
        elif "=" in tok:
            key, value = tok.split("=", 1)
        else:
            raise UsageError(f"unexpected argument {tok!r} for '{command}': use key=value or --key value")
        key = key.replace("-", "_")
        if key not in opts:
            raise UsageError(f"unknown argument {key!r} for '{command}'; valid: {', '.join(opts)}")
        opt = opts[key]
        if value is None:
            if opt.flag_value is None:
                raise UsageError(f"--{key} needs a value")
            out[key] = opt.flag_value
        else:
            try:
                out[key] = opt.type(value)
            except LibreYOLOError as exc:
                text = str(exc)
                raise UsageError(text if text.startswith(key) else f"{key}: {text}") from None
            except ValueError:
                raise UsageError(f"{key}: invalid value {value!r}") from None
        i += 1
    return out


def _usage(command: str, opts: dict[str, Opt], summary: str) -> str:
    lines = [f"usage: libreyolo {command} [key=value | --key value] ...", "", summary, "", "arguments:"]
    for k, o in opts.items():
        lines.append(f"  {k:<20} {o.help} (default: {o.default})")
    return "\n".join(lines)


def cmd_predict(args: dict[str, Any]) -> int:
    from pathlib import Path

    from libreyolo import SAMPLE_IMAGE, LibreYOLO

    if not args["model"]:
        raise UsageError("predict needs model=<checkpoint|artifact>, e.g. model=LibreYOLO9t.pt")
    from tqdm import tqdm

    from libreyolo.checkpoint import atomic_write
    from libreyolo.results import OutputNames, save_suffix

    save_dir = Path(args["save_dir"])
    if args["save"] or args["json"]:  # before any work: a bad folder fails fast
        try:
            save_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create save_dir {save_dir}: {exc.strerror or exc}") from None
    model = LibreYOLO(args["model"], device=args["device"], verify=args["verify"])
    source = args["source"] or SAMPLE_IMAGE
    results = model.predict(source, conf=args["conf"], iou=args["iou"], max_det=args["max_det"],
                            imgsz=args["imgsz"], classes=args["classes"], half=args["half"],
                            device=args["device"], batch=args["batch"], cuda_graph=args["cuda_graph"], stream=True)
    names = OutputNames()  # a.jpg and a.png in one folder must not save to the same file
    for r in results:
        stem = names.stem(r.path)
        line = f"{r.path or 'image'}: {r.verbose()} ({', '.join(f'{k} {v:.1f} ms' for k, v in r.speed.items())})"
        if args["save"]:
            line += f" -> {r.save(save_dir / f'{stem}{save_suffix(r.path)}')}"
        if args["json"]:
            atomic_write(save_dir / f"{stem}.json", lambda tmp, r=r: tmp.write_text(r.to_json(indent=1)))
        tqdm.write(line, file=sys.stdout)  # above the progress bar, if one is shown
    return 0


def _positive_int(v: str) -> int:
    value = int(v)
    if value < 1:
        raise UsageError(f"expected a whole number of at least 1, got {v!r}")
    return value


def _workers(v: str) -> int:
    value = int(v)
    if value < 0:
        raise UsageError(f"expected a whole number of at least 0, got {v!r}")
    return value


def _floor(v: str) -> float:
    import math

    value = float(v)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise UsageError(f"expected an absolute metric drop from 0 to 1 (e.g. 0.01), got {v!r}")
    return value


def _formats(v: str) -> list[str] | None:
    from libreyolo.engine.benchmark_formats import parse_formats

    return parse_formats(v)


BENCH_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) or architecture (.yaml); an artifact gets one row of its own"),
    "formats": Opt(_formats, None, "comma list of onnx, executorch, coreml, tensorrt, aoti; 'eager' for the eager "
                   "rows only; unset: every format, those that cannot run here with a row saying why"),
    "data": Opt(str, None, "dataset YAML (detect) or image-folder root (classify) for the mAP50-95 / top-1 column"),
    "floor": Opt(_floor, 0.01, "fail (exit 1) when a format's metric is below eager minus this (absolute)"),
    "json": Opt(str, None, "also write the table as JSON to this path"),
    "save_dir": Opt(str, None, "keep the exported artifacts in this folder (unset: a temporary one, removed)"),
    "device": Opt(_device, None, "cpu, cuda, cuda:N (unset: cuda when available)"),
    "imgsz": Opt(_imgsz, None, "network input size, also of the exports (unset: the model's)"),
    "batch": Opt(_positive_int, 1, "images per predict() call (and the exports' batch)"),
    "n": Opt(_positive_int, 50, "timed calls per format (median reported)"),
    "workers": Opt(_workers, 0, "DataLoader workers of the data= validation"),
    "half": Opt(_bool, False, "fp16 (CUDA)", True),
    "cuda_graph": Opt(_graph_mode, True, "also time predict(cuda_graph=...): true, auto or false", True),
}


def cmd_benchmark(args: dict[str, Any]) -> int:
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.checkpoint import atomic_write
    from libreyolo.engine.benchmark_formats import benchmark_formats, format_table

    if not args["model"]:
        raise UsageError("benchmark needs model=<checkpoint|architecture>, e.g. model=LibreYOLO9t.pt")
    if args["json"] is not None:
        from pathlib import Path

        if not Path(args["json"]).expanduser().absolute().parent.is_dir():
            raise UsageError(f"json: the folder of {args['json']} does not exist")
    device = args["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    model = LibreYOLO(args["model"], device=device)
    result = benchmark_formats(model, formats=args["formats"], data=args["data"], imgsz=args["imgsz"],
                               batch=args["batch"], n=args["n"], half=args["half"], cuda_graph=args["cuda_graph"],
                               floor=args["floor"], save_dir=args["save_dir"], workers=args["workers"])
    print(format_table(result))
    if args["json"] is not None:
        import json

        text = json.dumps(result.to_dict(), indent=1)
        atomic_write(args["json"], lambda tmp: tmp.write_text(text + "\n"))
        print(f"wrote {args['json']}")
    return 1 if result.failures else 0


def cmd_export(args: dict[str, Any]) -> int:
    try:
        from libreyolo.export.cli import run_export
    except ImportError:
        raise UsageError("export is not available in this build") from None
    if not args["model"]:
        raise UsageError("export needs model=<checkpoint>, e.g. model=LibreYOLO9t.pt")
    return run_export(args)


TRAIN_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) or architecture (.yaml) to start from; a run's last.pt with resume"),
    "data": Opt(str, None, "dataset YAML (detect: path/train/val/names) or image-folder root (classify)"),
    "epochs": Opt(int, 100, "epochs"),
    "imgsz": Opt(_imgsz, None, "training input size (default from the model)"),
    "batch": Opt(int, 16, "images per batch (all ranks together)"),
    "workers": Opt(int, 2, "DataLoader worker processes"),
    "device": Opt(_device, None, "cpu, cuda, cuda:N"),
    "optimizer": Opt(str, "auto", "SGD, AdamW or auto (SGD)"),
    "lr0": Opt(float, 0.01, "initial learning rate"),
    "lrf": Opt(float, 0.01, "final learning rate as a fraction of lr0"),
    "cos_lr": Opt(_bool, True, "cosine decay (false: linear)", True),
    "warmup_epochs": Opt(float, 3.0, "warm-up epochs"),
    "amp": Opt(_bool, True, "mixed precision (CUDA)", True),
    "ema": Opt(_bool, True, "keep an EMA of the weights (validated and saved)", True),
    "mosaic": Opt(float, 1.0, "mosaic probability (detect)"),
    "close_mosaic": Opt(int, 10, "turn mosaic off for the last N epochs"),
    "seed": Opt(int, 0, "random seed"),
    "project": Opt(str, "runs/train", "parent folder of runs"),
    "name": Opt(str, "exp", "run folder name (a number is appended when it exists)"),
    "exist_ok": Opt(_bool, False, "reuse an existing run folder", True),
    "resume": Opt(_bool, False, "continue the run of model=<run>/weights/last.pt", True),
    "val": Opt(_bool, True, "validate every epoch", True),
    "cuda_graph": Opt(_bool, False, "capture the training step in CUDA graphs (never stops a run)", True),
}

VAL_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) or artifact (.onnx, .pte, .pt2, .engine, .mlpackage)"),
    "data": Opt(str, None, "dataset YAML (detect) or image-folder root (classify)"),
    "imgsz": Opt(_imgsz, None, "input size (default from the model)"),
    "batch": Opt(int, 16, "images per batch"),
    "workers": Opt(int, 2, "DataLoader worker processes"),
    "device": Opt(_device, None, "cpu, cuda, cuda:N"),
    "conf": Opt(float, 0.001, "confidence threshold (mAP is computed over all confidences)"),
    "iou": Opt(float, 0.7, "NMS IoU threshold"),
}


def cmd_train(args: dict[str, Any]) -> int:
    import json

    from libreyolo import LibreYOLO

    if not args["model"]:
        raise UsageError("train needs model=<checkpoint|architecture>, e.g. model=LibreYOLO9t.yaml")
    opts = {k: v for k, v in args.items() if k != "model"}
    model = LibreYOLO(args.pop("model"), device=args["device"])
    summary = model.train(**opts)
    print(json.dumps(summary, indent=1, default=str))
    return 0


def cmd_val(args: dict[str, Any]) -> int:
    import json

    from libreyolo import LibreYOLO

    if not args["model"] or not args["data"]:
        raise UsageError("val needs model=<checkpoint or artifact> and data=<dataset YAML or image-folder root>")
    model = LibreYOLO(args.pop("model"), device=args["device"])
    print(json.dumps(model.val(**args), indent=1))
    return 0


COMPARE_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) the artifact should come from"),
    "artifact": Opt(str, None, "exported file (.onnx, .pte, .pt2, .mlpackage, .engine)"),
    "device": Opt(_device, None, "cpu, cuda, cuda:N (default: the artifact's export device where it can run)"),
    "json": Opt(str, None, "also write the report as JSON to this path"),
}


def cmd_compare(args: dict[str, Any]) -> int:
    """0: the artifact matches the checkpoint; 1: it does not (or cannot be validated here)."""
    import json
    from pathlib import Path

    from libreyolo.export.compare import compare

    if not args["model"] or not args["artifact"]:
        raise UsageError("compare needs model=<checkpoint .pt> and artifact=<exported file>")
    report = compare(args["model"], args["artifact"], device=args["device"])
    print(report.text())
    if args["json"]:
        from libreyolo.checkpoint import atomic_write

        text = json.dumps(report.to_dict(), indent=1, default=str)
        atomic_write(Path(args["json"]), lambda tmp: tmp.write_text(text))
    return 0 if report.passed else 1


COMMANDS: dict[str, tuple[Callable[[dict[str, Any]], int], dict[str, Opt], str]] = {
    "predict": (cmd_predict, PREDICT_OPTS, "Detect objects or classify images, and save annotated copies."),
    "export": (cmd_export, EXPORT_OPTS, "Export a model to ONNX, ExecuTorch, CoreML or TensorRT, validated."),
    "benchmark": (cmd_benchmark, BENCH_OPTS, "One row per format: size, validation, error, metric, speed."),
    "train": (cmd_train, TRAIN_OPTS, "Train a model on a dataset (YOLO-format YAML or image folders)."),
    "val": (cmd_val, VAL_OPTS, "Validate a model on a dataset's val split (mAP, or top-1/top-5)."),
    "compare": (cmd_compare, COMPARE_OPTS, "Re-validate an artifact against a checkpoint (exit 0: match)."),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = "usage: libreyolo <command> [args]\n\ncommands:\n" + "\n".join(
        f"  {name:<10} {summary}" for name, (_, _, summary) in COMMANDS.items())
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(top)
        return 0
    if argv[0] in ("-V", "--version", "version"):
        from libreyolo import __version__

        print(__version__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"libreyolo: unknown command {command!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    func, opts, summary = COMMANDS[command]
    if any(t in ("-h", "--help") for t in rest):
        print(_usage(command, opts, summary))
        return 0
    from libreyolo.utils.log import enable_console

    enable_console()  # library messages (warnings, progress notes) on stderr; results go to stdout
    try:
        return func(parse_args(rest, opts, command))
    except LibreYOLOError as exc:  # user mistakes exit 2; an error may say it is a failure of the work (1)
        print(f"libreyolo {command}: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    except OSError as exc:  # the file system refused something (disk full, permissions)
        print(f"libreyolo {command}: error: {exc}", file=sys.stderr)
        return 1
    except NotImplementedError as exc:
        print(f"libreyolo {command}: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"libreyolo {command}: error: out of memory; try a smaller imgsz or batch", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
