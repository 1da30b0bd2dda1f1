"""The Transformer family as PyTorch has it: ``TransformerEncoderLayer``, ``TransformerDecoderLayer``,
``TransformerEncoder``, ``TransformerDecoder`` and ``Transformer``, with torch's constructors, defaults, forward
contracts, submodule names (so a torch ``state_dict`` loads) and initialisation.

Attention is ``MultiheadAttention`` called with ``need_weights=False``, so without dropout (or in eval mode) it
runs as one fused ``dot_product_attention`` op per layer (``F.scaled_dot_product_attention``). Masks mean what
they mean in torch: a boolean mask is True where attending is *not* allowed, a float mask is added to the scores;
``src_mask``/``tgt_mask``/``memory_mask`` are (L, S) or (N·nhead, L, S), the ``*_key_padding_mask``s (N, S).
``is_causal`` (``tgt_is_causal``, ...) is a hint in torch that the mask given is the causal one; here it applies
the causal mask itself, with or without a mask (torch requires the mask with it), so a correct hint gives torch's
result and no mask is needed.

Differences, on purpose: torch's ``TransformerEncoder`` has an inference fast path (eval mode, no gradient,
``enable_nested_tensor``, a ``src_key_padding_mask``) that returns zeros at padded positions; here those positions
are computed as in torch's other paths (the values there are not meaningful in either). ``enable_nested_tensor``
and ``mask_check`` are accepted for that reason and change nothing.
"""

from __future__ import annotations

import copy

import numpy as np

from .. import ops as F
from ..core.errors import ArgumentError, ShapeError, describe
from ..tensor import Tensor
from . import init
from .layers import Dropout, LayerNorm, Linear, MultiheadAttention, _count, _dtype, _on_device
from .module import Module, ModuleList


def _activation(activation, layer: str):
    """torch's choices: "relu", "gelu" or any callable (a function or a module, which is then a submodule)."""
    if isinstance(activation, str):
        if activation in ("relu", "gelu"):
            return getattr(F, activation)
        raise ArgumentError(f"{layer}(): activation should be relu/gelu, not {activation}")
    if not callable(activation):
        raise ArgumentError(f"{layer}(): activation must be 'relu', 'gelu' or a callable, got {describe(activation)}")
    return activation


def _dropout(p, layer: str) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ArgumentError(f"{layer}(): dropout must be a probability in [0, 1], got {p!r}")
    return float(p)


def _clones(layer, num_layers: int, owner: str) -> ModuleList:
    """``num_layers`` independent copies of ``layer`` (torch's ``_get_clones``: the layer given is not one of them,
    and every copy starts from its weights)."""
    if not isinstance(layer, Module):
        raise ArgumentError(f"{owner}(): expected a layer (a Module) to copy, got {describe(layer)}")
    return ModuleList([copy.deepcopy(layer) for _ in range(_count(num_layers, "num_layers", owner))])


class _Layer(Module):
    """What the encoder and decoder layers share: the feed-forward block, the norms and dropouts, the activation."""

    def __init__(self, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                 norm_first, bias, dtype, norms: int):
        super().__init__()
        name = type(self).__name__
        d_model, dim_feedforward = _count(d_model, "d_model", name), _count(dim_feedforward, "dim_feedforward", name)
        dropout = _dropout(dropout, name)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            dtype=dtype)
        if norms == 3:  # the decoder attends to the encoder's output too
            self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                     batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = bool(norm_first)
        for i in range(1, norms + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        for i in range(1, norms + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = _activation(activation, name)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x, dropout):
        return dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoderLayer(_Layer):
    """Self-attention, then a feed-forward block (linear1 → activation → linear2), each with a residual connection
    and a LayerNorm: after it (``norm_first=False``, torch's default: "Attention Is All You Need") or before it.
    Inputs (S, N, E), (N, S, E) with ``batch_first=True``, or (S, E) unbatched."""

    @_on_device
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation=F.relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, dtype=None):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, dtype, norms=2)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x), self.dropout2)
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x, self.dropout2))


class TransformerDecoderLayer(_Layer):
    """Self-attention over the target, attention to the encoder's output (``memory``), then a feed-forward block,
    each with a residual connection and a LayerNorm (after it, or before it with ``norm_first=True``)."""

    @_on_device
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation=F.relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, dtype=None):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, dtype, norms=3)

    def _mha_block(self, x, memory, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(x)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False, memory_is_causal: bool = False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x), self.dropout3)
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff_block(x, self.dropout3))


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` (``layers.0`` ...), then ``norm`` if given."""

    def __init__(self, encoder_layer, num_layers: int, norm=None, enable_nested_tensor: bool = True,
                 mask_check: bool = True):
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers, "TransformerEncoder")
        self.num_layers = len(self.layers)
        self.norm = norm
        # Accepted as torch's, and change nothing: there are no nested tensors here (see the module's docstring).
        self.enable_nested_tensor, self.mask_check = bool(enable_nested_tensor), bool(mask_check)

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool | None = None):
        # torch guesses is_causal=None from the mask's values: a speed hint only, as the mask is applied anyway.
        for layer in self.layers:
            src = layer(src, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return src if self.norm is None else self.norm(src)


class TransformerDecoder(Module):
    """``num_layers`` copies of ``decoder_layer`` (``layers.0`` ...), then ``norm`` if given."""

    def __init__(self, decoder_layer, num_layers: int, norm=None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers, "TransformerDecoder")
        self.num_layers = len(self.layers)
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool | None = None, memory_is_causal: bool = False):
        for layer in self.layers:
            tgt = layer(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return tgt if self.norm is None else self.norm(tgt)


class Transformer(Module):
    """The encoder-decoder of "Attention Is All You Need", as torch's: ``encoder`` (``num_encoder_layers`` layers
    and a final LayerNorm) reads ``src``, ``decoder`` reads ``tgt`` and the encoder's output. Every parameter of
    more than one dim is re-initialised with Xavier's uniform (torch's ``_reset_parameters``)."""

    @_on_device
    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1, activation=F.relu,
                 custom_encoder=None, custom_decoder=None, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, dtype=None):
        super().__init__()
        layer = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(TransformerEncoderLayer(*layer, dtype=dtype), num_encoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(TransformerDecoderLayer(*layer, dtype=dtype), num_decoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        self._reset_parameters()
        self.d_model, self.nhead, self.batch_first = d_model, nhead, bool(batch_first)

    def _reset_parameters(self) -> None:
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal: bool | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False):
        batch = 0 if self.batch_first else 1
        if len(src.shape) == 3 and (len(tgt.shape) != 3 or src.shape[batch] != tgt.shape[batch]):
            raise ShapeError(f"Transformer: the batch number of src and tgt must be equal (batch_first="
                             f"{self.batch_first}); got shapes {tuple(src.shape)} and {tuple(tgt.shape)}")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ShapeError(f"Transformer: the feature number of src and tgt must be equal to d_model "
                             f"({self.d_model}); got shapes {tuple(src.shape)} and {tuple(tgt.shape)}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """The (sz, sz) causal float mask: -inf above the diagonal (a later position), 0 elsewhere."""
        sz = _count(sz, "sz", "Transformer.generate_square_subsequent_mask", 0)
        return Tensor(np.triu(np.full((sz, sz), -np.inf), 1), dtype=_dtype(dtype), device=device)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, nhead={self.nhead}, batch_first={self.batch_first}"
