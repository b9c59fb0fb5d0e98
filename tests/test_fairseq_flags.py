"""fairseq's flags on the plugin's models do what they do on fairseq's ``transformer``, or are refused naming the
flag: none is taken and ignored. The Transformer's flags on ``fusion_transformer`` and ``dense_transformer``;
``fairseq-generate``'s retained dropout on every model's own dropouts."""

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from model_building import dictionary_of_size, parse_model_args

TINY = ("--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2")
MODELS = {"transformer": (), "fusion_transformer": (), "dense_transformer": ("--growth-dim", "8")}


class TranslationTaskDictionaries:
    """What a model's ``build_model`` reads of fairseq's translation task: its dictionaries, as attributes
    (``src_dict``, ``tgt_dict``) behind the task's properties."""

    def __init__(self, src_vocab=30, tgt_vocab=20, joined=False):
        self.src_dict = dictionary_of_size(src_vocab)
        self.tgt_dict = self.src_dict if joined else dictionary_of_size(tgt_vocab)
        if not joined:
            self.tgt_dict.add_symbol("target-only")

    @property
    def source_dictionary(self):
        return self.src_dict

    @property
    def target_dictionary(self):
        return self.tgt_dict


def build(arch, *flags, task=None):
    args = parse_model_args(arch, *TINY, *MODELS[arch], *flags)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task or TranslationTaskDictionaries())


def logits(model, target_vocab):
    model.eval()
    src = torch.randint(4, 20, (2, 5), generator=torch.Generator().manual_seed(0))
    prev = torch.randint(4, target_vocab, (2, 4), generator=torch.Generator().manual_seed(1))
    return model(src, torch.full((2,), 5), prev)[0]


@pytest.mark.parametrize("arch", MODELS)
def test_decoder_output_dim_given_as_text_is_the_output_width(arch):
    """fairseq's parser keeps --decoder-output-dim as text (its default names another field)."""
    model = build(arch, "--decoder-output-dim", "8")
    assert model.decoder.output_projection.weight.shape == (21, 8)
    assert logits(model, 20).shape == (2, 4, 21)


@pytest.mark.parametrize("arch", ["fusion_transformer", "dense_transformer"])
@pytest.mark.parametrize("value", ["0", "wide"])
def test_a_bad_decoder_output_dim_is_refused_naming_it(arch, value):
    with pytest.raises(ValueError, match=f"^--decoder-output-dim must be a positive integer, got '{value}'$"):
        build(arch, "--decoder-output-dim", value)


@pytest.mark.parametrize("arch", MODELS)
def test_merged_source_and_target_embeddings_are_one_table_over_both_dictionaries(arch):
    task = TranslationTaskDictionaries(src_vocab=30, tgt_vocab=20)
    model = build(arch, "--merge-src-tgt-embed", task=task)
    assert model.encoder.embed_tokens is model.decoder.embed_tokens
    assert task.target_dictionary is task.source_dictionary and len(task.source_dictionary) == 31  # the target's own word added
    assert model.decoder.output_projection.weight is model.encoder.embed_tokens.weight
    assert logits(model, 20).shape[-1] == len(task.source_dictionary)


@pytest.mark.parametrize("arch,flags,message", [
    ("fusion_transformer", ("--encoder-layers", "3", "--decoder-layers", "3", "--multi-layer-attention", "2",
                            "--cross-self-attention"),
     "--multi-layer-attention 2 attends the decoder's lower layers over the target only and does not support "
     "--cross-self-attention"),
    ("dense_transformer", ("--cross-self-attention",), "--cross-self-attention True is not supported"),
    ("dense_transformer", ("--no-cross-attention",), "--no-cross-attention True is not supported"),
    ("dense_transformer", ("--quant-noise-pq", "0.1"), "--quant-noise-pq 0.1 is not supported"),
])
def test_flags_a_model_cannot_honour_are_refused_naming_them(arch, flags, message):
    with pytest.raises(ValueError, match=message):
        build(arch, *flags)


def retaining(model, modules):
    """``model`` as ``fairseq-generate --retain-dropout --retain-dropout-modules MODULES`` prepares it."""
    from types import SimpleNamespace

    generation = SimpleNamespace(retain_dropout=True, retain_dropout_modules=modules, beam=5, no_beamable_mm=False,
                                 print_alignment=False)
    model.eval()
    model.prepare_for_inference_(SimpleNamespace(generation=generation))
    return model


@pytest.mark.parametrize("arch,flags,module", [
    ("layerwise_coordination", ("--dropout", "0.3"), "CoordinationLayer"),
    ("layerwise_coordination", ("--dropout", "0.3"), "CoordinationEmbedding"),
    ("layerwise_coordination", ("--attention-dropout", "0.3"), "MixedAttention"),
    ("fusion_transformer", ("--fuse-decoder", "fnn", "--fusion-dropout", "0.3"), "FeedForward"),
    ("fusion_transformer", ("--aggregate-decoder", "hierarchical", "--dropout", "0.3"), "AggregationNode"),
    ("fusion_transformer", ("--layer-attention", "fine", "--layer-attention-dropconnect", "0.3"), "LayerAttention"),
    ("fusion_transformer", ("--surface-fusion", "hard", "--surface-fusion-variant", "released", "--dropout", "0.3"),
     "SurfaceFusion"),
])
def test_retained_dropout_reaches_the_plugins_own_modules(arch, flags, module):
    """Monte-Carlo dropout at generation (--retain-dropout[-modules]) keeps the plugin's dropouts on, as it keeps
    fairseq's; unretained, two passes agree."""
    tiny = TINY if arch != "layerwise_coordination" else ("--layers", "2", "--embed-dim", "16", "--ffn-embed-dim",
                                                           "32", "--attention-heads", "2")
    args = parse_model_args(arch, *tiny, *flags)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, TranslationTaskDictionaries(30, joined=True))
    torch.manual_seed(0)
    with torch.no_grad():
        assert torch.equal(logits(model, 30), logits(model, 30))
        retaining(model, [module])
        assert not torch.equal(logits(model, 30), logits(model, 30))
