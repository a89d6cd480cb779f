"""The package's shape, checked: no import cycles, and torch internals only in dsgraph/compat/.

(The layers themselves are import-linter contracts in pyproject.toml; `lint-imports` runs in
the README's test command.)"""

import io
import pathlib
import tokenize

import pytest

grimp = pytest.importorskip("grimp")  # comes with import-linter, in the test extra (CI has it)

ROOT = pathlib.Path(__file__).resolve().parents[2] / "dsgraph"

# private attributes of torch objects that dsgraph reads (through compat only)
PRIVATE_TORCH_ATTRIBUTES = {
    "_schema", "_backward_hooks", "_post_accumulate_grad_hooks", "_execution_engine", "_cdata",
    "_overloadpacket", "_op_dk", "_base", "_version",
}


def _sources():
    for path in sorted(ROOT.rglob("*.py")):
        if "compat" not in path.relative_to(ROOT).parts:
            yield path


def _private_uses(source: str) -> list[str]:
    """``torch._x`` (or ``torch.a._b``) in code, and the attributes above; strings and
    comments are not code."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type in (tokenize.NAME, tokenize.OP)]
    found = []
    for i, tok in enumerate(tokens):
        if tok.type != tokenize.NAME:
            continue
        if tok.string == "torch":
            j = i
            while j + 2 < len(tokens) and tokens[j + 1].string == "." and tokens[j + 2].type == tokenize.NAME:
                j += 2
                if tokens[j].string.startswith("_") and not tokens[j].string.startswith("__"):
                    found.append(f"line {tok.start[0]}: torch...{tokens[j].string}")
                    break
        elif tok.string in PRIVATE_TORCH_ATTRIBUTES and i > 0 and tokens[i - 1].string == ".":
            found.append(f"line {tok.start[0]}: .{tok.string}")
    return found


def test_torch_internals_only_in_compat():
    offenders = {str(p.relative_to(ROOT)): uses for p in _sources() if (uses := _private_uses(p.read_text()))}
    assert not offenders, f"private torch access outside dsgraph/compat/: {offenders}"


def test_the_check_finds_what_it_looks_for():
    code = "import torch\nx = torch._inductor.config\ny = op._schema\nz = torch.utils._pytree\n# torch._dynamo\ns = 'torch._x'\n"
    assert _private_uses(code) == ["line 2: torch..._inductor", "line 3: ._schema", "line 4: torch..._pytree"]


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), imports inside
    functions included."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return out


def test_no_import_cycles():
    graph = grimp.build_graph("dsgraph")
    # the package root re-exports the public API, so every module "imports" it through
    # its parent package; cycles through the root are not design cycles
    graph.remove_module("dsgraph")
    assert _cycles(graph) == []


@pytest.mark.parametrize("folder", ["compile", "pass_api", "passes", "lowering", "analysis", "recompute",
                                    "runtime", "report", "compat"])
def test_each_layer_folder_is_a_documented_package(folder):
    init = ROOT / folder / "__init__.py"
    assert init.exists() and init.read_text().lstrip().startswith('"""'), init


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]
