"""Layer-wise coordination between encoder and decoder (He et al., NeurIPS 2018).

One stack of N layers serves both languages (with sharing, the default, the very same modules):
source layer i is ``layers[i].encode`` over the source states of layer i-1; target layer i is
``layers[i].decode``, a mixed attention over the source states of layer i-1 and the target states of
layer i-1 up to the position itself (Eq. 3). Source and target are numbered from zero separately
(resettable positions); a learned language embedding marks each position's side. The source states
are projected to keys/values once per sentence; each new target token costs one position of the stack.
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.dataclass import FairseqDataclass
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel, FairseqIncrementalDecoder
from fairseq.models.transformer import Embedding
from omegaconf import II

from fusion_fairseq.modules.coordination_layer import CoordinationLayer
from fusion_fairseq.modules.resettable_positions import position_embedding, sinusoidal_positions
from fusion_fairseq.registry import register_model, register_model_architecture

from fusion_fairseq.errors import ConfigurationError

from fusion_fairseq.config_fields import (
    POSITIVE_INT, PROBABILITY, FlagsOfConfig, as_namespace, check_values, fill_defaults, flag, set_defaults,
)

SOURCE, TARGET = 0, 1


class CoordinationEmbedding(nn.Module):
    """Token embedding (scaled by sqrt(d)) + resettable sinusoidal position + language embedding,
    then dropout. Shared by both sides (one vocabulary)."""

    def __init__(self, embed_tokens: nn.Embedding, dropout: float, use_positions: bool, use_language: bool,
                 scale: bool = True):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.padding_idx = embed_tokens.padding_idx
        self.dim = embed_tokens.embedding_dim
        self.scale = math.sqrt(self.dim) if scale else 1.0
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        self.use_positions = use_positions
        self.language = None
        if use_language:
            self.language = nn.Embedding(2, self.dim)
            nn.init.normal_(self.language.weight, mean=0, std=self.dim ** -0.5)

    def forward(self, tokens: Tensor, side: int, positions: Optional[Tensor] = None) -> Tensor:
        """``positions``: explicit position numbers (incremental decoding); by default the
        non-padding tokens of each row are numbered from zero."""
        x = self.scale * self.embed_tokens(tokens)
        if self.use_positions:
            table = (position_embedding(tokens, self.padding_idx, self.dim) if positions is None
                     else sinusoidal_positions(positions, self.dim))
            x = x + table.type_as(x)
        if self.language is not None:
            x = x + self.language.weight[side]
        return self.dropout_module(x)


class CoordinationEncoder(FairseqEncoder):
    """The source side: the states of layers 0..N-1, which the target's layers 1..N read. The
    top source layer would feed nothing, so it is not run (nor built without sharing)."""

    def __init__(self, dictionary, embedding: CoordinationEmbedding, layers: nn.ModuleList, num_target_layers: int,
                 max_positions: int):
        super().__init__(dictionary)
        self.embedding = embedding
        self.layers = layers
        self.padding_idx = embedding.padding_idx
        self.num_source_layers = min(len(layers), num_target_layers - 1)
        self._max_positions = max_positions

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False):
        padding_mask = src_tokens.eq(self.padding_idx)
        allowed = ~padding_mask[:, None, None, :]
        states = [self.embedding(src_tokens, SOURCE)]
        for layer in self.layers[:self.num_source_layers]:
            states.append(layer.encode(states[-1], allowed))
        return {
            "encoder_out": [states[-1].transpose(0, 1)],  # T x B x C, as fairseq encoders
            "encoder_padding_mask": [padding_mask],
            "encoder_states": states,  # B x T x C, the inputs of target layers 1..N
        }

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        """Along the batch: the second dimension of ``encoder_out`` (T x B x C), the first of the others."""
        return {name: [tensor.index_select(1 if name == "encoder_out" else 0, new_order) for tensor in tensors]
                for name, tensors in encoder_out.items()}

    def max_positions(self):
        return self._max_positions


class CoordinationDecoder(FairseqIncrementalDecoder):
    """The target side: layer i attends to source layer i-1 and target layer i-1 together.

    ``extra["mixed_attn"]`` holds the mixed-attention weights of layer ``alignment_layer`` (by
    default the top layer, as fairseq's Transformer decoder: fairseq's generator asks for
    ``--print-alignment`` without naming a layer) over [source ; target] positions averaged over
    heads, ``(batch, tgt, src + tgt)``; ``extra["attn"]`` their source part, as fairseq's
    alignment expects.
    """

    def __init__(self, dictionary, embedding: CoordinationEmbedding, layers: nn.ModuleList,
                 final_layer_norm: Optional[nn.LayerNorm], max_positions: int):
        super().__init__(dictionary)
        self.embedding = embedding
        self.layers = layers
        self.final_layer_norm = final_layer_norm
        self._max_positions = max_positions

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, features_only: bool = False,
                alignment_layer: Optional[int] = None, **unused):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state, alignment_layer)
        return (x if features_only else self.output_layer(x)), extra

    def output_layer(self, features):
        return F.linear(features, self.embedding.embed_tokens.weight)

    def extract_features(self, prev_output_tokens, encoder_out, incremental_state=None,
                         alignment_layer: Optional[int] = None, **unused):
        if alignment_layer is None:
            alignment_layer = len(self.layers) - 1
        # the (keys, values) of each layer: "source", projected at the first step, and "target", the positions so far
        cache = self.get_incremental_state(incremental_state, "coordination") or {}
        source_allowed = ~encoder_out["encoder_padding_mask"][0][:, None, None, :]
        source_memory = cache.get("source") or [layer.project_memory(state)
                                                for layer, state in zip(self.layers, encoder_out["encoder_states"])]
        if incremental_state is None:
            x = self.embedding(prev_output_tokens, TARGET)
            length = prev_output_tokens.size(1)
            target_allowed = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()[None, None]
        else:
            positions = torch.full_like(prev_output_tokens[:, -1:], prev_output_tokens.size(1) - 1)
            x = self.embedding(prev_output_tokens[:, -1:], TARGET, positions)
            target_allowed = None
        inner_states, target_memory, mixed_attn = [x], [], None
        for index, (layer, past) in enumerate(zip(self.layers, cache.get("target", [None] * len(self.layers)))):
            x, (keys, values), weights = layer.decode(
                x, source_memory[index], source_allowed, past, target_allowed, need_weights=index == alignment_layer)
            if past is not None:
                keys, values = torch.cat([past[0], keys], dim=2), torch.cat([past[1], values], dim=2)
            target_memory.append((keys, values))
            if weights is not None:
                mixed_attn = weights
            inner_states.append(x)
        memory = {"source": source_memory, "target": target_memory}
        self.set_incremental_state(incremental_state, "coordination", memory)  # nothing without incremental_state
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        attn = None if mixed_attn is None else mixed_attn[:, :, :source_allowed.size(-1)]  # its source part
        # inner_states time-major (views), as fairseq's decoders return them and the layer-diversity criterion reads them
        return x, {"attn": [attn], "mixed_attn": [mixed_attn],
                   "inner_states": [state.transpose(0, 1) for state in inner_states]}

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Follow beam search. As fairseq's encoder-decoder attention does with its cached source
        keys, the cached source memory is reordered only when the number of rows changes: a
        reorder that keeps the size moves hypotheses among the beams of one sentence, which share
        the same source, so copying it every step would only cost time growing with its length."""
        cache = self.get_incremental_state(incremental_state, "coordination")
        if cache is None:
            return
        reordered = {side: [pair if side == "source" and pair[0].size(0) == new_order.size(0)
                            else tuple(tensor.index_select(0, new_order) for tensor in pair) for pair in memory]
                     for side, memory in cache.items()}
        self.set_incremental_state(incremental_state, "coordination", reordered)

    def max_positions(self):
        return self._max_positions


@dataclass
class LayerwiseCoordinationConfig(FairseqDataclass):
    """The flags of ``--arch layerwise_coordination``; defaults: the paper's small configuration
    (d=256, d_ff=1024, 4 heads, 14 layers, Sec. 4.2)."""

    layers: int = flag(14, "depth N of the stack (the same for both sides; paper: 14)",
                       values=POSITIVE_INT, structural=True)
    embed_dim: int = flag(256, "model width d_model", values=POSITIVE_INT, structural=True)
    ffn_embed_dim: int = flag(1024, "d_ff", values=POSITIVE_INT, structural=True)
    attention_heads: int = flag(4, "attention heads", values=POSITIVE_INT, structural=True)
    dropout: float = flag(0.1, "dropout probability, in [0, 1)", values=PROBABILITY)
    attention_dropout: float = flag(0.0, "dropout on attention weights, in [0, 1)", values=PROBABILITY)
    activation_dropout: float = flag(0.0, "dropout after the FFN's activation, in [0, 1)", values=PROBABILITY)
    normalize_before: bool = flag(False, "pre-norm layers (final LayerNorm on top)", structural=True)
    no_scale_embedding: bool = flag(False, "do not scale token embeddings by sqrt(d)", structural=True)
    no_layer_sharing: bool = flag(
        False, "ablation (Table 3): separate source and target layers, the source --layers - 1 of its own",
        structural=True)
    no_mixed_attention: bool = flag(
        False, "ablation (Table 3): separate target self-attention and source attention, the source attention "
        "reading the source layer below, as the mixed attention does", structural=True)
    no_language_embedding: bool = flag(False, "ablation (Table 3): no learned source/target language embedding",
                                       structural=True)
    no_position_embedding: bool = flag(False, "ablation (Table 3): no position embedding", structural=True)
    # the task's flags (no help: no flag of the model's)
    max_source_positions: Optional[int] = II("task.max_source_positions")
    max_target_positions: Optional[int] = II("task.max_target_positions")


@register_model("layerwise_coordination", dataclass=LayerwiseCoordinationConfig)
class LayerwiseCoordinationModel(FlagsOfConfig, FairseqEncoderDecoderModel):
    """He et al. (2018): one shared stack, mixed attention, resettable positions, language embeddings; the
    output projection is the shared embedding matrix (Table 3's 19.07M counts it once)."""

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)
        layerwise_coordination(args)
        check_coordination_args(args, task)
        dictionary = task.source_dictionary
        embedding = CoordinationEmbedding(
            Embedding(len(dictionary), args.embed_dim, dictionary.pad()), args.dropout,
            use_positions=not args.no_position_embedding, use_language=not args.no_language_embedding,
            scale=not args.no_scale_embedding)
        target_layers = build_layers(args, args.layers)
        source_layers = target_layers if not args.no_layer_sharing else build_layers(args, args.layers - 1)
        encoder = CoordinationEncoder(dictionary, embedding, source_layers, args.layers, args.max_source_positions)
        final_layer_norm = nn.LayerNorm(args.embed_dim) if args.normalize_before else None
        decoder = CoordinationDecoder(dictionary, embedding, target_layers, final_layer_norm, args.max_target_positions)
        return cls(encoder, decoder)


def check_coordination_args(args, task) -> None:
    """Raise ``ConfigurationError`` naming the flag, the value and what is allowed: every value (also one read
    from a checkpoint or ``--model-overrides``), then what the shared stack needs."""
    check_values(args, LayerwiseCoordinationConfig)
    if task.source_dictionary != task.target_dictionary:
        raise ConfigurationError(
            "layer-wise coordination shares one stack and one embedding between source and target, which "
            "requires a joined dictionary: binarise with fairseq-preprocess --joined-dictionary")
    if args.embed_dim % args.attention_heads:
        raise ConfigurationError(f"--embed-dim {args.embed_dim} is not divisible by --attention-heads "
                                 f"{args.attention_heads}")
    if args.no_layer_sharing and args.layers < 2:
        raise ConfigurationError(f"--no-layer-sharing gives the source --layers - 1 layers of its own, so it needs "
                                 f"--layers 2 or more; --layers is {args.layers}")


def build_layers(args, count: int) -> nn.ModuleList:
    return nn.ModuleList(
        CoordinationLayer(
            args.embed_dim, args.ffn_embed_dim, args.attention_heads, args.dropout, args.attention_dropout,
            args.activation_dropout, args.normalize_before, mixed=not args.no_mixed_attention)
        for _ in range(count))


@register_model_architecture("layerwise_coordination", "layerwise_coordination_iwslt_de_en")
@register_model_architecture("layerwise_coordination", "layerwise_coordination")
def layerwise_coordination(args):
    """Defaults: the paper's small configuration for IWSLT14 (Sec. 4.2): 14 layers, d=256, d_ff=1024,
    4 heads. Reading: dropout is not given; 0.1 (the Transformer's)."""
    fill_defaults(args, LayerwiseCoordinationConfig)
    args.max_source_positions = getattr(args, "max_source_positions", None) or 1024
    args.max_target_positions = getattr(args, "max_target_positions", None) or 1024


@register_model_architecture("layerwise_coordination", "layerwise_coordination_wmt_en_de")
def layerwise_coordination_wmt_en_de(args):
    """Sec. 5.1 base configuration for WMT14 En-De: d=512, d_ff=2048, 8 heads; reading: 14 layers
    as the other configurations."""
    set_defaults(args, embed_dim=512, ffn_embed_dim=2048, attention_heads=8)
    layerwise_coordination(args)


@register_model_architecture("layerwise_coordination", "layerwise_coordination_wmt_en_de_big")
def layerwise_coordination_wmt_en_de_big(args):
    """Sec. 4.2 big configuration: 14 layers, d=1024, d_ff=2048 (as the paper states), 16 heads; dropout 0.3,
    fairseq's transformer_wmt_en_de_big's (the paper states none)."""
    set_defaults(args, embed_dim=1024, ffn_embed_dim=2048, attention_heads=16, dropout=0.3)
    layerwise_coordination(args)
