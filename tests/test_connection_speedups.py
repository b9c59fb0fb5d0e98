"""The hand-written parts of the connections' computation against autograd's: each check fails if
the written-out backward (or the rearranged forward) differs from the function it stands for."""

import pytest
import torch

from fusion_fairseq.modules.hyper_connection import SINKHORN_ORDERS, SinkhornKnopp, ThinProduct, sinkhorn, thin_product


def reference_sinkhorn(logits, iterations, order):
    """Eq. 9 as written, in log space throughout, differentiated by autograd."""
    dims = (-2, -1) if order == "columns-first" else (-1, -2)
    for _ in range(iterations):
        for dim in dims:
            logits = logits.log_softmax(dim=dim)
    return logits.exp()


@pytest.mark.parametrize("order", SINKHORN_ORDERS)
@pytest.mark.parametrize("iterations", [1, 2, 20])
def test_sinkhorn_gradient_is_the_derivative_of_its_output(order, iterations):
    """In float64 (``sinkhorn`` itself computes in float32), against finite differences."""
    logits = (3 * torch.randn(2, 3, 4, 4, dtype=torch.float64)).requires_grad_()
    columns_first = order == "columns-first"
    assert torch.autograd.gradcheck(lambda x: SinkhornKnopp.apply(x, iterations, columns_first), (logits,))


@pytest.mark.parametrize("order", SINKHORN_ORDERS)
def test_sinkhorn_and_its_gradient_are_the_log_space_iterations(order):
    logits = (3 * torch.randn(5, 4, 4)).requires_grad_()
    logits.data[0, 1] -= 200  # a row whose exp underflows: the first iteration runs in log space
    weights = torch.randn(5, 4, 4)
    matrix = sinkhorn(logits, order=order)
    expected = reference_sinkhorn(logits, 20, order)
    torch.testing.assert_close(matrix, expected, rtol=1e-5, atol=1e-6)
    grad, = torch.autograd.grad((matrix * weights).sum(), logits)
    expected_grad, = torch.autograd.grad((expected * weights).sum(), logits)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-6)


def test_sinkhorn_keeps_the_dtype_and_computes_in_float32():
    logits = torch.randn(3, 4, 4).half()
    matrix = sinkhorn(logits)
    assert matrix.dtype == torch.float16
    torch.testing.assert_close(matrix.float(), reference_sinkhorn(logits.float(), 20, "columns-first"),
                               rtol=1e-3, atol=1e-3)


def test_thin_product_gradient_is_the_derivative_of_its_output():
    """The products' orientations are chosen by hand in forward and backward; in float64 against
    finite differences, for the rows and the weight."""
    rows = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ThinProduct.apply, (rows, weight))


def test_thin_product_is_the_matrix_product():
    x = torch.randn(2, 3, 4, 8, requires_grad=True)
    weight = torch.randn(8, 6, requires_grad=True)
    output = thin_product(x, weight)
    torch.testing.assert_close(output, x @ weight)
    grads = torch.autograd.grad(output.square().sum(), (x, weight))
    expected = torch.autograd.grad((x @ weight).square().sum(), (x, weight))
    for grad, expected_grad in zip(grads, expected):
        torch.testing.assert_close(grad, expected_grad)


def test_under_autocast_both_run_as_autocast_runs_their_operations():
    """The product in autocast's dtype with gradients in each input's own, Sinkhorn-Knopp in float32 (its
    written-out backward had mixed bfloat16 and float32 operands and refused to run)."""
    rows, weight = torch.randn(6, 8, requires_grad=True), torch.randn(8, 3, requires_grad=True)
    logits = torch.randn(6, 4, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        product, matrix = thin_product(rows, weight), sinkhorn(logits)
        expected = rows @ weight
    assert product.dtype == expected.dtype == torch.bfloat16 and torch.equal(product, expected)
    assert matrix.dtype == torch.float32 and torch.allclose(matrix, sinkhorn(logits.detach()))
    (product.float().sum() + matrix.square().sum()).backward()
    assert rows.grad.dtype == weight.grad.dtype == logits.grad.dtype == torch.float32
    assert torch.isfinite(rows.grad).all() and torch.isfinite(logits.grad).all()
