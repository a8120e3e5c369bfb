"""The tolerance model: allowances measured against float64 per output group; fp16 drift on top;
float32 compared with TF32 off on CUDA."""
from __future__ import annotations

import math

import pytest
import torch

from libreyolo.utils.tolerance import (
    ELEMENT_MULTIPLE,
    FLOOR,
    FP16_DRIFT_FACTOR,
    OutputGroup,
    allowance,
    drift,
    groups_for,
    score_tolerance,
)

BOX = OutputGroup("predictions", "box", axis=1, start=0, stop=4)
SCORE = OutputGroup("predictions", "score", axis=1, start=4)


def test_cosine_floor_picks_the_most_specific_key_format_device_precision():
    from libreyolo.models.base import ExportContract

    c = ExportContract(min_cosine={"fp32": 0.99999, "onnx:fp32": 0.9999, "aoti:cuda:fp32": 0.999, "fp16": 0.99})
    assert c.cosine_floor("aoti", "fp32", "cuda") == 0.999
    assert c.cosine_floor("aoti", "fp32", "cpu") == 0.99999
    assert c.cosine_floor("onnx", "fp32") == 0.9999
    assert c.cosine_floor("onnx", "fp16", "cuda") == 0.99


def test_a_box_coordinate_is_scaled_by_the_boxs_extent_not_by_its_own_value():
    """x1 = cx - w/2 of a 726 px wide box centred at 363.26 is 0.26: its rounding error is that of
    its ~363 px operands, so its allowance must be too."""
    ref = torch.tensor([[[0.26], [10.0], [726.26], [50.0], [1e-3]]], dtype=torch.float64)
    scale = BOX.scale(ref)
    assert torch.allclose(scale, torch.full((1, 4, 1), 726.26, dtype=torch.float64))
    assert float(SCORE.scale(ref).max()) == 1.0


def test_allowance_is_the_declared_multiple_of_the_measured_drift_plus_a_floor():
    ref = torch.tensor([[[100.0, 5.0], [0.0, 1.0], [200.0, 9.0], [20.0, 3.0], [0.5, 0.25]]], dtype=torch.float64)
    eager = ref.clone()
    eager[0, 2, 0] += 0.01   # box 0: 0.01 px at extent 200 -> 5e-5 relative
    eager[0, 4, 1] += 1e-6   # a score
    d = drift([BOX, SCORE], [({"predictions": eager}, {"predictions": ref})])
    assert d["predictions/box"] == pytest.approx(0.01 / 200)
    assert d["predictions/score"] == pytest.approx(1e-6, rel=1e-6)
    allowed = allowance([BOX, SCORE], {"predictions": ref}, d)["predictions"]
    assert float(allowed[0, 0, 0]) == pytest.approx((ELEMENT_MULTIPLE * 5e-5 + FLOOR) * 200)
    assert float(allowed[0, 0, 1]) == pytest.approx((ELEMENT_MULTIPLE * 5e-5 + FLOOR) * 9)  # box 1: extent 9
    assert float(allowed[0, 4, 0]) == pytest.approx(ELEMENT_MULTIPLE * 1e-6 + FLOOR)
    with_fp16 = allowance([BOX, SCORE], {"predictions": ref}, d, {"predictions/box": 1e-3})["predictions"]
    assert float(with_fp16[0, 0, 0] - allowed[0, 0, 0]) == pytest.approx(FP16_DRIFT_FACTOR * 1e-3 * 200)
    assert score_tolerance([BOX, SCORE], {"predictions": allowed}) == pytest.approx(ELEMENT_MULTIPLE * 1e-6 + FLOOR)


def test_drift_ignores_non_finite_differences_so_an_fp16_overflow_widens_nothing():
    ref = torch.ones(1, 5, 3, dtype=torch.float64)
    half = ref.clone()
    half[0, 0, 0] = math.inf
    assert drift([BOX, SCORE], [({"predictions": half}, {"predictions": ref})])["predictions/box"] == 0.0


def test_an_output_no_group_declares_is_still_judged_as_one_logit_group():
    groups = groups_for((BOX,), {"predictions": torch.zeros(1, 5, 2), "extra": torch.ones(1, 3)})
    assert [g.key for g in groups] == ["predictions/box", "extra/logit"]


def test_compare_group_names_the_element_that_fails_with_its_three_values():
    from libreyolo.export.validate import compare_group

    ref = torch.tensor([[[100.0], [0.0], [300.0], [20.0], [0.5]]], dtype=torch.float64)
    eager = ref.float()
    allowed = allowance([BOX, SCORE], {"predictions": ref}, {"predictions/box": 1e-6, "predictions/score": 1e-6})
    art = eager.clone()
    assert compare_group(BOX, eager, ref, art, allowed["predictions"], 0.99999)["passed"]
    art[0, 2, 0] += 0.05  # x2 moved 0.05 px at extent 300: 1.7e-4 relative, far past 2e-5
    check = compare_group(BOX, eager, ref, art, allowed["predictions"], 0.99999)
    assert not check["passed"] and check["index"] == [0, 2, 0] and check["ratio"] > 5
    assert check["float64"] == 300.0 and check["artifact"] == pytest.approx(300.05)
    nan = eager.clone()
    nan[0, 4, 0] = math.nan
    assert not compare_group(SCORE, eager, ref, nan, allowed["predictions"], 0.99999)["passed"]


def test_the_cosine_bar_still_catches_values_scrambled_within_a_huge_allowance():
    from libreyolo.export.validate import compare_group

    g = torch.Generator().manual_seed(0)
    ref = torch.rand(1, 5, 50, generator=g, dtype=torch.float64) * 100
    huge = torch.full_like(ref, 50.0)  # element-wise, almost anything passes
    scrambled = ref.flip(2).float()
    assert not compare_group(BOX, ref.float(), ref, scrambled, huge, 0.99999)["passed"]


def test_fp16_drift_is_measured_per_group_on_the_demo_detector():
    """The demo detector's eager fp16 output moves boxes by about a pixel: its fp16 drift widens the
    box allowance accordingly, while an artifact farther off than that still fails."""
    from libreyolo import LibreYOLO
    from libreyolo.assets import DEMO_MODEL
    from libreyolo.export.validate import _half_copy, compare_group, probe_images

    model = LibreYOLO(DEMO_MODEL)
    x = probe_images(160)["ramps"]
    with torch.inference_mode():
        e32 = model.family.named_outputs(model.net(x))["predictions"]
        e64 = model.family.named_outputs(model.net.double()(x.double()))["predictions"]
        model.net.float()
        e16 = model.family.named_outputs(_half_copy(model.net)(x.half()))["predictions"].float()
    d32 = drift([BOX, SCORE], [({"predictions": e32}, {"predictions": e64})])
    d16 = drift([BOX, SCORE], [({"predictions": e16}, {"predictions": e32.double()})])
    assert d16["predictions/box"] > 100 * d32["predictions/box"] > 0
    allowed = allowance([BOX, SCORE], {"predictions": e64}, d32, d16)["predictions"]
    assert compare_group(BOX, e32, e64, e16, allowed, 0.999)["passed"]
    assert not compare_group(BOX, e32, e64, e16, allowance([BOX, SCORE], {"predictions": e64}, d32)["predictions"],
                             0.999)["passed"]
    off = e16.clone()
    off[0, :4] += 2 * allowed[0, :4].float()
    assert not compare_group(BOX, e32, e64, off, allowed, 0.999)["passed"]


def test_exact_float32_turns_tf32_off_only_for_cuda_and_restores_the_flags():
    from libreyolo.utils.numerics import exact_float32

    cudnn, mm = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.allow_tf32, mm.allow_tf32
    try:
        cudnn.allow_tf32 = mm.allow_tf32 = True
        with exact_float32("cpu"):
            assert cudnn.allow_tf32 and mm.allow_tf32
        with pytest.raises(ValueError), exact_float32("cuda"):
            assert not cudnn.allow_tf32 and not mm.allow_tf32
            raise ValueError("the flags come back even when the body fails")
        assert cudnn.allow_tf32 and mm.allow_tf32
    finally:
        cudnn.allow_tf32, mm.allow_tf32 = saved


def test_a_tie_decided_otherwise_than_float64_is_left_out_of_the_drift_and_judged_by_eagers_own_difference():
    """YOLOX keeps only the best class of a box: two class probabilities saturated at 1.0 tie in
    float32, and float64 picks the other. That flip is a decision, not rounding noise: it must not
    widen the whole score group, and an artifact that decides like eager must still pass."""
    from libreyolo.utils.tolerance import DECISION_FACTOR

    ref = torch.zeros(1, 7, 3, dtype=torch.float64)
    ref[0, :4] = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [10.0, 11.0, 12.0], [10.0, 11.0, 12.0]])
    ref[0, 6, 0] = 1.0  # float64: class 2 of box 0
    ref[0, 4, 1] = 0.5
    eager = ref.clone()
    eager[0, 6, 0], eager[0, 5, 0] = 0.0, 1.0  # float32: class 1 (the first of the tie)
    eager[0, 4, 1] += 1e-7
    decided: dict[str, int] = {}
    d = drift([BOX, SCORE], [({"predictions": eager}, {"predictions": ref})], decided)
    assert d["predictions/score"] == pytest.approx(1e-7) and decided == {"predictions/score": 2}
    allowed = allowance([BOX, SCORE], {"predictions": ref}, d, eager={"predictions": eager})["predictions"]
    assert float(allowed[0, 5, 0]) == DECISION_FACTOR * 1.0
    assert float(allowed[0, 4, 1]) == pytest.approx(ELEMENT_MULTIPLE * 1e-7 + FLOOR)  # the rest stays tight


def test_an_exclusive_groups_flip_is_realigned_only_where_float64_ties_within_the_artifacts_own_error():
    """YOLOX scores hold a box's best class only. A runtime may put a tied best value in the other
    channel: realigned where float64 (every class's value, the family's tie evidence) puts the two
    channels closer than twice the artifact's own error on the columns it did not flip. A flip over
    a real gap, or one the artifact's own error cannot bridge, stays and fails the comparison; a
    head whose classes moved is realigned only where its classes were tied anyway."""
    from libreyolo.utils.tolerance import align_exclusive

    n = 40
    group = OutputGroup("predictions", "score", axis=1, start=4, exclusive=True)
    every = torch.zeros(1, 7, n, dtype=torch.float64)
    every[0, 4] = torch.linspace(0.9, 0.5, n, dtype=torch.float64)  # class 0 best everywhere in float64
    every[0, 5] = every[0, 4] - 0.1                                  # class 1: 0.1 below it ...
    ties = [10, 11, 12]
    every[0, 5, ties] = every[0, 4, ties] - 1e-9                     # ... but for three tied columns
    every[0, 6] = 0.01
    ref = every.clone()
    ref[0, 5:] = 0.0                                                 # the output: the best class only
    eager = ref.clone()
    allowed = torch.full_like(ref, 1e-5)
    noise = 1e-7 * torch.linspace(-1, 1, n, dtype=torch.float64)

    def artifact(flips, error=noise) -> torch.Tensor:  # eager plus rounding, with these columns flipped
        art = eager.clone()
        art[0, 4] += error
        for j in flips:
            art[0, 5, j], art[0, 4, j] = every[0, 5, j] + error[j], 0.0
        return art.float()

    fixed, moved, flips = align_exclusive(group, eager, artifact(ties), allowed, every)
    assert (moved, flips) == (3, 3) and torch.allclose(fixed.double(), eager, atol=2e-7)
    wrong = artifact([*ties, 20])                                    # column 20 flipped over a 0.1 gap
    fixed, moved, flips = align_exclusive(group, eager, wrong, allowed, every)
    assert (moved, flips) == (3, 4) and float(fixed[0, 5, 20]) == float(wrong[0, 5, 20])
    # a gap of 1e-6 within the allowance: bridged by an artifact whose own error is 1e-6, not by one of 1e-9
    every[0, 5, 30] = every[0, 4, 30] - 1e-6
    assert align_exclusive(group, eager, artifact([30], 1e-6 * noise.sign()), allowed, every)[1] == 1
    assert align_exclusive(group, eager, artifact([30], 1e-9 * noise.sign()), allowed, every)[1] == 0
    # a head whose classes moved on one level (columns 0-19: class 1 holds class 0's score), right elsewhere
    shifted = artifact([]).double()
    shifted[0, 5, :20], shifted[0, 4, :20] = every[0, 4, :20], 0.0
    fixed, moved, flips = align_exclusive(group, eager, shifted.float(), allowed, every)
    assert flips == 20 and moved == len(ties)                        # realigned only where classes tied anyway
    everywhere = shifted.clone()
    everywhere[0, 5], everywhere[0, 4] = every[0, 4], 0.0
    assert align_exclusive(group, eager, everywhere.float(), allowed, every)[1:] == (0, n)  # no error to bridge
    assert align_exclusive(group, eager, artifact(ties), allowed, None)[1] == 0  # no evidence, no excuse
