"""Which AOTInductor CUDA packages load on this machine? (the H200 diagnosis of 2026-12-01)

    PYTHONPATH=. python3 tools/aoti_cuda_diag.py ours-static    # our exporter, demo detector, 640, fp32
    PYTHONPATH=. python3 tools/aoti_cuda_diag.py ours-dynamic   # the same with a dynamic batch
    PYTHONPATH=. python3 tools/aoti_cuda_diag.py raw            # bare torch.export + aoti_compile_and_package,
                                                                 # loaded in fresh processes (device_index 0, -1,
                                                                 # 0 after initialising CUDA)

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
    elif mode == "load":
        path, idx = sys.argv[2], sys.argv[3]
        if idx.endswith("-init"):
            torch.zeros(1, device="cuda")
            idx = idx[: -len("-init")]
        m = torch._inductor.aoti_load_package(path, device_index=int(idx))
        m(torch.rand(1, 3, 640, 640, device="cuda"))
        torch.cuda.synchronize()
        print("ran", flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}: ours-static, ours-dynamic or raw")


if __name__ == "__main__":
    main()
