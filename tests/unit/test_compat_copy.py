"""compat.copy_graph_module keeps what AOTAutograd needs to tell parameters from inputs.

Found when a second compile (a post-compile check's Recompile) started from a copy of
Dynamo's graph: the copy had lost the nodes' ``_dynamo_source`` and the module's
``_param_name_to_source``, so AOTAutograd saw no static inputs and the checkpoint planner
planned the parameters as activations (a budget the first compile met was refused)."""

import torch

from dsgraph import compat


def _static_indices(gm, example_inputs) -> list[int]:
    seen = {}

    def partition(joint, joint_inputs, **kwargs):
        seen["static"] = list(kwargs.get("static_lifetime_input_indices") or [])
        return compat.default_partition(joint, joint_inputs, **kwargs)

    with compat.dsgraph_compile_config():
        compat.compile_fx(gm, example_inputs, inner_compile=lambda g, i, **kw: compat.boxed_fx(g),
                          config_patches={"custom_partitioner_fn": _partitioner(partition)})
    return seen["static"]


def _partitioner(fn):
    base = compat.custom_partitioner_base()

    class P(base):
        def __call__(self, gm, joint_inputs, **kwargs):
            return fn(gm, joint_inputs, **kwargs)

        def uuid(self):
            return None

    return P()


def test_a_copy_of_dynamos_graph_keeps_its_static_inputs():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(4, 8)
    got = {}

    def backend(gm, example_inputs):
        got["copy"] = _static_indices(compat.copy_graph_module(gm), example_inputs)
        return gm.forward

    compat.reset()
    torch.compile(model, backend=backend)(x).sum().backward()
    compat.reset()
    assert len(got["copy"]) == 4  # two weights, two biases
