#!/usr/bin/env python
"""Scale of Dou et al.'s dense connection (Eq. 4) under each reading, from the same vanilla weights.

Builds ``fusion_transformer`` (Transformer-Base unless ``--model-flags`` say otherwise) once as
the vanilla model and once per ``--dense-connection`` reading with ``--aggregate-encoder dense
--aggregate-decoder dense``, gives every one the vanilla model's weights (dense connection has
no parameters of its own), runs one teacher-forced forward pass in eval mode on a random batch
and prints, per model: the mean L2 norm of the top encoder and decoder states, the standard
deviation of the logits relative to the vanilla model's, the mean max-softmax probability and
how often the most probable word is the decoder's own input word.
Forward only; about half a minute on one CPU core at Transformer-Base size.

    python scripts/dense_connection_readings.py                      # Transformer-Base, vocabulary 32k
    python scripts/dense_connection_readings.py --model-flags "--encoder-layers 3 --decoder-layers 3"
"""

import argparse
import os
import shlex
import sys

import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_fairseq.modules.layer_aggregation import DENSE_CONNECTION_READINGS  # noqa: E402 (registers the models)
from fusion_fairseq.tools.benchmark import build_model  # noqa: E402
from fusion_fairseq.tools.common import dictionary_of_size  # noqa: E402

ARCH = "fusion_transformer"


@torch.no_grad()
def measure(model, src_tokens, prev_output_tokens) -> dict:
    lengths = torch.full((src_tokens.size(0),), src_tokens.size(1), dtype=torch.long)
    encoder_out = model.encoder(src_tokens, src_lengths=lengths)
    features, _ = model.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=True)
    logits = model.decoder.output_layer(features)
    return {
        "encoder_norm": encoder_out["encoder_out"][0].norm(dim=-1).mean().item(),
        "decoder_norm": features.norm(dim=-1).mean().item(),
        "logit_std": logits.std().item(),
        "max_prob": logits.softmax(dim=-1).max(dim=-1).values.mean().item(),
        # the most probable word is the decoder's own input word: the embedding dominates the state
        "copies_input": (logits.argmax(dim=-1) == prev_output_tokens).float().mean().item(),
    }


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-flags", default="", help="extra fairseq model flags (default: Transformer-Base)")
    parser.add_argument("--vocab", type=int, default=32000, help="joined vocabulary size (shared embeddings)")
    parser.add_argument("--batch", type=int, default=16, help="sentences in the random batch")
    parser.add_argument("--length", type=int, default=25, help="source and target length")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def main(argv=None):
    settings = parse(argv)
    torch.manual_seed(settings.seed)
    dictionary = dictionary_of_size(settings.vocab)
    flags = ["--share-all-embeddings", *shlex.split(settings.model_flags)]
    vanilla = build_model(ARCH, flags, dictionary)[2].eval()
    src = torch.randint(dictionary.nspecial, len(dictionary), (settings.batch, settings.length))
    prev = torch.randint(dictionary.nspecial, len(dictionary), (settings.batch, settings.length))
    prev[:, 0] = dictionary.eos()
    rows = [("vanilla", measure(vanilla, src, prev))]
    for reading in DENSE_CONNECTION_READINGS:
        dense = build_model(ARCH, flags + ["--aggregate-encoder", "dense", "--aggregate-decoder", "dense",
                                           "--dense-connection", reading], dictionary)[2].eval()
        dense.load_state_dict(vanilla.state_dict())
        rows.append((f"dense {reading}", measure(dense, src, prev)))
    base_std = rows[0][1]["logit_std"]
    print(f"{'model':<16} {'enc norm':>9} {'dec norm':>9} {'logit std / vanilla':>20} {'mean max p':>11} "
          f"{'argmax = input':>15}")
    for name, row in rows:
        print(f"{name:<16} {row['encoder_norm']:9.1f} {row['decoder_norm']:9.1f} "
              f"{row['logit_std'] / base_std:20.2f} {row['max_prob']:11.3f} {row['copies_input']:15.3f}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
