"""Hostile pages in the renderer: how each is cut, how long it took, the renderer's peak RSS.

Renders three pages that never settle (an endless DOM, an endless loop, an endless heap) with
the default ``RenderSettings`` but a 10 s deadline, sampling the RSS of Chromium's renderer
processes every 50 ms from ``/proc``. Needs the ``render`` extra and a Chromium. No network:
the pages make no request. Run from the checkout::

    python benchmarks/render_hostile.py
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from idemcrawl.fetch import FetchResult
from idemcrawl.render import Renderer, RenderSettings

HOSTILE = {
    "endless-dom": "const b = document.body; for (let i = 0; ; i++) { const d = "
    "document.createElement('div'); d.textContent = 'x'.repeat(200) + i; b.append(d); }",
    "endless-loop": "while (true) {}",
    "endless-heap": "const a = []; while (true) { a.push(new Array(1e6).fill(1.5)); }",
}


def renderer_rss_mb() -> list[int]:
    """RSS of every Chromium renderer process on the machine, MB."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            if b"chrom" not in cmd or b"--type=renderer" not in cmd:
                continue
            with open(f"/proc/{pid}/status") as f:
                out += [int(ln.split()[1]) // 1024 for ln in f if ln.startswith("VmRSS:")]
        except OSError:
            continue
    return out


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.peak = max([self.peak, *renderer_rss_mb()])


async def main() -> None:
    sampler = Sampler()
    sampler.start()

    async def no_fetch(*_: Any) -> FetchResult:
        raise AssertionError("the hostile pages make no request")

    async with Renderer(RenderSettings(timeout=10)) as renderer:
        for name, script in HOSTILE.items():
            sampler.peak = 0
            html = f"<html><body><script>{script}</script></body></html>".encode()
            page = FetchResult("http://127.0.0.1:9/h", 200, {"content-type": "text/html"}, html, 0)
            t0 = time.monotonic()
            res = await renderer.render(page, no_fetch)
            took = time.monotonic() - t0
            print(f"{name}: cut {res.cut_reason!r} after {took:.1f} s, peak {sampler.peak} MB")
    sampler.done.set()


if __name__ == "__main__":
    asyncio.run(main())
