"""Tiny random-init Hugging Face causal LMs through torch.compile(backend="keraunos"), in eval
mode, against eager: logits within float32 round-off. Skipped without transformers
(scripts/setup.sh installs a pinned one). These models build their causal masks with nested
torch.vmap, which used to kill the process (the dispatcher dereferenced NULL when data_ptr()
failed on a functorch-wrapped tensor)."""

from __future__ import annotations

import io

import pytest
import torch
import torch._dynamo

import keraunos

transformers = pytest.importorskip("transformers")


def _llama():
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg)


def _mistral():
    cfg = transformers.MistralConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.MistralForCausalLM(cfg)


MODELS = {"llama": _llama, "gpt2": _gpt2, "mistral": _mistral}


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("fusion", [True, False], ids=["fusion", "nofusion"])
@pytest.mark.parametrize("name", list(MODELS))
def test_causal_lm_logits_match_eager(name, fusion):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
        compiled = torch.compile(model, backend="keraunos", options={"fusion": fusion})
        for _ in range(2):  # the second call runs the cached programs
            torch.testing.assert_close(compiled(ids).logits, expected, atol=1e-4, rtol=1e-4)
    stats = keraunos.compile_stats(compiled)
    assert stats["graphs"] >= 1 and stats["keraunos_regions"] >= 1 and stats["compiles"] >= 1
    assert stats["hits"] >= 1
    # The vmapped mask construction runs eagerly, and says why.
    assert "inside a torch.func transform" in keraunos.explain(
        compiled, file=io.StringIO(), traces="none"
    )


@pytest.mark.parametrize("name", list(MODELS))
def test_causal_lm_with_grad_matches_eager(name):
    # Grad mode on, parameters requiring grad: the regions run through torch (autograd kept).
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(2))
    expected = model(ids).logits
    compiled = torch.compile(model, backend="keraunos")
    out = compiled(ids).logits
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    assert out.requires_grad
