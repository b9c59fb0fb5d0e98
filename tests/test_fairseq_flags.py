"""fairseq's Transformer flags on the plugin's Transformers (``fusion_transformer``, ``dense_transformer``) do
what they do on fairseq's ``transformer``, or are refused naming the flag: none is taken and ignored."""

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

    def __init__(self, src_vocab=30, tgt_vocab=20):
        self.src_dict, self.tgt_dict = dictionary_of_size(src_vocab), dictionary_of_size(tgt_vocab)
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
