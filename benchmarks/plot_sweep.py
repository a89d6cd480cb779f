"""Draw budget sweeps: (step ms, peak GiB) of dsgraph's memory budgets next to Inductor's
activation_memory_budget points, hand-written checkpointing and the stock compile.

    python -m benchmarks.plot_sweep docs/results/<sweep>.json --out docs/budget_sweep.png

Reads the JSON of ``benchmarks.run`` (one or more files). One panel per model family:
``gpt2`` and ``gpt2_ckpt`` (hand-written per-block checkpointing) share a panel, as do
``hf_gpt2`` and ``hf_gpt2_gc`` (the model's gradient_checkpointing_enable()).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

GIB = 1 << 30
FAMILY = {"gpt2_ckpt": "gpt2", "hf_gpt2_gc": "hf_gpt2"}


def series(records):
    """family -> label -> [(peak GiB, step ms, config)] sorted by peak."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        if "error" in r or r.get("regime", "none") != "none" or "peak_allocated_bytes" not in r or r.get("fallback"):
            continue
        family = FAMILY.get(r["workload"], r["workload"])
        config = r["config"]
        if r["workload"] in FAMILY:
            label = "hand-written checkpointing" if family == "gpt2" else "gradient_checkpointing_enable()"
            label += f" ({config.split(':')[0]})"
        elif config.startswith("dsgraph") and "memory_budget" in config:
            label = "dsgraph memory_budget"
        elif config.startswith("inductor:budget"):
            label = "inductor activation_memory_budget"
        else:
            label = config
        out[family][label].append((r["peak_allocated_bytes"] / GIB, r["step_ms"], config))
    for family in out.values():
        for points in family.values():
            points.sort()
    return out


def plot(records, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(records)
    fig, axes = plt.subplots(1, len(data), figsize=(6.5 * len(data), 4.8), squeeze=False)
    for ax, (family, lines) in zip(axes[0], sorted(data.items())):
        for label, points in sorted(lines.items()):
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            style = "-o" if len(points) > 1 else "s"
            ax.plot(xs, ys, style, label=label)
        ax.set_title(family)
        ax.set_xlabel("peak allocated GiB (grads set to None)")
        ax.set_ylabel("step ms")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    records = []
    for path in args.json:
        with open(path) as f:
            records += json.load(f)["records"]
    plot(records, args.out)
    for family, lines in sorted(series(records).items()):
        print(f"## {family}")
        for label, points in sorted(lines.items()):
            print(f"{label}: " + ", ".join(f"{peak:.2f} GiB / {ms:.1f} ms" for peak, ms, _ in points))


if __name__ == "__main__":
    main()
