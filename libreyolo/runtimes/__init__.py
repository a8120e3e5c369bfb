"""Runtimes for exported artifacts: ``LibreYOLO("x.onnx" | "x.pte" | "x.mlpackage" | "x.engine" | "x.pt2")``,
and Triton-served models: ``LibreYOLO("grpc://host:8001/<name>")`` (:mod:`libreyolo.runtimes.triton`).

Each module exposes ``load(path, device=None, **kw)`` returning a
:class:`~libreyolo.runtimes.base.ArtifactPredictor` with the eager model's ``predict()``;
:func:`libreyolo.api.LibreYOLO` picks the module from the artifact's suffix.
"""
