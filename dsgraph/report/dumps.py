"""Pass-by-pass dumps: one folder per compiled graph, one numbered Python file per pass.

Layout (DESIGN.md)::

    dir/index.md                      pipeline, versions, per graph per pass: ms, stats
    dir/c000_joint/00_input.py        the joint graph, then partition.md (what is saved)
    dir/c000_forward/00_input.py      readable Python that parses: shapes, dtypes, live bytes
    dir/c000_forward/01_lifetimes.py  one file per pass; header: pass, ms, stats
    dir/c000_forward/repro.py         runs the final graph on random inputs
    dir/c000_forward/memory_timeline.csv

Names are deterministic: compile ids count up from c000 in each process and nothing
written inside a file depends on ids or clocks except the measured pass times.
"""

from __future__ import annotations

import collections
import csv
import json
import logging
import os
import platform
import re
import shutil
import threading
from typing import Sequence

import torch
from torch.fx import GraphModule, Node

from .. import compat
from ..analysis.lifetimes import TensorLifetimes, default_held
from ..analysis.step import graph_inputs_external, stage_timelines
from ..units import format_bytes
from ..version import __version__
from . import plots
from .reports import MAX_REPORTS, GraphReport, format_table

log = logging.getLogger("dsgraph")
_lock = threading.Lock()
_prepared: set[str] = set()  # dump dirs cleaned of stale graph folders in this process
# reports listed in each dump dir's index.md: the last MAX_REPORTS graphs of this process
_dir_reports: dict[str, collections.deque[GraphReport]] = {}
_GRAPH_DIR_RE = re.compile(r"^c\d{3,}_(joint|forward|backward|inference)$")
_STEP_FILE_RE = re.compile(r"^c\d{3,}_step_memory_\w+\.(csv|png)$")


def prepare_dir(root: str) -> None:
    """First use of a dump dir in this process: drop graph folders of an earlier run.

    Only folders dsgraph names (c000_forward, ...) and index.md are removed, so pointing
    dumps at a folder that holds other files never deletes them.
    """
    root = os.path.abspath(root)
    with _lock:
        if root in _prepared:
            return
        _prepared.add(root)
        os.makedirs(root, exist_ok=True)
        for entry in os.listdir(root):
            path = os.path.join(root, entry)
            if _GRAPH_DIR_RE.match(entry) and os.path.isdir(path):
                shutil.rmtree(path)
            elif _STEP_FILE_RE.match(entry) or entry in ("index.md", "reports.json", "NOTES.md"):
                os.remove(path)


def _annotation(lifetimes: TensorLifetimes | None, node: Node) -> str | None:
    if lifetimes is None or node not in lifetimes.index:
        return None
    own = lifetimes.node_bytes(node)
    live = lifetimes.live_at(node)
    alloc = lifetimes.allocated_by(node)
    parts = [format_bytes(own)]
    if alloc == 0 and own and node.op == "call_function":
        parts.append("no alloc")
    parts.append(f"live {format_bytes(live)}")
    return " | ".join(parts)


def readable_code(gm: GraphModule, stage: str, header: Sequence[str] = ()) -> str:
    """The graph as Python that parses: typed signature, one line per node, live bytes."""
    try:
        lifetimes = TensorLifetimes(gm, default_held(stage))
    except Exception as e:  # never let a dump annotation break a compile
        lifetimes = None
        header = list(header) + [f"(live bytes unavailable: {type(e).__name__}: {e})"]
    body = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    by_name = {n.name: n for n in gm.graph.nodes}
    out = []
    for line in body.splitlines():
        m = re.match(r"^\s+(\w+)(?::\s*\"[^\"]*\")?\s*=\s", line)
        note = _annotation(lifetimes, by_name[m.group(1)]) if m and m.group(1) in by_name else None
        out.append(f"{line}  # {note}" if note else line)
    lines = [f"# {h}" for h in header]
    if lifetimes is not None:
        peak, node = lifetimes.peak()
        lines.append(f"# peak live {format_bytes(peak)} at {node.name if node else '-'} "
                     f"({len(lifetimes.nodes)} nodes, FX execution order)")
    lines += ["import torch", "from torch import device, inf, nan  # noqa: F401", "", ""]
    return "\n".join(lines + out) + "\n"


class GraphDump:
    """Writes the files of one graph's folder."""

    def __init__(self, root: str, graph_name: str, stage: str):
        self.root = os.path.abspath(root)
        self.stage = stage
        self.dir = os.path.join(self.root, graph_name)
        os.makedirs(self.dir, exist_ok=True)

    def graph(self, step: int, label: str, gm: GraphModule, header: Sequence[str]) -> str:
        path = os.path.join(self.dir, f"{step:02d}_{label}.py")
        with open(path, "w") as f:
            f.write(readable_code(gm, self.stage, header))
        return path

    def text(self, name: str, text: str) -> None:
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def timeline_csv(self, gm: GraphModule, name: str = "memory_timeline.csv") -> None:
        lifetimes = TensorLifetimes(gm, default_held(self.stage))
        with open(os.path.join(self.dir, name), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["index", "node", "op", "target", "bytes", "allocated_bytes", "live_bytes"])
            for i, node in enumerate(lifetimes.nodes):
                w.writerow([i, node.name, node.op, _target_name(node), lifetimes.node_bytes(node),
                            lifetimes.allocated_by(node), lifetimes.live[i]])

    def repro(self, gm: GraphModule) -> None:
        """repro.py: the final graph plus random inputs of the recorded shapes."""
        specs = []
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                specs.append((node.name, "tensor", [compat.size_hint(s) for s in val.shape],
                              [compat.size_hint(s) for s in val.stride()], str(val.dtype), val.device.type))
            elif isinstance(val, (int, torch.SymInt)):
                specs.append((node.name, "int", compat.size_hint(val), None, None, None))
            else:
                specs.append((node.name, "none", None, None, None, None))
        constants = {}
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(gm, str(node.target), None)
                if isinstance(value, torch.Tensor):
                    constants[str(node.target)] = value.detach().cpu()
        if constants:
            torch.save(constants, os.path.join(self.dir, "constants.pt"))
        code = readable_code(gm, self.stage, ["repro: runs this graph on random inputs of the recorded shapes"])
        code = code.replace("import torch\n", "import os\nimport torch\nimport torch._inductor.inductor_prims  # noqa: F401  (ops Inductor's passes insert)\n"
                            "import dsgraph.runtime.ops  # noqa: F401  (ops dsgraph's passes insert)\n"
                            "import dsgraph.runtime.linear_cross_entropy  # noqa: F401  (chunk_loss's ops)\n", 1)
        main = _REPRO_MAIN.format(specs=_pformat(specs))
        with open(os.path.join(self.dir, "repro.py"), "w") as f:
            f.write(code + main)


def _pformat(specs: list) -> str:
    return "[\n" + "".join(f"    {s!r},\n" for s in specs) + "]"


_REPRO_MAIN = '''

INPUTS = {specs}


def make_input(name, kind, shape, stride, dtype, device):
    if kind == "int":
        return shape
    if kind == "none":
        return None
    if device == "cuda" and not torch.cuda.is_available():
        device = "cpu"
    dtype = getattr(torch, dtype.replace("torch.", ""))
    t = torch.empty_strided(shape, stride, dtype=dtype, device=device)
    if dtype.is_floating_point or dtype.is_complex:
        t.normal_()
    elif dtype == torch.bool:
        t.copy_(torch.rand(t.shape, device=device) < 0.5)
    else:
        t.random_(0, 2)  # indices stay in range of any dimension
    return t


def main():
    torch.manual_seed(0)
    module = GraphModule()
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(here, "constants.pt")):
        for name, value in torch.load(os.path.join(here, "constants.pt")).items():
            setattr(module, name, value)
    with torch.no_grad():
        outputs = module.forward(*[make_input(*spec) for spec in INPUTS])
    for i, out in enumerate(outputs if isinstance(outputs, (tuple, list)) else [outputs]):
        if isinstance(out, torch.Tensor):
            print(i, tuple(out.shape), out.dtype, float(out.float().abs().sum()))
        else:
            print(i, out)


if __name__ == "__main__":
    main()
'''


_noted: set[tuple[str, str]] = set()


def _note_once(root: str, message: str) -> None:
    """Say once per dump dir why something the README lists is not in it."""
    key = (os.path.abspath(root), message)
    with _lock:
        if key in _noted:
            return
        _noted.add(key)
    log.warning("dsgraph dump %s: %s", root, message)
    with open(os.path.join(os.path.abspath(root), "NOTES.md"), "a") as f:
        f.write(f"- {message}\n")


def _target_name(node: Node) -> str:
    t = node.target
    return getattr(t, "__name__", None) or str(t) if not isinstance(t, str) else t


def add_report(root: str, report: GraphReport, pipeline: str) -> None:
    """Record a graph's report for this dump dir and rewrite index.md."""
    root = os.path.abspath(root)
    with _lock:
        items = _dir_reports.setdefault(root, collections.deque(maxlen=MAX_REPORTS))
        items.append(report)
        items = list(items)
    lines = ["# dsgraph dump", ""]
    lines.append(f"- torch {torch.__version__}, python {platform.python_version()}")
    lines.append(f"- dsgraph {__version__}")
    lines.append(f"- pipeline: `{pipeline}`")
    lines.append("")
    lines.append(format_table(items, markdown=True))
    lines.append("")
    with open(os.path.join(root, "index.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(root, "reports.json"), "w") as f:
        json.dump({"pipeline": pipeline, "reports": [r.to_dict() for r in items]}, f, indent=1, default=str)


def remove_graph_dirs(root: str, compile_id: str) -> None:
    """Forget a compile's folders (a failed attempt, before its stock fallback is dumped)."""
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        return
    for entry in os.listdir(root):
        if entry.startswith(compile_id + "_") and _GRAPH_DIR_RE.match(entry):
            shutil.rmtree(os.path.join(root, entry))
        elif entry.startswith(compile_id + "_") and _STEP_FILE_RE.match(entry):
            os.remove(os.path.join(root, entry))


def step_memory(root: str, compile_id: str, stages: dict, saved_names: list[str]) -> None:
    """The whole step's live bytes before and after the pipeline (FX execution), and as
    Inductor schedules it when it compiled: CSVs, and a PNG when matplotlib is installed."""
    external = graph_inputs_external(stages)
    series = {}
    for which in ("before", "after"):
        for prediction, timeline in stage_timelines(stages, saved_names, external, which).items():
            # "inductor" exists only after the pipeline (Inductor compiled those graphs)
            suffix = "" if prediction == "inductor" else f"_{which}"
            name = f"{compile_id}_step_memory_{prediction}{suffix}"
            path = os.path.join(os.path.abspath(root), name + ".csv")
            plots.write_step_csv(timeline, path)
            series[step_series_label(prediction + suffix)] = plots.read_step_csv(path)
    png = os.path.join(os.path.abspath(root), f"{compile_id}_step_memory_plot.png")
    if not plots.plot_step(series, png, f"{compile_id}: live bytes over the step (graph inputs counted as held)"):
        _note_once(root, "matplotlib is not installed: the dump has the step's memory as CSV files but no PNG "
                   "plots (pip install matplotlib, then `dsgraph report <dir>` draws them)")


# what each whole-step CSV holds, as the plot's legend says it
_SERIES_LABELS = {
    "fx_before": "FX execution, before the pipeline",
    "fx_after": "FX execution, after the pipeline",
    "fused_before": "Inductor predicted from FX (fused_plan), before",
    "fused_after": "Inductor predicted from FX (fused_plan), after",
    "inductor": "Inductor's own schedule (compiled)",
}


def step_series_label(key: str) -> str:
    """The legend label of a step-memory series, from its file name's key (``fx_after``)."""
    return _SERIES_LABELS.get(key, key.replace("_", " "))
