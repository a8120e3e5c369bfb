"""Stand-ins for the ``tensorrt`` Python module, shaped like TensorRT 10's and 11's documented API.

They record every call the build code makes, so a test can assert which calls are made on each
API generation. TensorRT 11 (NVIDIA's 10.x to 11.x migration guide) has no ``BuilderFlag.FP16``/
``INT8``/``BF16``/``FP8``/``OBEY_PRECISION_CONSTRAINTS``, no ``IBuilderConfig.int8_calibrator``, no
``Builder.platform_has_fast_fp16``/``int8``/``tf32``, and keeps ``NetworkDefinitionCreationFlag.
STRONGLY_TYPED`` only for compatibility (ignored: strong typing is always on); a stand-in raises
``AttributeError`` on any of them, as the real module would. Nothing here builds an engine.
"""
from __future__ import annotations

import enum
import types
from typing import Any


def standin(major: int, *, progress: bool = True) -> types.ModuleType:
    """A fake ``tensorrt`` module of API generation ``major`` (10 or 11); ``module.calls`` records calls."""
    calls: list[tuple] = []
    flags = ["DEBUG", "GPU_FALLBACK", "REFIT", "DISABLE_TIMING_CACHE", "TF32", "SPARSE_WEIGHTS"]
    if major == 10:
        flags += ["FP16", "INT8", "BF16", "FP8", "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS"]
    builder_flag = enum.IntEnum("BuilderFlag", flags)

    class NetworkDefinitionCreationFlag(enum.IntEnum):
        STRONGLY_TYPED = 0  # 11: deprecated, accepted and ignored

    class MemoryPoolType(enum.IntEnum):
        WORKSPACE = 0

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            calls.append(("Logger", level))

    class TimingCache:
        def __init__(self, blob: bytes) -> None:
            self.blob = blob

        def serialize(self) -> bytes:
            calls.append(("timing_cache.serialize",))
            return b"timing:" + self.blob

    class Profile:
        def set_shape(self, name: str, low: tuple, opt: tuple, high: tuple) -> None:
            calls.append(("profile.set_shape", name, low, opt, high))

    class Config:
        _fields = ("progress_monitor", "int8_calibrator") if major == 10 else ("progress_monitor",)

        def __init__(self) -> None:
            object.__setattr__(self, "progress_monitor", None)

        def __setattr__(self, name: str, value: Any) -> None:
            if name not in self._fields:
                raise AttributeError(f"'tensorrt.IBuilderConfig' object has no attribute '{name}'")
            calls.append((f"config.{name}=", type(value).__name__))
            object.__setattr__(self, name, value)

        def set_memory_pool_limit(self, pool: Any, size: int) -> None:
            calls.append(("config.set_memory_pool_limit", pool.name, size))

        def set_flag(self, flag: Any) -> None:
            calls.append(("config.set_flag", flag.name))

        def clear_flag(self, flag: Any) -> None:
            calls.append(("config.clear_flag", flag.name))

        def create_timing_cache(self, blob: bytes) -> TimingCache:
            calls.append(("config.create_timing_cache", bytes(blob)))
            return TimingCache(bytes(blob))

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            calls.append(("config.set_timing_cache", ignore_mismatch))
            return True

        def add_optimization_profile(self, profile: Profile) -> int:
            calls.append(("config.add_optimization_profile",))
            return 0

    class Network:
        pass

    class Builder:
        def __init__(self, logger: Logger) -> None:
            calls.append(("Builder",))

        def create_network(self, flags: int = 0) -> Network:
            calls.append(("builder.create_network", flags))
            return Network()

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes:
            monitor = config.progress_monitor
            if monitor is not None:  # as TensorRT reports a build: nested phases with steps
                monitor.phase_start("Building engine", None, 2)
                monitor.phase_start("Tactic selection", "Building engine", 3)
                for step in range(3):
                    assert monitor.step_complete("Tactic selection", step) is True
                monitor.phase_finish("Tactic selection")
                monitor.phase_finish("Building engine")
            calls.append(("builder.build_serialized_network",))
            return b"ENGINE-" + str(major).encode()

    if major == 10:
        Builder.platform_has_fast_fp16 = True  # removed in 11
        Builder.platform_has_fast_int8 = True
        Builder.platform_has_tf32 = True

    class OnnxParser:
        num_errors = 0

        def __init__(self, network: Network, logger: Logger) -> None:
            pass

        def parse(self, data: bytes) -> bool:
            calls.append(("parser.parse", len(data)))
            return True

        def get_error(self, i: int) -> str:
            return ""

    module = types.ModuleType("tensorrt")
    module.__version__ = {10: "10.13.3.9", 11: "11.4.0.5"}[major]
    module.calls = calls
    module.Logger, module.Builder, module.OnnxParser = Logger, Builder, OnnxParser
    module.BuilderFlag, module.NetworkDefinitionCreationFlag = builder_flag, NetworkDefinitionCreationFlag
    module.MemoryPoolType = MemoryPoolType
    if progress:
        class IProgressMonitor:
            def __init__(self) -> None:
                calls.append(("IProgressMonitor.__init__",))

        module.IProgressMonitor = IProgressMonitor
    if major == 10:
        class IInt8EntropyCalibrator2:  # exists in 10 (deprecated), removed in 11
            pass

        module.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2
    return module
