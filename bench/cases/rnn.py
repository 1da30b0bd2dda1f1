"""10. Recurrent layers (issue 28): a 2-layer LSTM and a 2-layer GRU, hidden 256, input 256, 35 steps of a batch of
20 (a word-level language model's shape), forward and backward: the loss ⟨output, u⟩ for a fixed u, and the gradients
of every parameter (the input needs none). Every framework starts from the same float32 weights, torch's layout
(its state dict loaded into opforge's layer)."""

from __future__ import annotations

import numpy as np

from .common import Variant, load_torch, scalar, sq, unknown

TITLE = "10. LSTM and GRU, 2 layers × 256, 35 steps × batch 20, forward + backward (float32)"
UNIT = "ms"
FRAMEWORKS = ("opforge", "opforge.compiled", "torch")
REFERENCES = ("torch",)

LAYERS, HIDDEN, INPUT, STEPS, BATCH = 2, 256, 256, 35, 20
MODES = ("LSTM", "GRU")


def init(mode: str, seed: int = 0):
    """(state dict as NumPy arrays in torch's names, x (T, N, I), u (T, N, H)): weights U(±1/√H) as torch's."""
    rng = np.random.default_rng(seed)
    gates = {"LSTM": 4, "GRU": 3}[mode] * HIDDEN
    bound = 1 / np.sqrt(HIDDEN)
    state = {}
    for layer in range(LAYERS):
        fan_in = INPUT if layer == 0 else HIDDEN
        for name, shape in ((f"weight_ih_l{layer}", (gates, fan_in)), (f"weight_hh_l{layer}", (gates, HIDDEN)),
                            (f"bias_ih_l{layer}", (gates,)), (f"bias_hh_l{layer}", (gates,))):
            state[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    x = rng.standard_normal((STEPS, BATCH, INPUT)).astype(np.float32)
    u = rng.standard_normal((STEPS, BATCH, HIDDEN)).astype(np.float32) / (STEPS * BATCH)
    return state, x, u


def opforge_step(mode: str, compiled: bool):
    import opforge as of
    from opforge import nn
    from opforge import ops as F

    state, x, u = init(mode)
    layer = getattr(nn, mode)(INPUT, HIDDEN, LAYERS)
    layer.load_state_dict(state)
    params = list(layer.parameters())

    def step(x, u):
        loss = F.sum(layer(x)[0] * u)
        return (loss, *of.grad(loss, params))

    fn = of.compile(step) if compiled else step
    x, u = of.tensor(x), of.tensor(u)
    return lambda: fn(x, u)


def torch_step(mode: str):
    torch = load_torch()
    state, x, u = init(mode)
    layer = getattr(torch.nn, mode)(INPUT, HIDDEN, LAYERS)
    layer.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    params = list(layer.parameters())
    x, u = torch.from_numpy(x), torch.from_numpy(u)

    def step():
        loss = (layer(x)[0] * u).sum()
        return (loss, *torch.autograd.grad(loss, params))

    return step


def check(step):
    return lambda: (lambda out: {"loss": scalar(out[0]), "grad²": sq(list(out[1:]))})(step())


def variants(framework: str, quick: bool) -> list[Variant]:
    out = []
    for mode in MODES:
        if framework in ("opforge", "opforge.compiled"):
            step = opforge_step(mode, framework == "opforge.compiled")
        elif framework == "torch":
            step = torch_step(mode)
        else:
            raise unknown(framework, "rnn")
        out.append(Variant(f"{mode} forward+backward", step, check=check(step)))
    return out
