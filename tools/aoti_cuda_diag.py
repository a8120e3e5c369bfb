"""Which AOTInductor CUDA packages load on this machine? (the H200 diagnosis of 2026-12-01)

    PYTHONPATH=. python3 tools/aoti_cuda_diag.py ours-static    # our exporter, demo detector, 640, fp32
    PYTHONPATH=. python3 tools/aoti_cuda_diag.py ours-dynamic   # the same with a dynamic batch
    PYTHONPATH=. python3 tools/aoti_cuda_diag.py raw            # bare torch.export + aoti_compile_and_package,
                                                                 # loaded in fresh processes (device_index 0, -1,
                                                                 # 0 after initialising CUDA)
    PYTHONPATH=. python3 tools/aoti_cuda_diag.py native [v1,v2] # compile variants in parallel (default options,
                                                                 # no assembler-embedded constants, kernels
                                                                 # embedded in the .so, a two-conv net), load
                                                                 # each under tools/segv_backtrace.c: the native
                                                                 # stack of a crash, resolved with addr2line

faulthandler prints the Python stack of a crash; `bench/results/2026-12-01-aoti-cuda-load-h200.log`
holds that run's output. Set LIBREYOLO_AOTI_PROBE=0 to see the loader crash in the exporting
process itself instead of the probe's error.
"""
import faulthandler
import subprocess
import sys
import time

import torch

faulthandler.enable()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "raw"
    from libreyolo import LibreYOLO
    from libreyolo.assets import DEMO_MODEL

    if mode.startswith("ours"):
        t = time.time()
        rep = LibreYOLO(DEMO_MODEL, device="cuda").export(format="aoti", device="cuda", imgsz=640,
                                                          dynamic=(mode == "ours-dynamic"), output=f"/tmp/{mode}.pt2")
        print(mode, "exported in", round(time.time() - t, 1), "s:", rep.validation.status, flush=True)
    elif mode == "raw":
        net = LibreYOLO(DEMO_MODEL, device="cuda").net.eval()

        class Predictions(torch.nn.Module):
            def __init__(self, n: torch.nn.Module) -> None:
                super().__init__()
                self.n = n

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.n(x)["predictions"]

        with torch.no_grad():
            ep = torch.export.export(Predictions(net), (torch.rand(1, 3, 640, 640, device="cuda"),), strict=False)
            torch._inductor.aoti_compile_and_package(ep, package_path="/tmp/raw640.pt2")
        print("raw compiled", flush=True)
        for idx in ("0", "-1", "0-init"):
            r = subprocess.run([sys.executable, __file__, "load", "/tmp/raw640.pt2", idx], capture_output=True,
                               text=True)
            print("LOAD idx", idx, "rc", r.returncode, r.stdout[-300:], r.stderr[-1200:], flush=True)
    elif mode == "native":
        native()
    elif mode == "compile":
        compile_variant(sys.argv[2], sys.argv[3])
    elif mode == "load":
        path, idx = sys.argv[2], sys.argv[3]
        if idx.endswith("-init"):
            torch.zeros(1, device="cuda")
            idx = idx[: -len("-init")]
        m = torch._inductor.aoti_load_package(path, device_index=int(idx))
        print("loaded", flush=True)
        x = torch.rand(1, 3, 640, 640, device="cuda")
        y = m(x)
        torch.cuda.synchronize()
        print("ran", flush=True)
        graph_replay(path, x, y)
    elif mode == "toolchain":
        toolchain()
    else:
        raise SystemExit(f"unknown mode {mode!r}: ours-static, ours-dynamic or raw")


VARIANTS = {  # name: (network, inductor config overrides, link against the shared libstdc++)
    "default": ("demo", {"aot_inductor.debug_symbols": True}, False),
    "no-asm-consts": ("demo", {"aot_inductor.use_consts_asm_build": False}, False),
    "embed-kernels": ("demo", {"aot_inductor.embed_kernel_binary": True}, False),
    "two-convs": ("tiny", {}, False),
    "two-convs-shared": ("tiny", {}, True),
    "demo-shared": ("demo", {}, True),
}


def graph_replay(path: str, x: torch.Tensor, expected) -> None:
    """Load single-threaded (no per-call event query), capture one call in a CUDA graph, replay it."""
    m = torch._inductor.aoti_load_package(path, device_index=0, run_single_threaded=True)
    print("loaded single-threaded", flush=True)
    static = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            m(static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = m(static)
    static.copy_(x)
    g.replay()
    torch.cuda.synchronize()
    a = out[0] if isinstance(out, (list, tuple)) else out
    b = expected[0] if isinstance(expected, (list, tuple)) else expected
    print("graph replay max abs diff vs eager call:", float((a.float() - b.float()).abs().max()), flush=True)


def shared_stdcxx_dir() -> str:
    """A folder holding ``libstdc++.so`` -> the libstdc++ this process runs with (for LIBRARY_PATH)."""
    import os

    lib = next(line.split()[-1] for line in open("/proc/self/maps") if "libstdc++.so" in line)
    d = "/tmp/shared-stdcxx"
    os.makedirs(d, exist_ok=True)
    if not os.path.lexists(f"{d}/libstdc++.so"):
        os.symlink(lib, f"{d}/libstdc++.so")
    return d


def toolchain() -> None:
    """Which C++ compiler Inductor uses, and whether it links libstdc++ statically."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    cxx = get_cpp_compiler()
    run = lambda *a: subprocess.run(a, capture_output=True, text=True).stdout.strip()  # noqa: E731
    print("compiler:", cxx, "|", run(cxx, "--version").splitlines()[0])
    for f in ("libstdc++.so", "libstdc++.a"):
        print(f"{cxx} -print-file-name={f}:", run(cxx, f"-print-file-name={f}"))
    print("process libstdc++:", sorted({line.split()[-1] for line in open("/proc/self/maps") if "stdc++" in line}))
    print("GLIBCXX max:", sorted(v for v in run("sh", "-c", "strings $(ls /lib/x86_64-linux-gnu/libstdc++.so.6) | "
                                                  "grep '^GLIBCXX_3'").split())[-1:])


def compile_variant(name: str, path: str) -> None:
    import os

    from libreyolo import LibreYOLO
    from libreyolo.assets import DEMO_MODEL

    kind, options, shared = VARIANTS[name]
    if shared:
        os.environ["LIBRARY_PATH"] = shared_stdcxx_dir() + os.pathsep + os.environ.get("LIBRARY_PATH", "")
    if kind == "demo":
        net = LibreYOLO(DEMO_MODEL, device="cuda").net.eval()

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.n = net

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.n(x)["predictions"]
    else:
        class Net(torch.nn.Sequential):
            def __init__(self) -> None:
                super().__init__(torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.SiLU(), torch.nn.Conv2d(16, 8, 3, 2, 1))
    t = time.time()
    with torch.no_grad():
        ep = torch.export.export(Net().cuda().eval(), (torch.rand(1, 3, 640, 640, device="cuda"),), strict=False)
        torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=options)
    import zipfile

    with zipfile.ZipFile(path) as z:
        so = next(n for n in z.namelist() if n.endswith(".so"))
        z.extract(so, "/tmp/so-" + name)
    syms = subprocess.run(["nm", "-D", "--defined-only", f"/tmp/so-{name}/{so}"], capture_output=True, text=True).stdout
    deps = subprocess.run(["ldd", f"/tmp/so-{name}/{so}"], capture_output=True, text=True).stdout
    print(f"{name}: libstdc++ internals exported by the wrapper: {syms.count('codecvt')} codecvt symbols; "
          f"needs libstdc++.so.6: {'libstdc++.so.6' in deps}", flush=True)
    print(f"compiled {name} in {time.time() - t:.0f} s", flush=True)


def native() -> None:
    """Compile every variant (in parallel), then load and run each in a child with the crash reporter."""
    import os
    import re
    import shutil

    here = os.path.dirname(os.path.abspath(__file__))
    so = "/tmp/segv_backtrace.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", so, os.path.join(here, "segv_backtrace.c")], check=True)
    toolchain()
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(VARIANTS)
    procs = {}
    for name in names:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"/tmp/inductor-{name}")
        procs[name] = subprocess.Popen([sys.executable, __file__, "compile", name, f"/tmp/{name}.pt2"], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, p in procs.items():
        out = p.communicate()[0]
        tail = out.strip().splitlines()[-1:] if p.returncode == 0 else out[-2000:]
        print(f"== compile {name}: rc {p.returncode}", out.strip().splitlines()[-2:] if p.returncode == 0 else tail,
              flush=True)
    for name in names:
        if not os.path.isfile(f"/tmp/{name}.pt2"):
            continue
        maps = f"/tmp/maps-{name}.txt"
        env = dict(os.environ, LD_PRELOAD=so, SEGV_MAPS=maps, TORCH_SHOW_CPP_STACKTRACES="1")
        r = subprocess.run([sys.executable, __file__, "load", f"/tmp/{name}.pt2", "0"], env=env, capture_output=True,
                           text=True)
        print(f"== load {name}: rc {r.returncode}; stdout {r.stdout.strip()[-300:]!r}", flush=True)
        if r.returncode == 0:
            continue
        lines = r.stderr.splitlines()
        print("\n".join(line for line in lines if not line.startswith("NATIVE #"))[-1500:], flush=True)
        for line in lines:
            m = re.match(r"NATIVE #(\d+) (\S+) \+(0x[0-9a-f]+) (\S+)", line)
            if not m:
                if line.startswith("NATIVE"):
                    print(line)
                continue
            idx, lib, off, sym = m.groups()
            where = ""
            if shutil.which("addr2line") and os.path.isfile(lib):
                a = subprocess.run(["addr2line", "-f", "-C", "-i", "-e", lib, off], capture_output=True, text=True)
                where = " | ".join(a.stdout.split("\n")[:4]).strip()
            print(f"#{idx} {os.path.basename(lib)} +{off} {sym[:120]} :: {where[:300]}", flush=True)
        m = re.search(r"NATIVE signal \d+ at address (0x[0-9a-f]+|\(nil\))", r.stderr)
        if m and os.path.isfile(maps) and m.group(1) != "(nil)":
            addr = int(m.group(1), 16)
            for row in open(maps):
                lo, hi = (int(v, 16) for v in row.split()[0].split("-"))
                if lo <= addr < hi:
                    print("fault in mapping:", row.strip(), flush=True)


if __name__ == "__main__":
    main()
