"""fairseq keeps every sentence in its batches once the plugin is imported (fairseq issue #5036)."""

import numpy as np
import pytest
from fairseq.data import data_utils

import fusion_fairseq  # noqa: F401  (installs the fix)
from fusion_fairseq.fairseq_fixes import with_last_partial_batch


def flat(batches):
    return [int(i) for batch in batches for i in batch]


@pytest.mark.parametrize("max_sentences,max_tokens", [(16, None), (None, None), (None, 40)])
def test_batch_by_size_keeps_the_last_partial_batch(max_sentences, max_tokens):
    """30 sentences with the default multiple of 8: fairseq alone keeps 24 (or fewer); with the
    plugin every index is batched once, in order, and the full batches are fairseq's own."""
    indices = np.arange(30, dtype=np.int64)
    sizes = np.full(30, 3, dtype=np.int64)
    batches = data_utils.batch_by_size(indices, lambda i: 3, num_tokens_vec=sizes, max_tokens=max_tokens,
                                       max_sentences=max_sentences, required_batch_size_multiple=8)
    assert flat(batches) == list(range(30))
    assert all(len(batch) % 8 == 0 for batch in batches[:-1])
    assert len(batches[-1]) == 30 - 8 * (30 // 8) or len(batches) == 1


def test_batch_by_size_keeps_iterator_input_and_is_installed_once():
    batches = data_utils.batch_by_size(iter(range(13)), lambda i: 1, max_sentences=8, required_batch_size_multiple=8)
    assert flat(batches) == list(range(13)) and [len(b) for b in batches] == [8, 5]
    before = data_utils.batch_by_size
    fusion_fairseq.fairseq_fixes.keep_last_partial_batch()
    assert data_utils.batch_by_size is before


def test_batches_of_a_multiple_are_unchanged():
    original = data_utils.batch_by_size.__wrapped__
    sizes = np.full(32, 3, dtype=np.int64)
    expected = original(np.arange(32), None, num_tokens_vec=sizes, max_sentences=16, required_batch_size_multiple=8)
    actual = with_last_partial_batch(original)(np.arange(32), None, num_tokens_vec=sizes, max_sentences=16,
                                               required_batch_size_multiple=8)
    assert [list(b) for b in actual] == [list(b) for b in expected] == [list(range(16)), list(range(16, 32))]


def test_translation_task_iterates_every_training_sentence(tiny_data_bin):
    """fairseq's own task machinery (what fairseq-train, -validate and -generate use) with its
    default --required-batch-size-multiple 8: every one of the 300 training and 30 validation
    sentences is in an epoch."""
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [tiny_data_bin, "--arch", "transformer", "--max-tokens", "1000"])
    assert args.required_batch_size_multiple == 8
    task = tasks.setup_task(args)
    for split, count in (("train", 300), ("valid", 30)):
        task.load_dataset(split)
        iterator = task.get_batch_iterator(task.dataset(split), max_tokens=1000, max_sentences=32,
                                           required_batch_size_multiple=8).next_epoch_itr(shuffle=False)
        seen = sorted(int(i) for batch in iterator for i in batch["id"])
        assert seen == list(range(count)), split
