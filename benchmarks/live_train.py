"""Chapter 15's "Train" panel in headless Chromium against the same run in PyTorch.

For each seed: the panel is opened from a ``file://`` page, Start pressed, and the clock runs
until its status line names the phase change (the wall time a reader waits, drawing included);
meanwhile the page's answer time is sampled (training runs in slices that yield). Then the
console API's ``trainRun`` (no drawing, the whole run) gives steps per second and the first
copy's loss, and :func:`mhbook.training.live_copier.live_copier_run` the phase
change and the first copy's loss of the same run in PyTorch (one thread). Last, the 1-layer
control, in the page and in PyTorch: a whole run of ``LIVE_COPIER_TRAIN.num_steps`` steps,
with no phase change expected. Prints one line per run, and a screenshot of the panel at its
phase change goes to ``_build/screenshots/``. The results, with the command, commit, machine,
Chromium and date that made them, go to
``benchmarks/live_train.json`` (``--out``).

    python -m benchmarks.live_train            # seeds 0 1 2, about 3 minutes on 2 cores
    python -m benchmarks.live_train --seeds 0
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import mhbook
from mhbook.training.live_copier import LIVE_COPIER_TRAIN, live_copier_run
from mhbook.viz.explorers.live_train import live_train_html

from .llama_ablations import _commit, _machine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from browser import launch_chromium  # noqa: E402


def _first_copy(run: dict) -> dict:
    """The first copy's loss (nats) at step 0, at the phase change, 50 steps after it, its
    lowest and highest, and at the last step: chapter 15 says it never goes below ln 32, rises
    around the change to about 4.3 and eases back to 3.8 or 3.9."""
    at = {look["step"]: look["first"] for look in run["looks"]}
    found = {"start": at[0], "change": at[run["change"]], "after_50": at[run["change"] + 50]}
    found |= {"lowest": min(at.values()), "highest": max(at.values()), "last": at[max(at)]}
    return {name: round(value, 3) for name, value in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("live_train.json"))
    args = parser.parse_args()
    runs = []
    print(mhbook.describe_machine())
    folder = Path(tempfile.mkdtemp())
    page = folder / "page.html"
    page.write_text(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Train</title></head>"
        f"<body><main>{live_train_html().data}</main></body></html>",
        encoding="utf-8",
    )
    shots = Path("_build/screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    browser_gen = launch_chromium()
    browser = next(browser_gen)
    tab = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    tab.set_default_timeout(300_000)
    tab.goto(page.as_uri())
    panel = tab.locator("div.mhbook-explorer")
    status = panel.locator(".mhbook-live-status")
    for seed in args.seeds:
        panel.locator("summary").click() if seed == args.seeds[0] else None
        panel.locator(".mhbook-live-train-seed").fill(str(seed))
        panel.locator(".mhbook-live-train-seed").dispatch_event("change")
        begun = time.perf_counter()
        panel.locator(".mhbook-live-train-start").click()
        answers = []
        while "phase change came" not in (text := status.text_content()):
            t = time.perf_counter()
            tab.evaluate("() => 1")
            answers.append(time.perf_counter() - t)
            time.sleep(0.1)
        wall = time.perf_counter() - begun
        panel.locator(".mhbook-live-train-start").click()  # Pause
        change = int(re.search(r"phase change came at step (\d+)", text).group(1))
        if seed == args.seeds[0]:
            panel.screenshot(path=str(shots / "live-train-trained.png"))
        api = tab.evaluate(f"() => window.mhbookLive.trainRun({{seed: {seed}}})")  # 1,500 steps
        begun = time.perf_counter()
        ours = live_copier_run(seed, every=10)
        torch_seconds = time.perf_counter() - begun
        print(
            f"seed {seed}: panel phase change at step {change} after {wall:.1f} s of wall time "
            f"(slowest answer of the page while training {1000 * max(answers):.0f} ms); "
            f"trainRun {api['stepsPerSecond']:.0f} steps/s, change at {api['change']}; "
            f"PyTorch change at {ours['change']} ({len(ours['losses']) / torch_seconds:.0f} "
            f"steps/s, one thread, looks included); the first copy's loss (nats): page "
            f"{_first_copy(api)}, PyTorch {_first_copy(ours)}",
            flush=True,
        )
        runs.append({
            "seed": seed, "page_change": change, "page_wall_s": round(wall, 1),
            "slowest_answer_ms": round(1000 * max(answers)),
            "trainRun_steps_per_s": round(api["stepsPerSecond"], 1),
            "trainRun_change": api["change"], "pytorch_change": ours["change"],
            "pytorch_steps_per_s": round(len(ours["losses"]) / torch_seconds, 1),
            "page_first_copy": _first_copy(api), "pytorch_first_copy": _first_copy(ours),
        })  # fmt: skip
    one = tab.evaluate("() => window.mhbookLive.trainRun({seed: 0, layers: 1})")
    ours = live_copier_run(0, num_layers=1, every=10)
    print(
        f"1 layer, seed 0, {LIVE_COPIER_TRAIN.num_steps} steps: page change {one['change']}, "
        f"second copy at the end {one['looks'][-1]['second']:.2f} nats "
        f"({one['stepsPerSecond']:.0f} steps/s); PyTorch change {ours['change']}, "
        f"{ours['looks'][-1]['second']:.2f} nats"
    )
    result = {
        "command": " ".join(["python -m benchmarks.live_train", *sys.argv[1:]]),
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "machine": _machine(),
        "chromium": browser.version,
        "runs": runs,
        "one_layer": {
            "steps": LIVE_COPIER_TRAIN.num_steps,
            "page_change": one["change"],
            "page_second_copy": round(one["looks"][-1]["second"], 3),
            "pytorch_change": ours["change"],
            "pytorch_second_copy": round(ours["looks"][-1]["second"], 3),
        },  # fmt: skip
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    browser_gen.close()


if __name__ == "__main__":
    main()
