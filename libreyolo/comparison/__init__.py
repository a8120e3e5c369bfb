"""The one comparison of an eager model with another program of it (an exported artifact, a
compiled copy, a CUDA graph), used by export validation (:mod:`libreyolo.export.validate`),
compile validation (:mod:`libreyolo.engine.compiled`) and the graph parity harness
(:mod:`libreyolo.graphs.parity`).

- :mod:`~libreyolo.comparison.groups`: one output group against a float64 reference, element by
  element within the allowance and by cosine; the eager model's own drifts; error distributions.
- :mod:`~libreyolo.comparison.selection`: top-k selections (DETR queries) realigned and their edges excused.
- :mod:`~libreyolo.comparison.matching`, :mod:`~libreyolo.comparison.images`: decoded predictions matched
  (detections, classes, masks, restored images; a task names its matcher in ``decoded_match``).
- :mod:`~libreyolo.comparison.programs`: a whole program's raw outputs against eager (compile validation).
- :mod:`~libreyolo.comparison.exact`: bit-for-bit equality (CUDA graphs replay eager's kernels).

The allowances themselves (float64 copies, drift, element allowance, quantile bars) are the numeric
primitives of :mod:`libreyolo.utils.tolerance`, which families' export contracts also declare
their output groups with. This package imports no task, family or format: what is compared, and
at which options, comes from the caller (the family's export contract, the task plugin).
"""
