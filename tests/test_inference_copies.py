"""Inference copies: predict() runs derived modules; the fp32 master is never changed by it.

CPU tests here; the CUDA cases (float16 copies, channels-last, device switches, graphs on
copies) are marked ``gpu``. Numbers measured by these tests are quoted in docs/inference.md.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import nn

from libreyolo import SAMPLE_IMAGE
from libreyolo.engine.inference import build_copy, conv_bn_pairs, fold_conv_bn
from libreyolo.errors import ArgumentError
from libreyolo.graphs.parity import seeded_model
from libreyolo.layers.conv import ConvBNAct
from tests.numerics import float32_bar, float64_run

IMGSZ = 96
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the lent H200)")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the test machine is shared
    yield
    torch.set_num_threads(before)


@pytest.fixture
def model():
    m = seeded_model("yolo9", "t", device="cpu")
    m.inference_options(fold_bn=True)  # the default "auto" folds on CUDA only; test folding here
    return m


def test_default_folds_on_cuda_only_so_cpu_predict_is_the_exact_master_arithmetic():
    m = seeded_model("yolo9", "t", device="cpu")
    assert m.inference_options()["fold_bn"] == "auto"
    x = torch.rand(1, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        master = m.family.named_outputs(m.net(x))["predictions"]
    assert m.inference_copy().folded == 0
    assert torch.equal(m._forward(x)["predictions"], master)
    assert m._copies().key("cuda:0", torch.float32).fold_bn and not m._copies().key("cpu", torch.float32).fold_bn


def _master(model) -> dict[str, tuple[torch.Tensor, int]]:
    """Every master tensor: a clone of its value and its storage address."""
    return {k: (v.detach().clone(), v.data_ptr()) for k, v in model.net.state_dict(keep_vars=True).items()}


def _assert_master_unchanged(model, before: dict[str, tuple[torch.Tensor, int]]) -> None:
    now = model.net.state_dict(keep_vars=True)
    assert list(now) == list(before)
    changed = [k for k, (v, ptr) in before.items()
               if now[k].dtype != v.dtype or now[k].device != v.device or now[k].data_ptr() != ptr
               or not torch.equal(now[k].detach(), v)]
    assert changed == [], f"{len(changed)} master tensors changed, e.g. {changed[:3]}"


def _dets(r) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return r.boxes.xyxy, r.boxes.conf, r.boxes.cls


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_dets(a), _dets(b), strict=True))


# --- the master is never changed by precision or device switches (issue 13 items 4 and 8) ---------
def test_half_then_float_leaves_every_fp32_weight_bit_identical(model):
    before = _master(model)
    model.half()
    assert model._default_dtype() == torch.float16
    model.float()
    _assert_master_unchanged(model, before)
    assert all(t.dtype == torch.float32 for t in model.net.parameters())


def test_predict_with_precision_and_device_arguments_never_changes_the_master(model):
    before = _master(model)
    ref = model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.3)
    with pytest.raises(ArgumentError, match="half=True"):  # half on the CPU: a clear error, as before
        model(SAMPLE_IMAGE, imgsz=IMGSZ, half=True)
    model.half()
    with pytest.raises(ArgumentError, match="CUDA"):  # the default precision is now fp16: same error
        model(SAMPLE_IMAGE, imgsz=IMGSZ)
    assert _equal(model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.3, half=False), ref)
    model.float()
    assert _equal(model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.3, device="cpu"), ref)
    assert _equal(model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.3, device=torch.device("cpu")), ref)
    for bad in ("meta", "cuda:99" if torch.cuda.is_available() else "cuda"):
        with pytest.raises(ArgumentError):
            model(SAMPLE_IMAGE, imgsz=IMGSZ, device=bad)
    assert model.device == torch.device("cpu")
    _assert_master_unchanged(model, before)
    assert _equal(model(SAMPLE_IMAGE, imgsz=IMGSZ, conf=0.3), ref)


def test_predict_runs_a_cached_copy_not_the_master(model):
    x = torch.rand(1, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(0))
    model._forward(x)
    model._forward(x)
    copies = model._copies().live()
    assert len(copies) == 1 and model._copies().builds == 1
    c = copies[0]
    assert c.module is not model.net
    master_ptrs = {t.data_ptr() for t in model.net.parameters()}
    assert not master_ptrs & {t.data_ptr() for t in c.module.parameters()}  # shares no storage
    assert all(not p.requires_grad for p in c.module.parameters()) and not c.module.training
    # training-side views of the master still see the reference keys and BatchNorms
    assert any(k.endswith("bn.running_var") for k in model.net.state_dict())
    assert c.folded == len(conv_bn_pairs(model.net)) > 0
    assert not any(isinstance(m, nn.BatchNorm2d) for m in c.module.modules())


def test_each_dtype_gets_its_own_copy_and_float32_keeps_its_numbers(model):
    x = torch.rand(1, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(1))
    a = model._forward(x)["predictions"]
    b = model._forward(x.double())["predictions"]  # another precision: another copy
    assert a.dtype == torch.float32 and b.dtype == torch.float64
    assert sorted(str(c.key.dtype) for c in model._copies().live()) == ["torch.float32", "torch.float64"]
    assert torch.equal(model._forward(x)["predictions"], a)  # the fp32 path did not change
    with torch.inference_mode():
        master = model.family.named_outputs(model.net(x))["predictions"]
    exact = model.family.named_outputs(float64_run(model.net, x))["predictions"]
    for out in (a, b):  # each copy is as close to the float64 master as the fp32 master is
        bar = float32_bar(out, master, exact, box_dim=1)
        assert bar.ok, (out.dtype, bar)


# --- invalidation ---------------------------------------------------------------------------------
def test_weight_changes_retire_the_copies(model):
    x = torch.rand(1, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(2))
    model._forward(x)
    first = model.inference_copy()
    other = seeded_model("yolo9", "t", seed=5, device="cpu")
    other.inference_options(fold_bn=True)  # the same derivation as `model`
    model.load_weights(other.net.state_dict())
    assert first.retired and model.inference_copy() is not first
    assert torch.equal(model._forward(x)["predictions"], other._forward(x)["predictions"])

    second = model.inference_copy()
    with torch.no_grad():  # an in-place update by hand, as an optimizer step makes
        for p in model.net.parameters():
            p.mul_(1.0)
    assert model.inference_copy() is not second

    third = model.inference_copy()
    model.net.to(torch.float64)  # a dtype change moves every tensor
    assert model.inference_copy() is not third
    model.float()
    assert all(t.dtype == torch.float32 for t in model.net.parameters())

    fourth = model.inference_copy()
    name, child = next(iter(model.net.named_children()))
    setattr(model.net, name, child)  # re-registering a submodule: same tensors, nothing to rebuild
    assert model.inference_copy() is fourth
    model.net = seeded_model("yolo9", "t", seed=6, device="cpu").net  # a new master network
    assert model.inference_copy().module is not fourth.module and fourth.retired


def test_inference_options_switch_folding_off_for_the_exact_master_arithmetic(model):
    x = torch.rand(1, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        master = model.family.named_outputs(model.net(x))["predictions"]
    assert model.inference_options()["fold_bn"] is True
    assert model.inference_options(fold_bn=False) == {"fold_bn": False, "channels_last": "auto"}
    assert model.inference_copy().folded == 0
    assert torch.equal(model._forward(x)["predictions"], master)  # unfolded: bit-for-bit the master
    model.inference_options(fold_bn=True)
    folded = model._forward(x)["predictions"]
    exact = model.family.named_outputs(float64_run(model.net, x))["predictions"]
    bar = float32_bar(folded, master, exact, box_dim=1)  # folded: as close to float64 as the master
    assert bar.ok, bar
    with pytest.raises(ArgumentError):
        model.inference_options(fold_bn="yes")
    with pytest.raises(ArgumentError):
        model.inference_options(channels_last="sometimes")


# --- the Conv-BN fold itself ---------------------------------------------------------------------
class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = ConvBNAct(3, 8, 3)
        self.b = ConvBNAct(8, 8, 3, 2, groups=2, act=False)
        self.plain = nn.Sequential(nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4))  # not a ConvBNAct: untouched

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.plain(self.b(self.a(x)))


def _toy(seed: int = 0) -> _Toy:
    g = torch.Generator().manual_seed(seed)
    net = _Toy().eval()
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=g) + 0.5 if "var" in name else torch.randn(t.shape, generator=g))
    return net


def test_a_deep_copy_of_a_used_model_has_its_own_weights_and_predicts_the_same(model):
    """copy.deepcopy of a model that has run (or was built with device=) copies the weights and
    settings, not the inference-copy cache (its locks cannot be copied: this raised TypeError)."""
    import copy

    before = model(SAMPLE_IMAGE, conf=0.01).boxes.xyxy
    assert len(before) > 0
    twin = copy.deepcopy(model)
    assert twin.net is not model.net and "_inference" not in twin.__dict__
    assert torch.equal(twin(SAMPLE_IMAGE, conf=0.01).boxes.xyxy, before)
    with torch.no_grad():
        next(twin.net.parameters()).mul_(2.0)
    assert torch.equal(model(SAMPLE_IMAGE, conf=0.01).boxes.xyxy, before)  # the original is untouched
    assert twin._inference_opts == model._inference_opts == {"fold_bn": True, "channels_last": "auto"}


def test_fold_conv_bn_is_a_generic_module_transform():
    net = _toy()
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    copy, folded = build_copy(net, build_key(torch.float64))
    assert folded == 2 and isinstance(copy.a.bn, nn.Identity) and isinstance(copy.plain[1], nn.BatchNorm2d)
    assert copy.a.conv.bias is not None and copy.b.conv.groups == 2
    with torch.no_grad():
        exact = net.double()(x.double())
        assert torch.allclose(copy(x.double()), exact, rtol=1e-10, atol=1e-10)  # the algebra is right
    assert "a.bn.running_var" in net.state_dict()  # the source module keeps its BatchNorms


def test_fold_skips_a_block_whose_folded_weights_overflow_float16():
    net = _toy()
    with torch.no_grad():
        net.a.bn.running_var.fill_(1e-12)
        net.a.bn.eps = 1e-12
    assert fold_conv_bn(net, torch.float16) == 1  # block a would overflow: left unfolded
    assert isinstance(net.a.bn, nn.BatchNorm2d) and isinstance(net.b.bn, nn.Identity)


def build_key(dtype: torch.dtype, device: str = "cpu", channels_last: bool = False):
    from libreyolo.engine.inference import CopyKey

    return CopyKey(torch.device(device), dtype, True, channels_last)


def test_channels_last_copies_on_request():
    net = _toy()
    copy, _ = build_copy(net, build_key(torch.float32, channels_last=True))
    assert copy.a.conv.weight.is_contiguous(memory_format=torch.channels_last)


# --- folding against the compatibility bar (numbers quoted in docs/inference.md) ----------------
def test_folded_copy_is_as_close_to_the_float64_model_as_the_unfolded_and_matches_its_detections(
        compat_dir, compat_fill):
    """Folding Conv-BN changes float32 rounding, by an amount that depends on the CPU. The bar is
    measured (tests/numerics.py): the folded and the unfolded copy, and the reference library's
    recorded outputs, are each compared with the unfolded model run in float64; the folded copy and
    the recording may be off by NOISE_MULTIPLE times the unfolded copy's own error. Detection sets
    on the sample image must match exactly."""
    from tests.compat_utils import (
        MIN_SET_MATCH,
        fixtures,
        flatten_outputs,
        model_from_fixture,
        recorded_detections,
        schema,
        set_match,
    )

    for d in fixtures(compat_dir, family="yolo9"):
        model = model_from_fixture(d, compat_fill)
        model.inference_options(fold_bn=True)  # as on CUDA (the default folds there only)
        s = schema(d)
        recorded = np.load(d / "probes.npz")
        folded = model.inference_module("cpu", torch.float32)
        assert model.inference_copy().folded == len(conv_bn_pairs(model.net)) > 0
        bars, worst_vs_unfolded = {}, 0.0
        for name, x in compat_fill.probes(s["probe_size"], s["seed"]).items():
            with torch.inference_mode():
                plain, fused = flatten_outputs(model.net(x)), flatten_outputs(folded(x))
            exact = flatten_outputs(float64_run(model.net, x))
            for key in (k for k in recorded if k.startswith(f"output.{name}.")):
                path = key[len(f"output.{name}."):]
                box_dim = 1 if path == "predictions" else None  # (B, 4 + nc, A): boxes scale by their extent
                bars[f"folded {name}.{path}"] = float32_bar(fused[path], plain[path], exact[path], box_dim)
                bars[f"recorded {name}.{path}"] = float32_bar(torch.from_numpy(recorded[key]), plain[path],
                                                              exact[path], box_dim)
                worst_vs_unfolded = max(worst_vs_unfolded, float((fused[path] - plain[path]).abs().max()))
        worst = max(bars, key=lambda k: bars[k].used)
        print(f"\n{d.name}: folded vs unfolded raw max abs diff {worst_vs_unfolded:.3g}; "
              f"closest to its bar: {worst}: {bars[worst]}")
        assert [k for k, bar in bars.items() if not bar.ok] == [], {k: str(b) for k, b in bars.items() if not b.ok}
        assert worst_vs_unfolded > 0  # folding does change rounding: the docs must not claim bit-exactness

        sample = str(compat_dir / "fixtures" / "sample.png")
        theirs, _ = recorded_detections(d)
        r_fold = model(sample, conf=0.01)
        model.inference_options(fold_bn=False)
        r_plain = model(sample, conf=0.01)
        dets = [{"xyxy": r.boxes.xyxy, "conf": r.boxes.conf, "cls": r.boxes.cls} for r in (r_fold, r_plain)]
        vs_recorded, vs_plain = set_match(dets[0], theirs), set_match(*dets)
        print(f"{d.name}: detections folded vs recorded {vs_recorded}, folded vs unfolded {vs_plain} "
              f"({len(r_fold)} boxes)")
        assert min(vs_recorded) >= MIN_SET_MATCH and vs_plain == (1.0, 1.0) and len(r_fold) == len(r_plain)


# --- threads ------------------------------------------------------------------------------------
def test_concurrent_predicts_with_mixed_precision_and_device_switches_are_exact(model):
    from PIL import Image

    base = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    images = [base, base[:, ::-1].copy(), base[::-1].copy()]
    kw = {"imgsz": IMGSZ, "conf": 0.3, "color_format": "rgb", "half": False}
    expected = [model(img, **kw) for img in images]
    x = torch.rand(1, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(4))
    expected64 = model._forward(x.double())["predictions"]
    state = {k: v.clone() for k, v in model.net.state_dict().items()}
    before = _master(model)
    errors: list[str] = []

    def worker(w: int) -> None:
        try:
            for step in range(4):
                i = (w + step) % len(images)
                mode = (w + step) % 5
                if mode == 0:
                    r = model(images[i], **kw)
                elif mode == 1:
                    r = model(images[i], device="cpu", **kw)
                elif mode == 2:
                    out = model._forward(x.double())["predictions"]  # another dtype's copy, concurrently
                    if not torch.equal(out, expected64):
                        errors.append(f"worker {w}: float64 forward differs")
                    continue
                elif mode == 3:
                    model.half()  # precision switches: defaults only, never a conversion
                    model.float()
                    with pytest.raises(ArgumentError):
                        model(images[i], **{**kw, "half": True})
                    continue
                else:
                    model.load_weights(state)  # same weights: copies rebuilt under the other threads
                    continue
                if not _equal(r, expected[i]):
                    errors.append(f"worker {w} step {step}: image {i} differs")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"worker {w}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    model.float()
    assert model.device == torch.device("cpu")
    for k, (v, _) in before.items():  # values equal (load_weights copies in place: same addresses too)
        assert torch.equal(model.net.state_dict()[k], v), k


# --- CUDA ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@cuda
def test_gpu_half_then_float_predicts_take_different_copies_and_master_stays_fp32():
    model = seeded_model("yolo9", "t", device="cuda")
    before = _master(model)
    r32 = model(SAMPLE_IMAGE, conf=0.3, half=False)
    r16 = model(SAMPLE_IMAGE, conf=0.3, half=True)
    again = model(SAMPLE_IMAGE, conf=0.3, half=False)
    assert _equal(again, r32)  # fp32 after fp16: the same path as before, same bits
    keys = {(c.key.dtype, c.key.channels_last) for c in model._copies().live()}
    assert keys == {(torch.float32, False), (torch.float16, True)}
    _assert_master_unchanged(model, before)
    from tests.compat_utils import set_match

    a, b = set_match(*[{"xyxy": r.boxes.xyxy, "conf": r.boxes.conf.float(), "cls": r.boxes.cls}
                       for r in (r16, r32)])
    print(f"\nfp16 vs fp32 detections (sets, IoU>=0.99, score 1e-4): {a:.3f} / {b:.3f} ({len(r16)}/{len(r32)})")
    assert len(r16) > 0


@pytest.mark.gpu
@cuda
def test_gpu_predict_on_another_device_leaves_the_model_where_it_was():
    model = seeded_model("yolo9", "t", device="cuda")
    before = _master(model)
    on_gpu = model(SAMPLE_IMAGE, conf=0.3)
    on_cpu = model(SAMPLE_IMAGE, conf=0.3, device="cpu")
    assert model.device.type == "cuda" and on_cpu.boxes.xyxy.device.type == "cpu"
    assert _equal(model(SAMPLE_IMAGE, conf=0.3), on_gpu)
    assert len(on_cpu) == len(on_gpu)
    _assert_master_unchanged(model, before)


@pytest.mark.gpu
@cuda
def test_gpu_graphs_capture_the_copy_and_are_released_with_it():
    model = seeded_model("yolo9", "t", device="cuda")
    x = torch.rand(1, 3, 320, 320, device="cuda")
    out = model._forward(x, cuda_graph=True)["predictions"]
    copy = model.inference_copy()
    runner = copy.attachment("graphs")
    assert runner is not None and runner.module is copy.module
    assert torch.equal(out, model._forward(x)["predictions"])
    other = seeded_model("yolo9", "t", seed=3, device="cuda")
    model.load_weights(other.net.state_dict())
    out = model._forward(x, cuda_graph=True)["predictions"]
    assert copy.retired and model.graph_info()["invalidations"] == 1
    assert torch.equal(out, other._forward(x)["predictions"])


@pytest.mark.gpu
@cuda
def test_gpu_threads_mixing_half_and_device_get_their_own_results():
    model = seeded_model("yolo9", "t", device="cuda")
    from PIL import Image

    img = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    cases = [{"half": False}, {"half": True}, {"half": False, "device": "cpu"}, {"half": True, "cuda_graph": True},
             {"half": False, "cuda_graph": True}]
    expected = [model(img, conf=0.3, color_format="rgb", **c) for c in cases]
    errors: list[str] = []

    def worker(w: int) -> None:
        for step in range(10):
            i = (w + step) % len(cases)
            r = model(img, conf=0.3, color_format="rgb", **cases[i])
            if not _equal(r, expected[i]):
                errors.append(f"case {cases[i]}")

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and model.device.type == "cuda"
