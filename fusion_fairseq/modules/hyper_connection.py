"""Hyper-connections (Zhu et al., ICLR 2025) and manifold-constrained hyper-connections (mHC,
Xie et al., DeepSeek 2025): the residual stream widened to n copies.

Paper (Zhu et al.): Sec. 2. The hidden vector h becomes the hyper hidden matrix H = (h_1, ..., h_n)^T (n x d),
n copies of the embedding at the start. Around every layer T^k (one attention or one feed-forward sublayer;
fairseq's decoder layer has three, its encoder layer two), the hyper-connection

    HC = [[0, B], [A_m, A_r]],   B in R^{1 x n}, A_m in R^{n x 1}, A_r in R^{n x n}

reads the layer input h_0 = A_m^T H (width-connection) and writes back
H' = B^T T(h_0) + A_r^T H (depth-connection). Static (SHC) weights are learned
directly; dynamic (DHC) ones add an input-dependent term per stream:

    H_bar = norm(H);  B(H) = s_beta * tanh(H_bar W_beta)^T + B;
    A_m(H) = s_alpha * tanh(H_bar W_m) + A_m;  A_r(H) = s_alpha * tanh(H_bar W_r) + A_r,

with W_* zero and s_alpha = s_beta = 0.01 at the start. Initialisation: A_m = e_{k mod n}
for layer k, A_r = I, B = 1, which computes exactly the Pre-Norm residual: every stream stays the
same vector h. The stack's output is read from the streams (the paper sums them before the final
norm).

Paper (Xie et al., mHC): the same three maps, computed from the flattened n x d streams
x = RMSNorm(vec(H)) (no weight): H_pre = sigmoid(a_pre (x phi_pre) + b_pre),
H_post = 2 sigmoid(a_post (x phi_post) + b_post), H_res = SinkhornKnopp(a_res mat(x phi_res) + b_res),
so that H_res is doubly stochastic (rows and columns sum to one) and the signal neither grows nor
vanishes across depth; x_{l+1} = H_res x_l + H_post^T F(H_pre x_l). Eq. 9 runs Sinkhorn-Knopp from
M(0) = exp(logits) as M(t) = T_r(T_c(M(t-1))), a column normalisation then a row normalisation, for
20 iterations: the rows of H_res sum exactly to one after the last step (each new stream is a convex
combination of the old ones), the columns to within the iteration's residual.

Readings:
* Layer index k counts sublayers over the whole stack (attention 0, feed-forward 1, ... in the
  encoder; self-attention, cross-attention, feed-forward in the decoder): each T^k of the paper
  is one sublayer with its own connection.
* The stack's output is the streams' mean, the paper's sum divided by n: the same after a final
  LayerNorm up to its epsilon, and the only readout under which a post-norm stack (fairseq's
  default, no final LayerNorm) starts as the plain Transformer.
* The norm of DHC is a LayerNorm with parameters, shared by the streams of one connection.
* Sinkhorn-Knopp runs in Eq. 9's order, columns then rows (``--hyper-connections-sinkhorn-order
  columns-first``, the default); ``rows-first`` (exact columns, inexact rows) is kept for checkpoints
  trained that way. Both are exact at the start (phi = 0 leaves the symmetric b_res below as the
  logits); once the logits move, rows-first leaves its rows off by about 5e-4 (median of 200 draws;
  2e-3 the largest) for logits b_res + N(0, 0.1^2) at n = 4, by 4e-3 (2e-2) for b_res + N(0, 1), so
  its mix is not the convex combination Eq. 9 guarantees.
* Zhu et al.'s training recipe (Sec. 4) for SHC and DHC, on by default: the initialisation std of
  each sublayer's output projection (attention's ``out_proj``, the FFN's ``fc2``) is divided by
  sqrt(n) (:func:`rescale_output_projections`; ``--hyper-connections-no-output-rescale`` keeps
  fairseq's), and the static weights A_m, A_r, B get no weight decay (fairseq's per-parameter
  ``optim_overrides``, which only ``--optimizer adam_with_overrides`` honours, not ``composite``;
  ``--hyper-connections-decay-static`` decays them like the rest).
  Paper: the output modules' std is scaled "by a factor of sqrt(n)" at initialisation, so that the
  output, the sum of the last layer's n streams, keeps the std of the original model. Reading:
  divided; the paper does not spell out the direction, and neither direction keeps that std
  literally (with B = 1 every stream receives the same sublayer outputs, so at the start the sum is
  n times one stream whatever the scale); the division puts each sublayer's output at 1/sqrt(n) of
  fairseq's scale against the embedding. A fresh model then computes the Transformer whose output
  projections are scaled by 1/sqrt(n), not fairseq's of the same seed; given a Transformer's weights
  (``--finetune-from-model``, or a loaded state) it computes that Transformer exactly.
  mHC's paper states no such recipe: mHC keeps fairseq's initialisation and decay.
* mHC initialisation (not given in what we read of the paper): phi = 0 and a = 0.01 as for DHC,
  b_pre = logit(1/n) so that the layer first reads the streams' mean, b_post = 0 so that 2 sigmoid
  writes the output to every stream with weight 1, and b_res with 0 on the diagonal and -4
  elsewhere, so that H_res starts near the identity (0.95 on the diagonal for n = 4), as A_r = I
  does for HC. Any doubly stochastic H_res keeps equal streams equal, so at the start mHC, too,
  computes the plain Transformer.
* Post-norm (fairseq's ``--*-normalize-before`` off): each sublayer's LayerNorm is applied to every
  stream after the depth-connection, LN(B^T T(h_0) + A_r^T H); with equal streams this is
  LN(h + T(h)), fairseq's post-norm layer. Pre-norm: the LayerNorm is part of T^k, as in the paper.
  With n = 1 the static connection at its start is the residual connection itself, of the pre-norm
  or (in this reading) the post-norm layer, as the paper shows both to be non-trainable
  hyper-connections of rate 1.

Every weight mixes the streams of one position, so incremental decoding stays exact.

Why written here: the maintained ``hyper-connections`` package (PyPI, 0.4.x) wraps a branch function and
reduces the streams by a sum; it has no post-norm reading (fairseq's default), and as a 0.x package its
parameter names and defaults may change between releases, which would stop trained checkpoints from loading.
"""

import functools
import math
from typing import List, Tuple

import torch
from torch import Tensor, nn

from .layer_aggregation import ApplyLayer, PlainStack

HYPER_CONNECTION_KINDS = ("none", "static", "dynamic", "manifold")
SINKHORN_ORDERS = ("columns-first", "rows-first")
DYNAMIC_SCALE_INIT = 0.01
SINKHORN_ITERATIONS = 20
MANIFOLD_OFF_DIAGONAL_LOGIT = -4.0


def read_streams(weights: Tensor, streams: Tensor) -> Tuple[Tensor, Tensor]:
    """The width-connection in one batched product: ``weights`` are [A_m | A_r]^T, ``(n+1, n)`` or
    per position ``(..., n+1, n)``; returns (h_0 = A_m^T H ``(..., d)``, A_r^T H ``(..., n, d)``).
    The shared matrix is expanded over the positions because torch's ``matmul`` of a plain matrix
    and batched streams transposes the streams into one tall product and copies its result back,
    the largest cost of a connection on a CPU; ``split``, not two slices: the backward of a slice
    fills a zero tensor of the product's size."""
    mixed = weights.to(streams).expand(*streams.shape[:-2], *weights.shape[-2:]) @ streams
    layer_input, kept = mixed.split([1, streams.shape[-2]], dim=-2)
    return layer_input.squeeze(-2), kept


def thin_product(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight`` for a weight of a few columns ``(d, k)``, by :class:`ThinProduct`. Under autocast
    both are cast to its dtype first, as autocast casts a product's operands, so that the node's
    gradients come in the dtype of what it was given."""
    rows = x.reshape(-1, x.shape[-1])
    if torch.is_autocast_enabled(rows.device.type):
        dtype = torch.get_autocast_dtype(rows.device.type)
        rows, weight = rows.to(dtype), weight.to(dtype)
    return ThinProduct.apply(rows, weight).view(*x.shape[:-1], weight.shape[-1])


class ThinProduct(torch.autograd.Function):
    """``rows @ weight`` ``(N, d) @ (d, k)`` with k = 6 or 24, each of its three products in the
    orientation CPU BLAS runs fast: the output as (weight^T rows^T)^T, the weight's gradient as
    (grad^T rows)^T, the rows' as grad weight^T. The other orientations (x @ weight; rows^T grad,
    which autograd picks to hand back the weight's layout) run three to six times slower."""

    @staticmethod
    def forward(ctx, rows: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(rows, weight)
        return (weight.t() @ rows.t()).t()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        rows, weight = ctx.saved_tensors
        grad_rows = grad @ weight.t() if ctx.needs_input_grad[0] else None
        grad_weight = (grad.t() @ rows).t() if ctx.needs_input_grad[1] else None
        return grad_rows, grad_weight


def write_streams(output: Tensor, kept_streams: Tensor, beta: Tensor) -> Tensor:
    """The depth-connection H' = B^T T(h_0) + A_r^T H, one fused multiply-add."""
    return torch.addcmul(kept_streams, beta.to(output).unsqueeze(-1), output.unsqueeze(-2))


class HyperConnection(nn.Module):
    """SHC or DHC around one sublayer: :meth:`width` gives the sublayer's input, :meth:`depth`
    the new streams. Streams are ``(..., n, d)``."""

    def __init__(self, rate: int, embed_dim: int, layer_index: int, dynamic: bool):
        super().__init__()
        self.rate = rate
        input_weights = torch.zeros(rate, 1)
        input_weights[layer_index % rate, 0] = 1.0
        self.static_alpha = nn.Parameter(torch.cat([input_weights, torch.eye(rate)], dim=1))  # [A_m | A_r]
        self.static_beta = nn.Parameter(torch.ones(rate))  # B
        self.dynamic = dynamic
        if dynamic:
            self.norm = nn.LayerNorm(embed_dim)
            self.dynamic_alpha_fn = nn.Parameter(torch.zeros(embed_dim, rate + 1))  # [W_m | W_r]
            self.dynamic_alpha_scale = nn.Parameter(torch.tensor(DYNAMIC_SCALE_INIT))
            self.dynamic_beta_fn = nn.Parameter(torch.zeros(embed_dim))  # W_beta
            self.dynamic_beta_scale = nn.Parameter(torch.tensor(DYNAMIC_SCALE_INIT))

    def width(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """(h_0 = A_m^T H ``(..., d)``, A_r^T H ``(..., n, d)``, B ``(..., n)``)."""
        alpha, beta = self.static_alpha, self.static_beta  # alpha = [A_m | A_r] (..., n, n+1)
        if self.dynamic:  # tanh(H_bar [W_m | W_r | W_beta]): the three input-dependent terms from one product
            weights = torch.cat([self.dynamic_alpha_fn, self.dynamic_beta_fn.unsqueeze(-1)], dim=-1)
            dynamic = torch.tanh(thin_product(self.norm(streams), weights))
            dynamic_alpha, dynamic_beta = dynamic.split([self.rate + 1, 1], dim=-1)
            alpha = torch.addcmul(alpha, self.dynamic_alpha_scale, dynamic_alpha)
            beta = torch.addcmul(beta, self.dynamic_beta_scale, dynamic_beta.squeeze(-1))
        layer_input, kept = read_streams(alpha.transpose(-1, -2), streams)
        return layer_input, kept, beta

    depth = staticmethod(write_streams)


def sinkhorn(logits: Tensor, iterations: int = SINKHORN_ITERATIONS, order: str = "columns-first") -> Tensor:
    """exp(logits) scaled to a doubly stochastic matrix over the last two dimensions by alternating
    normalisation (Sinkhorn-Knopp): ``columns-first`` is Eq. 9 of the mHC paper, T_r(T_c(M)), whose rows
    sum exactly to one; ``rows-first`` the reverse order. The first iteration runs in log space, so that
    no row or column of exp(logits) can underflow to a zero sum; after it every row and column sums to
    between 1/n and n, and the rest divide by sums directly (the log-space result to float rounding).
    The gradient is autograd's through every iteration, written out in :class:`SinkhornKnopp`."""
    return SinkhornKnopp.apply(logits.float(), iterations, order == "columns-first").to(logits.dtype)


@functools.lru_cache(maxsize=None)
def sum_matrices(n: int, dtype: torch.dtype, device: torch.device) -> Tuple[Tensor, Tensor]:
    """For an n x n matrix flattened row by row to n^2 values m: ``m @ same_column`` holds at every
    entry the sum of its column, ``m @ same_row`` the sum of its row. One small matrix product per
    normalisation: a CPU sums strided groups of four values several times slower. Built once per
    kind (building them cost a tenth of a decoding step's Sinkhorn-Knopp), outside inference mode
    so that a training step can save them for its backward."""
    with torch.inference_mode(False):
        eye = torch.eye(n, dtype=dtype, device=device)
        return eye.repeat(n, n), torch.kron(eye, torch.ones_like(eye))


class SinkhornKnopp(torch.autograd.Function):
    """:func:`sinkhorn` as one autograd node: the forward keeps every normalised matrix and the sums
    it was divided by, the backward runs the chain rule through the iterations in reverse, three
    operations a normalisation; autograd's own graph of the same iterations had eight and a node
    for each, most of mHC's added training time on a CPU."""

    @staticmethod
    @torch.autocast("cpu", enabled=False)  # its sums in float32 under autocast too, as its backward runs
    @torch.autocast("cuda", enabled=False)
    def forward(ctx, logits: Tensor, iterations: int, columns_first: bool) -> Tensor:
        n = logits.shape[-1]
        rows, columns = -1, -2  # the dimension summed over to normalise rows, columns
        first, last = (columns, rows) if columns_first else (rows, columns)
        same_column, same_row = sum_matrices(n, logits.dtype, logits.device)
        first_sums, last_sums = (same_column, same_row) if columns_first else (same_row, same_column)
        first_log = logits.log_softmax(dim=first)
        matrix = first_log.log_softmax(dim=last).exp().reshape(-1, n * n)
        steps = [matrix]
        for _ in range(iterations - 1):
            for sums in (first_sums, last_sums):
                total = torch.mm(matrix, sums)
                matrix = matrix / total
                steps += [total, matrix]
        if ctx.needs_input_grad[0]:  # with the first iteration's other softmax
            ctx.save_for_backward(first_sums, last_sums, first_log.exp().reshape(-1, n * n), *steps)
        return matrix.view(logits.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        first_sums, last_sums, first_softmax, last_softmax, *steps = ctx.saved_tensors
        shape = grad.shape
        grad = grad.reshape(last_softmax.shape)
        for step in range(len(steps) // 2, 0, -1):  # y = x / (x @ sums): dx = (dy - (dy * y) @ sums) / (x @ sums)
            total, normalised = steps[2 * step - 2], steps[2 * step - 1]
            sums = first_sums if step % 2 else last_sums
            grad = torch.addmm(grad, grad * normalised, sums, alpha=-1).div_(total)
        grad = grad * last_softmax  # through exp, then each log_softmax: dx = dy - softmax * sum(dy)
        grad = torch.addcmul(grad, last_softmax, grad @ last_sums, value=-1)
        grad = torch.addcmul(grad, first_softmax, grad @ first_sums, value=-1)
        return grad.view(shape), None, None


class ManifoldHyperConnection(nn.Module):
    """mHC around one sublayer, with the interface of :class:`HyperConnection`."""

    def __init__(self, rate: int, embed_dim: int, sinkhorn_order: str = "columns-first"):
        super().__init__()
        if sinkhorn_order not in SINKHORN_ORDERS:
            raise ValueError(f"unknown Sinkhorn order {sinkhorn_order!r}; allowed: {', '.join(SINKHORN_ORDERS)}")
        self.sinkhorn_order = sinkhorn_order
        if rate < 2:
            raise ValueError(f"manifold-constrained hyper-connections need at least 2 streams, got {rate}")
        self.rate = rate
        self.phi = nn.Parameter(torch.zeros(rate * embed_dim, rate * (rate + 2)))  # [phi_pre | phi_post | phi_res]
        self.scales = nn.Parameter(torch.full((3,), DYNAMIC_SCALE_INIT))  # a_pre, a_post, a_res
        res_bias = torch.full((rate, rate), MANIFOLD_OFF_DIAGONAL_LOGIT).fill_diagonal_(0.0)
        pre_bias = torch.full((rate,), -math.log(rate - 1))  # sigmoid(b_pre) = 1/n
        self.bias = nn.Parameter(torch.cat([pre_bias, torch.zeros(rate), res_bias.flatten()]))  # [b_pre | b_post | b_res]
        # which of the three scales multiplies each logit; not saved: it follows from n
        self.register_buffer("scale_of_logit", torch.tensor([0] * rate + [1] * rate + [2] * rate * rate),
                             persistent=False)

    def width(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """(H_pre x ``(..., d)``, H_res x ``(..., n, d)``, H_post ``(..., n)``)."""
        n = self.rate
        flat = streams.flatten(-2)
        # RMSNorm without weight, applied after the product: (x / rms(x)) phi = (x phi) / rms(x), so the
        # normalised n x d vector is never built (its backward was the largest part of mHC's own cost)
        mean_square = torch.linalg.vector_norm(flat, dim=-1, keepdim=True).square() / flat.shape[-1]
        scales = self.scales.to(flat)[self.scale_of_logit]  # a_pre (n times), a_post (n), a_res (n^2)
        dynamic = thin_product(flat, self.phi.to(flat))
        logits = torch.addcmul(self.bias.to(flat), scales * torch.rsqrt(mean_square + 1e-6), dynamic)
        gates, res_logits = logits.split([2 * n, n * n], dim=-1)
        pre, post = torch.sigmoid(gates).split([n, n], dim=-1)
        res = sinkhorn(res_logits.unflatten(-1, (n, n)), order=self.sinkhorn_order)
        layer_input, kept = read_streams(torch.cat([pre.unsqueeze(-2), res], dim=-2), streams)  # [H_pre; H_res]
        return layer_input, kept, 2 * post

    depth = staticmethod(write_streams)


def build_hyper_connection(kind: str, rate: int, embed_dim: int, layer_index: int,
                           sinkhorn_order: str = "columns-first") -> nn.Module:
    if kind in ("static", "dynamic"):
        return HyperConnection(rate, embed_dim, layer_index, dynamic=kind == "dynamic")
    if kind == "manifold":
        return ManifoldHyperConnection(rate, embed_dim, sinkhorn_order)
    raise ValueError(f"unknown hyper-connection kind {kind!r}; allowed: {', '.join(HYPER_CONNECTION_KINDS[1:])}")


class HyperConnectedStack(PlainStack):
    """The stack over n streams: the embedding is copied n times, every layer maps streams to
    streams (its sublayers carry their own connections), and each layer's state, like the stack's
    output, is the streams' mean (see the readings above)."""

    def __init__(self, num_layers: int, rate: int):
        super().__init__(num_layers)
        self.rate = rate

    def run(self, x0: Tensor, apply_layer: ApplyLayer) -> Tuple[Tensor, List[Tensor]]:
        streams = x0.unsqueeze(-2).expand(*x0.shape[:-1], self.rate, x0.shape[-1])
        states = [x0]
        for index in range(self.num_layers):
            streams = apply_layer(index, streams, states)
            states.append(streams.mean(dim=-2))
        return states[-1], states


def connect(connection: nn.Module, streams: Tensor, sublayer, layer_norm: nn.Module, normalize_before: bool):
    """One sublayer with its hyper-connection: ``sublayer(h_0)`` is its output (dropout included);
    ``layer_norm`` is the sublayer's own LayerNorm, applied to its input (pre-norm) or to every stream after
    the connection (post-norm). Returns (new streams, what the sublayer returned beside its output)."""
    layer_input, kept, beta = connection.width(streams)
    if normalize_before:
        layer_input = layer_norm(layer_input)
    output, extra = sublayer(layer_input)
    streams = connection.depth(output, kept, beta)
    return (streams if normalize_before else layer_norm(streams)), extra
