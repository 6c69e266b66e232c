"""What the encoder and decoder stacks share (paper §3.1, §3.4, §3.5, §5.4).

Both stacks read ``x = Dropout(sqrt(d_model) * Embed(tokens) + PE(positions))``, run N
identical layers, and end with one more LayerNorm when the layers are pre-norm. The encoder and
the decoder inherit this once and add only what differs: the decoder's masks, incremental
decoding and pre-softmax linear.

fairseq's stack-level training options live here too, each off by default and then costing
nothing: a LayerNorm on the embeddings, no positional encoding, no final LayerNorm, LayerDrop
(Fan et al. 2019: whole layers skipped at random while training), activation checkpointing
(each layer's activations recomputed in the backward pass, optionally kept on the CPU), FSDP
wrapping of each layer, and quantization noise on the layers' linear weights (Fan et al. 2020).

``--compile-layers`` runs every layer of a training forward pass through ``torch.compile``
(:meth:`TransformerStack.run_layer`): inductor fuses each layer's elementwise work (dropout,
residual additions, LayerNorm, ReLU) into a few kernels, where eager PyTorch launches one per
operation. The layers of a stack share their code, so they share the compiled graph (their
weights are its inputs); shapes are dynamic from the start, so a new batch shape does not
compile again. Decoding, and any call that wants attention weights, stays eager. Compiled
dropout draws its masks from inductor's generator: other masks than eager's, the same law.
"""

from __future__ import annotations

import math
from typing import Any, Callable, List

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.modules import LayerDropModuleList
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor, nn

from ..modules.dropout import dropout
from ..modules.quant_noise import add_quant_noise
from .transformer_config import StackConfig


class TransformerStack:
    """Embedding, N layers and the final LayerNorm of one stack (a mixin of the fairseq
    encoder / decoder classes; parameter names are ``embed_tokens``, ``embed_positions``,
    ``layernorm_embedding``, ``layers.<i>`` and ``layer_norm``, as fairseq's ``transformer``)."""

    stack: StackConfig
    layers: nn.ModuleList

    def build_stack(
        self,
        stack: StackConfig,
        embed_tokens: nn.Embedding,
        blocks,
        build_layer: Callable[[StackConfig], nn.Module],
    ) -> None:
        """Create the stack's modules (call from ``__init__`` after the fairseq base class's).

        ``blocks`` (a :class:`~.blocks.TransformerBlocks`) builds the positional encoding
        (``build_positional_encoding(stack)``); ``build_layer(stack)`` one layer.
        """
        self.stack = stack
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(stack.embed_dim) if stack.scale_embedding else 1.0
        self.embed_positions = (blocks.build_positional_encoding(stack)
                                if stack.token_positions else None)
        self.layernorm_embedding = (nn.LayerNorm(stack.embed_dim)
                                    if stack.layernorm_embedding else None)
        self.dropout = stack.dropout
        layers = [self._prepare_layer(build_layer(stack), stack) for _ in range(stack.layers)]
        self.layers = (LayerDropModuleList(stack.layerdrop, layers) if stack.layerdrop > 0
                       else nn.ModuleList(layers))
        self.layer_norm = (nn.LayerNorm(stack.embed_dim)
                           if stack.normalize_before and stack.final_norm else None)
        # the compiled callables of the layers, made on first use; a plain list, so that they
        # are no submodules (the state dict and the parameters stay the layers' own)
        self._compiled_layers: List[Any] = []

    def run_layer(self, index: int, layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
        """``layer(*args, **kwargs)``: compiled (``--compile-layers``) in a training forward
        pass that computes gradients, eager otherwise."""
        if not (self.stack.compile_layers and self.training and torch.is_grad_enabled()):
            return layer(*args, **kwargs)
        compiled = {id(c._orig_mod): c for c in self._compiled_layers}
        function = compiled.get(id(layer))
        if function is None:
            function = torch.compile(layer, dynamic=True)
            self._compiled_layers.append(function)
        return function(*args, **kwargs)

    @staticmethod
    def _prepare_layer(layer: nn.Module, stack: StackConfig) -> nn.Module:
        """Apply the training options that act on a whole layer, as fairseq's transformer does:
        quantization noise on its linear weights, activation checkpointing (offloading), and
        FSDP wrapping (every checkpointed layer; others from ``--min-params-to-wrap`` up; a
        no-op outside ``--ddp-backend fully_sharded``)."""
        if stack.quant_noise_pq > 0:
            linears: List[nn.Module] = [m for m in layer.modules() if isinstance(m, nn.Linear)]
            for linear in linears:
                add_quant_noise(linear, stack.quant_noise_pq, stack.quant_noise_pq_block_size)
        if stack.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=stack.offload_activations)
        min_params = 0 if stack.checkpoint_activations else stack.min_params_to_wrap
        return fsdp_wrap(layer, min_num_params=min_params)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """``Dropout(sqrt(d_model) * Embed(tokens) + PE(positions))`` (§3.4, §3.5, §5.4)."""
        x = self.embed_scale * self.embed_tokens(tokens)
        if self.embed_positions is not None:
            x = x + self.embed_positions(positions).to(x)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return dropout(x, self.dropout, self.training)

    def final_norm(self, x: Tensor) -> Tensor:
        """The last LayerNorm of a pre-norm stack; post-norm layers already end normalized."""
        return x if self.layer_norm is None else self.layer_norm(x)

    def max_positions(self) -> int:
        return self.stack.max_positions
