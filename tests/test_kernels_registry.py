"""The kernel registry: selection, caching, environment, failure handling, lazy providers."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

from libreyolo import kernels
from libreyolo.kernels import _providers, _registry

REPO_ROOT = Path(__file__).resolve().parents[1]
SLOT = "test_double"
ENV_VARS = ("LIBREYOLO_KERNELS", "LIBREYOLO_QUANT_KERNELS", "LIBREYOLO_HUB_KERNELS")


def reference_double(x):
    return 2 * x


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    _providers.load_once()  # so the snapshot keeps whatever this machine's providers register
    state = _registry._snapshot()
    kernels.define_slot(SLOT, reference_double)
    yield
    _registry._restore(state)


@contextlib.contextmanager
def kernel_warnings():
    """Collect KernelWarnings with Python's own deduplication off (ours must do it)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found: list[str] = []
        yield found
        found.extend(str(w.message) for w in caught if issubclass(w.category, kernels.KernelWarning))


def test_resolve_returns_the_reference_when_nothing_is_registered():
    assert kernels.resolve(SLOT) is reference_double
    assert kernels.active()[SLOT] == kernels.REFERENCE


def test_newest_eligible_registration_wins():
    kernels.register(SLOT, lambda x: "old", name="old")
    kernels.register(SLOT, lambda x: "new", name="new")
    assert kernels.call(SLOT, 1) == "new"
    assert kernels.active()[SLOT] == "new"


def test_ineligible_newest_falls_through_to_older_then_reference():
    kernels.register(SLOT, lambda x: "old", name="old")
    kernels.register(SLOT, lambda x: "new", name="new", predicate=lambda *a, **k: False)
    assert kernels.call(SLOT, 1) == "old"
    kernels.unregister(SLOT, "old")
    assert kernels.call(SLOT, 3) == 6


def test_predicate_receives_the_call_arguments_and_can_decline_by_input():
    seen = []

    def only_ints(x=None):
        seen.append(x)
        return x is None or isinstance(x, int)

    kernels.register(SLOT, lambda x: "fast", name="fast", predicate=only_ints)
    assert kernels.call(SLOT, 5) == "fast"
    assert kernels.call(SLOT, 1.5) == 3.0
    assert seen == [5, 1.5]
    assert kernels.active()[SLOT] == "fast"  # called with no arguments: "could you run at all?"


def test_registration_after_a_cached_resolve_is_visible_at_once():
    assert kernels.resolve(SLOT) is reference_double  # now cached
    kernels.register(SLOT, lambda x: "late", name="late")
    assert kernels.call(SLOT, 1) == "late"


def test_unregister_takes_effect_at_once_and_reports_whether_it_removed():
    kernels.register(SLOT, lambda x: "fast", name="fast")
    assert kernels.call(SLOT, 1) == "fast"
    assert kernels.unregister(SLOT, "fast") is True
    assert kernels.call(SLOT, 1) == 2
    assert kernels.unregister(SLOT, "fast") is False


def test_registering_the_same_name_again_replaces_it():
    kernels.register(SLOT, lambda x: "v1", name="fast")
    kernels.register(SLOT, lambda x: "v2", name="fast")
    assert [c.name for c in kernels.candidates(SLOT, 1)] == ["fast", kernels.REFERENCE]
    assert kernels.call(SLOT, 1) == "v2"


def test_candidates_are_eligible_best_first_with_the_reference_last():
    kernels.register(SLOT, lambda x: "a", name="a")
    kernels.register(SLOT, lambda x: "b", name="b", predicate=lambda x=None: x != 0)
    kernels.register(SLOT, lambda x: "c", name="c")
    assert [c.name for c in kernels.candidates(SLOT, 1)] == ["c", "b", "a", kernels.REFERENCE]
    assert [c.name for c in kernels.candidates(SLOT, 0)] == ["c", "a", kernels.REFERENCE]


def test_slot_without_reference_resolves_to_none_and_keeps_the_callers_path():
    kernels.define_slot("test_no_reference", None)
    assert kernels.resolve("test_no_reference") is None
    assert kernels.active()["test_no_reference"] == kernels.UNAVAILABLE
    assert kernels.call_or("test_no_reference", lambda x: x + 1, 1) == 2
    with pytest.raises(LookupError, match="call_or"):
        kernels.call("test_no_reference", 1)


def test_unknown_slot_error_names_the_known_slots():
    with pytest.raises(KeyError, match="known slots: .*fake_quant_fp8"):
        kernels.resolve("fake_quant_fp9")


def test_active_lists_the_builtin_slots():
    table = kernels.active()
    for slot in ("fake_quant_fp8", "fake_quant_int8_per_channel", "fake_quant_int8_affine", "ms_deform_attn"):
        assert slot in table


def test_predicate_that_raises_is_warned_about_once_and_counts_as_ineligible():
    def broken(*args, **kwargs):
        raise ZeroDivisionError("bad predicate")

    kernels.register(SLOT, lambda x: "never", name="broken", predicate=broken)
    with kernel_warnings() as messages:
        assert kernels.call(SLOT, 1) == 2
        assert kernels.call(SLOT, 2) == 4
        assert kernels.resolve(SLOT) is reference_double
    assert len(messages) == 1
    assert "broken" in messages[0] and "ZeroDivisionError" in messages[0]


def test_impl_that_raises_mid_run_is_disabled_warned_once_and_the_fallback_answers():
    calls = []

    def flaky(x):
        calls.append(x)
        raise RuntimeError("kernel crashed")

    kernels.register(SLOT, flaky, name="flaky")
    with kernel_warnings() as messages:
        assert kernels.call(SLOT, 5) == 10
        assert kernels.call(SLOT, 6) == 12
    assert calls == [5]  # disabled after the first failure
    assert len(messages) == 1 and "flaky" in messages[0] and "kernel crashed" in messages[0]
    assert kernels.active()[SLOT] == kernels.REFERENCE


def test_errors_from_the_reference_propagate_unchanged():
    def strict(x):
        raise ValueError("x must be positive")

    kernels.define_slot("test_strict", strict)
    with pytest.raises(ValueError, match="positive"):
        kernels.call("test_strict", -1)


@pytest.mark.parametrize("value", ["off", "reference", "OFF"])
def test_env_off_forces_the_reference(monkeypatch, value):
    kernels.register(SLOT, lambda x: "fast", name="fast")
    assert kernels.call(SLOT, 1) == "fast"
    monkeypatch.setenv("LIBREYOLO_KERNELS", value)
    assert kernels.call(SLOT, 1) == 2  # selector change takes effect at once, despite the cache
    assert kernels.active()[SLOT] == kernels.REFERENCE
    monkeypatch.delenv("LIBREYOLO_KERNELS")
    assert kernels.call(SLOT, 1) == "fast"


def test_env_name_restricts_selection_to_that_name(monkeypatch):
    kernels.register(SLOT, lambda x: "a", name="alpha")
    kernels.register(SLOT, lambda x: "b", name="beta")
    monkeypatch.setenv("LIBREYOLO_KERNELS", "alpha")
    assert kernels.call(SLOT, 1) == "a"
    monkeypatch.setenv("LIBREYOLO_KERNELS", "beta")
    assert kernels.call(SLOT, 1) == "b"


def test_env_unknown_name_warns_once_and_uses_references(monkeypatch):
    kernels.register(SLOT, lambda x: "a", name="alpha")
    monkeypatch.setenv("LIBREYOLO_KERNELS", "nosuchbackend")
    with kernel_warnings() as messages:
        assert kernels.call(SLOT, 1) == 2
        assert kernels.call(SLOT, 1) == 2
        kernels.active()
    assert len(messages) == 1 and "nosuchbackend" in messages[0]


def test_legacy_quant_env_is_honoured_only_when_the_main_one_is_unset(monkeypatch):
    kernels.register(SLOT, lambda x: "fast", name="fast")
    monkeypatch.setenv("LIBREYOLO_QUANT_KERNELS", "off")
    assert kernels.selector() == kernels.REFERENCE
    assert kernels.call(SLOT, 1) == 2
    monkeypatch.setenv("LIBREYOLO_KERNELS", "fast")
    assert kernels.selector() == "fast"
    assert kernels.call(SLOT, 1) == "fast"


def test_disable_takes_an_implementation_out_for_the_process():
    kernels.register(SLOT, lambda x: "fast", name="fast")
    with pytest.warns(kernels.KernelWarning, match="fast"):
        kernels.disable(SLOT, "fast", "operator request")
    assert kernels.call(SLOT, 1) == 2
    kernels.register(SLOT, lambda x: "fixed", name="fast")  # re-registering re-enables
    assert kernels.call(SLOT, 1) == "fixed"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"impl": 3, "name": "x"}, TypeError),
        ({"impl": abs, "name": ""}, ValueError),
        ({"impl": abs, "name": "reference"}, ValueError),
        ({"impl": abs, "name": "x", "predicate": True}, TypeError),
    ],
)
def test_register_rejects_bad_arguments_with_a_clear_error(kwargs, error):
    with pytest.raises(error):
        kernels.register(SLOT, **kwargs)


def test_concurrent_resolve_while_registering_always_returns_a_valid_choice():
    valid = {"reference"} | {f"impl{i}" for i in range(40)}
    seen, errors = [], []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                chosen = kernels.selected(SLOT, 1)
                seen.append(chosen.name)
                assert chosen.name in valid
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    for i in range(40):
        kernels.register(SLOT, lambda x, i=i: i, name=f"impl{i}")
        if i % 3 == 0:
            kernels.unregister(SLOT, f"impl{i}")
    stop.set()
    for thread in threads:
        thread.join()
    assert not errors
    assert seen
    assert kernels.selected(SLOT, 1).name == "impl38"  # newest surviving registration


# --- lazy providers, checked in fresh interpreters -------------------------

PROBE = """
import json, sys
{setup}
print(json.dumps({{
    "triton": "triton" in sys.modules,
    "kernels_pkg": "kernels" in sys.modules,
    "out_of_tree": "libreyolo_kernels" in sys.modules,
    "providers": sorted(m for m in sys.modules if m.startswith("libreyolo.kernels.") and
                        (m.endswith("_provider") or m.endswith("_triton") or m.endswith("_hub")
                         or m.endswith("_providers"))),
    "result": RESULT,
}}))
"""


def run_probe(setup: str, tmp_path: Path, env: dict[str, str] | None = None) -> dict:
    full_env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(tmp_path)])
    full_env.update(env or {})
    code = PROBE.format(setup=textwrap.dedent(setup))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_out_of_tree_package(tmp_path: Path, body: str) -> None:
    package = tmp_path / "libreyolo_kernels"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(body))


EXTERNAL = """
from libreyolo import kernels

def fp8_external(x, scale):
    return x * 0 + 7

kernels.register("fake_quant_fp8", fp8_external, name="external")
"""


def test_importing_libreyolo_and_kernels_imports_no_provider(tmp_path):
    write_out_of_tree_package(tmp_path, EXTERNAL)
    probe = run_probe("import libreyolo\nfrom libreyolo import kernels\nRESULT = None", tmp_path)
    assert probe == {
        "triton": False,
        "kernels_pkg": False,
        "out_of_tree": False,
        "providers": [],
        "result": None,
    }


def test_env_off_imports_no_accelerated_module_at_all(tmp_path):
    write_out_of_tree_package(tmp_path, EXTERNAL)
    setup = """
    import torch
    from libreyolo import kernels
    table = kernels.active()
    out = kernels.call("fake_quant_fp8", torch.ones(3), 1.0)
    RESULT = [table["fake_quant_fp8"], out.tolist()]
    """
    probe = run_probe(setup, tmp_path, {"LIBREYOLO_KERNELS": "off"})
    assert probe["result"] == ["reference", [1.0, 1.0, 1.0]]
    assert not probe["triton"] and not probe["kernels_pkg"] and not probe["out_of_tree"]
    assert probe["providers"] == []


COUNT_IMPORTS = """
import builtins
builtins.IMPORTS = getattr(builtins, "IMPORTS", 0) + 1
"""


def test_out_of_tree_package_is_imported_lazily_once_and_registers_itself(tmp_path):
    write_out_of_tree_package(tmp_path, EXTERNAL + COUNT_IMPORTS)
    setup = """
    import builtins, sys, torch
    from libreyolo import kernels
    before = "libreyolo_kernels" in sys.modules
    first = kernels.active()["fake_quant_fp8"]
    out = kernels.call("fake_quant_fp8", torch.ones(2), 1.0)
    kernels.active()
    RESULT = [before, first, out.tolist(), builtins.IMPORTS]
    """
    probe = run_probe(setup, tmp_path)
    assert probe["result"] == [False, "external", [7.0, 7.0], 1]


def test_broken_out_of_tree_package_warns_and_the_references_still_work(tmp_path):
    write_out_of_tree_package(tmp_path, "raise ImportError('compiled for another torch')\n")
    setup = """
    import warnings, torch
    from libreyolo import kernels
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = kernels.active()
    out = kernels.call("fake_quant_fp8", torch.ones(2), 1.0)
    RESULT = [table["fake_quant_fp8"], out.tolist(), [str(w.message) for w in caught]]
    """
    probe = run_probe(setup, tmp_path)
    name, values, messages = probe["result"]
    assert name in (kernels.REFERENCE, "triton") and values == [1.0, 1.0]
    assert len(messages) == 1 and "another torch" in messages[0] and "libreyolo_kernels" in messages[0]


def test_torch_compile_traces_the_reference_without_graph_breaks():
    import torch

    from libreyolo.quant import fake_quant_fp8

    kernels.register("fake_quant_fp8", lambda x, scale: x * 0 + 42, name="eager_only")

    def step(x):
        return kernels.call("fake_quant_fp8", x * 2, 0.5) + 1

    x = torch.randn(8)
    assert step(x).tolist() == [43.0] * 8  # eager: the registered kernel
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="eager")  # fullgraph: a break would raise
    assert torch.equal(compiled(x), fake_quant_fp8(x * 2, 0.5) + 1)


def test_a_binding_resolves_each_slot_once_without_reading_the_environment(monkeypatch):
    """Inside an inference copy's binding a call looks its slot up in the binding: no environment read,
    no lock (mutation: dropping the binding's fast path in _selection makes ``reads`` grow per call)."""
    kernels.register(SLOT, lambda x: "fast", name="fast")
    binding = kernels.bind()
    reads = []
    real = _registry._env_key
    monkeypatch.setattr(_registry, "_env_key", lambda: reads.append(1) or real())
    with binding.active():
        assert [kernels.call(SLOT, 1) for _ in range(5)] == ["fast"] * 5
    assert reads == [] and set(binding.selections) == {SLOT}
    assert kernels.call(SLOT, 1) == "fast" and len(reads) == 1  # outside a binding: read per call, as before


def test_a_binding_is_renewed_when_registrations_or_the_selector_change(monkeypatch):
    kernels.register(SLOT, lambda x: "fast", name="fast")
    binding = kernels.bind()
    assert kernels.bind(binding) is binding and binding.current()
    monkeypatch.setenv("LIBREYOLO_KERNELS", "off")
    assert not binding.current()
    renewed = kernels.bind(binding)
    assert renewed is not binding
    with renewed.active():
        assert kernels.call(SLOT, 2) == 4  # the selector now says: references only
    monkeypatch.delenv("LIBREYOLO_KERNELS")
    current = kernels.bind(renewed)
    with current.active():
        assert kernels.call(SLOT, 2) == "fast"
        kernels.register(SLOT, lambda x: "newer", name="newer")  # a registration during the binding
        assert kernels.call(SLOT, 2) == "newer"  # a stale binding is not used
    assert not current.current() and kernels.bind(current) is not current


def test_an_inference_copy_keeps_its_binding_until_the_registry_changes():
    import torch

    from libreyolo.engine.inference import InferenceCopies

    copies = InferenceCopies(torch.nn.Linear(2, 2))
    copy = copies.get("cpu", torch.float32)
    first = copy.kernels()
    assert copy.kernels() is first
    kernels.register(SLOT, lambda x: "fast", name="fast")
    assert copy.kernels() is not first and copy.kernels().current()
