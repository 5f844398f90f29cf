"""Masked-LM evaluation on the XLA device: sums stay on the device, one host read per evaluation."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from hf_tpu_ext.metrics.masked_lm import load_masked_lm_metric



def _encoder_and_head(model):
    """``(encoder, head)`` of a transformers masked LM: the head maps hidden states ``[..., H]`` to logits
    ``[..., V]`` as the model's own ``forward`` does -- RoBERTa ``lm_head``, BERT ``cls.predictions``, DistilBERT
    ``vocab_transform`` -> ``activation`` -> ``vocab_layer_norm`` -> ``vocab_projector``, ModernBERT ``head`` ->
    ``decoder``; ``None`` for another architecture (its full ``forward`` is used)."""
    base = getattr(model, model.base_model_prefix, None)
    head = getattr(model, "lm_head", None) or getattr(getattr(model, "cls", None), "predictions", None)
    if head is None and hasattr(model, "vocab_projector"):
        def head(hidden):
            return model.vocab_projector(model.vocab_layer_norm(model.activation(model.vocab_transform(hidden))))
    elif head is None and hasattr(model, "decoder") and hasattr(model, "head"):
        def head(hidden):
            return model.decoder(model.head(hidden))
    return base, head


def masked_lm_sums(model, input_ids, labels, max_predictions: int, attention_mask=None) -> Tuple[Any, Any, Any]:
    """Summed cross-entropy, correct predictions and count over the masked positions, all on device.

    Only ``P = max_predictions`` positions per sequence go through the LM head: they are picked with
    ``topk`` over ``labels != -100`` (static shape ``[B, P]``), so the graph does not depend on the data.

    Args:
        model: a ``*ForMaskedLM`` (RoBERTa, BERT, DistilBERT, ModernBERT: the head at the ``P`` positions only; any
            other: its full logits).
        input_ids: int64 ``[B, L]``.
        labels: int64 ``[B, L]``, -100 where nothing is predicted (at most ``P`` labels per row).
        max_predictions: ``P``.
        attention_mask: optional ``[B, L]``.

    Returns:
        ``(loss_sum, num_correct, num_tokens)``: float32 scalar tensor (nats), and two float32 scalar tensors.
    """
    import torch
    import torch.nn.functional as F

    base, head = _encoder_and_head(model)
    selected = (labels != -100)
    if base is None or head is None:  # other architectures: the full head, same sums
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        gathered_labels = labels
    else:
        hidden = base(input_ids=input_ids, attention_mask=attention_mask)[0]  # [B, L, H]
        P = min(int(max_predictions), labels.shape[1])
        score, positions = torch.topk(selected.to(torch.int32), P, dim=1)  # [B, P]
        hidden = torch.gather(hidden, 1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        logits = head(hidden)  # [B, P, V]
        gathered_labels = torch.where(score > 0, torch.gather(labels, 1, positions), torch.full_like(positions, -100))
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()
    flat_labels = gathered_labels.reshape(-1)
    loss_sum = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum")
    valid = flat_labels != -100
    correct = ((flat_logits.argmax(-1) == flat_labels) & valid).sum().to(torch.float32)
    return loss_sum, correct, valid.sum().to(torch.float32)


def evaluate_masked_lm(model, dataloader, max_predictions: Optional[int], max_batches: Optional[int] = None
                       ) -> Dict[str, float]:
    """Loss, perplexity and accuracy over the masked tokens of every batch of ``dataloader``.

    The per-batch sums of :func:`masked_lm_sums` are added on the
    device; the three totals reach the host once at the end and go through the package's ``masked_lm``
    ``evaluate`` metric, so both backends compute the numbers the same way. Under several processes the
    totals are summed over all of them (``xm.all_reduce``).

    Args:
        model: the masked LM (on the XLA device, or any torch device).
        dataloader: batches ``{"input_ids": [B, L], "labels": [B, L]}`` and optionally ``"attention_mask"``
            ``[B, L]`` (a padding collator's: pads are then not attended), already on the device, as the
            Trainer's eval dataloader gives them on XLA, or moved here. ``L`` may change from batch to batch.
        max_predictions: ``P``, masked positions per sequence (None: each batch's ``L``, every label counts).
        max_batches: stop after this many batches (None: all).

    Returns:
        ``{"eval_loss": nats per masked token, "perplexity": exp(eval_loss), "eval_accuracy": in [0, 1],
        "eval_tokens": int}``.

    Raises:
        ValueError: the batches hold no masked token.
    """
    import torch


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
                mask = batch.get("attention_mask")
                P = int(ids.shape[1]) if max_predictions is None else max_predictions
                loss_sum, correct, count = masked_lm_sums(model, ids, labels, P,
                                                          attention_mask=None if mask is None else mask.to(device))
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
