"""Shape arithmetic folded into constants, so that every ONNX reader sees a plain graph.

The TorchScript exporter records ``tensor.shape`` reads as ``Shape`` nodes, also in a static
export: the anchor grids of the dense detectors (``arange(h)`` / ``meshgrid`` / ``flatten``), the
reshapes of attention and the padding of the embedded NMS become ``Shape -> Gather/Slice ->
Concat -> Range/Expand/Reshape`` chains, some with an empty ``Slice[0:0]`` (the batch prefix of a
``flatten``). ONNX Runtime folds them when it loads the file; OpenCV 4.x DNN refuses the empty
slice and other readers (microcontroller and NPU converters) handle them unevenly.

:func:`fold_static_shapes` evaluates those chains once, at export: a ``Shape`` of a tensor whose
shape the graph fixes is a constant, and so is every node whose inputs are all constants (but a
quantized layer's ``QuantizeLinear``/``DequantizeLinear`` pairs are left as they are: INT8 runtimes
read them). It is exact (the same operators,
evaluated by ONNX's reference implementation on the same inputs) and the exported artifact is
validated against eager afterwards like any other. :func:`fix_output_dims` writes the sizes a
family's contract declares (the ``4 + nc`` class axis) into the graph's outputs, where the
exporter leaves a symbolic name in a dynamic export.
"""
from __future__ import annotations

from typing import Any

import numpy as np

# the largest folded tensor kept as an initializer (a grid of every anchor is a few thousand values;
# a full-size attention mask would not be worth storing)
MAX_FOLDED_ELEMENTS = 1 << 20
# never folded: control flow, random draws, and the Q/DQ pairs of an INT8 graph (its runtime reads them)
_SKIP = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "If", "Loop", "Scan",
         "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
         "Multinomial", "Bernoulli"}


def _static_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of every tensor whose shape shape inference fixes completely."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = {}
    for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        t = value.type.tensor_type
        if not t.HasField("shape"):
            continue
        dims = t.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(int(d.dim_value) for d in dims)
    return shapes


def _shape_value(node: Any, shape: tuple[int, ...]) -> np.ndarray:
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.array(shape[slice(start, end)], dtype=np.int64)


def _fold_once(model: Any) -> int:
    """One pass: fold what the current shapes allow; returns the number of nodes folded."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    shapes = _static_shapes(model)
    const: dict[str, np.ndarray] = {i.name: None for i in graph.initializer}  # type: ignore[misc]
    values: dict[str, np.ndarray] = {}
    folded: list[Any] = []
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            const[node.output[0]] = None
        if node.op_type == "Shape" and node.input[0] in shapes:
            out = node.output[0]
            values[out] = _shape_value(node, shapes[node.input[0]])
            folded.append(node)
            continue
        ins = [n for n in node.input if n]
        if node.op_type in _SKIP or node.domain not in ("", "ai.onnx") or not ins:
            continue
        if not all(n in values or n in const for n in ins):
            continue
        feeds = {n: values[n] if n in values else _const_value(graph, n) for n in ins}
        try:
            outs = ReferenceEvaluator(node).run(None, feeds)
        except Exception:  # an operator the reference cannot evaluate: leave the node in the graph
            continue
        if any(np.asarray(o).size > MAX_FOLDED_ELEMENTS for o in outs):
            continue
        for name, value in zip(node.output, outs, strict=True):
            values[name] = np.asarray(value)
        folded.append(node)
    if not folded:
        return 0
    folded_ids = {id(n) for n in folded}
    kept = [n for n in graph.node if id(n) not in folded_ids]
    used = _used(kept) | {o.name for o in graph.output}
    for node in folded:
        for name in node.output:
            if name in used:
                graph.initializer.append(numpy_helper.from_array(values[name], name))
    del graph.node[:]
    graph.node.extend(kept)
    _drop_dead(graph)
    return len(folded)


def _const_value(graph: Any, name: str) -> np.ndarray:
    from onnx import numpy_helper

    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            from onnx.reference import ReferenceEvaluator

            return np.asarray(ReferenceEvaluator(node).run(None, {})[0])
    raise KeyError(name)


def _used(nodes: Any) -> set[str]:
    """Every tensor name ``nodes`` read, also from inside their subgraphs (an ``If`` branch reads the
    outer graph's tensors by name)."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.input)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                names |= _used(sub.node)
    return names


def _drop_dead(graph: Any) -> None:
    """Remove nodes and initializers nothing reads any more (the Shape nodes' Constant inputs)."""
    while True:
        used = _used(graph.node) | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            break
        dead_ids = {id(n) for n in dead}
        kept = [n for n in graph.node if id(n) not in dead_ids]
        del graph.node[:]
        graph.node.extend(kept)
    used = _used(graph.node) | {o.name for o in graph.output}
    kept_init = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept_init)
    # value_info of tensors that no longer exist would only confuse readers
    alive = used | {o for node in graph.node for o in node.output}
    kept_info = [v for v in graph.value_info if v.name in alive]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)


def fold_static_shapes(model: Any, max_passes: int = 8) -> int:
    """Fold the shape arithmetic of ``model`` (in place, see the module docstring); the number of
    nodes removed. Passes repeat while they fold something: a folded ``Reshape`` target lets
    shape inference fix the shapes the next ``Shape`` reads."""
    total = 0
    for _ in range(max_passes):
        before = len(model.graph.node)
        if not _fold_once(model):
            break
        total += before - len(model.graph.node)
    return total


def shape_ops(model: Any) -> int:
    """How many ``Shape`` nodes the graph holds (a static export should hold none)."""
    return sum(1 for n in model.graph.node if n.op_type == "Shape")


def fix_output_dims(model: Any, sizes: dict[str, dict[int, int]]) -> None:
    """Write fixed sizes into the graph's outputs: ``{output: {axis: size}}`` (from the family's
    declared contract, e.g. the class axis ``4 + nc``); a size the graph contradicts is an error."""
    for out in model.graph.output:
        for axis, size in sizes.get(out.name, {}).items():
            dims = out.type.tensor_type.shape.dim
            if axis >= len(dims):
                continue
            dim = dims[axis]
            if dim.HasField("dim_value") and dim.dim_value != size:
                raise ValueError(f"output {out.name!r} axis {axis} is {dim.dim_value} in the graph, but the "
                                 f"contract says {size}")
            dim.Clear()
            dim.dim_value = size
