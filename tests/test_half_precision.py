"""Half precision of the models: what ``--fp16`` / ``--bf16`` training and half inference need of
them, checked on the CPU and, where there is one, on a CUDA GPU.

Every registered architecture (``conformance_utils.ARCHITECTURES``), and the fusion modules a
preset does not switch on (soft and hard SurfaceFusion at the smallest tau, the literal dense
connection, iterative and linear aggregation with multi-layer attention, coarse layer attention,
attention aggregation nodes), at Transformer-Base width (d=512, FFN 2048, 8 heads; the convolutional
DenseNMT: embeddings 512, its preset's layers) with the preset's own depth and the default
initialisation, on 2 sentences of 6 source and 4 target tokens: in ``bfloat16`` and ``float16``,
with the model cast and under ``torch.autocast``, the loss and every gradient are finite and the
loss is within the dtype's tolerance of float32; decoding the cast model incrementally gives the
full forward's log-probabilities within the same tolerance.

Tolerance: 4 units in the last place of the dtype (``4 * torch.finfo(dtype).eps``, 3.1e-2 for
bfloat16 and 3.9e-3 for float16), relative, with the same absolute floor: every input and
weight is rounded to half (half an ulp each) and each layer rounds again; the loss averages
those errors, and the incremental and full forwards are two differently ordered half
computations (their log-probabilities of about -5 differ by one bfloat16 ulp, 2^-5 = 0.031, in
``deeprep_transformer_wmt_en_de``). A log-probability is a difference of logits, so it carries
the rounding error of the largest logit: the incremental comparison's absolute tolerance is the
same 4 ulps times the float32 model's largest |logit| (at least 1). That scale is the computed
function's own, not an overflow: SurfaceFusion's surface scores divided by tau = 0.01 reach 227,
the literal dense connection (states growing about 2^l with depth) gives logits up to 67, where
the two bfloat16 forwards differ by 1.2 and 1.5; MLRF's logits stay below 4 (difference 0.019).
A module that overflows or loses a term shows up as infinities, NaNs or errors of whole units
at unit scale, far above these bounds.

Half arithmetic on this CPU is slow (a base-width model takes tens of seconds for both dtypes):
one preset of each family runs always (both dtypes for MLRF, one for the others), the other
parametrisations are marked ``slow`` and deselected by default (``pytest -m slow
tests/test_half_precision.py`` runs them). The ``dense_fconv`` defaults (ConvS2S's 20 layers of 512,
densely connected: 987M parameters) run only on a GPU: on a 2-core CPU they take almost three minutes,
and their modules are those of the presets that do run here (15 layers in ``dense_fconv_wmt_en_de``).
On a CUDA device every configuration also runs there (``-cuda`` ids; skipped without one), the
float32 reference without TF32.
"""

import pytest
import torch
import torch.nn.functional as F

from conformance_utils import ARCHITECTURES, LARGEST_ARCHITECTURES, Variant, decode_incrementally, full_forward
from model_building import build_model

BASE_WIDTH = ("--encoder-embed-dim", "512", "--decoder-embed-dim", "512", "--encoder-ffn-embed-dim", "2048",
              "--decoder-ffn-embed-dim", "2048", "--encoder-attention-heads", "8", "--decoder-attention-heads", "8")
WIDTH = {
    "fusion_transformer": BASE_WIDTH,
    "dense_transformer": BASE_WIDTH,
    "layerwise_coordination": ("--embed-dim", "512", "--ffn-embed-dim", "2048", "--attention-heads", "8"),
    "dense_fconv": ("--encoder-embed-dim", "512", "--decoder-embed-dim", "512", "--decoder-out-embed-dim", "512"),
}
# run always: one preset per family, in one dtype where both would take too long
ALWAYS = {("mlrf_iwslt_de_en", "bfloat16"), ("mlrf_iwslt_de_en", "float16"), ("dense_fconv_iwslt_de_en", "float16"),
          ("dense_transformer_iwslt_de_en", "bfloat16"), ("layerwise_coordination_wmt_en_de", "bfloat16")}
FEATURES = [
    Variant("soft-surface-fusion-tau-0.01", "fusion_transformer", ("--surface-fusion", "soft", "--surface-fusion-tau", "0.01")),
    Variant("hard-surface-fusion-tau-0.01", "fusion_transformer", ("--surface-fusion", "hard", "--surface-fusion-tau", "0.01")),
    Variant("dense-aggregation-literal", "fusion_transformer",
            ("--aggregate-encoder", "dense", "--aggregate-decoder", "dense", "--dense-connection", "literal")),
    Variant("iterative+linear+multi-layer-attention-3", "fusion_transformer",
            ("--aggregate-encoder", "iterative", "--aggregate-decoder", "linear", "--multi-layer-attention", "3")),
    Variant("coarse-layer-attention", "fusion_transformer", ("--layer-attention", "coarse")),
    Variant("hierarchical-attention-nodes", "deeprep_transformer_wmt_en_de", ("--aggregation-fn", "attention")),
    Variant("denseformer-2x2", "fusion_transformer",
            ("--denseformer-encoder", "--denseformer-decoder", "--denseformer-dilation", "2", "--denseformer-period", "2")),
] + [  # static hyper-connections compute a subset of the dynamic ones' operations
    Variant(f"hyper-connections-{kind}", "fusion_transformer",
            ("--hyper-connections-encoder", kind, "--hyper-connections-decoder", kind))
    for kind in ("dynamic", "manifold")
]
DTYPES = (("bfloat16", torch.bfloat16), ("float16", torch.float16))
VARIANTS = [Variant(arch, arch) for arch in ARCHITECTURES] + FEATURES
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CONFIGURATIONS = [
    pytest.param(variant, dtype, "cpu", id=f"{variant.id}-{name}",
                 marks=() if (variant.id, name) in ALWAYS else pytest.mark.slow)
    for variant in VARIANTS if variant.id not in LARGEST_ARCHITECTURES for name, dtype in DTYPES
] + [  # on a GPU every configuration is quick; the 982M-parameter one waits for the others of its group
    pytest.param(variant, dtype, "cuda", id=f"{variant.id}-{name}-cuda",
                 marks=(CUDA, pytest.mark.xdist_group("largest")) if variant.id in LARGEST_ARCHITECTURES else CUDA)
    for variant in VARIANTS for name, dtype in DTYPES
]
VOCABULARY, SOURCE_LENGTH, TARGET_LENGTH = 100, 6, 4


def tolerance(dtype) -> float:
    return 4 * torch.finfo(dtype).eps


def base_width_model(variant, device):
    torch.manual_seed(1)
    return build_model(variant.arch, *WIDTH[ARCHITECTURES[variant.arch]], *variant.flags, src_vocab=VOCABULARY,
                       tgt_vocab=VOCABULARY, joined=True).eval().to(device)


def sentences(device):
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCABULARY, (2, SOURCE_LENGTH), generator=generator)
    target = torch.randint(4, VOCABULARY, (2, TARGET_LENGTH), generator=generator)
    prev = torch.cat([torch.full((2, 1), 2), target[:, :-1]], dim=1)  # EOS first, as fairseq's collater
    net_input = {"src_tokens": src, "src_lengths": torch.full((2,), SOURCE_LENGTH), "prev_output_tokens": prev}
    return {key: value.to(device) for key, value in net_input.items()}, target.to(device)


def loss_and_log_probs(model, net_input, target):
    encoder_out, logits, lprobs = full_forward(model, net_input)
    return F.nll_loss(lprobs.float().flatten(0, 1), target.flatten()), encoder_out, lprobs, logits


def assert_finite_training_step(model, loss):
    assert torch.isfinite(loss), loss
    loss.backward()
    infinite = [name for name, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not infinite, f"gradients not finite: {infinite}"


@pytest.fixture
def exact_float32():
    """The float32 reference computed in float32 on a GPU too (cuDNN's convolutions would round to TF32)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("variant,dtype,device", CONFIGURATIONS)
def test_half_precision_matches_float32(variant, dtype, device, exact_float32):
    net_input, target = sentences(device)
    model = base_width_model(variant, device)
    with torch.no_grad():
        reference, _, _, logits = loss_and_log_probs(model, net_input, target)
    reference, logit_scale = reference.item(), max(1.0, logits.abs().max().item())
    close = dict(rtol=tolerance(dtype), atol=tolerance(dtype))

    with torch.autocast(device, dtype=dtype):
        loss = loss_and_log_probs(model, net_input, target)[0]
    assert_finite_training_step(model, loss)
    torch.testing.assert_close(loss.item(), reference, **close, msg=lambda m: f"autocast loss: {m}")

    model.zero_grad(set_to_none=True)
    half = model.to(dtype)
    loss, encoder_out, lprobs, _ = loss_and_log_probs(half, net_input, target)
    assert_finite_training_step(half, loss)
    torch.testing.assert_close(loss.item(), reference, **close, msg=lambda m: f"cast loss: {m}")
    with torch.no_grad():
        (_, incremental), _ = decode_incrementally(half, encoder_out, net_input["prev_output_tokens"])
    torch.testing.assert_close(incremental.float(), lprobs.detach().float(), rtol=tolerance(dtype),
                               atol=tolerance(dtype) * logit_scale, msg=lambda m: f"incremental decoding: {m}")
