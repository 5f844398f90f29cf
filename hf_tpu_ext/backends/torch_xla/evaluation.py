"""Masked-LM evaluation on the XLA device: sums stay on the device, one host read per evaluation."""

from __future__ import annotations

from typing import Dict, Optional


def evaluate_masked_lm(model, dataloader, max_predictions: int, max_batches: Optional[int] = None) -> Dict[str, float]:
    """Loss, perplexity and accuracy over the masked tokens of every batch of ``dataloader``.

    The per-batch sums of :func:`~hf_tpu_ext.backends.torch_xla.model.masked_lm_sums` are added on the
    device; the three totals reach the host once at the end and go through the package's ``masked_lm``
    ``evaluate`` metric, so both backends compute the numbers the same way. Under several processes the
    totals are summed over all of them (``xm.all_reduce``).

    Args:
        model: the masked LM (on the XLA device, or any torch device).
        dataloader: batches ``{"input_ids": [B, L], "labels": [B, L]}`` (already on the device, as the
            Trainer's eval dataloader gives them on XLA, or moved here).
        max_predictions: ``P``, masked positions per sequence.
        max_batches: stop after this many batches (None: all).

    Returns:
        ``{"eval_loss": nats per masked token, "perplexity": exp(eval_loss), "eval_accuracy": in [0, 1],
        "eval_tokens": int}``.

    Raises:
        ValueError: the batches hold no masked token.
    """
    import torch

    from hf_tpu_ext.backends.torch_xla.model import masked_lm_sums
    from hf_tpu_ext.metrics.masked_lm import load_masked_lm_metric

    device = next(model.parameters()).device
    mark_step = None
    if device.type == "xla":
        import torch_xla.core.xla_model as xm

        mark_step = xm.mark_step  # one graph per batch, however the batches reach the device
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float32, device=device)
    try:
        with torch.no_grad():
            for i, batch in enumerate(dataloader):
                if max_batches is not None and i >= max_batches:
                    break
                ids = batch["input_ids"].to(device)
                labels = batch["labels"].to(device)
                loss_sum, correct, count = masked_lm_sums(model, ids, labels, max_predictions)
                totals = totals + torch.stack([loss_sum.float(), correct, count])
                if mark_step is not None:
                    mark_step()
        if device.type == "xla":
            import torch_xla.core.xla_model as xm
            import torch_xla.runtime as xr

            if xr.world_size() > 1:
                totals = xm.all_reduce(xm.REDUCE_SUM, totals)
        loss_sum, correct, count = (float(v) for v in totals.cpu().tolist())
    finally:
        model.train(was_training)
    metric = load_masked_lm_metric()
    return metric.compute(loss_sum=[loss_sum], num_correct=[int(round(correct))], num_tokens=[int(round(count))])
