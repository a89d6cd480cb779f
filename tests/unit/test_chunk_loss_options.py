"""The chunk_loss option and pipeline entry: accepted values, the default pipeline it builds,
and contradictions with an explicit pipeline."""

import pytest

import dsgraph
from dsgraph.compile.pipeline import parse, resolve

GIB = 1 << 30


@pytest.mark.parametrize("value", ["auto", True, False, 1, 12])
def test_accepted_values(value):
    assert dsgraph.validate_options({"chunk_loss": value}).chunk_loss == value
    assert dsgraph.validate_options({"chunk_loss": value, "memory_budget": "1GiB"}).chunk_loss == value


def test_faster_is_accepted_with_a_budget():
    assert dsgraph.validate_options({"chunk_loss": "faster", "memory_budget": "1GiB"}).chunk_loss == "faster"


@pytest.mark.parametrize("bad", [0, -3, "on", 2.5, None])
def test_bad_values_name_the_option(bad):
    with pytest.raises(ValueError, match="chunk_loss"):
        dsgraph.validate_options({"chunk_loss": bad})


@pytest.mark.parametrize("options, pipeline", [
    ({}, "lifetimes"),
    ({"chunk_loss": "auto"}, "lifetimes"),
    ({"memory_budget": "1GiB"}, f"chunk_loss,lifetimes,checkpoint{{budget={GIB}}}"),
    ({"memory_budget": "1GiB", "chunk_loss": False}, f"lifetimes,checkpoint{{budget={GIB}}}"),
    ({"chunk_loss": True}, "chunk_loss,lifetimes"),
    ({"memory_budget": "1GiB", "chunk_loss": "faster"}, f"chunk_loss{{choose=faster}},lifetimes,checkpoint{{budget={GIB}}}"),
    ({"chunk_loss": 6, "grad_pool": True}, "chunk_loss{chunks=6},lifetimes,grad_pool"),
])
def test_default_pipeline(options, pipeline):
    assert str(resolve(dsgraph.validate_options(options), {})) == pipeline


def test_pipeline_arguments_parse_and_print_back():
    text = "chunk_loss{chunks=3,budget=2GiB},lifetimes"
    assert str(parse(text)) == text
    with pytest.raises(ValueError, match="chunks"):
        parse("chunk_loss{chunks=0}")


def test_explicit_pipelines_and_the_option():
    # the option fills in the chunk count the pipeline leaves out
    opts = dsgraph.validate_options({"chunk_loss": 4, "pipeline": "chunk_loss,lifetimes"})
    assert str(resolve(opts, {})) == "chunk_loss{chunks=4},lifetimes"
    with pytest.raises(ValueError, match="contradicts"):
        resolve(dsgraph.validate_options({"chunk_loss": 4, "pipeline": "chunk_loss{chunks=5}"}), {})
    # True switches the pass on: any chunk count in the pipeline agrees with it
    opts = dsgraph.validate_options({"chunk_loss": True, "pipeline": "chunk_loss{chunks=5}"})
    assert str(resolve(opts, {})) == "chunk_loss{chunks=5}"
    with pytest.raises(ValueError, match="needs the pass 'chunk_loss'"):
        resolve(dsgraph.validate_options({"chunk_loss": True, "pipeline": "lifetimes"}), {})
    # "auto" and False never contradict a pipeline
    for value in ("auto", False):
        opts = dsgraph.validate_options({"chunk_loss": value, "pipeline": "lifetimes"})
        assert str(resolve(opts, {})) == "lifetimes"
    assert str(resolve(dsgraph.validate_options({"memory_budget": "1GiB"}), {"DSGRAPH_DISABLE": "chunk_loss"})) \
        == f"lifetimes,checkpoint{{budget={GIB}}}"


def test_choosing_the_faster_loss_needs_a_budget():
    """chunk_loss="faster" compares the checkpoint planner's plans (passes/loss_choice.py):
    without a budget, or with a pipeline that has no checkpoint pass, there is nothing to
    compare and the option is refused rather than ignored."""
    with pytest.raises(ValueError, match="it needs memory_budget"):
        resolve(dsgraph.validate_options({"chunk_loss": "faster"}), {})
    with pytest.raises(ValueError, match="needs the checkpoint pass"):
        resolve(dsgraph.validate_options({"pipeline": "chunk_loss{choose=faster},lifetimes"}), {})
    with pytest.raises(ValueError, match="needs the checkpoint pass"):
        resolve(dsgraph.validate_options({"memory_budget": "1GiB", "chunk_loss": "faster"}),
                {"DSGRAPH_DISABLE": "checkpoint"})
    # the option sets the pass's argument in an explicit pipeline, and contradicts another one
    opts = dsgraph.validate_options({"memory_budget": "1GiB", "chunk_loss": "faster",
                                     "pipeline": "chunk_loss,lifetimes,checkpoint"})
    assert str(resolve(opts, {})) == f"chunk_loss{{choose=faster}},lifetimes,checkpoint{{budget={GIB}}}"
    with pytest.raises(ValueError, match="contradicts"):
        resolve(dsgraph.validate_options({"memory_budget": "1GiB", "chunk_loss": "faster",
                                          "pipeline": "chunk_loss{choose=always},lifetimes,checkpoint"}), {})
    with pytest.raises(ValueError, match="choose"):
        parse("chunk_loss{choose=sometimes}")
