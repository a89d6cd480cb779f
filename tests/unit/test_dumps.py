"""Dumps through torch.compile with inductor=False (fast): layout, parseable files,
deterministic names, a repro that runs."""

import ast
import os
import re
import subprocess
import sys

import torch

from models import MLP


def compile_and_step(dump_dir=None, env_dump=None, monkeypatch=None, **options):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MLP()
    if dump_dir:
        options["dump_dir"] = str(dump_dir)
    compiled = torch.compile(model, backend="dsgraph", options={"inductor": False, **options})
    compiled(torch.randn(6, 13)).sum().backward()


def files(root):
    out = []
    for dirpath, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in names]
    return sorted(out)


def renumber(tmp_path):
    """Compile ids count per process; tests see the first compile of their dump as c000."""
    ids = sorted({n.split("_")[0] for n in os.listdir(tmp_path) if re.match(r"c\d{3}_", n)})
    for n in os.listdir(tmp_path):
        if re.match(r"c\d{3}_", n):
            os.rename(tmp_path / n, tmp_path / (f"c{ids.index(n.split('_')[0]):03d}_" + n.split("_", 1)[1]))


def test_layout_and_contents(tmp_path):
    compile_and_step(tmp_path)
    renumber(tmp_path)
    listing = files(tmp_path)
    for expected in [
        "index.md",
        "c000_joint/00_input.py", "c000_joint/partition.md", "c000_joint/memory_timeline.csv",
        "c000_forward/00_input.py", "c000_forward/01_lifetimes.py", "c000_forward/repro.py",
        "c000_forward/memory_timeline.csv",
        "c000_backward/00_input.py", "c000_backward/01_lifetimes.py", "c000_backward/repro.py",
    ]:
        assert expected in listing, (expected, listing)
    for name in listing:
        if name.endswith(".py"):
            ast.parse((tmp_path / name).read_text())  # every dumped graph is Python that parses
    after = (tmp_path / "c000_forward/01_lifetimes.py").read_text()
    assert re.search(r"^# pass: lifetimes  ms: [\d.]+  changed: False$", after, re.M)
    size = r"[\d.]+ (?:B|KiB|MiB|GiB)"  # byte counts print with units (issue 17)
    assert re.search(rf"^# stats: nodes=\d+, peak_bytes={size}, peak_node=\w+, saved_bytes={size}$", after, re.M)
    assert re.search(r'addmm: "f32\[6, 37\]\[37, 1\]cpu" = .*# 888 B \| live [\d.]+ (KiB|B)', after)
    index = (tmp_path / "index.md").read_text()
    assert "pipeline: `lifetimes`" in index and re.search(r"\| c\d{3}_backward \| lifetimes \|", index)
    assert "torch " + torch.__version__ in index
    partition = (tmp_path / "c000_joint/partition.md").read_text()
    assert "saved for backward" in partition and "| addmm |" in partition
    csv_lines = (tmp_path / "c000_backward/memory_timeline.csv").read_text().splitlines()
    assert csv_lines[0] == "index,node,op,target,bytes,allocated_bytes,live_bytes"
    assert len(csv_lines) > 10


def strip_times(text):
    return re.sub(r"ms: [\d.]+|\| [\d.]+ \|", "<ms>", text)


def test_two_dumps_diff_cleanly(tmp_path):
    compile_and_step(tmp_path / "a")
    compile_and_step(tmp_path / "b")
    a, b = files(tmp_path / "a"), files(tmp_path / "b")
    # each run counts compiles from where the process is: compare after renumbering
    renum = lambda names: sorted(re.sub(r"^c\d{3}", "cXXX", n) for n in names)
    assert renum(a) == renum(b)
    for name in a:
        if name.endswith((".py", ".md", ".csv")):
            other = re.sub(r"^c\d{3}", lambda m: [x for x in b if x.endswith(name[4:])][0][:4], name)
            ta = strip_times((tmp_path / "a" / name).read_text())
            tb = strip_times((tmp_path / "b" / other).read_text())
            assert re.sub(r"c\d{3}", "cXXX", ta) == re.sub(r"c\d{3}", "cXXX", tb), name


def test_repro_runs(tmp_path):
    compile_and_step(tmp_path)
    renumber(tmp_path)
    for stage in ("forward", "backward"):
        result = subprocess.run([sys.executable, str(tmp_path / f"c000_{stage}" / "repro.py")],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert re.search(r"^0 \(\d+, \d+\) torch.float32 [\d.]+", result.stdout, re.M), result.stdout


def test_env_var_and_stale_folders(tmp_path, monkeypatch):
    # a name this process does not write: compile ids count every compile of the process,
    # and with nine dsgraph compiles before it in one pytest run (the zoo's e2e files ahead
    # of tests/unit) "c009_forward" was this test's own forward graph
    (tmp_path / "c999_forward").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.setenv("DSGRAPH_DUMP", str(tmp_path))
    compile_and_step()
    listing = files(tmp_path)
    assert "notes.txt" in listing  # files dsgraph did not write stay
    assert not (tmp_path / "c999_forward").exists()  # folders of an earlier run go
    assert any(n.startswith("c") and n.endswith("forward/01_lifetimes.py") for n in listing)


def test_step_memory_files_and_report_cli(tmp_path):
    compile_and_step(tmp_path, pipeline="lifetimes,reorder_for_memory")
    names = os.listdir(tmp_path)
    before = [n for n in names if n.endswith("_step_memory_fx_before.csv")]
    after = [n for n in names if n.endswith("_step_memory_fx_after.csv")]
    assert len(before) == len(after) == 1
    rows = (tmp_path / after[0]).read_text().splitlines()
    assert rows[0] == "index,graph,node,live_bytes"
    assert rows[1].startswith("0,start,start,") and rows[-1].split(",")[1] == "end"
    assert {r.split(",")[1] for r in rows[1:]} == {"start", "forward", "backward", "end"}
    result = subprocess.run([sys.executable, "-m", "dsgraph", "report", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "reorder_for_memory" in result.stdout and "lifetimes" in result.stdout
    pngs = [line.strip() for line in result.stdout.splitlines() if line.strip().endswith(".png")]
    assert any(p.endswith("_step_memory_plot.png") for p in pngs)
    assert any(p.endswith("backward/memory_timeline.png") for p in pngs)
    for p in pngs:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_cli_on_a_folder_that_is_not_a_dump(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dsgraph", "report", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "not a dsgraph dump folder" in (result.stderr + result.stdout)


def _series(path):
    return [int(r.split(",")[3]) for r in path.read_text().splitlines()[1:]]


def test_step_memory_files_are_named_by_what_they_predict(tmp_path):
    """Each whole-step CSV holds the prediction its name says: with FX execution there is no
    Inductor schedule, and the fused prediction is written as "fused" (it used to be written
    as "inductor"), computed from the same graphs as the FX one."""
    from dsgraph.report.capture import capture as capture_compiles
    from dsgraph.analysis.step import graph_inputs_external, stage_timelines

    with capture_compiles() as cap:
        compile_and_step(tmp_path, pipeline="lifetimes,reorder_for_memory")
    renumber(tmp_path)
    names = sorted(n for n in os.listdir(tmp_path) if "_step_memory_" in n and n.endswith(".csv"))
    assert names == [f"c000_step_memory_{k}.csv" for k in ("fused_after", "fused_before", "fx_after", "fx_before")]
    stages, saved = cap.compiles[0].stages, cap.compiles[0].saved_names
    for which in ("before", "after"):
        expected = stage_timelines(stages, saved, graph_inputs_external(stages), which)
        for prediction in ("fx", "fused"):
            got = _series(tmp_path / f"c000_step_memory_{prediction}_{which}.csv")
            assert got == expected[prediction].live, (prediction, which)
    assert _series(tmp_path / "c000_step_memory_fused_after.csv") != _series(tmp_path / "c000_step_memory_fx_after.csv")


def test_structured_trace_carries_the_pass_files(tmp_path):
    """TORCH_TRACE (tlparse's input) gets each graph after each pass and the plan files as
    artifacts, without dumps being asked for."""
    script = (
        "import torch, dsgraph\n"
        "m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))\n"
        "c = torch.compile(m, backend='dsgraph', options={'inductor': False, 'pipeline': 'lifetimes'})\n"
        "c(torch.randn(4, 5)).sum().backward()\n"
    )
    env = {**os.environ, "TORCH_TRACE": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    text = "".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())
    for name in ("dsgraph_c000_forward_01_lifetimes", "dsgraph_c000_backward_01_lifetimes",
                 "dsgraph_c000_joint_partition.md"):
        assert f'"name": "{name}"' in text, name
    assert "# pass: lifetimes" in text  # the payload is the dumped file
