"""Initialisers shared by the fusion modules."""

import math

from torch import nn


def fan_in_uniform_(linear: nn.Linear):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.

    Paper (MLRF, Sec. 4.2): "All other parameters are initialized from U(-1/sqrt(fanin), 1/sqrt(fanin))".
    Written out rather than relying on torch's default, which happens to coincide today.
    """
    bound = 1.0 / math.sqrt(linear.in_features)
    nn.init.uniform_(linear.weight, -bound, bound)
    if linear.bias is not None:
        nn.init.uniform_(linear.bias, -bound, bound)
