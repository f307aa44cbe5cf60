"""Issue 18, item 14: main-thread long tasks of a CNN's createModel, predict and fit, measured with
a PerformanceObserver for 'longtask' while two busy workers burn the page's CPU (on this project's
2-core machine the browser's GPU process then competes with them)."""
from __future__ import annotations

import pytest
import torch

from helpers import build_module
from models import blocked_cnn

BURNER = "onmessage = () => { for (;;) { Math.sqrt(Math.random()); } };"

# The bound the README states for tasks of the runtime under this load (its Speed section). Measured
# on 2 cores shared with other browser tests, five runs: worst tasks of 363, 91, 68, 241 and 81 ms,
# and none at all in one run. A task of the runtime is a few to 12 ms of work (fit yields every
# 12 ms, createModel compiles a few programs a task); under load the OS deschedules the main thread
# and the GPU process it waits on, and a long task's duration is wall time. The bound leaves room
# for that, and still fails a task that does a second of work in one go.
LONG_TASK_BOUND_MS = 1000


def test_long_tasks_of_a_cnn_under_load(web, site):
    torch.manual_seed(0)
    url = build_module(site, "longtask_cnn", blocked_cnn(), (1, 12, 12), max_batch=32)
    folder = site.add_files("longtask_burner", {"burn.js": BURNER})
    got = web.evaluate("""async (args) => {
        const tasks = [];
        let phase = 'idle';
        new PerformanceObserver((list) => { for (const e of list.getEntries()) tasks.push([phase, e.duration]); })
          .observe({ type: 'longtask', buffered: false });
        const burners = [0, 1].map(() => new Worker(args.burner));
        burners.forEach((w) => w.postMessage(0));
        const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
        await sleep(200);
        const mod = await import(args.url);
        phase = 'createModel';
        const m = await mod.createModel();
        phase = 'predict';
        const x = Float32Array.from({ length: 32 * 144 }, (_, i) => Math.sin(i));
        for (let i = 0; i < 5; i++) await m.predict(x, 32);
        phase = 'fit';
        const y = Int32Array.from({ length: 32 * 10 }, (_, i) => i % 10);
        const xs = Float32Array.from({ length: 32 * 10 * 144 }, (_, i) => Math.cos(i));
        await m.fit(xs, y, { batchSize: 32, epochs: 3 });
        phase = 'after';
        await sleep(100);
        burners.forEach((w) => w.terminate());
        m.dispose();
        return tasks;
    }""", {"url": url, "burner": folder + "/burn.js"})
    by_phase: dict[str, list[float]] = {}
    for phase, d in got:
        by_phase.setdefault(phase, []).append(d)
    print("[long tasks under load, ms]", {k: sorted(round(d) for d in v)[-5:] for k, v in by_phase.items()})
    worst = max((d for p, d in got if p in ("createModel", "predict", "fit")), default=0)
    assert worst <= LONG_TASK_BOUND_MS, f"a task of {worst:.0f} ms: {by_phase}"
