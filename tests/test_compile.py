"""compile=True: torch.compile of the inference copy, validated against the eager copy before it serves.

One real Inductor compilation on the CPU (YOLOv9-t at imgsz 64, batch 1: about 15 s with a warm
Inductor cache, 2-3 minutes cold on a loaded 2-core machine), shared by the module-scoped
``compiled`` fixture; later models of the same architecture and shape reuse what torch.compile
cached. The other behaviours patch :func:`libreyolo.engine.compiled.torch_compile` (the one place
torch.compile is called) with a program that is wrong on purpose or that fails, so the validation
and the fallback are exercised without compiling. The CUDA case is ``gpu``-marked.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.cli import main
from libreyolo.engine import compiled as compiled_mod
from libreyolo.errors import ArgumentError
from tests.conftest import seeded_model

IMGSZ = 64
CONF = 0.05


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the test machine is shared
    yield
    torch.set_num_threads(before)


def _same_results(a, b) -> bool:
    return torch.equal(a.boxes.data, b.boxes.data)


@pytest.fixture(scope="module")
def compiled():
    """A seeded YOLOv9-t compiled for real (mode "default" on the CPU), its first predict, and the
    same model's eager predict."""
    eager = seeded_model("t")
    model = seeded_model("t").compile(True)
    first = model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF)
    return SimpleNamespace(model=model, first=first, eager=eager.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF))


def _batch(model):
    """The letterboxed sample image, as predict() feeds the network."""
    from libreyolo.data.sources import load_sources

    batch, _ = model.family.letterbox(IMGSZ)([load_sources(SAMPLE_IMAGE)[0].data])
    return batch


# --- the real compile ---------------------------------------------------------------------------
def test_compiled_predict_gives_the_eager_detections(compiled):
    e, c = compiled.eager, compiled.first
    assert len(e.boxes) > 0, "the seeded model must detect something for this comparison to mean anything"
    assert torch.equal(c.boxes.cls, e.boxes.cls)
    torch.testing.assert_close(c.boxes.xyxy, e.boxes.xyxy, rtol=0, atol=1e-3)  # pixels, at imgsz 64
    torch.testing.assert_close(c.boxes.conf, e.boxes.conf, rtol=0, atol=1e-5)


def test_compiled_raw_outputs_pass_the_export_validators_bar(compiled):
    model = compiled.model
    batch = _batch(model)
    copy = model.inference_copy()
    program = copy.attachment("compiled")
    with torch.inference_mode():
        got = program(batch)
    verdict = compiled_mod.check_against_eager(copy.module, model.family, batch, [got])
    assert verdict["passed"] and verdict["ratio"] <= 1.0, verdict


def test_compile_info_reports_the_mode_the_validated_shape_and_compile_seconds(compiled):
    info = compiled.model.compile_info()
    assert info["mode"] is True and "cuda_graph=True" in info["cuda_graph"]
    (entry,) = info["copies"]
    assert entry["device"] == "cpu" and entry["dtype"] == "float32"
    assert entry["mode"] == "default" and entry["inductor_cuda_graphs"] is False
    assert entry["compiled"] is True and entry["fallback"] is None
    shape = next(s for s in entry["shapes"] if s["shape"] == [1, 3, IMGSZ, IMGSZ])
    assert shape["compile_seconds"] > 0 and shape["validate_seconds"] > 0
    assert 0 <= shape["worst_ratio"] <= 1.0 and shape["checked_runs"] == 1
    assert entry["calls"]["compiled"] >= 1


def test_end_compile_workers_ends_the_pool_a_compilation_left_and_says_so(compiled):
    from torch._inductor import async_compile

    had = bool(async_compile._pool_set)
    assert compiled_mod.end_compile_workers() is had
    assert not async_compile._pool_set and compiled_mod.end_compile_workers() is False


def test_changed_weights_drop_the_compiled_program_and_the_next_predict_revalidates(compiled):
    model = compiled.model
    old = model.inference_copy().attachment("compiled")
    retired = model.compile_info()["retired"]
    model.load_weights(model.net.state_dict())  # the same values: still retires the copies
    assert old.released and old._fn is None
    info = model.compile_info()
    assert info["retired"] == retired + 1 and "load_weights" in info["last_retired"] and info["copies"] == []
    again = model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF)
    (entry,) = model.compile_info()["copies"]
    assert entry["compiled"] and entry["shapes"][0]["shape"] == [1, 3, IMGSZ, IMGSZ]
    assert model.inference_copy().attachment("compiled") is not old
    assert _same_results(again, compiled.first)


# --- options and entry points ---------------------------------------------------------------------
@pytest.mark.parametrize("value", ["fast", "auto", "Default", 2, None])
def test_a_wrong_compile_value_is_refused_at_LibreYOLO_with_what_is_valid(value):
    with pytest.raises(ArgumentError) as err:
        LibreYOLO("LibreYOLO9t.yaml", compile=value)
    text = str(err.value)
    assert len(text.splitlines()) == 1 and repr(value)[:20] in text
    assert "reduce-overhead" in text and "max-autotune-no-cudagraphs" in text


@pytest.mark.parametrize("value, stored", [(True, True), ("true", True), ("reduce-overhead", "reduce-overhead"),
                                           (False, False), ("0", False)])
def test_LibreYOLO_and_model_compile_take_the_same_values(value, stored):
    assert LibreYOLO("LibreYOLO9t.yaml", compile=value).compile_info()["mode"] == stored
    assert LibreYOLO("LibreYOLO9t.yaml").compile(value).compile_info()["mode"] == stored


def test_compile_on_an_artifact_is_refused_before_loading_it():
    with pytest.raises(ArgumentError, match="applies to eager models"):
        LibreYOLO("missing.onnx", compile=True)


def test_true_means_reduce_overhead_on_cuda_and_default_elsewhere():
    assert compiled_mod.resolve_mode(True, torch.device("cuda", 0)) == "reduce-overhead"
    assert compiled_mod.resolve_mode(True, torch.device("cpu")) == "default"
    assert compiled_mod.resolve_mode("max-autotune", torch.device("cpu")) == "max-autotune"
    assert compiled_mod.resolve_mode(False, torch.device("cpu")) is None
    assert compiled_mod.uses_cudagraphs("reduce-overhead", torch.device("cuda", 0))
    assert not compiled_mod.uses_cudagraphs("max-autotune-no-cudagraphs", torch.device("cuda", 0))
    assert not compiled_mod.uses_cudagraphs("reduce-overhead", torch.device("cpu"))


@pytest.mark.parametrize("argv", [["compile=fast"], ["--compile", "fast"], ["--compile=auto"]])
def test_cli_refuses_a_wrong_compile_value_in_one_line(argv, capsys):
    assert main(["predict", "model=LibreYOLO9t.yaml", "save=false", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compile must be" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, mode", [(["compile=true"], "default"), (["--compile", "max-autotune"], "max-autotune")])
def test_cli_predict_runs_through_the_compiled_program(argv, mode, monkeypatch, tmp_path):
    seen = []

    def record(module, mode):
        seen.append(mode)
        return module  # the eager module as "compiled": passes validation, nothing to build

    monkeypatch.setattr(compiled_mod, "torch_compile", record)
    assert main(["predict", "model=LibreYOLO9t.yaml", f"imgsz={IMGSZ}", f"save_dir={tmp_path}", "save=false",
                 *argv]) == 0
    assert seen == [mode]


# --- validation and fallback ----------------------------------------------------------------------
def _skewed(module, mode, relative=1e-5):
    """A "compiled" program whose box coordinates are off by ``relative`` (a wrong kernel, say)."""
    def run(x):
        out = module(x)
        pred = out["predictions"].clone()
        pred[:, :4] *= 1 + relative
        return {**out, "predictions": pred}

    return run


def test_a_slightly_wrong_compiled_program_is_refused_and_predict_serves_eager_with_one_warning(monkeypatch, caplog):
    eager = seeded_model("t").predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF)
    assert len(eager.boxes) > 0
    monkeypatch.setattr(compiled_mod, "torch_compile", _skewed)
    model = seeded_model("t").compile(True)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        first = model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF)
        second = model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "differ from the eager copy's beyond the validation bar" in warnings[0].getMessage()
    assert "runs the eager inference copy" in warnings[0].getMessage()
    assert _same_results(first, eager) and _same_results(second, eager)
    (entry,) = model.compile_info()["copies"]
    assert entry["compiled"] is False and "predictions/box" in entry["fallback"]
    assert entry["calls"] == {"compiled": 0, "eager": 2}


def test_the_skew_the_validation_refuses_would_move_the_boxes(monkeypatch):
    """The control of the test above: served unchecked, that program changes predict()'s boxes."""
    model = seeded_model("t")
    copy = model.inference_copy()
    batch = _batch(model)
    with torch.inference_mode():
        right = model.family.named_outputs(copy.module(batch))
        wrong = model.family.named_outputs(_skewed(copy.module, "default")(batch))
    metas = model.family.letterbox(IMGSZ)([torch.zeros(3, IMGSZ, IMGSZ, dtype=torch.uint8)])[1]
    opts = model.predict_options(conf=CONF)
    a, b = (model.family.postprocess(o, metas, opts)[0] for o in (right, wrong))
    assert a["xyxy"].numel() and not torch.equal(a["xyxy"], b["xyxy"])


def test_a_float16_copy_is_judged_like_an_fp16_artifact():
    """fp16 adds the eager copy's own fp16 drift to the bar (no CUDA needed to check the judging:
    the CPU runs float16 convolutions): its own output passes, boxes 1% off do not."""
    import copy as copy_mod

    model = seeded_model("t")
    module = copy_mod.deepcopy(model.inference_copy().module).half()
    x = _batch(model).half()
    with torch.inference_mode():
        own = model.family.named_outputs(module(x))
    wrong = {"predictions": own["predictions"].clone()}
    wrong["predictions"][:, :4] *= 1.01
    assert compiled_mod.check_against_eager(module, model.family, x, [own])["passed"]
    verdict = compiled_mod.check_against_eager(module, model.family, x, [wrong])
    assert not verdict["passed"] and "predictions/box" in verdict["line"]


def test_a_failing_compilation_falls_back_and_names_the_missing_compiler(monkeypatch, caplog):
    from torch._inductor.exc import InvalidCxxCompiler

    def no_compiler(module, mode):
        def run(x):
            raise InvalidCxxCompiler()
        return run

    monkeypatch.setattr(compiled_mod, "torch_compile", no_compiler)
    model = seeded_model("t").compile(True)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "torch.compile failed" in warning and "needs a working C++ compiler" in warning
    assert "C++ compiler" in model.compile_info()["copies"][0]["fallback"]


def test_compile_false_drops_the_compiled_program_and_predict_runs_eager(monkeypatch):
    monkeypatch.setattr(compiled_mod, "torch_compile", lambda module, mode: module)
    model = seeded_model("t").compile("default")
    model.predict(SAMPLE_IMAGE, imgsz=IMGSZ)
    program = model.inference_copy().attachment("compiled")
    assert program is not None and program.calls["compiled"] == 1
    model.compile(False)
    assert program.released and model.inference_copy().attachment("compiled") is None
    model.predict(SAMPLE_IMAGE, imgsz=IMGSZ)
    assert model.compile_info() == {**model.compile_info(), "mode": False, "copies": []}


# --- CUDA (run on the lent H200) ------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_fp16_reduce_overhead_is_validated_and_replays_give_the_eager_detections():
    from libreyolo.export.matching import match_detections
    from libreyolo.results import decoded_predictions

    eager = seeded_model("t").to("cuda").half()
    model = seeded_model("t").to("cuda").half().compile(True)
    images = [SAMPLE_IMAGE, torch.rand(3, 480, 640), SAMPLE_IMAGE]
    want = [eager.predict(i, conf=CONF, workers=0) for i in images]
    got = [model.predict(i, conf=CONF, workers=0) for i in images]  # each result held while the next replays
    (entry,) = model.compile_info()["copies"]
    assert entry["mode"] == "reduce-overhead" and entry["inductor_cuda_graphs"] and entry["dtype"] == "float16"
    assert entry["compiled"], entry["fallback"]
    assert entry["shapes"][0]["checked_runs"] == compiled_mod.RECORD_CALLS
    assert entry["calls"]["compiled"] == 3
    assert len(want[0].boxes) > 0
    for w, g in zip(want, got, strict=True):
        m = match_detections(decoded_predictions("detect", w), decoded_predictions("detect", g), conf=CONF,
                             max_det=300, iou_min=0.9, score_tol=2e-3)  # the fp16 artifact bar
        assert m["passed"], m
    assert _same_results(got[0], model.predict(SAMPLE_IMAGE, conf=CONF, workers=0))  # replay: not overwritten
    streamed = model.predict(images, conf=CONF, batch=1)  # the streaming pipeline (workers=4 on CUDA)
    assert all(_same_results(a, b) for a, b in zip(streamed, got, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_gpu_cuda_graphs_of_a_compiled_model_replay_the_validated_compiled_network(half):
    """Real Inductor code (mode "default": reduce-overhead without its CUDA graphs) captured in our
    whole-pipeline graphs, the letterbox inside from a frame size's second batch: the detections
    pass the artifact bar against the eager model's, every replay."""
    from libreyolo.export.matching import match_detections
    from libreyolo.results import decoded_predictions

    plain = seeded_model("t").to("cuda")
    model = seeded_model("t").to("cuda").compile(True)
    if half:
        plain, model = plain.half(), model.half()
    import numpy as np
    from PIL import Image

    frame = np.ascontiguousarray(np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))[..., ::-1])  # BGR, as cv2 reads
    frame[:40] = 0  # not the file's pixels: another input of the same size
    images = [SAMPLE_IMAGE, frame, frame, frame]
    want = [plain.predict(i, conf=CONF, workers=0) for i in images]
    got = [model.predict(i, conf=CONF, cuda_graph=True, workers=0) for i in images]
    entries = {e["used_by"]: e for e in model.compile_info()["copies"]}
    entry = entries["CUDA graphs"]
    assert entry["mode"] == "default" and not entry["inductor_cuda_graphs"]
    assert entry["compiled"], entry["fallback"]
    programs = sorted(g["program"] for g in model.graph_info()["graphs"])
    assert programs == ["letterbox+pipeline", "pipeline"], programs
    assert len(want[0].boxes) > 0
    for w, g in zip(want, got, strict=True):  # the bar of the test above (the raw outputs passed the validation)
        m = match_detections(decoded_predictions("detect", w), decoded_predictions("detect", g), conf=CONF,
                             max_det=300, iou_min=0.9, score_tol=2e-3)
        assert m["passed"], m
    assert _same_results(got[2], got[3])  # replays of one graph: the same numbers


def test_threads_share_one_compilation_and_one_validation(monkeypatch):
    import threading

    made, checks = [], []
    real_check = compiled_mod.check_against_eager
    monkeypatch.setattr(compiled_mod, "torch_compile", lambda module, mode: made.append(mode) or module)
    monkeypatch.setattr(compiled_mod, "check_against_eager", lambda *a: checks.append(1) or real_check(*a))
    model = seeded_model("t").compile(True)
    want = seeded_model("t").predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF)
    results = [None] * 4

    def work(i):
        results[i] = model.predict(SAMPLE_IMAGE, imgsz=IMGSZ, conf=CONF)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == ["default"] and len(checks) == 1
    assert all(_same_results(r, want) for r in results)
    assert model.compile_info()["copies"][0]["calls"]["compiled"] == 4
