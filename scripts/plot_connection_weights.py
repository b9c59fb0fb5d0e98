#!/usr/bin/env python
"""Plot the learned connection weights of DenseFormer, hyper-connections and MUDDFormer in a checkpoint.

DenseFormer (``--denseformer-*``, Pagliardini et al. 2024, as the paper draws them): one row per depth-weighted
average (after layer i), one column per output X_j it may read (j = 0 is the embedding); cells it does not read are
blank. Hyper-connections (``--hyper-connections-*``, Zhu et al. 2025): for every sublayer, the (n+1) x (n+1) matrix
[[0, B], [A_m, A_r]] of its input-independent part (static weights; for mHC the maps at zero dynamic input,
sigmoid(b_pre), 2 sigmoid(b_post) and SinkhornKnopp(b_res)), side by side. MUDDFormer (``--mudd-*``, Xiao et
al. 2025): the weights A_i at zero dynamic input (the static a_i: RMSNorm(0) W_1 = 0), one block per way (query,
key, value, residual) side by side, each with one row per aggregate (after layer i) and one column per output X_j;
the last aggregate has the residual way only. One panel per side that has any of them.

MUDDFormer's weights are dynamic: A_i(X_i) = GELU(RMSNorm(X_i) W_1) W_2 + a_i differs at every position
(Eq. 6). With ``--source`` (and ``--target``, teacher-forced; default: the beam-search translation), two more
panels per MUDD side in the same layout: the mean of A_i over the sentence's positions, and their standard
deviation, which is 0 where a weight does not depend on the input (the static a_i at initialisation).
"""

import os
import sys

import numpy as np
import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_fairseq.modules.depth_weighted_average import DepthWeightedAverage  # noqa: E402
from fusion_fairseq.modules.hyper_connection import HyperConnection, ManifoldHyperConnection, sinkhorn  # noqa: E402
from fusion_fairseq.modules.multiway_dense_connection import WAYS, MultiwayDynamicDense  # noqa: E402
from fusion_lab.analysis import UsageError, heatmap, load_model, positive, pyplot, script_main, script_parser, \
    sentence_pair, write_outputs  # noqa: E402


def connection_matrix(connection) -> np.ndarray:
    """[[0, B], [A_m, A_r]] of the input-independent part of one hyper-connection."""
    n = connection.rate
    if isinstance(connection, HyperConnection):
        alpha, beta = connection.static_alpha, connection.static_beta
    else:
        pre, post, res = connection.bias.split([n, n, n * n])
        alpha = torch.cat([torch.sigmoid(pre)[:, None], sinkhorn(res.view(n, n), order=connection.sinkhorn_order).T],
                          dim=1)
        beta = 2 * torch.sigmoid(post)
    matrix = torch.zeros(n + 1, n + 1)
    matrix[0, 1:], matrix[1:, :] = beta, alpha
    return matrix.detach().float().numpy()


def mudd_matrix(aggregates) -> np.ndarray:
    """The ways' blocks side by side, a blank column after each: ``(L, len(WAYS) * (L + 2))``, from one
    ``(ways, i + 1)`` array of weights per aggregate (the last aggregate's one way is R)."""
    layers = len(aggregates)
    blocks = np.full((len(WAYS), layers, layers + 2), np.nan)
    for row, weights in enumerate(aggregates):
        for way, values in zip(range(len(WAYS) - len(weights), len(WAYS)), weights):
            blocks[way, row, :len(values)] = values
    return np.concatenate(list(blocks), axis=1)


def mudd_stacks(model) -> dict:
    return {side: getattr(model, side).aggregation for side in ("encoder", "decoder")
            if isinstance(getattr(getattr(model, side), "aggregation", None), MultiwayDynamicDense)}


@torch.no_grad()
def sentence_weights(args, model, task) -> dict:
    """The mean and the standard deviation over the positions of ``--source`` (encoder) and its target
    (decoder) of every MUDD aggregate's weights A_i(X_i), recorded as the model computes them."""
    stacks = mudd_stacks(model)
    if not stacks:
        raise UsageError(f"--source: the checkpoint's model has no MUDD connections, whose weights are the only ones "
                         "here that depend on the input; drop --source or pass a checkpoint trained with --mudd-*")
    if args.target is not None and "decoder" not in stacks:
        raise UsageError("--target: the checkpoint's decoder has no MUDD connections (--mudd-decoder); drop --target")
    pair = sentence_pair(args, model, task, "decoder" in stacks, beam=args.beam)
    recorded = {side: [] for side in stacks}
    hooks = [generator.register_forward_hook(lambda module, inputs, output, side=side: recorded[side].append(output))
             for side, stack in stacks.items() for generator in stack.generators]
    try:
        if "decoder" in stacks:
            model(pair.src_tokens, pair.src_lengths, pair.prev_output_tokens)
        else:
            model.encoder(pair.src_tokens, src_lengths=pair.src_lengths)
    finally:
        for hook in hooks:
            hook.remove()
    print(f"source: {' '.join(pair.source)}" + (f"\ntarget ({pair.target_from}): {' '.join(pair.predicted)}"
                                               if "decoder" in stacks else ""))
    weights = {}
    for side, outputs in recorded.items():  # each (T, B, ways, i + 1); a batch of one sentence, no padding
        positions = [output.flatten(0, -3).float() for output in outputs]
        weights[f"{side} MUDD, mean over the sentence"] = mudd_matrix([p.mean(0).numpy() for p in positions])
        weights[f"{side} MUDD, std over the sentence"] = mudd_matrix([p.std(0, correction=0).numpy()
                                                                     for p in positions])
    return weights


def side_weights(model) -> dict:
    weights = {}
    for side in ("encoder", "decoder"):
        module = getattr(model, side)
        stack = getattr(module, "aggregation", None)
        if isinstance(stack, DepthWeightedAverage):  # (averages, L+1), NaN where an average reads nothing
            weights[f"{side} DenseFormer"] = matrix = np.full((len(stack.blocks), stack.num_layers + 1), np.nan)
            for row, (_, read, alpha) in enumerate(stack.weights()):
                matrix[row, read] = alpha.detach().float().numpy()
        if isinstance(stack, MultiwayDynamicDense):  # the static a_i: RMSNorm(0) W_1 = 0
            weights[f"{side} MUDD"] = mudd_matrix([generator.static.detach().float().numpy()
                                                   for generator in stack.generators])
        layers = getattr(module, "layers", [])  # a ConvS2S stack has none of these connections
        connections = [connection for layer in layers for connection in getattr(layer, "hyper_connections", [])
                       if isinstance(connection, (HyperConnection, ManifoldHyperConnection))]
        if connections:
            weights[f"{side} hyper-connections"] = np.concatenate(
                [np.pad(connection_matrix(c), ((0, 0), (0, 1)), constant_values=np.nan) for c in connections], axis=1)
    return weights


def plot(weights: dict):
    fig, axes = pyplot().subplots(len(weights), 1, figsize=(8, 2.6 * len(weights)), layout="constrained",
                                  squeeze=False)
    for ax, (name, matrix) in zip(axes[:, 0], weights.items()):
        limit, dense, mudd = np.nanmax(np.abs(matrix)), "DenseFormer" in name, "MUDD" in name
        xlabel = ("output X_j (0 = embedding)" if dense else "output X_j read by each way (Q, K, V, R: "
                  f"{', '.join(WAYS)})" if mudd else "sublayers, each [[0, B], [A_m, A_r]]")
        layers = matrix.shape[0]
        labels = {"x_labels": [f"{way[0].upper()}:X{j}" if j <= layers else "" for way in WAYS
                               for j in range(layers + 2)], "y_labels": range(1, layers + 1)} if mudd else {}
        heatmap(ax, matrix, cmap="RdBu_r", vmin=-limit, vmax=limit, colorbar="weight", title=name, xlabel=xlabel,
                ylabel="aggregate after layer" if dense or mudd else "", rotate_x=mudd, **labels)
    return fig


def run(args) -> dict:
    sentence_flags = [flag for flag, value in (("--target", args.target), ("--bpe", args.bpe), ("--bpe-codes",
                      args.bpe_codes), ("--allow-unk", args.allow_unk)) if value not in (None, False)]
    if args.source is None and sentence_flags:
        raise UsageError(f"{sentence_flags[0]}: only with --source (the sentence whose MUDD weights are drawn)")
    model, _, task = load_model(args.path, args.data, args.user_dir)
    weights = side_weights(model)
    if not weights:
        raise UsageError(f"--path {args.path}: the checkpoint's model has no DenseFormer averages, hyper-connections "
                         "or MUDD connections; one trained with --denseformer-*, --hyper-connections-* or --mudd-* "
                         "is needed")
    if args.source is not None:
        weights.update(sentence_weights(args, model, task))
    for name, matrix in weights.items():
        print(f"{name}\n{np.array2string(matrix, precision=3, max_line_width=200)}")
    return write_outputs(args, {name: [[None if np.isnan(v) else float(v) for v in row] for row in matrix]
                                for name, matrix in weights.items()}, plot(weights))


PARSER = script_parser(__doc__, sentence=True, source_required=False)
PARSER.add_argument("--beam", type=positive(int, "--beam"), default=5, help="beam size when translating --source")
main = script_main(PARSER.parse_args, run, "plot_connection_weights.py", __name__)
