"""Static-shape masked-LM batches for ``transformers.Trainer`` on XLA.

Blocks come from the shared :func:`hf_tpu_ext.data.blocks.group_into_blocks` (int32 ``[N, L]``, full, no
padding). A batch has fixed shapes whatever the data, so XLA compiles the train step once:

| key | dtype | shape | meaning |
|---|---|---|---|
| ``input_ids`` | int64 | [B, L] | ids after masking (80% ``<mask>``, 10% random, 10% unchanged) |
| ``labels`` | int64 | [B, L] | original id at the chosen positions, -100 elsewhere |

Per sequence exactly ``min(P, maskable tokens)`` positions are chosen (``P = max_predictions_per_seq``,
``round(L * mlm_probability)`` by default), never special tokens -- the same rule as the TensorFlow
masking (:mod:`hf_tpu_ext.data.masking`), so both backends train on the same task. No ``attention_mask``
is emitted: blocks are full, and the model then attends everywhere without a mask tensor.

Masking is deterministic: a sequence's mask depends on ``(seed, epoch, example index)`` for training
(dynamic masking: a new mask each epoch; a resumed run sees the same masks) and on ``(seed, example
index)`` for evaluation (the same masks at every evaluation).
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

_EVAL_STREAM = 1 << 20  # keeps evaluation seeds apart from every training epoch's


class BlocksDataset:
    """A map-style ``torch.utils.data.Dataset`` over int32 blocks ``[N, L]``.

    Items are ``{"input_ids": np.ndarray int32 [L], "idx": int}``; the index seeds the masking.

    Args:
        blocks: int32 ``[N, L]`` array (one split of :func:`~hf_tpu_ext.data.blocks.group_into_blocks`).
    """

    def __init__(self, blocks: np.ndarray):
        blocks = np.asarray(blocks)
        if blocks.ndim != 2:
            raise ValueError(f"blocks must be [N, L], got shape {blocks.shape}.")
        self.blocks = blocks

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    def __getitem__(self, i: int) -> Dict[str, object]:
        return {"input_ids": self.blocks[i], "idx": int(i)}


class StaticMaskingCollator:
    """Collate :class:`BlocksDataset` items into fixed-shape masked-LM batches (see the module doc).

    Args:
        mask_token_id: id of ``<mask>``.
        vocab_size: random replacements are drawn from ``[0, vocab_size)`` minus ``special_token_ids``.
        special_token_ids: ids never chosen nor drawn (``tokenizer.all_special_ids``).
        max_predictions: ``P``, positions chosen per sequence (``<= L``).
        seed: base seed of the masking.
        train: ``True`` for training masks (depend on :attr:`epoch`), ``False`` for fixed evaluation masks.

    Attributes:
        epoch: the training epoch the next batches belong to (set by :class:`MaskingEpochCallback`).

    Raises:
        ValueError: ``max_predictions < 1`` or no id is left for random replacement.
    """

    def __init__(self, mask_token_id: int, vocab_size: int, special_token_ids: Sequence[int], max_predictions: int,
                 seed: int = 42, train: bool = True):
        if int(max_predictions) < 1:
            raise ValueError(f"max_predictions must be >= 1, got {max_predictions}.")
        self.mask_token_id = int(mask_token_id)
        self.special = np.array(sorted({int(i) for i in special_token_ids if i is not None}), dtype=np.int64)
        self.replacements = np.setdiff1d(np.arange(int(vocab_size), dtype=np.int64), self.special)
        if self.replacements.size == 0:
            raise ValueError(f"vocab_size={vocab_size} leaves no non-special token id for random replacement.")
        self.max_predictions = int(max_predictions)
        self.seed = int(seed)
        self.train = bool(train)
        self.epoch = 0

    @classmethod
    def from_tokenizer(cls, tokenizer, max_predictions: int, seed: int = 42, train: bool = True) -> "StaticMaskingCollator":
        """Build from a tokenizer: its mask id, ``len(tokenizer)`` and ``all_special_ids``."""
        return cls(tokenizer.mask_token_id, len(tokenizer), tokenizer.all_special_ids, max_predictions, seed, train)

    def _rng(self, idx: int) -> np.random.Generator:
        stream = self.epoch if self.train else _EVAL_STREAM
        return np.random.default_rng([self.seed, stream, int(idx)])

    def mask_one(self, ids: np.ndarray, idx: int):
        """Masked ids and labels (int64 ``[L]`` each) of one block with index ``idx``."""
        ids = np.asarray(ids, dtype=np.int64)
        rng = self._rng(idx)
        labels = np.full(ids.shape, -100, dtype=np.int64)
        maskable = np.flatnonzero(~np.isin(ids, self.special))
        if maskable.size == 0:
            return ids.copy(), labels
        chosen = rng.permutation(maskable)[: self.max_predictions]
        labels[chosen] = ids[chosen]
        action = rng.integers(0, 10, size=chosen.size)  # 0-7 <mask>, 8 random, 9 unchanged
        new = ids.copy()
        new[chosen[action < 8]] = self.mask_token_id
        random_pos = chosen[action == 8]
        new[random_pos] = self.replacements[rng.integers(0, self.replacements.size, size=random_pos.size)]
        return new, labels

    def __call__(self, features: List[Dict[str, object]]):
        """Returns ``{"input_ids": LongTensor [B, L], "labels": LongTensor [B, L]}``."""
        import torch

        pairs = [self.mask_one(f["input_ids"], f.get("idx", i)) for i, f in enumerate(features)]
        return {"input_ids": torch.from_numpy(np.stack([p[0] for p in pairs])),
                "labels": torch.from_numpy(np.stack([p[1] for p in pairs]))}


def masking_epoch_callback(collator: StaticMaskingCollator):
    """A ``TrainerCallback`` that tells ``collator`` the epoch at each ``on_epoch_begin`` (dynamic masking).

    Returns:
        A ``transformers.TrainerCallback`` instance.
    """
    from transformers import TrainerCallback

    class MaskingEpochCallback(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            collator.epoch = int((state.epoch or 0) + 1e-6)  # state.epoch is k.0 at the start of epoch k

    return MaskingEpochCallback()

