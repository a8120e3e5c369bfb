"""Tracking evaluation (issue 48): synthetic MOTChallenge sequences and HOTA / IDF1 / MOTA from
Roboflow ``trackers.eval``, through ``libreyolo track-synth`` and ``libreyolo val tracker=...``.

The metrics are checked on a case computed by hand (two shapes, ten frames, every box visible):
the truth given back as the tracker's output scores 1.0 everywhere; the same output with the two
identities swapped from frame 6 on matches each truth identity to one output identity for 5 of
its 10 frames, so IDTP = 10 of 20 truth boxes and 20 output boxes: IDF1 = 2*10 / (20 + 20) = 0.5,
and MOTA = 1 - IDSW/GT = 1 - 2/20 = 0.9 (the mutation the metric must see).
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("trackers", reason="trackers is not installed (libreyolo[track])")

from libreyolo.cli import main as cli_main  # noqa: E402
from libreyolo.track.evaluate import evaluate_results  # noqa: E402
from libreyolo.track.synth import gt_rows, read_mot_sequences, synth_sequence, write_mot_sequence  # noqa: E402


def _as_results(gt_text: str, swap_from: int | None = None) -> str:
    """gt rows as a tracker's result rows; identities 1 and 2 swapped from frame ``swap_from`` on."""
    out = []
    for line in gt_text.splitlines():
        t, i, x, y, w, h, *_ = line.split(",")
        if swap_from is not None and int(t) >= swap_from and i in ("1", "2"):
            i = "2" if i == "1" else "1"
        out.append(f"{t},{i},{x},{y},{w},{h},1,-1,-1,-1\n")
    return "".join(out)


def test_perfect_tracker_scores_one_and_a_swap_is_seen(tmp_path):
    frames, truth = synth_sequence(10, width=96, height=64, n_objects=2, size=24, speed=2.0, occlusion=False,
                                   entry_exit=False, seed=1)
    assert all(len(f) == 2 and min(b.visibility for b in f) == 1.0 for f in truth)
    write_mot_sequence(tmp_path / "gt", "seq", frames, truth)
    (tmp_path / "res").mkdir()
    gt = gt_rows(truth)
    (tmp_path / "res" / "seq.txt").write_text(_as_results(gt))
    perfect = evaluate_results(tmp_path / "gt", tmp_path / "res", ["seq"])["COMBINED"]
    assert (perfect["HOTA"], perfect["IDF1"], perfect["MOTA"], perfect["IDSW"]) == (1.0, 1.0, 1.0, 0)
    (tmp_path / "res" / "seq.txt").write_text(_as_results(gt, swap_from=6))
    swapped = evaluate_results(tmp_path / "gt", tmp_path / "res", ["seq"])["COMBINED"]
    assert swapped["IDF1"] == pytest.approx(0.5) and swapped["MOTA"] == pytest.approx(0.9)
    assert swapped["IDSW"] == 2 and swapped["HOTA"] < 1.0


def test_synthetic_sequences_have_occlusion_entry_and_exit():
    _, truth = synth_sequence(60, seed=0)
    present = [{b.ident for b in f} for f in truth]
    first = {i: next(t for t, p in enumerate(present) if i in p) for i in set().union(*present)}
    last = {i: max(t for t, p in enumerate(present) if i in p) for i in first}
    assert any(t > 0 for t in first.values())                   # entry
    assert any(t < len(truth) - 1 for t in last.values())      # exit...
    assert all(all(i in present[t] for t in range(first[i], last[i] + 1)) for i in first)  # ...and no return
    inside = [b for f in truth for b in f if b.box[0] > 0 and b.box[2] < 160]
    assert any(b.visibility < 0.9 for b in inside)             # occlusion (not the frame's edge)


def test_val_of_a_tracker_on_generated_sequences(demo, tmp_path, capsys):
    """`libreyolo track-synth`, then val with tracker=bytetrack: a per-sequence and combined table, JSON
    with the same numbers; the demo detector and ByteTrack track the shapes well (HOTA, IDF1 and MOTA
    above 0.6; measured 0.82 / 0.94 / 0.89 on two 40-frame sequences at 160x128 with `libreyolo val`)."""
    from libreyolo.track.evaluate import format_table

    seqs, out = tmp_path / "seqs", tmp_path / "mot.json"
    assert cli_main(["track-synth", f"out={seqs}", "sequences=2", "frames=8", "width=128", "height=96",
                     "size=24", "seed=0"]) == 0
    assert [s.name for s in read_mot_sequences(seqs)] == ["synth-00", "synth-01"]
    result = demo.val(data=str(seqs), tracker="bytetrack", imgsz=128, json=str(out))
    table = format_table(result).splitlines()
    assert table[1].split()[:4] == ["sequence", "HOTA", "DetA", "AssA"]
    assert [line.split()[0] for line in table[3:] if not line.startswith("-")] == ["synth-00", "synth-01", "COMBINED"]
    assert json.loads(out.read_text()) == result
    combined = result["COMBINED"]
    assert min(combined["HOTA"], combined["IDF1"], combined["MOTA"]) > 0.6, combined
    assert f"{100 * combined['IDF1']:.2f}" in table[-1]


def test_tracking_data_mistakes_are_one_line(tmp_path, capfd):
    assert cli_main(["val", "model=LibreYOLO9t-shapes.pt", "tracker=bytetrack", f"data={tmp_path}"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no MOTChallenge sequence" in err[0], err
    assert cli_main(["val", "model=LibreYOLO9t-shapes.pt", "tracker=nope", f"data={tmp_path}"]) == 2
