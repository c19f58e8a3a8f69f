"""20 optimizer steps of tiny Hugging Face models (Llama, GPT-2, BERT; random init, CPU float32)
through keraunos.jit and through torch.compile(backend="keraunos"): every step's loss equals
eager's within tolerance, and so do the parameters after the last step. AdamW (its update
normalizes the gradient, so a wrong gradient shows in the next losses). How each entry point
ran is checked too: keraunos.jit must have compiled the backward (BERT's in-place add on its
embeddings included)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

import model_cases  # noqa: E402

STEPS = 20


def _losses(model, fn, inputs, labels, extra):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, loss = model_cases._call(fn, model, inputs, labels, extra)
        loss.backward()
        opt.step()
        losses.append(loss.detach().item())
    return losses


@pytest.mark.parametrize("entry", ["jit", "compile"])
@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_twenty_steps_match_eager(name, entry):
    import keraunos

    torch.manual_seed(0)
    model, inputs, labels = model_cases.MODELS[name][0]()
    model.float().train()
    eager, mine = copy.deepcopy(model), copy.deepcopy(model)
    extra = {"use_cache": False} if name != "bert" else {}
    ref = _losses(eager, eager, inputs, labels, extra)
    fn = model_cases._wrap(mine, entry, "consecutive")
    try:
        got = _losses(mine, fn, inputs, labels, extra)
        if entry == "jit":
            stats = keraunos.compile_stats(fn)
            assert not stats["grad_fallback"], stats["grad_fallback"]
    finally:
        if entry == "compile":
            torch._dynamo.reset()
    assert ref[-1] < ref[0], f"eager's loss does not fall: {ref}"
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), atol=2e-4, rtol=2e-4)
    e_params = dict(eager.named_parameters())
    for pname, p in mine.named_parameters():
        torch.testing.assert_close(p, e_params[pname], atol=2e-4, rtol=2e-4, msg=pname)
