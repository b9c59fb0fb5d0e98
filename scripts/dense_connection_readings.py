#!/usr/bin/env python
"""Scale of Dou et al.'s dense connection (Eq. 4) under each reading, from the same vanilla weights.

Builds ``fusion_transformer`` (Transformer-Base unless ``--model-flags`` say otherwise) as the vanilla
model and once per ``--dense-connection`` reading with ``--aggregate-encoder dense --aggregate-decoder
dense``, each with the vanilla model's weights (dense connection has no parameters of its own); one
teacher-forced forward pass in eval mode on a random batch gives, per model: the mean L2 norm of the top
encoder and decoder states, the standard deviation of the logits relative to the vanilla model's, the
mean max-softmax probability and how often the most probable word is the decoder's own input word.
Forward only; about half a minute on one CPU core at Transformer-Base size.

    python scripts/dense_connection_readings.py                      # Transformer-Base, vocabulary 32k
    python scripts/dense_connection_readings.py --model-flags "--encoder-layers 3 --decoder-layers 3"
"""

import argparse
import os
import sys

import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_fairseq.modules.layer_aggregation import DENSE_CONNECTION_READINGS  # noqa: E402 (registers the models)
from fusion_lab.analysis import UsageError, format_matrix  # noqa: E402
from fusion_lab.benchmark import build_model, split_flags  # noqa: E402
from fusion_lab.common import dictionary_of_size  # noqa: E402

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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-flags", default="", help="extra fairseq model flags (default: Transformer-Base)")
    args = parser.parse_args(argv)
    torch.manual_seed(1)
    dictionary = dictionary_of_size(32000)  # joined, with shared embeddings
    try:
        flags = ["--share-all-embeddings", *split_flags(args.model_flags, "--model-flags")]
        if any(flag.split("=", 1)[0] == "--arch" for flag in flags):
            raise UsageError(f"--model-flags {args.model_flags!r}: the architecture is {ARCH} (the readings are its "
                             "--dense-connection values); give its flags only")
        vanilla = build_model(ARCH, flags, dictionary)[2].eval()
    except UsageError as error:
        parser.error(str(error))
    src, prev = torch.randint(dictionary.nspecial, len(dictionary), (2, 16, 25))  # 16 sentences of 25 tokens
    prev[:, 0] = dictionary.eos()
    rows = [("vanilla", measure(vanilla, src, prev))]
    for reading in DENSE_CONNECTION_READINGS:
        dense = build_model(ARCH, flags + ["--aggregate-encoder", "dense", "--aggregate-decoder", "dense",
                                           "--dense-connection", reading], dictionary)[2].eval()
        dense.load_state_dict(vanilla.state_dict())
        rows.append((f"dense {reading}", measure(dense, src, prev)))
    base_std = rows[0][1]["logit_std"]
    table = [[f"{row['encoder_norm']:.1f}", f"{row['decoder_norm']:.1f}", f"{row['logit_std'] / base_std:.2f}",
              f"{row['max_prob']:.3f}", f"{row['copies_input']:.3f}"] for _, row in rows]
    print(format_matrix("scale of the top states and logits, all models with the vanilla weights", table,
                        [name for name, _ in rows], ["enc norm", "dec norm", "logit std / vanilla", "mean max p",
                                                     "argmax = input"], cell=str, corner="model"))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
