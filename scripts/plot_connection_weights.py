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
"""

import os
import sys

import numpy as np
import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_fairseq.modules.depth_weighted_average import DepthWeightedAverage  # noqa: E402
from fusion_fairseq.modules.hyper_connection import HyperConnection, ManifoldHyperConnection, sinkhorn  # noqa: E402
from fusion_fairseq.modules.multiway_dense_connection import WAYS, MultiwayDynamicDense  # noqa: E402
from fusion_lab.analysis import UsageError, heatmap, load_model, pyplot, script_main, script_parser, \
    write_outputs  # noqa: E402


def connection_matrix(connection) -> np.ndarray:
    """[[0, B], [A_m, A_r]] of the input-independent part of one hyper-connection."""
    n = connection.rate
    if isinstance(connection, HyperConnection):
        alpha, beta = connection.static_alpha, connection.static_beta
    else:
        pre, post, res = connection.bias.split([n, n, n * n])
        alpha = torch.cat([torch.sigmoid(pre)[:, None], sinkhorn(res.view(n, n)).T], dim=1)
        beta = 2 * torch.sigmoid(post)
    matrix = torch.zeros(n + 1, n + 1)
    matrix[0, 1:], matrix[1:, :] = beta, alpha
    return matrix.detach().float().numpy()


def mudd_matrix(stack: MultiwayDynamicDense) -> np.ndarray:
    """The ways' blocks side by side, a blank column after each: ``(L, len(WAYS) * (L + 2))``."""
    layers = stack.num_layers
    blocks = np.full((len(WAYS), layers, layers + 2), np.nan)
    for row, generator in enumerate(stack.generators):
        static = generator.static.detach().float().numpy()  # (ways, i + 1): the last aggregate's one way is R
        for way, values in zip(range(len(WAYS) - len(static), len(WAYS)), static):
            blocks[way, row, :len(values)] = values
    return np.concatenate(list(blocks), axis=1)


def side_weights(model) -> dict:
    weights = {}
    for side in ("encoder", "decoder"):
        module = getattr(model, side)
        stack = getattr(module, "aggregation", None)
        if isinstance(stack, DepthWeightedAverage):  # (averages, L+1), NaN where an average reads nothing
            weights[f"{side} DenseFormer"] = matrix = np.full((len(stack.blocks), stack.num_layers + 1), np.nan)
            for row, (_, read, alpha) in enumerate(stack.weights()):
                matrix[row, read] = alpha.detach().float().numpy()
        if isinstance(stack, MultiwayDynamicDense):
            weights[f"{side} MUDD"] = mudd_matrix(stack)
        connections = [connection for layer in module.layers for connection in getattr(layer, "hyper_connections", [])
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
        xlabel = ("output X_j (0 = embedding)" if dense else f"output X_j in each way: {', '.join(WAYS)}" if mudd
                  else "sublayers, each [[0, B], [A_m, A_r]]")
        heatmap(ax, matrix, cmap="RdBu_r", vmin=-limit, vmax=limit, colorbar="weight", title=name, xlabel=xlabel,
                ylabel="aggregate after layer" if dense or mudd else "")
    return fig


def run(args) -> dict:
    weights = side_weights(load_model(args.path, args.data, args.user_dir)[0])
    if not weights:
        raise UsageError(f"--path {args.path}: the checkpoint's model has no DenseFormer averages, hyper-connections "
                         "or MUDD connections; one trained with --denseformer-*, --hyper-connections-* or --mudd-* "
                         "is needed")
    for name, matrix in weights.items():
        print(f"{name}\n{np.array2string(matrix, precision=3, max_line_width=200)}")
    return write_outputs(args, {name: [[None if np.isnan(v) else float(v) for v in row] for row in matrix]
                                for name, matrix in weights.items()}, plot(weights))


main = script_main(script_parser(__doc__).parse_args, run, "plot_connection_weights.py", __name__)
