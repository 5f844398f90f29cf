"""The Keras backend's host input without a framework: each process builds only its rows of a global batch.

Row ``r`` of global step ``g`` is masked by a generator seeded by ``(seed, g, r)`` and its block is found by a
per-position permutation, so the rows of two processes, put side by side, are the rows one process builds.
"""

import numpy as np

from hf_tpu_ext.data.numpy_batches import NumpyMasker, TrainBatches, eval_batches

SPECIAL = [0, 1, 2, 3, 4]


def _masker():
    return NumpyMasker(mask_token_id=4, vocab_size=60, special_token_ids=SPECIAL, max_predictions=3, pad_token_id=1)


def _blocks(n=48, length=12):
    blocks = np.random.default_rng(3).integers(5, 60, size=(n, length)).astype(np.int32)
    blocks[:, 0], blocks[:, -1] = 0, 2
    return blocks


def test_two_processes_rows_are_the_one_process_batch():
    blocks = _blocks()
    whole = TrainBatches(blocks, 8, 7, _masker())
    # accumulation 2 over 2 processes of 2 devices: micro-batches of 4 rows, process p holds rows 2p, 2p+1 of each
    parts = [TrainBatches(blocks, 8, 7, _masker(), rows=np.array(rows)) for rows in ([0, 1, 4, 5], [2, 3, 6, 7])]
    for step in (0, 5, 6, 13):  # 6 steps per epoch: 6 and 13 are in epochs 1 and 2
        full = whole(step)
        for part in parts:
            got = part(step)
            for key, value in full.items():
                np.testing.assert_array_equal(got[key], value[part.rows], err_msg=f"{key} of step {step}")
        # the rows' blocks are the permutation's: an epoch is a permutation of the 48 blocks
        np.testing.assert_array_equal(full["masked_lm_ids"] * full["masked_lm_weights"].astype(np.int32),
                                      np.take_along_axis(blocks[whole.block_indices(step)],
                                                         full["masked_lm_positions"], 1)
                                      * full["masked_lm_weights"].astype(np.int32))
    assert sorted(np.concatenate([whole.block_indices(s) for s in range(6)]).tolist()) == list(range(48))
    assert sorted(whole.order(1).tolist()) == list(range(48))
    assert not np.array_equal(whole.order(0), whole.order(1))
    np.testing.assert_array_equal(whole.block_indices(6), whole.order(1)[:8])


def test_a_row_masks_the_same_whatever_rows_it_is_built_with():
    masker, blocks = _masker(), _blocks()[:6]
    alone = masker(blocks[4:5], (7, 0, 9), rows=np.array([4]))
    together = masker(blocks, (7, 0, 9))
    for key, value in alone.items():
        np.testing.assert_array_equal(value[0], together[key][4])
    assert together["masked_lm_weights"].sum() == 18.0  # 3 of the 10 maskable tokens in each of the 6 rows


def test_evaluation_rows_of_two_processes_are_the_whole_batches():
    blocks, masker = _blocks(20), _masker()
    whole = list(eval_batches(blocks, 8, 7, masker))
    halves = [list(eval_batches(blocks, 8, 7, masker, rows=np.arange(4) + 4 * p)) for p in (0, 1)]
    assert len(whole) == 2 and [len(h) for h in halves] == [2, 2]
    for i, batch in enumerate(whole):
        for key, value in batch.items():
            np.testing.assert_array_equal(np.concatenate([halves[0][i][key], halves[1][i][key]]), value)
        np.testing.assert_array_equal(batch["masked_lm_ids"][batch["masked_lm_weights"] == 1],
                                      np.take_along_axis(blocks[8 * i:8 * i + 8], batch["masked_lm_positions"],
                                                         1)[batch["masked_lm_weights"] == 1])
