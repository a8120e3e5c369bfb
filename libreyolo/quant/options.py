"""The options of ``model.quantize()`` and ``libreyolo quantize``, declared once."""
from __future__ import annotations

from libreyolo.options import Opt

# declared here (torch-free, so the CLI reads them without torch); calibrate and simulate use them
RECIPES = ("int8", "fp8")
METHODS = ("minmax", "percentile", "entropy")

MAX_SAMPLES = 100_000

QUANT_OPTIONS: dict[str, Opt] = {
    "recipe": Opt(str, "int8", "int8 (weights per channel, inputs per tensor) or fp8 (E4M3, simulation only)",
                  choices=RECIPES),
    "data": Opt(str, None, "calibration images: a dataset YAML (train split, else val) or a folder of images"),
    "samples": Opt(int, 256, "calibration images to use (fewer if the data has fewer)", min=1, max=MAX_SAMPLES),
    "method": Opt(str, "minmax", "input-range calibration: minmax, percentile (99.99th) or entropy (KL)",
                  choices=METHODS),
}
