"""export(format="triton"): a Triton model folder; LibreYOLO("grpc://..."/"http://...") decodes what Triton returns.

No Triton server runs here. The config is parsed with Triton's own protobuf schema
(tritonclient's model_config_pb2), and the client runtime talks to :class:`FakeServer`, which
answers as tritonserver does from the exported folder: the config, the model metadata
(``[-1] + dims`` per tensor), and inference by ONNX Runtime on the served ``model.onnx`` with
requests and responses passed through Triton's wire formats (gRPC ModelInferRequest/Response
protobufs; HTTP JSON header + binary tensors) and read back by tritonclient.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tritonclient.http")

import onnx  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from google.protobuf.json_format import MessageToDict  # noqa: E402
from tritonclient.grpc import model_config_pb2, service_pb2  # noqa: E402

from libreyolo import SAMPLE_IMAGE, LibreYOLO  # noqa: E402
from libreyolo.errors import ArgumentError, CheckpointError, MissingDependencyError  # noqa: E402
from libreyolo.export.triton import CONFIG, model_file  # noqa: E402
from libreyolo.runtimes.base import RuntimeUnavailableError  # noqa: E402
from tests.test_export_common import model  # noqa: E402

IMGSZ = 64
OPTIONS = {"max_batch": 2, "preferred_batch": [2], "queue_delay_us": 250, "instances": 2}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("triton") / "models"
    return model().export(format="triton", imgsz=IMGSZ, output=repo, name="yolo", verbose=False, **OPTIONS)


@pytest.fixture(scope="module")
def served_nms(tmp_path_factory):
    # the embedded-NMS ONNX graph is validated by test_export_onnx; here only the serving of it matters
    repo = tmp_path_factory.mktemp("triton-nms")
    return model().export(format="triton", imgsz=IMGSZ, output=repo, name="yolo-nms", nms=True, verbose=False,
                          max_batch=4, validate=False)


def parse_config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _type(config_type: int) -> str:
    return model_config_pb2.DataType.Name(config_type).removeprefix("TYPE_")


class FakeServer:
    """tritonserver's answers for one model folder (see the module docstring)."""

    def __init__(self, folder, config_text: str | None = None) -> None:
        self.config = parse_config(config_text or (folder / CONFIG).read_text())
        self.session = ort.InferenceSession(str(model_file(folder)), providers=["CPUExecutionProvider"])
        self.batches: list[int] = []

    def _metadata(self) -> service_pb2.ModelMetadataResponse:
        reply = service_pb2.ModelMetadataResponse(name=self.config.name, versions=["1"], platform=self.config.platform)
        for kind, tensors in (("inputs", self.config.input), ("outputs", self.config.output)):
            for t in tensors:
                getattr(reply, kind).add(name=t.name, datatype=_type(t.data_type), shape=[-1, *t.dims])
        return reply

    def _run(self, name: str, inputs: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
        assert name == self.config.name
        batch = next(iter(inputs.values())).shape[0]
        assert batch <= self.config.max_batch_size, "the client sent more than max_batch_size"
        self.batches.append(batch)
        outs = dict(zip(wanted, self.session.run(wanted, inputs), strict=True))
        dims = {o.name: list(o.dims) for o in self.config.output}
        return {k: v.reshape(v.shape[0], *[-1 if d < 0 else d for d in dims[k]]) for k, v in outs.items()}


class FakeGrpcServer(FakeServer):
    def get_model_config(self, model_name, model_version="", headers=None, as_json=False, client_timeout=None):
        reply = service_pb2.ModelConfigResponse(config=self.config)
        return MessageToDict(reply, preserving_proto_field_name=True) if as_json else reply

    def get_model_metadata(self, model_name, model_version="", headers=None, as_json=False, client_timeout=None):
        reply = self._metadata()
        return MessageToDict(reply, preserving_proto_field_name=True) if as_json else reply

    def infer(self, model_name, inputs, model_version="", outputs=None, headers=None, **kw):
        from tritonclient.grpc import InferResult
        from tritonclient.grpc._utils import _get_inference_request

        wire = _get_inference_request(model_name=model_name, inputs=inputs, model_version=model_version,
                                      request_id="", outputs=outputs, sequence_id=0, sequence_start=False,
                                      sequence_end=False, priority=0, timeout=None, parameters=None)
        request = service_pb2.ModelInferRequest.FromString(wire.SerializeToString())
        arrays = {t.name: np.frombuffer(raw, dtype=np.float32 if t.datatype == "FP32" else np.float16).reshape(t.shape)
                  for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)}
        served = self._run(request.model_name, arrays, [o.name for o in request.outputs])
        response = service_pb2.ModelInferResponse(model_name=model_name, model_version="1")
        for key, value in served.items():
            response.outputs.add(name=key, datatype=_type(model_config_pb2.DataType.Value(
                "TYPE_" + {"float32": "FP32", "int64": "INT64"}[str(value.dtype)])), shape=list(value.shape))
            response.raw_output_contents.append(value.tobytes())
        return InferResult(service_pb2.ModelInferResponse.FromString(response.SerializeToString()))


class FakeHttpServer(FakeServer):
    def get_model_config(self, model_name, model_version="", headers=None, query_params=None):
        return MessageToDict(self.config, preserving_proto_field_name=True)

    def get_model_metadata(self, model_name, model_version="", headers=None, query_params=None):
        return MessageToDict(self._metadata(), preserving_proto_field_name=True)

    def infer(self, model_name, inputs, model_version="", outputs=None, headers=None, **kw):
        from tritonclient.http import InferResult
        from tritonclient.http._utils import _get_inference_request

        body, header_size = _get_inference_request(inputs=inputs, request_id="", outputs=outputs, sequence_id=0,
                                                   sequence_start=False, sequence_end=False, priority=0,
                                                   timeout=None, custom_parameters=None)
        header = json.loads(body[:header_size])
        arrays, offset = {}, header_size
        for t in header["inputs"]:
            size = t["parameters"]["binary_data_size"]
            arrays[t["name"]] = np.frombuffer(body[offset:offset + size], dtype=np.float32).reshape(t["shape"])
            offset += size
        served = self._run(model_name, arrays, [o["name"] for o in header["outputs"]])
        dtypes = {"float32": "FP32", "int64": "INT64"}
        reply = {"model_name": model_name, "model_version": "1", "outputs": [
            {"name": k, "datatype": dtypes[str(v.dtype)], "shape": list(v.shape),
             "parameters": {"binary_data_size": v.nbytes}} for k, v in served.items()]}
        head = json.dumps(reply).encode()
        return InferResult.from_response_body(head + b"".join(v.tobytes() for v in served.values()),
                                              header_length=len(head))


def config_mismatches(config: model_config_pb2.ModelConfig, onnx_path, ort_outputs: dict[str, tuple]) -> list[str]:
    """Where the config does not describe the ONNX graph: names, data types, and dims (the graph's
    fixed sizes; its symbolic non-batch axes against the sizes ONNX Runtime returns)."""
    graph = onnx.load(str(onnx_path)).graph
    found = []
    for kind, tensors, declared in (("input", graph.input, config.input), ("output", graph.output, config.output)):
        by_name = {t.name: t for t in declared}
        if set(by_name) != {t.name for t in tensors}:
            found.append(f"{kind} names {sorted(by_name)} vs {[t.name for t in tensors]}")
            continue
        for t in tensors:
            c = by_name[t.name]
            if _type(c.data_type) != {1: "FP32", 10: "FP16", 7: "INT64"}[t.type.tensor_type.elem_type]:
                found.append(f"{t.name}: data type {_type(c.data_type)}")
            dims = t.type.tensor_type.shape.dim
            if dims[0].HasField("dim_value"):
                found.append(f"{t.name}: batch axis fixed at {dims[0].dim_value} in the ONNX graph")
            served = list(c.reshape.shape) if c.HasField("reshape") else list(c.dims)
            real = ort_outputs.get(t.name)
            for axis, d in enumerate(dims[1:], start=1):
                want = d.dim_value if d.HasField("dim_value") else (real[axis] if real else -1)
                if axis > len(served) or served[axis - 1] != want:
                    found.append(f"{t.name}: axis {axis} is {served[axis - 1:axis]} in the config, {want} in the graph")
            if len(served) != len(dims) - 1:
                found.append(f"{t.name}: rank {len(served) + 1} in the config, {len(dims)} in the graph")
    return found


def _ort_shapes(folder, batch: int = 2) -> dict[str, tuple]:
    session = ort.InferenceSession(str(model_file(folder)), providers=["CPUExecutionProvider"])
    outs = session.run(None, {"images": np.zeros((batch, 3, IMGSZ, IMGSZ), np.float32)})
    return {o.name: v.shape for o, v in zip(session.get_outputs(), outs, strict=True)}


# --- the model folder ---
def test_the_folder_is_a_triton_model_repository_entry(served):
    folder = served.path
    assert folder.name == "yolo" and folder.parent.name == "models"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == ["1", "1/model.onnx", CONFIG]
    assert not [p for p in folder.parent.parent.iterdir() if p.name.startswith(".")]  # no build folder left


def test_config_parses_with_tritons_schema_and_describes_the_onnx_graph(served):
    config = parse_config((served.path / CONFIG).read_text())
    assert (config.name, config.platform, config.backend) == ("yolo", "onnxruntime_onnx", "onnxruntime")
    assert config.max_batch_size == 2
    assert list(config.dynamic_batching.preferred_batch_size) == [2]
    assert config.dynamic_batching.max_queue_delay_microseconds == 250
    assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in config.instance_group] == \
        [(2, "KIND_AUTO")]
    assert [list(t.dims) for t in config.input] == [[3, IMGSZ, IMGSZ]]
    assert config_mismatches(config, model_file(served.path), _ort_shapes(served.path)) == []


def test_a_wrong_dim_in_the_config_is_found(served):
    text = (served.path / CONFIG).read_text()
    shapes = _ort_shapes(served.path)
    wrong = text.replace(f"dims: [ 3, {IMGSZ}, {IMGSZ} ]", f"dims: [ 3, {IMGSZ}, {IMGSZ - 1} ]")
    assert wrong != text and config_mismatches(parse_config(wrong), model_file(served.path), shapes)
    anchors = shapes["predictions"][2]
    wrong = text.replace(f"dims: [ 84, {anchors} ]", f"dims: [ 84, {anchors + 1} ]")
    assert wrong != text and config_mismatches(parse_config(wrong), model_file(served.path), shapes)


def test_config_parameters_carry_the_models_metadata(served):
    config = parse_config((served.path / CONFIG).read_text())
    params = {k: v.string_value for k, v in config.parameters.items()}
    props = {p.key: p.value for p in onnx.load(str(model_file(served.path))).metadata_props}
    assert {k: v for k, v in params.items() if k != "validation"} == {k: v for k, v in props.items()
                                                                      if k != "validation"}
    assert params["family"] == "yolo9" and params["format"] == "triton" and params["nc"] == "80"
    assert json.loads(params["names"])["0"] == "person" and json.loads(params["letterbox"])["size"] == IMGSZ
    assert json.loads(params["validation"])["status"] == "passed" == json.loads(props["validation"])["status"]
    assert json.loads(params["export_args"])["max_batch"] == 2


def test_the_onnx_inside_has_a_dynamic_batch_axis_and_the_report_includes_its_validation(served):
    dims = onnx.load(str(model_file(served.path))).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and [d.dim_value for d in dims[1:]] == [3, IMGSZ, IMGSZ]
    assert served.validation.status == "passed" and served.format == "triton"
    assert "not run here: a Triton server" in served.validation.text()


# --- the client runtime ---
def _boxes(results):
    return [(r.boxes.xyxy, r.boxes.conf, r.boxes.cls) for r in results]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(_boxes(a), _boxes(b), strict=True):
        assert x[0].shape[0] > 0 and all(torch.equal(p, q) for p, q in zip(x, y, strict=True))


def _images():
    from PIL import Image

    rgb = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    return [rgb, rgb[:, ::-1].copy(), rgb[::2, ::2].copy()]


@pytest.mark.parametrize("scheme, server", [("grpc", FakeGrpcServer), ("http", FakeHttpServer)])
def test_the_triton_client_decodes_the_same_results_as_the_onnx_file(served, scheme, server):
    fake = server(served.path)
    remote = LibreYOLO(f"{scheme}://localhost:8001/yolo", client=fake)
    local = LibreYOLO(model_file(served.path))
    images = _images()
    _assert_same(remote.predict(images, conf=0.25, color_format="rgb"),
                 local.predict(images, conf=0.25, color_format="rgb"))
    assert fake.batches == [2, 1]  # three images, split at max_batch_size 2
    assert remote.names == local.names and remote.validation["status"] == "passed"
    assert "Triton" in remote.describe()


def test_a_local_model_folder_runs_the_onnx_it_serves(served):
    folder = LibreYOLO(served.path)
    assert folder.format == "onnx"
    _assert_same(folder.predict([SAMPLE_IMAGE], conf=0.25),
                 LibreYOLO(model_file(served.path)).predict([SAMPLE_IMAGE], conf=0.25))


def test_embedded_nms_model_is_served_with_a_reshaped_count_and_decodes_like_onnx(served_nms):
    config = parse_config((served_nms.path / CONFIG).read_text())
    count = next(o for o in config.output if o.name == "num_detections")
    assert list(count.dims) == [1] and count.HasField("reshape") and list(count.reshape.shape) == []
    assert config_mismatches(config, model_file(served_nms.path), _ort_shapes(served_nms.path)) == []
    remote = LibreYOLO("grpc://[::1]:8001/yolo-nms", client=FakeGrpcServer(served_nms.path))
    assert type(remote.family).__name__ == "DecodedFamily"  # the ONNX runtime's embedded-NMS decoder
    local = LibreYOLO(model_file(served_nms.path))
    images = _images()
    _assert_same(remote.predict(images, conf=0.25, color_format="rgb"),
                 local.predict(images, conf=0.25, color_format="rgb"))
    batch = torch.rand(3, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(0))
    got, want = remote._forward(batch), local._forward(batch)  # raw outputs, as the decoder receives them
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert got["num_detections"].shape == (3,)


def test_a_served_config_that_contradicts_its_metadata_is_refused(served):
    text = (served.path / CONFIG).read_text()
    wrong_dim = text.replace(f"dims: [ 3, {IMGSZ}, {IMGSZ} ]", f"dims: [ 3, {IMGSZ}, {IMGSZ + 32} ]")
    with pytest.raises(CheckpointError, match="'imgsz' is 64"):
        LibreYOLO("grpc://localhost:8001/yolo", client=FakeGrpcServer(served.path, wrong_dim))
    edited = text.replace('key: "nc" value: { string_value: "80" }', 'key: "nc" value: { string_value: "81" }')
    assert edited != text
    with pytest.raises(CheckpointError, match="edited after export"):
        LibreYOLO("grpc://localhost:8001/yolo", client=FakeGrpcServer(served.path, edited))
    with pytest.raises(CheckpointError, match="'nc' is 81"):  # caught by the served shapes even without the hash
        LibreYOLO("grpc://localhost:8001/yolo", client=FakeGrpcServer(served.path, edited), verify=False)


def test_an_unreachable_server_is_one_clear_error(served):
    class Down(FakeGrpcServer):
        def get_model_config(self, *a, **kw):
            raise ConnectionError("failed to connect to all addresses")

    with pytest.raises(RuntimeUnavailableError, match="Is the server running"):
        LibreYOLO("grpc://localhost:8001/yolo", client=Down(served.path))


# --- errors ---
@pytest.mark.parametrize("url, message", [
    ("grpc://localhost/yolo", "names no port"),
    ("http://example.com/models/yolo9t.pt", "names no port"),
    ("grpc://localhost:8001", "no model name"),
    ("grpc://localhost:8001/a/b", "not one model name"),
    ("grpc://localhost:99999/yolo", "port is not a number"),
    ("grpc://user@localhost:8001/yolo", "user, query or fragment"),
    ("s3://bucket/yolo9t.pt", "does not download model files from URLs"),
])
def test_a_url_that_is_not_a_triton_model_is_one_clear_error(url, message):
    with pytest.raises(ArgumentError, match=message) as err:
        LibreYOLO(url)
    assert len(str(err.value).splitlines()) == 1


def test_without_tritonclient_the_message_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tritonclient.grpc", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'libreyolo\[triton\]'"):
        LibreYOLO("grpc://localhost:8001/yolo")


@pytest.mark.parametrize("opts, message", [
    ({"max_batch": 0}, "max_batch must be an integer from 1 to 1024, got 0"),
    ({"max_batch": -2}, "max_batch must be an integer from 1 to 1024"),
    ({"max_batch": 2, "preferred_batch": [4]}, r"preferred_batch \[4\] exceed max_batch=2"),
    ({"max_batch": 2, "batch": 3}, "batch=3 is larger than max_batch=2"),
    ({"queue_delay_us": -1}, "queue_delay_us must be an integer from 0"),
    ({"instances": 0}, "instances must be an integer from 1"),
    ({"name": "my model"}, "not a usable Triton model name"),
    ({"half": True}, "half=True for format=triton needs a CUDA device"),
    ({"int8": True, "data": "x.yaml"}, "int8=True is not supported for format=triton"),
])
def test_bad_triton_options_are_refused_before_anything_is_built(tmp_path, opts, message):
    with pytest.raises(ArgumentError, match=message):
        model().export(format="triton", output=tmp_path / "repo", imgsz=64, verbose=False, **opts)
    assert not list(tmp_path.iterdir())


def test_a_family_with_a_static_batch_axis_is_refused(tmp_path, monkeypatch):
    import dataclasses

    m = model()
    monkeypatch.setattr(type(m.family), "export", dataclasses.replace(m.family.export, dynamic_batch=False))
    with pytest.raises(ArgumentError, match="format=triton needs a dynamic batch axis"):
        m.export(format="triton", output=tmp_path / "repo", imgsz=64, verbose=False)
    assert not list(tmp_path.iterdir())


def test_triton_options_are_refused_for_other_formats(tmp_path):
    with pytest.raises(ArgumentError, match="max_batch applies only to format=triton, not format=onnx"):
        model().export(format="onnx", output=tmp_path / "m.onnx", max_batch=4, verbose=False)


def test_a_model_folder_holding_other_versions_is_not_replaced(tmp_path):
    other = tmp_path / "repo" / "yolo" / "2"
    other.mkdir(parents=True)
    (other / "model.onnx").write_bytes(b"v2")
    with pytest.raises(ArgumentError, match="refuses to delete other files or versions"):
        model().export(format="triton", output=tmp_path / "repo", name="yolo", imgsz=64, verbose=False)
    assert (other / "model.onnx").read_bytes() == b"v2"


def test_a_failure_midway_leaves_no_repository_and_no_build_folder(tmp_path, monkeypatch):
    from libreyolo.export import triton as triton_exporter

    def half_written(module, example, path, opts):
        path.write_bytes(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(triton_exporter, "export_onnx", half_written)
    with pytest.raises(RuntimeError, match="disk full"):
        model().export(format="triton", output=tmp_path / "repo", imgsz=64, verbose=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (["export", "model=LibreYOLO9t.yaml", "format=triton", "max_batch=0"], "max_batch must be an integer"),
    (["predict", "model=grpc://localhost/yolo", f"source={SAMPLE_IMAGE}"], "names no port"),
])
def test_cli_bad_input_prints_one_line_and_exits_non_zero(argv, message, capsys, tmp_path, monkeypatch):
    from libreyolo.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "model_repository").exists()


def test_exporting_again_replaces_its_own_model_folder_whole(served_nms, tmp_path, monkeypatch):
    import shutil

    from libreyolo.export import triton as triton_exporter

    repo = tmp_path / "repo"
    shutil.copytree(served_nms.path, repo / "yolo-nms")
    (repo / "other-model").mkdir()  # the rest of the repository is left alone
    # the trace is the served model's own graph (tracing again would only cost time here)
    monkeypatch.setattr(triton_exporter, "export_onnx",
                        lambda module, example, path, opts: shutil.copy(model_file(served_nms.path), path))
    report = model().export(format="triton", imgsz=IMGSZ, output=repo, name="yolo-nms", nms=True, verbose=False,
                            max_batch=3, validate=False)
    assert parse_config((report.path / CONFIG).read_text()).max_batch_size == 3
    assert sorted(p.name for p in repo.iterdir()) == ["other-model", "yolo-nms"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # no build or old folder left beside it
