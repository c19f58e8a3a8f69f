"""The models of the suite and how one case runs: a tiny random-init model (nothing is
downloaded), its inputs, and a comparison of keraunos (keraunos.jit or torch.compile with the
keraunos backend) with eager on CPU float32.

eval:  model.eval(), forward under torch.no_grad() (so generated kernels run); the outputs
       (logits, last_hidden_state, ...) are compared.
train: model.train() (every dropout probability is 0, so train mode is deterministic),
       forward with labels, loss.backward(); the loss, the outputs, every parameter's .grad
       and every buffer (BatchNorm's running statistics) are compared.

Eager and keraunos each run on their own deep copy of one model. Also run by _worker.py in a
subprocess, so that a crash (segfault) of one torch.compile case does not end the session.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import inspect

import torch

ATOL = 1e-4
RTOL = 1e-4
BATCH, SEQ, VOCAB = 2, 8, 128

# Common tiny sizes of the decoder-only language models.
_LM = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
)


def _tokens(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)


def _causal_lm(config_name, model_name, **extra):
    def build():
        tf = importlib.import_module("transformers")
        config = getattr(tf, config_name)(**{**_LM, **extra})
        model = getattr(tf, model_name)(config)
        ids = _tokens()
        return model, {"input_ids": ids}, {"labels": ids}

    return build


def _gpt2():
    tf = importlib.import_module("transformers")
    config = tf.GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    ids = _tokens()
    return tf.GPT2LMHeadModel(config), {"input_ids": ids}, {"labels": ids}


def _bert():
    tf = importlib.import_module("transformers")
    config = tf.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    ids = _tokens()
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -2:] = 0  # padding in the second sequence: the extended attention mask is used
    labels = torch.full((BATCH, SEQ), -100)
    labels[:, 2:5] = ids[:, 2:5]
    return (
        tf.BertForMaskedLM(config),
        {"input_ids": ids, "attention_mask": mask},
        {"labels": labels},
    )


def _t5():
    tf = importlib.import_module("transformers")
    config = tf.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    ids = _tokens()
    labels = _tokens(seed=2)
    return (
        tf.T5ForConditionalGeneration(config),
        {"input_ids": ids, "decoder_input_ids": labels},
        {"labels": labels},
    )


def _vit():
    tf = importlib.import_module("transformers")
    config = tf.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=10,
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 3, 16, 16, generator=g)
    return (
        tf.ViTForImageClassification(config),
        {"pixel_values": x},
        {"labels": torch.tensor([3, 7])},
    )


def _whisper():
    tf = importlib.import_module("transformers")
    config = tf.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=8,  # 16 input frames (two stride-2 convolutions: 8 positions)
        max_target_positions=32,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=0,
        decoder_start_token_id=1,
        bos_token_id=1,
        eos_token_id=2,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(BATCH, 8, 16, generator=g)
    labels = _tokens(seed=2)
    return (
        tf.WhisperForConditionalGeneration(config),
        {"input_features": feats, "decoder_input_ids": labels},
        {"labels": labels},
    )


def _make_torchvision_importable():
    """The torchvision wheel on PyPI is a CUDA build: with torch's CPU build its C++ ops
    library does not load, and torchvision 0.28's import then fails registering fake kernels
    for torchvision::nms/qnms (so does transformers', which imports torchvision when it is
    installed). The models here use none of torchvision's ops: when (and only when) the
    library did not load, define the two schemas so that the import succeeds."""
    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        importlib.import_module("torchvision")
        return
    except RuntimeError as e:
        if "torchvision::nms does not exist" not in str(e):
            raise
    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)  # the definitions live as long as the Library object
    importlib.import_module("torchvision")


_KEEP: list = []
_make_torchvision_importable()


def _torchvision(name, size, **kw):
    def build():
        models = importlib.import_module("torchvision.models")
        model = getattr(models, name)(weights=None, num_classes=10, **kw)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(BATCH, 3, size, size, generator=g)
        return model, {"x": x}, {"labels": torch.tensor([3, 7])}

    return build


# name -> (builder, package it needs)
MODELS = {
    "llama": (_causal_lm("LlamaConfig", "LlamaForCausalLM"), "transformers"),
    "mistral": (
        _causal_lm("MistralConfig", "MistralForCausalLM", sliding_window=4),
        "transformers",
    ),
    "qwen2": (_causal_lm("Qwen2Config", "Qwen2ForCausalLM"), "transformers"),
    "gemma": (_causal_lm("GemmaConfig", "GemmaForCausalLM", head_dim=8), "transformers"),
    "phi3": (
        _causal_lm("Phi3Config", "Phi3ForCausalLM", resid_pdrop=0.0, embd_pdrop=0.0),
        "transformers",
    ),
    "gpt2": (_gpt2, "transformers"),
    "bert": (_bert, "transformers"),
    "t5": (_t5, "transformers"),
    "vit": (_vit, "transformers"),
    "whisper": (_whisper, "transformers"),
    # (64 x 64: at 32 x 32 the last stages' BatchNorms normalize 2 values per channel, where
    # float32 rounding in any order of summation changes the gradients by percents; float64
    # agrees with eager to 1e-11 there.)
    "resnet18": (_torchvision("resnet18", 64), "torchvision"),
    "mobilenet_v3_small": (_torchvision("mobilenet_v3_small", 64, dropout=0.0), "torchvision"),
}


def _is_torchvision(model) -> bool:
    return not hasattr(model, "config")


def _call(fn, model, inputs, labels, extra):
    """Runs fn (the model or its compiled form); returns (outputs to compare, loss or None)."""
    if _is_torchvision(model):
        out = fn(inputs["x"])
        loss = torch.nn.functional.cross_entropy(out, labels["labels"]) if labels else None
        return {"logits": out}, loss
    out = fn(**inputs, **labels, **extra)
    keep = {}
    for k in ("loss", "logits", "last_hidden_state", "encoder_last_hidden_state"):
        v = out.get(k) if hasattr(out, "get") else None
        if isinstance(v, torch.Tensor):
            keep[k] = v
    return keep, keep.get("loss")


def _wrap(model, entry, fusion_type):
    if entry == "jit":
        import keraunos

        return keraunos.jit(model, fusion_type=fusion_type)
    if entry == "compile":
        import keraunos  # noqa: F401  (registers the backend)

        torch._dynamo.reset()
        return torch.compile(model, backend="keraunos", options={"fusion_type": fusion_type})
    raise ValueError(entry)


def _close(actual, expected, what):
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")


# The models whose attention masks transformers builds with torch.vmap (masking_utils).
VMAP_MASK_MODELS = ("llama", "mistral", "qwen2", "gemma", "phi3", "gpt2", "whisper")


@contextlib.contextmanager
def broadcast_masks():
    """Makes transformers build attention masks by broadcasting instead of torch.vmap, for
    eager and keraunos alike: the mask function is called once on index tensors shaped
    (B,1,1,1), (1,H,1,1), (1,1,Q,1), (1,1,1,KV) (as transformers' sdpa_mask_older_torch does).
    Separates what the models' bodies do from the vmap problems (test_models.py)."""
    mu = importlib.import_module("transformers.masking_utils")

    def bcast(mask_function, bh_indices=True):
        def build(b, h, q, kv):
            m = mask_function(
                b[:, None, None, None],
                h[None, :, None, None],
                q[None, None, :, None],
                kv[None, None, None],
            )
            return m.expand(b.shape[0], h.shape[0], q.shape[0], kv.shape[0])

        return build

    saved = mu._vmap_for_bhqkv, mu.TransformGetItemToIndex
    mu._vmap_for_bhqkv, mu.TransformGetItemToIndex = bcast, contextlib.nullcontext
    try:
        yield
    finally:
        mu._vmap_for_bhqkv, mu.TransformGetItemToIndex = saved


def run_case(
    name: str, entry: str, fusion_type: str, mode: str, use_cache=False, masks="vmap"
) -> None:
    """Raises AssertionError (with what differs) when keraunos and eager disagree.

    Hugging Face models run with use_cache=False (where they take it): with a cache, the
    outputs hold a Cache object (past_key_values), which keraunos.jit cannot return
    (test_jit_returns_cache_object). masks="broadcast": under broadcast_masks()."""
    if masks == "broadcast":
        with broadcast_masks():
            return run_case(name, entry, fusion_type, mode, use_cache)
    assert masks == "vmap", masks
    build = MODELS[name][0]
    torch.manual_seed(0)
    model, inputs, labels = build()
    model.float()
    eager = copy.deepcopy(model)
    mine = copy.deepcopy(model)
    train = mode == "train"
    eager.train(train)
    mine.train(train)
    compiled = _wrap(mine, entry, fusion_type)
    extra = {}
    if "use_cache" in inspect.signature(model.forward).parameters:
        extra["use_cache"] = use_cache
    if train:
        e_out, e_loss = _call(eager, eager, inputs, labels, extra)
        e_loss.backward()
        k_out, k_loss = _call(compiled, mine, inputs, labels, extra)
        assert k_loss is not None and k_loss.requires_grad, "the loss does not require grad"
        k_loss.backward()
    else:
        with torch.no_grad():
            e_out, _ = _call(eager, eager, inputs, {}, extra)
            k_out, _ = _call(compiled, mine, inputs, {}, extra)
    assert e_out.keys() == k_out.keys(), f"outputs {sorted(k_out)} vs eager {sorted(e_out)}"
    for k in e_out:
        _close(k_out[k].detach(), e_out[k].detach(), k)
    if train:
        e_params = dict(eager.named_parameters())
        for pname, p in mine.named_parameters():
            e = e_params[pname]
            if e.grad is None:
                assert p.grad is None, f"{pname}.grad: eager has none, keraunos has one"
                continue
            assert p.grad is not None, f"{pname}.grad: None, eager has a gradient"
            _close(p.grad, e.grad, f"{pname}.grad")
        e_bufs = dict(eager.named_buffers())
        for bname, b in mine.named_buffers():
            _close(b, e_bufs[bname], f"buffer {bname}")
    if entry == "compile":
        torch._dynamo.reset()
