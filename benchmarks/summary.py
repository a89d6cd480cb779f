"""One line per measured run of the JSON files a device call wrote (``$OUT/<prefix>*.json``).

    python -m benchmarks.summary "$OUT" s14_

Prints model, role, config, median step ms with the range, absolute peak, first step and
the checkpoint pass's predictions and the loss choice, so a call's log holds its figures
even when a file does not come back.
"""

from __future__ import annotations

import glob
import json
import os
import sys


def _range(steps) -> str | None:
    return f"{min(steps):.3f}-{max(steps):.3f}" if steps else None


def _loss(joint) -> dict:
    """The loss choice (passes/loss_choice.py) of a chunk_loss="faster" run."""
    keys = ("chunked", "choice_compiles", "unchunked_recompute_ms", "chunked_recompute_ms")
    return {k: joint["loss_" + k] for k in keys if "loss_" + k in joint}


def main(argv: list[str]) -> None:
    out, prefix = argv[0], argv[1] if len(argv) > 1 else ""
    for path in sorted(glob.glob(os.path.join(out, prefix + "*.json"))):
        try:
            records = json.load(open(path))["records"]
        except (OSError, ValueError, KeyError) as e:
            print(path, "unreadable", e)
            continue
        for r in records:
            joint = ((r.get("dsgraph") or {}).get("joint") or {}).get("memory") or {}
            keys = ("predicted_peak", "inductor_peak", "recompute_ms", "recomputed_segments", "analysis_s")
            print(os.path.basename(path), r.get("model", r.get("workload")), r.get("role", ""), r["config"][:40],
                  "ms", r.get("step_ms"), "range", _range(r.get("step_ms_all")),
                  "peak", r.get("peak_allocated_bytes"), "first", r.get("first_step_s"),
                  {k: joint.get("checkpoint_" + k) for k in keys}, _loss(joint), (r.get("error") or "")[-300:])


if __name__ == "__main__":
    main(sys.argv[1:])
