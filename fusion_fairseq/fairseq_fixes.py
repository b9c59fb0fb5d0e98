"""Narrow fixes of upstream fairseq behaviour, applied when the plugin is imported.

``keep_last_partial_batch``: fairseq's ``data_utils.batch_by_size`` (main branch, ve-fairseq
0.12.3) builds its batches with the compiled ``data_utils_fast`` helpers, which cover every
index, and then removes the last batch when its size is not a multiple of
``--required-batch-size-multiple`` (default 8; fairseq issue #5036). fairseq-generate then
translates, fairseq-validate scores and every training epoch sees only part of the data: 24 of 30
sentences of a 30-sentence test set. The multiple is a speed hint for the other batches, never a
reason to lose sentences, so the wrapper gives the removed indices back as a last, smaller batch.
Everything else (batch order, sizes, fixed shapes) stays fairseq's.
"""

import functools

import numpy as np
from fairseq.data import data_utils

_MARK = "_keeps_last_partial_batch"


def with_last_partial_batch(batch_by_size):
    """``batch_by_size`` that returns the trailing indices it left out as one more batch."""

    @functools.wraps(batch_by_size)
    def wrapper(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):  # an iterator could be read only once
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                                required_batch_size_multiple, fixed_shapes)
        if fixed_shapes is not None:  # batches of the given shapes only, by design
            return batches
        covered = sum(len(batch) for batch in batches)
        # the batches are consecutive runs of ``indices``: what is left out is their tail
        if covered < len(indices):
            batches = list(batches) + [indices[covered:]]
        return batches

    setattr(wrapper, _MARK, True)
    return wrapper


def keep_last_partial_batch():
    """Install :func:`with_last_partial_batch` on ``fairseq.data.data_utils`` (once: the plugin
    may be imported under two names, as a package and through ``--user-dir``)."""
    if not getattr(data_utils.batch_by_size, _MARK, False):
        data_utils.batch_by_size = with_last_partial_batch(data_utils.batch_by_size)


keep_last_partial_batch()
