"""transformers' Trainer trains a model compiled with dsgraph: `model.compile(backend="dsgraph",
options=...)` compiles the module in place, so the Trainer sees the model's own forward
signature (no `remove_unused_columns=False` needed) and dsgraph compiles its graphs. The
Trainer's own switch (`TrainingArguments(torch_compile_backend=...)`) goes through
accelerate's fixed list of backend names and refuses "dsgraph" (README, "transformers Trainer")."""

import pytest
import torch

import dsgraph

transformers = pytest.importorskip("transformers")  # in the test extra: CI has it


class TokenWindows(torch.utils.data.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(100 + i)  # different data per step
        ids = torch.randint(0, 97, (16,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


def train(compile_options, tmp_path):
    torch.manual_seed(0)
    # no dropout: compiled graphs draw other random numbers than eager (FACTS.md)
    config = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    if compile_options is not None:
        model.compile(backend="dsgraph", options=compile_options)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3, report_to=[], use_cpu=True,
        save_strategy="no", logging_steps=1, seed=0, data_seed=0,
        # SGD: parameters then differ by lr x the gradients' rounding differences; Adam divides
        # each gradient by its own running scale, which turns rounding in near-zero gradients
        # into full-size differences in the update
        optim="sgd", learning_rate=0.1)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=TokenWindows())
    result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return result.training_loss, losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_trainer_trains_a_model_compiled_with_dsgraph(tmp_path):
    _, eager_losses, eager_params = train(None, tmp_path / "eager")
    torch._dynamo.reset()
    dsgraph.clear_reports()
    _, losses, params = train({"inductor": False, "fallback": "error"}, tmp_path / "dsgraph")
    assert any(r.kind == "backward" for r in dsgraph.reports())  # dsgraph compiled the training graphs
    assert len(losses) == len(eager_losses) == 3
    for got, ref in zip(losses, eager_losses):
        assert abs(got - ref) <= 1e-5 * abs(ref)
    for name, ref in eager_params.items():  # three SGD steps later, the same model
        rel = float((params[name].double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))
        assert rel <= 1e-5, (name, rel)
