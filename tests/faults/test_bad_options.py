"""Bad options of every kind: each is a ValueError naming the option (or the pass argument)
from ``dsgraph.validate_options`` and, at the first call, from ``torch.compile`` (as
BackendCompilerFailed, whatever ``fallback`` says). The tables are checked against the
options module and the registry, so an option or a pass argument added without a bad-value
case here fails ``test_every_option_has_bad_values``.

Found here: ``bucket_mb=float("nan")`` passed validation (``nan <= 0`` is False) and failed
only when the backward compiled, without naming the option; ``dsgraph.validate_options``
did not parse the pipeline nor check the options' combinations, so
``{"bucket_mb": 5}`` passed it and failed at the first compile; the pipeline
``allreduce,grad_pool`` (with ``data_parallel=True``) compiled and trained without averaging
the gradients (allreduce, running first in the backward, found no pool slots and planned
nothing): now a parse error.
"""

import dataclasses
import math

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

import dsgraph
from dsgraph.compile import registry
from dsgraph.pass_api.options import OPTION_HELP, Options

from models import MLP

# option -> [(bad value, what the message must say besides the option's name)]
BAD = {
    "pipeline": [(3, "must be a str"), ("lifetimes,lifetimez", "did you mean 'lifetimes'"),
                 ("lifetimes{x=1}", "no argument 'x'"), ("lifetimes,", "empty pass name"),
                 ("checkpoint{budget=1GiB", "unclosed")],
    "inductor": [(1, "must be a bool"), ("yes", "must be a bool"), (None, "must be a bool")],
    "fallback": [("stock", "must be one of"), ("Inductor", "must be one of"), (None, "must be one of")],
    "memory_budget": [(-1, "non-negative"), ("-1GiB", "cannot read"), ("6 gigs", "cannot read"),
                      ("6GiBs", "cannot read"), (0.5, "not fractions"), ("0.5", "cannot read"),
                      (True, "got bool"), ([1], "must be an int or a string"), (float("nan"), "must be bytes")],
    "chunk_loss": [(0, "int >= 1"), (-2, "int >= 1"), (2.5, "int >= 1"), ("8", "int >= 1"), ("on", "int >= 1")],
    "grad_pool": [(1, "must be a bool"), ("true", "must be a bool"), (None, "must be a bool")],
    "arena": [(1, "must be a bool"), ("yes", "must be a bool")],
    "data_parallel": [(1, "ProcessGroup"), ("yes", "ProcessGroup"), (None, "ProcessGroup")],
    "bucket_mb": [(0, "> 0"), (-5, "> 0"), (True, "> 0"), ("25", "> 0"), (float("nan"), "> 0")],
    "compress": [("fp16", "must be one of"), ("BF16", "must be one of"), (None, "must be one of"),
                 (True, "must be one of")],
    "lower_triton": [(1, "must be a bool"), ("yes", "must be a bool"), (None, "must be a bool")],
    "dump_dir": [(5, "must be a str"), (b"dumps", "must be a str")],
    "debug": [(1, "must be a bool"), ("yes", "must be a bool")],
    "compile_ahead": [("auto", "must be a bool"), (1, "must be a bool")],
}

# (pass, argument) -> bad pipeline text; the message names the pass and the argument
BAD_ARGS = {
    ("checkpoint", "budget"): "checkpoint{budget=-1GiB}",
    ("checkpoint", "rates"): "checkpoint{rates=fast}",
    ("checkpoint", "mixes"): "checkpoint{mixes=yes}",
    ("checkpoint", "refit"): "checkpoint{refit=true}",
    ("chunk_loss", "chunks"): "chunk_loss{chunks=0}",
    ("chunk_loss", "budget"): "chunk_loss{budget=0.5}",
    ("chunk_loss", "choose"): "chunk_loss{choose=sometimes},lifetimes,checkpoint{budget=1GiB}",
    ("allreduce", "bucket_mb"): "grad_pool,allreduce{bucket_mb=nan}",
    ("allreduce", "compress"): "grad_pool,allreduce{compress=fp16}",
    ("lower_triton", "select"): "lower_triton{select=everything}",
    ("lower_triton", "opaque"): "lower_triton{opaque=yes}",
    ("lower_triton", "fail_regions"): "lower_triton{fail_regions=first}",
}

# valid values alone, refused together (checked when the pipeline is made)
BAD_COMBINATIONS = [
    ({"bucket_mb": 5}, "bucket_mb"),
    ({"compress": "bf16"}, "compress"),
    ({"memory_budget": "1GiB", "pipeline": "checkpoint{budget=2GiB}"}, "memory_budget"),
    ({"memory_budget": "1GiB", "pipeline": "lifetimes"}, "memory_budget"),
    ({"grad_pool": True, "pipeline": "lifetimes"}, "grad_pool"),
    ({"pipeline": "arena"}, "arena"),  # through Inductor (inductor=True): FX only
    # allreduce before grad_pool found no slots and reduced nothing: ranks trained apart, silently
    ({"pipeline": "allreduce,grad_pool"}, "must run after 'grad_pool'"),
    ({"data_parallel": True, "pipeline": "allreduce,grad_pool"}, "must run after 'grad_pool'"),
    ({"pipeline": "lifetimes,lifetimes"}, "lifetimes"),
    ({"compile_ahead": True, "inductor": False}, "compile_ahead"),  # FX code: nothing to compile ahead
]


def _cases():
    return [(key, value, words) for key, rows in BAD.items() for value, words in rows]


def _id(case):
    key, value, _ = case
    return f"{key}={value!r}"


def test_every_option_has_bad_values():
    fields = {f.name for f in dataclasses.fields(Options)} - {"explicit"}
    assert set(OPTION_HELP) == fields
    assert set(BAD) == fields, f"options without a bad-value case: {sorted(fields - set(BAD))}"
    assert all(BAD[k] for k in BAD)


def test_every_pass_argument_has_a_bad_value():
    args = {(name, arg) for name in registry.CANONICAL_ORDER for arg in registry.spec(name).args}
    assert set(BAD_ARGS) == args, f"pass arguments without a bad-value case: {sorted(args - set(BAD_ARGS))}"


@pytest.mark.parametrize("case", _cases(), ids=_id)
def test_validate_options_names_the_option(case):
    key, value, words = case
    with pytest.raises(ValueError) as info:
        dsgraph.validate_options({key: value})
    text = str(info.value)
    assert (f"'{key}'" in text or key == "pipeline"), text
    assert words in text, text


@pytest.mark.parametrize("case", _cases(), ids=_id)
def test_torch_compile_names_the_option_at_the_first_call(case):
    key, value, words = case
    model = MLP()
    compiled = torch.compile(model, backend="dsgraph", options={"inductor": False, key: value})
    if key == "inductor":  # the other keys are checked under FX; this one alone
        compiled = torch.compile(model, backend="dsgraph", options={key: value})
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(torch.randn(3, 13))
    assert words in str(info.value) and (f"'{key}'" in str(info.value) or key == "pipeline")
    assert dsgraph.reports() == [] and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("fallback", ["inductor", "error"])
def test_fallback_never_swallows_an_option_error(fallback):
    compiled = torch.compile(MLP(), backend="dsgraph", options={"inductor": False, "fallback": fallback,
                                                                 "bucket_mb": float("nan")})
    with pytest.raises(BackendCompilerFailed, match="'bucket_mb' must be a number > 0"):
        compiled(torch.randn(3, 13))


@pytest.mark.parametrize("key", sorted(BAD_ARGS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_bad_pass_argument_names_the_pass_and_the_argument(key):
    name, arg = key
    with pytest.raises(ValueError, match=f"dsgraph pass '{name}': bad value .* for argument '{arg}'"):
        dsgraph.parse_pipeline(BAD_ARGS[key])
    compiled = torch.compile(MLP(), backend="dsgraph", options={"inductor": False, "pipeline": BAD_ARGS[key]})
    with pytest.raises(BackendCompilerFailed, match=f"argument '{arg}'"):
        compiled(torch.randn(3, 13))


@pytest.mark.parametrize("options,key", BAD_COMBINATIONS, ids=[str(i) for i in range(len(BAD_COMBINATIONS))])
def test_bad_combinations_are_refused_up_front_and_at_compile(options, key):
    with pytest.raises(ValueError, match=key):
        dsgraph.validate_options(options)
    compiled = torch.compile(MLP(), backend="dsgraph", options=options)
    with pytest.raises(BackendCompilerFailed, match=key):
        compiled(torch.randn(3, 13))


@pytest.mark.parametrize("key,hint", [("memory_budgt", "memory_budget"), ("bucket_size_mb", "bucket_mb"),
                                      ("lower_trition", "lower_triton"), ("gradpool", "grad_pool"),
                                      ("dumpdir", "dump_dir")])
def test_unknown_option_says_did_you_mean(key, hint):
    with pytest.raises(ValueError, match=f"unknown dsgraph option '{key}' \\(did you mean '{hint}'\\?\\)"):
        dsgraph.validate_options({key: 1})
    compiled = torch.compile(MLP(), backend="dsgraph", options={key: 1})
    with pytest.raises(BackendCompilerFailed, match=f"did you mean '{hint}'"):
        compiled(torch.randn(3, 13))


def test_unknown_option_far_from_any_lists_the_accepted_ones():
    with pytest.raises(ValueError) as info:
        dsgraph.validate_options({"wibble": 1, "memory_budget": "1GiB"})
    text = str(info.value)
    assert "did you mean" not in text and all(f"  {k}:" in text for k in OPTION_HELP)
    with pytest.raises(ValueError, match="unknown dsgraph option 7"):
        dsgraph.validate_options({7: True})


def test_options_that_are_not_a_dict_and_unexpected_backend_arguments():
    with pytest.raises(ValueError, match="must be a dict, got list"):
        dsgraph.validate_options([("memory_budget", "1GiB")])
    with pytest.raises(ValueError, match="inductor=False"):
        from dsgraph.compile.backend import dsgraph_backend
        dsgraph_backend(torch.fx.symbolic_trace(MLP()), [torch.randn(3, 13)], {"inductor": False}, mode="max-autotune")
    with pytest.raises(ValueError, match="unexpected arguments"):
        dsgraph_backend(torch.fx.symbolic_trace(MLP()), [torch.randn(3, 13)], {}, budget=1)


def test_a_valid_value_of_every_option_passes():
    """The other side of the tables: one accepted value each (data_parallel=True is checked
    when it compiles: it needs torch.distributed)."""
    good = {"pipeline": "lifetimes", "inductor": False, "fallback": "error", "memory_budget": "800MiB",
            "chunk_loss": 4, "grad_pool": True, "arena": True, "data_parallel": False, "lower_triton": True,
            "dump_dir": "dumps", "debug": True}
    assert set(good) | {"bucket_mb", "compress", "compile_ahead"} == set(BAD)
    assert dsgraph.validate_options({"compile_ahead": True}).compile_ahead is True
    opts = dsgraph.validate_options({**good, "pipeline": "chunk_loss,lifetimes,checkpoint,grad_pool,lower_triton,arena"})
    assert opts.memory_budget == 800 * 2**20 and opts.chunk_loss == 4
    assert math.isclose(dsgraph.validate_options({"data_parallel": True, "bucket_mb": 0.5}).bucket_mb, 0.5)
