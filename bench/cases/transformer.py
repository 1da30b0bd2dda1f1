"""A small Transformer encoder (issue 28): ``nn.TransformerEncoder`` of 2 post-norm layers (d_model 64, 4 heads,
feed-forward 256, ReLU, dropout 0), batch_first, 16 sequences of 32 tokens, float32. One step is the forward pass,
the mean square of the output as the loss, and the gradients of every parameter; with a causal mask, and with a
padding mask (the second half of every other sequence padded). Every framework starts from the same weights
(torch's modules load opforge's state_dict).

The attention itself, on the encoder's shapes ((16, 4, 32, 16) queries, keys and values, causal), forward and
backward: the framework's fused scaled-dot-product-attention op, and the same written as the ops of its definition
(matmul, scale, mask, softmax, matmul), so that the fused op's worth is measured in each framework."""

from __future__ import annotations

import math

import numpy as np

from .common import Variant, load_torch, scalar, sq, unknown

TITLE = "Extra (issue 28): Transformer encoder, 2 layers × (d_model 64, 4 heads, ff 256), 16 × 32 tokens (float32)"
UNIT = "ms"
FRAMEWORKS = ("opforge", "opforge.compiled", "torch")
REFERENCES = ("torch",)

D_MODEL, HEADS, FF, LAYERS, BATCH, TOKENS = 64, 4, 256, 2, 16, 32


def inputs():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((BATCH, TOKENS, D_MODEL)).astype(np.float32)
    padding = np.zeros((BATCH, TOKENS), bool)
    padding[1::2, TOKENS // 2:] = True
    qkv = [rng.standard_normal((BATCH, HEADS, TOKENS, D_MODEL // HEADS)).astype(np.float32) for _ in range(3)]
    return x, padding, qkv


def opforge_encoder():
    import opforge as of
    from opforge import nn

    of.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, LAYERS)


def opforge_variants(compiled: bool) -> list:
    import opforge as of
    from opforge import ops as F

    model = opforge_encoder()
    params = list(model.parameters())
    x, padding, qkv = inputs()
    x, padding = of.tensor(x), of.tensor(padding)
    q, k, v = (of.tensor(a, requires_grad=True) for a in qkv)

    def causal_step(x):
        loss = F.mean(F.square(model(x, is_causal=True)))
        return (loss, *of.grad(loss, params))

    def padded_step(x, padding):
        loss = F.mean(F.square(model(x, src_key_padding_mask=padding)))
        return (loss, *of.grad(loss, params))

    def composed(q, k, v):  # scaled_dot_product_attention(q, k, v, is_causal=True), op by op
        s = F.matmul(q, F.transpose(k, perm=[0, 1, 3, 2])) * (1.0 / math.sqrt(q.shape[-1]))
        rows = F.reshape(F.arange(start=0, stop=TOKENS, dtype="int64"), shape=[TOKENS, 1])
        s = F.where(rows >= F.arange(start=0, stop=TOKENS, dtype="int64"), s, -math.inf)
        return F.matmul(F.softmax(s, axis=-1), v)

    def attention_step(attention):
        def step(q, k, v):
            loss = F.sum(F.square(attention(q, k, v)))
            return (loss, *of.grad(loss, [q, k, v]))
        return step

    fused = attention_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    steps = {"encoder step, causal": (causal_step, (x,)), "encoder step, padding mask": (padded_step, (x, padding)),
             "attention fwd+bwd, fused op": (fused, (q, k, v)),
             "attention fwd+bwd, composed of ops": (attention_step(composed), (q, k, v))}
    return [variant(name, of.compile(fn) if compiled else fn, args) for name, (fn, args) in steps.items()]


def torch_variants() -> list:
    torch = load_torch()
    TF = torch.nn.functional
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
    model.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in opforge_encoder().state_dict().items()})
    params = list(model.parameters())
    x, padding, qkv = inputs()
    x, padding = torch.from_numpy(x), torch.from_numpy(padding)
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in qkv)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(TOKENS)

    def causal_step(x):  # torch takes is_causal as a hint beside the mask
        loss = model(x, mask=causal, is_causal=True).square().mean()
        return (loss, *torch.autograd.grad(loss, params))

    def padded_step(x, padding):
        loss = model(x, src_key_padding_mask=padding).square().mean()
        return (loss, *torch.autograd.grad(loss, params))

    allowed = torch.ones(TOKENS, TOKENS, dtype=torch.bool).tril()

    def composed(q, k, v):
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        return torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1) @ v

    def attention_step(attention):
        def step(q, k, v):
            loss = attention(q, k, v).square().sum()
            return (loss, *torch.autograd.grad(loss, [q, k, v]))
        return step

    fused = attention_step(lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True))
    steps = {"encoder step, causal": (causal_step, (x,)), "encoder step, padding mask": (padded_step, (x, padding)),
             "attention fwd+bwd, fused op": (fused, (q, k, v)),
             "attention fwd+bwd, composed of ops": (attention_step(composed), (q, k, v))}
    return [variant(name, fn, args) for name, (fn, args) in steps.items()]


def variant(name, step, args) -> Variant:
    def check():
        loss, *grads = step(*args)
        return {"loss": scalar(loss), "grads²": sq(list(grads))}

    return Variant(name, lambda: step(*args), check=check)


def variants(framework: str, quick: bool) -> list[Variant]:
    if framework in ("opforge", "opforge.compiled"):
        return opforge_variants(framework == "opforge.compiled")
    if framework == "torch":
        return torch_variants()
    raise unknown(framework, "transformer")
