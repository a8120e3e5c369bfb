"""The ``libreyolo`` command. Arguments work as ``key=value`` or ``--key value`` (``--flag`` for booleans).

User mistakes print one line on stderr and exit with status 2; failures of the work itself
(e.g. an export that does not validate) exit with status 1.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from libreyolo.engine.options import BENCH_OPTIONS, COMPILE_OPTION, PREDICT_OPTIONS, VIDEO_OPTIONS
from libreyolo.errors import LibreYOLOError
from libreyolo.export.formats import FORMATS, artifact_endings, help_lines
from libreyolo.export.options import EXPORT_OPTIONS
from libreyolo.options import Opt, as_bool, as_device, as_graph_mode, as_output_file, imgsz_opt
from libreyolo.quant.options import QUANT_OPTIONS
from libreyolo.serve.cli import SERVE_OPTS, cmd_serve
from libreyolo.tasks import all_task_options
from libreyolo.track.options import SYNTH_OPTIONS, TRACK_OPTIONS, TRACK_VAL_OPTIONS
from libreyolo.train.options import TRAIN_OPTIONS, VAL_OPTIONS


class UsageError(LibreYOLOError):
    pass


# the converters under the names older option tables use (Opt(_bool, ...)); new code uses libreyolo.options
_bool, _device, _graph_mode = as_bool, as_device, as_graph_mode


def _imgsz(name: str, value: object) -> int:
    return imgsz_opt().check(name, value)


PREDICT_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt), architecture (.yaml) or artifact (.onnx/.pte/...)"),
    "source": Opt(str, None, "image file or directory, video file, rtsp:// or http:// stream, or webcam index "
                  "(default: the bundled sample image)"),
    **all_task_options(),  # each task's own (libreyolo.tasks): detect conf, iou, ...; semantic classes
    **{k: PREDICT_OPTIONS[k] for k in ("imgsz", "device")},
    "half": Opt(as_bool, False, "fp16 inference (CUDA)", True),
    **{k: PREDICT_OPTIONS[k] for k in ("batch", "cuda_graph", "workers", "decode")},
    **{k: PREDICT_OPTIONS[k] for k in VIDEO_OPTIONS},
    "compile": COMPILE_OPTION,
    "save": Opt(as_bool, True, "save annotated images (a video source: the annotated video)", True),
    "save_dir": Opt(str, "runs/predict", "where annotated images and JSON go"),
    "json": Opt(as_bool, False, "also write predictions (detections, top-5 classes, class areas) as JSON next to "
                "each image",
                True),
    **{k: PREDICT_OPTIONS[k] for k in ("save_json", "save_csv")},
    "verify": Opt(as_bool, True, "refuse artifacts changed since export and checkpoints with NaN/Inf weights", True),
}

TRACK_OPTS: dict[str, Opt] = {**PREDICT_OPTS, "tracker": TRACK_OPTIONS["tracker"]}

EXPORT_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) or architecture (.yaml)"),
    **{k: o for k, o in EXPORT_OPTIONS.items() if k != "verbose"},
}


class Args(dict):
    """Parsed options (defaults filled in); ``given`` holds the keys the command line set."""

    given: frozenset[str] = frozenset()


def parse_args(tokens: Sequence[str], opts: dict[str, Opt], command: str) -> Args:
    """``key=value`` / ``--key value`` / ``--key=value`` / ``--flag`` into values checked by each option's schema."""
    out = Args({k: o.default for k, o in opts.items()})
    given: set[str] = set()
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
                # the next token, unless it is an argument itself, is this one's value (a flag's too:
                # --half false, --compile max-autotune; positional arguments do not exist)
                if nxt is not None and not nxt.startswith("--") and "=" not in nxt:
                    value, i = nxt, i + 1
        elif "=" in tok:
            key, value = tok.split("=", 1)
        else:
            raise UsageError(f"unexpected argument {tok!r:.80} for '{command}': use key=value or --key value")
        key = key.replace("-", "_")
        if key not in opts:
            raise UsageError(f"unknown argument {key!r:.80} for '{command}'; valid: {', '.join(opts)}")
        if key in given:
            raise UsageError(f"{key} is given twice; give each argument once")
        given.add(key)
        opt = opts[key]
        if value is None:
            if opt.flag_value is None:
                raise UsageError(f"--{key} needs a value")
            out[key] = opt.flag_value
        else:
            try:
                out[key] = opt.check(key, value)
            except LibreYOLOError as exc:
                text = str(exc)
                raise UsageError(text if text.startswith(key) else f"{key}: {text}") from None
        i += 1
    out.given = frozenset(given)
    return out


def _usage(command: str, opts: dict[str, Opt], summary: str) -> str:
    lines = [f"usage: libreyolo {command} [key=value | --key value] ...", "", summary, "", "arguments:"]
    for k, o in opts.items():
        bounds = f"; {o.allowed()}" if o.choices or o.type in (int, float) else ""
        lines.append(f"  {k:<20} {o.help}{bounds} (default: {o.default})")
    return "\n".join(lines)


def cmd_predict(args: dict[str, Any]) -> int:
    return _predict_or_track(args, track=False)


def cmd_track(args: dict[str, Any]) -> int:
    return _predict_or_track(args, track=True)


def _predict_or_track(args: dict[str, Any], *, track: bool) -> int:
    from pathlib import Path

    from libreyolo import SAMPLE_IMAGE, LibreYOLO

    if not args["model"]:
        raise UsageError("predict needs model=<checkpoint|artifact>, e.g. model=LibreYOLO9t.pt")
    from tqdm import tqdm

    from libreyolo.results import OutputNames, save_suffix
    from libreyolo.utils.atomic import atomic_write

    save_dir = Path(args["save_dir"])
    if args["save"] or args["json"]:  # before any work: a bad folder fails fast
        try:
            save_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create save_dir {save_dir}: {exc.strerror or exc}") from None
    source = args["source"] or SAMPLE_IMAGE
    from libreyolo.data.video import is_video

    video = is_video(source)
    for key in ("save_json", "save_csv"):  # before the model loads
        if args[key] and not video:
            raise UsageError(f"{key}=true writes the predictions of a video source; for images use json=true")
    model = LibreYOLO(args["model"], device=args["device"], verify=args["verify"], compile=args["compile"])
    task_opts = {k: args[k] for k in all_task_options() if k in args.given}
    if track:
        task_opts.update(tracker=args["tracker"], persist=False)
    if video:  # one annotated video (written by predict itself), not an image per frame
        task_opts.update({k: args[k] for k in VIDEO_OPTIONS}, save=args["save"], save_dir=str(save_dir),
                         save_json=args["save_json"], save_csv=args["save_csv"])
    run = model.track if track else model.predict
    results = run(source, imgsz=args["imgsz"], half=args["half"], device=args["device"],
                  batch=args["batch"], cuda_graph=args["cuda_graph"], workers=args["workers"],
                  decode=args["decode"], stream=True, **task_opts)
    names = OutputNames()  # a.jpg and a.png in one folder must not save to the same file
    for r in results:
        stem = names.stem(r.path) if r.frame is None else f"{Path(r.path or 'video').stem}_{r.frame:06d}"
        where = r.path or "image"
        if r.frame is not None:
            where += f" frame {r.frame} ({r.timestamp:.3f} s)"
        line = f"{where}: {r.verbose()} ({', '.join(f'{k} {v:.1f} ms' for k, v in r.speed.items())})"
        if args["save"] and not video:
            line += f" -> {r.save(save_dir / f'{stem}{save_suffix(r.path)}')}"
        if args["json"]:
            atomic_write(save_dir / f"{stem}.json", lambda tmp, r=r: tmp.write_text(r.to_json(indent=1)))
        tqdm.write(line, file=sys.stdout)  # above the progress bar, if one is shown
    return 0


def _formats(name: str, value: object) -> list[str] | None:
    from libreyolo.engine.benchmark_formats import parse_formats

    return parse_formats(value)


BENCH_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) or architecture (.yaml); an artifact gets one row of its own"),
    "formats": Opt(_formats, None, f"comma list of {', '.join(FORMATS)}; 'eager' for the eager rows only; unset: "
                   "every format, those that cannot run here with a row saying why"),
    "data": Opt(str, None, "the task's dataset (a YAML; an image-folder root for classify) for the metric column "
                "(mAP50-95, top-1, mIoU)"),
    "floor": BENCH_OPTIONS["floor"],
    "json": Opt(as_output_file, None, "also write the table as JSON to this path"),
    "save_dir": Opt(str, None, "keep the exported artifacts in this folder (unset: a temporary one, removed)"),
    **{k: BENCH_OPTIONS[k] for k in ("device", "imgsz", "batch", "n", "workers", "half", "int8", "max_drop",
                                         "cuda_graph")},
}


def cmd_benchmark(args: dict[str, Any]) -> int:
    import torch

    from libreyolo import LibreYOLO
    from libreyolo.engine.benchmark_formats import benchmark_formats, format_table
    from libreyolo.utils.atomic import atomic_write

    if not args["model"]:
        raise UsageError("benchmark needs model=<checkpoint|architecture>, e.g. model=LibreYOLO9t.pt")
    device = args["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    model = LibreYOLO(args["model"], device=device)
    result = benchmark_formats(model, formats=args["formats"], data=args["data"], imgsz=args["imgsz"],
                               batch=args["batch"], n=args["n"], half=args["half"], cuda_graph=args["cuda_graph"],
                               floor=args["floor"], save_dir=args["save_dir"], workers=args["workers"],
                               int8=args["int8"], max_drop=args["max_drop"])
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
    **TRAIN_OPTIONS,
}

VAL_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) or artifact (.onnx, .pte, .pt2, .engine, .mlpackage, .tflite, "
                            "_ncnn_model/, _openvino_model/)"),
    **{k: VAL_OPTIONS[k] for k in ("data", "imgsz", "batch", "workers", "device", "conf", "iou", "max_det")},
    **TRACK_VAL_OPTIONS,  # tracker=: data= is a folder of MOTChallenge sequences (libreyolo.track.evaluate)
}


def cmd_train(args: dict[str, Any]) -> int:
    import json

    from libreyolo import LibreYOLO

    if not args["model"]:
        raise UsageError("train needs model=<checkpoint|architecture>, e.g. model=LibreYOLO9t.yaml")
    # only what the command line set: a family's own training defaults (Family.train_defaults) stay
    opts = {k: v for k, v in args.items() if k != "model" and k in args.given}
    model = LibreYOLO(args.pop("model"), device=args["device"])
    summary = model.train(**opts)
    print(json.dumps(summary, indent=1, default=str))
    return 0


def cmd_val(args: dict[str, Any]) -> int:
    import json

    from libreyolo import LibreYOLO

    if not args["model"] or not args["data"]:
        raise UsageError("val needs model=<checkpoint or artifact> and data=<dataset YAML, image-folder root, "
                         "or a folder of high-resolution images (restore)>")
    model = LibreYOLO(args.pop("model"), device=args["device"])
    if args["tracker"] is not None:
        from libreyolo.track.evaluate import format_table

        # the detector's own predict defaults (conf, iou) unless given: mAP's conf=0.001 is no tracker input
        given = {k: args[k] for k in ("imgsz", "batch", "device", "conf", "iou", "max_det") if k in args.given}
        result = model.val(data=args["data"], tracker=args["tracker"], json=args["json"], **given)
        print(format_table(result))
        if args["json"]:
            print(f"wrote {args['json']}")
        return 0
    args.pop("tracker")
    json_path = args.pop("json")
    metrics = model.val(**args)
    text = json.dumps(metrics, indent=1)
    print(text)
    if json_path:
        from libreyolo.utils.atomic import atomic_write

        atomic_write(json_path, lambda tmp: tmp.write_text(text + "\n"))
    return 0


def cmd_track_synth(args: dict[str, Any]) -> int:
    from libreyolo.track.synth import make_mot_sequences

    if not args["out"]:
        raise UsageError("track-synth needs out=<folder> for the sequences")
    root = make_mot_sequences(args.pop("out"), **args)
    print(f"wrote {args['sequences']} sequences of {args['frames']} frames to {root} (MOTChallenge layout)")
    return 0


COMPARE_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) the artifact should come from"),
    "artifact": Opt(str, None, f"exported file or folder ({', '.join(artifact_endings())})"),
    "device": Opt(as_device, None, "cpu, cuda, cuda:N (default: the artifact's export device where it can run)"),
    "json": Opt(as_output_file, None, "also write the report as JSON to this path"),
    "data": Opt(str, None, "INT8 artifacts: the dataset the export calibrated on (rebuilds the quantized reference)"),
}


def cmd_compare(args: dict[str, Any]) -> int:
    """0: the artifact matches the checkpoint; 1: it does not (or cannot be validated here)."""
    import json
    from pathlib import Path

    from libreyolo.export.compare import compare

    if not args["model"] or not args["artifact"]:
        raise UsageError("compare needs model=<checkpoint .pt> and artifact=<exported file>")
    report = compare(args["model"], args["artifact"], device=args["device"], data=args["data"])
    print(report.text())
    if args["json"]:
        from libreyolo.utils.atomic import atomic_write

        text = json.dumps(report.to_dict(), indent=1, default=str)
        atomic_write(Path(args["json"]), lambda tmp: tmp.write_text(text))
    return 0 if report.passed else 1


QUANTIZE_OPTS: dict[str, Opt] = {
    "model": Opt(str, None, "checkpoint (.pt) or architecture (.yaml) to quantize"),
    **QUANT_OPTIONS,
    "exclude": Opt(str, None, "comma list of module-name globs kept in float (added to the family's defaults)"),
    "output": Opt(str, None, "where to write the quantized checkpoint (default: <model stem>-<recipe>.pt here)"),
    "device": PREDICT_OPTIONS["device"],
}


def cmd_quantize(args: dict[str, Any]) -> int:
    import json
    from pathlib import Path

    from libreyolo import LibreYOLO

    if not args["model"] or not args["data"]:
        raise UsageError("quantize needs model=<checkpoint|architecture> and data=<dataset YAML or image folder>")
    output = Path(args["output"] or f"{Path(args['model']).stem}-{args['recipe']}.pt").expanduser()
    if not output.absolute().parent.is_dir():
        raise UsageError(f"output: the folder of {output} does not exist; create it or choose another output=")
    exclude = [p.strip() for p in args["exclude"].split(",") if p.strip()] if args["exclude"] else None
    model = LibreYOLO(args["model"], device=args["device"])
    model.quantize(recipe=args["recipe"], data=args["data"], samples=args["samples"], method=args["method"],
                   exclude=exclude)
    info = model.quant_info()
    path = model.save(output)
    print(json.dumps({"output": path, **{k: info[k] for k in ("recipe", "method", "samples", "count")},
                      "excluded": info["excluded"]}, indent=1))
    return 0


COMMANDS: dict[str, tuple[Callable[[dict[str, Any]], int], dict[str, Opt], str]] = {
    "predict": (cmd_predict, PREDICT_OPTS, "Detect objects or classify images, and save annotated copies."),
    "track": (cmd_track, TRACK_OPTS, "Track objects over the frames of a video, stream or webcam (detect models)."),
    "export": (cmd_export, EXPORT_OPTS, "Export to an artifact format, validated against eager (docs/formats.md)."
               "\n\nformats:\n" + "\n".join(help_lines())),
    "benchmark": (cmd_benchmark, BENCH_OPTS, "One row per format: size, validation, error, metric, speed."),
    "train": (cmd_train, TRAIN_OPTS, "Train a model on a dataset (YOLO-format YAML or image folders)."),
    "val": (cmd_val, VAL_OPTS, "Validate a model on a dataset's val split (mAP, top-1/top-5, mIoU, or PSNR/SSIM), "
            "or a tracker on MOTChallenge sequences (HOTA, IDF1, MOTA)."),
    "track-synth": (cmd_track_synth, SYNTH_OPTIONS, "Write synthetic tracking sequences of moving shapes "
                    "(MOTChallenge layout) for `libreyolo val tracker=...`."),
    "compare": (cmd_compare, COMPARE_OPTS, "Re-validate an artifact against a checkpoint (exit 0: match)."),
    "quantize": (cmd_quantize, QUANTIZE_OPTS, "Calibrate simulated INT8/FP8 and write the quantized checkpoint."),
    "serve": (cmd_serve, SERVE_OPTS, "Serve a model over HTTP (micro-batched; POST /predict, a page at /)."),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = "usage: libreyolo <command> [args]\n\ncommands:\n" + "\n".join(
        f"  {name:<10} {(summary.splitlines() or [''])[0]}" for name, (_, _, summary) in COMMANDS.items())
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
    except BrokenPipeError:  # stdout closed by the reader (`| head`): stop quietly, as Unix tools do
        _silence_stdout()
        return 1
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


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail a second time."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
