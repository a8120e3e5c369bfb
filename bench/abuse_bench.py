"""Good clients against ``libreyolo serve`` with and without hostile clients in the mix (issue 49).

    PYTHONPATH=. python bench/abuse_bench.py --clients 32,64 --seconds 15 \\
        --json bench/results/<date>-abuse-cpu.json

For each client count and each mix (``clean``: good clients only; ``hostile``: the same good
clients plus ``--hostile`` hostile ones), a fresh ``libreyolo serve`` (the demo detector,
``LibreYOLO9t-shapes.pt``, at its imgsz) is started on 127.0.0.1 (loopback only) with declared
budgets, and every good client posts the demo's held-out image in a closed loop for ``--seconds``
(a 429 is retried after a short pause, as Retry-After asks; it counts as a refusal, not an
answer). Hostile clients cycle through four abuses: an oversized legal PNG (9219 x 9219 pixels, a
few hundred kB: refused from its header, 413), ``?imgsz=4096`` (413), a body that trickles (100
bytes of a declared 100,000, then a byte a second: 408 after ``body_timeout``) and a disconnect
mid-upload, each at most ``--hostile-rate`` times a second (default 10; 0 floods), from a child
process (their client-side work must not share the GIL with the good clients being timed; the
CPU is still shared). Reported per run: good answers per second, their p50 and p99 latency, refusals, the
hostile clients' statuses, and the server's RSS (idle after start, peak: sampled every 10 ms with
/proc, so Linux only). Targets: with hostile clients the good clients keep at least 80% of their clean
throughput, and the server's peak RSS stays under the declared budget: the clean run's peak plus
the decoded-image budget (``max_pixels`` x 3 bytes, twice: PIL's buffer and the array).
Every run is bounded: ``--seconds`` each, at most ``--max-requests`` per good client.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import io
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_json import write_json  # noqa: E402

SHAPES = ROOT / "libreyolo" / "assets" / "shapes.jpg"


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "libreyolo.cli", "serve", "model=LibreYOLO9t-shapes.pt", "port=0",
           f"max_pixels={args.max_pixels}", f"max_batch={args.max_batch}", f"body_timeout={args.body_timeout}",
           "grace=2", "warmup=false"]  # warm-up timings on a loaded CPU mislead; real batches time the sizes
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.server_threads)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if " on http://" not in line:
        proc.kill()
        raise SystemExit(f"serve did not start: {line!r}")
    return proc, line.split(" on ")[1].split("/ ")[0]


class RssSampler:
    """The server's resident memory (peak, sampled every 10 ms) and CPU seconds, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for process {self.pid}")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, self.rss())
            except OSError:  # the process ended
                return
            time.sleep(0.01)


def good_client(url: str, body: bytes, end: float, limit: int) -> dict:
    import httpx

    lat, refused, other = [], 0, 0
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.monotonic() < end and len(lat) < limit:
            t0 = time.perf_counter()
            r = client.post("/predict", content=body)
            if r.status_code == 200:
                lat.append(time.perf_counter() - t0)
            elif r.status_code == 429:
                refused += 1
                time.sleep(0.05)
            else:
                other += 1
    return {"latencies": lat, "refused": refused, "other": other}


def _raw(url: str, declared: int, sent: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=120)
    sock.sendall(f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Length: {declared}\r\n\r\n".encode() + sent)
    return sock


def hostile_client(k: int, url: str, big: bytes, small: bytes, end: float, rate: float) -> dict:
    """One hostile client, at most ``rate`` abuses a second (0: as fast as it can)."""
    import httpx

    counts: dict[str, int] = {}
    due = time.monotonic()

    def note(what: str) -> None:
        nonlocal due
        counts[what] = counts.get(what, 0) + 1
        if rate:
            due += 1.0 / rate
            time.sleep(max(0.0, due - time.monotonic()))

    kind = ("oversized", "imgsz", "slow_body", "disconnect")[k % 4]
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.monotonic() < end:
            if kind == "oversized":
                note(f"oversized:{client.post('/predict', content=big).status_code}")
            elif kind == "imgsz":
                note(f"imgsz:{client.post('/predict', content=small, params={'imgsz': '4096'}).status_code}")
            elif kind == "disconnect":
                _raw(url, 100_000, small[:2000]).close()
                note("disconnect")
            else:
                sock = _raw(url, 100_000, small[:100])
                sock.settimeout(1.0)
                status = None
                while status is None and time.monotonic() < end + 30:
                    try:
                        data = sock.recv(4096)
                        status = data[9:12].decode() if data else "closed"
                    except TimeoutError:
                        try:
                            sock.sendall(b"\0")  # a byte a second
                        except OSError:
                            status = "closed"
                sock.close()
                note(f"slow_body:{status}")
    return counts


def hostile_mix(n: int, url: str, big: bytes, small: bytes, end: float, rate: float) -> list[dict]:
    """``n`` hostile clients in threads of this (child) process: their client-side work does not
    share the GIL with the good clients whose latency is measured."""
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda k: hostile_client(k, url, big, small, end, rate), range(n)))


def run(args: argparse.Namespace, clients: int, hostile: int, body: bytes, big: bytes) -> dict:
    proc, url = start_server(args)
    try:
        import httpx

        httpx.post(url + "/predict", content=body, timeout=120)  # first request outside the timing
        import multiprocessing

        child = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        child.submit(time.sleep, 0).result(120)  # started (and its imports done) before the timing
        time.sleep(1.0)
        sampler = RssSampler(proc.pid)
        idle = sampler.rss()
        cpu0 = sampler.cpu_seconds()
        sampler.thread.start()
        end = time.monotonic() + args.seconds
        with concurrent.futures.ThreadPoolExecutor(clients) as pool, child:
            start = time.monotonic()
            bads = child.submit(hostile_mix, hostile, url, big, body, end, args.hostile_rate) if hostile else None
            goods = [pool.submit(good_client, url, body, end, args.max_requests) for _ in range(clients)]
            good = [f.result(args.seconds + 300) for f in goods]
            wall = time.monotonic() - start
            bad = bads.result(args.seconds + 300) if bads else []
        cpu = sampler.cpu_seconds() - cpu0
        info = httpx.get(url + "/info", timeout=60).json()
        sampler.stop.set()
        sampler.thread.join(5)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    lat = np.array([x for g in good for x in g["latencies"]]) * 1e3
    statuses: dict[str, int] = {}
    for counts in bad:
        for key, n in counts.items():
            statuses[key] = statuses.get(key, 0) + n
    return {"clients": clients, "hostile_clients": hostile, "seconds": round(wall, 2), "answered": int(lat.size),
            "answers_per_s": round(lat.size / wall, 2),
            "p50_ms": round(float(np.percentile(lat, 50)), 1) if lat.size else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 1) if lat.size else None,
            "good_refused_429": sum(g["refused"] for g in good), "good_other_errors": sum(g["other"] for g in good),
            "hostile_statuses": statuses, "server_cpu_s": round(cpu, 2),
            "server_cpu_ms_per_answer": round(cpu / lat.size * 1e3, 1) if lat.size else None,
            "rss_idle_mib": round(idle / 2**20, 1),
            "rss_peak_mib": round(sampler.peak / 2**20, 1), "mean_batch": info["batcher"]["mean_batch"],
            "budget": info["batcher"]["budget"], "limits": info["limits"]}


def oversized_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (9219, 9219), 1).save(buf, format="PNG")  # 85 M pixels, decoded 255 MB as RGB
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="32,64")
    parser.add_argument("--hostile", type=int, default=8, help="hostile clients in the hostile mix")
    parser.add_argument("--hostile-rate", type=float, default=10.0,
                        help="abuses a second per hostile client (0: unpaced, a flood)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-requests", type=int, default=10_000, help="per good client")
    parser.add_argument("--max-pixels", type=int, default=1 << 25)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--body-timeout", type=float, default=5.0)
    parser.add_argument("--server-threads", type=int, default=1,
                        help="the server's intra-op threads (OMP_NUM_THREADS; on a shared 2-core machine two spin)")
    parser.add_argument("--repeat", type=int, default=1, help="clean/hostile pairs per client count (medians)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import torch

    import libreyolo

    body, big = SHAPES.read_bytes(), oversized_png()
    rows = []
    for n in (int(c) for c in args.clients.split(",")):
        for hostile in [0, args.hostile] * args.repeat:  # alternated: the machine's load drifts
            rows.append(run(args, n, hostile, body, big))
            r = rows[-1]
            print(f"clients {n:3d} hostile {hostile:2d}: {r['answers_per_s']:7.2f} answers/s, p50 {r['p50_ms']} ms, "
                  f"p99 {r['p99_ms']} ms, 429 {r['good_refused_429']}, RSS idle {r['rss_idle_mib']} MiB peak "
                  f"{r['rss_peak_mib']} MiB, hostile {r['hostile_statuses']}", flush=True)
    image_budget_mib = 2 * 3 * args.max_pixels / 2**20
    targets = []
    print(f"\n{'clients':>7} {'clean/s':>8} {'hostile/s':>9} {'kept':>6} {'p99 clean':>9} {'p99 hostile':>11} "
          f"{'cpu ms/ans clean':>16} {'hostile':>7} {'peak hostile':>12} {'budget':>8}  met")
    for n in sorted({r["clients"] for r in rows}):
        clean = [r for r in rows if r["clients"] == n and not r["hostile_clients"]]
        mixed = [r for r in rows if r["clients"] == n and r["hostile_clients"]]

        def med(runs: list[dict], key: str) -> float:
            return statistics.median(r[key] for r in runs)

        kept = med(mixed, "answers_per_s") / med(clean, "answers_per_s")
        budget = max(r["rss_peak_mib"] for r in clean) + image_budget_mib
        peak = max(r["rss_peak_mib"] for r in mixed)
        t = {"clients": n, "runs_each": len(clean), "median_answers_per_s_clean": med(clean, "answers_per_s"),
             "median_answers_per_s_hostile": med(mixed, "answers_per_s"), "throughput_kept": round(kept, 3),
             "median_p99_ms_clean": med(clean, "p99_ms"), "median_p99_ms_hostile": med(mixed, "p99_ms"),
             "server_cpu_ms_per_answer_clean": med(clean, "server_cpu_ms_per_answer"),
             "server_cpu_ms_per_answer_hostile": med(mixed, "server_cpu_ms_per_answer"),
             "rss_budget_mib": round(budget, 1), "rss_peak_hostile_mib": peak,
             "met": kept >= 0.8 and peak <= budget}
        targets.append(t)
        print(f"{n:>7} {t['median_answers_per_s_clean']:>8.2f} {t['median_answers_per_s_hostile']:>9.2f} {kept:>6.1%} "
              f"{t['median_p99_ms_clean']:>9} {t['median_p99_ms_hostile']:>11} "
              f"{t['server_cpu_ms_per_answer_clean']:>16} {t['server_cpu_ms_per_answer_hostile']:>7} {peak:>12} "
              f"{budget:>8.0f}  {'yes' if t['met'] else 'NO'}")
    report = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "load_avg_at_start": os.getloadavg(), "note": "a shared CPU machine: other jobs ran"},
              "versions": {"libreyolo": libreyolo.__version__, "torch": torch.__version__,
                           "python": platform.python_version()},
              "command": " ".join(["python", *sys.argv]), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "settings": vars(args), "image_budget_mib": image_budget_mib, "runs": rows, "targets": targets}
    if args.json:
        write_json(args.json, report)
    return 0 if all(t["met"] for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
