"""transformers' own masked-LM loss on a Keras run's evaluation batches: the reference the runs' ``eval_loss`` is
checked against (``--eval_on_start``: the first evaluation, before any step, sees the starting weights)."""

import numpy as np


def transformers_eval_loss(argv, folder) -> float:
    """Mean cross-entropy (nats per masked position, float64) of ``AutoModelForMaskedLM`` loaded from ``folder``
    (eval mode, float32) over the evaluation batches of the ``hf-tpu train`` command line ``argv``.

    The batches are rebuilt the way the Keras backend builds them: the run's validation blocks
    (:func:`hf_tpu_ext.data.run_data.load_text_blocks`, same ``--seed``), ``per_device_eval_batch_size`` x the JAX
    device count per batch, masks from :func:`hf_tpu_ext.data.numpy_batches.eval_batches` (seed rule
    ``(seed, eval stream, batch index, row)``); positions of weight 0 (padding slots) do not count.
    """
    import jax
    import torch
    import transformers

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.data.numpy_batches import NumpyMasker, eval_batches
    from hf_tpu_ext.data.run_data import load_text_blocks

    model_args, data_args, training_args = parse_args([str(a) for a in argv])
    tokenizer, blocks, _ = load_text_blocks(model_args, data_args, training_args.seed)
    masker = NumpyMasker.for_tokenizer(tokenizer, data_args.max_predictions_per_seq)
    model = transformers.AutoModelForMaskedLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    loss = count = 0.0
    batch_size = training_args.per_device_eval_batch_size * jax.device_count()
    for batch in eval_batches(blocks["validation"], batch_size, training_args.seed, masker):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                           attention_mask=torch.tensor(batch["attention_mask"], dtype=torch.long)).logits
        logp = torch.log_softmax(logits.double(), dim=-1).numpy()
        rows = np.arange(logp.shape[0])[:, None]
        picked = logp[rows, batch["masked_lm_positions"], batch["masked_lm_ids"]]
        weights = batch["masked_lm_weights"].astype(np.float64)
        loss -= float((picked * weights).sum())
        count += float(weights.sum())
    return loss / count


def rerun(argv, output_dir, *extra):
    """Run ``hf-tpu train`` again with the command line ``argv`` into ``output_dir`` (its ``--output_dir``
    replaced), ``extra`` flags appended (argparse: a repeated flag's last value wins); returns ``(log_history,
    training_summary)`` of the new folder."""
    import json

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    argv = [str(a) for a in argv]
    argv[argv.index("--output_dir") + 1] = str(output_dir)
    train(*parse_args(argv + [str(a) for a in extra]))
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return state["log_history"], json.loads((output_dir / "training_summary.json").read_text())


def step_losses(log_history) -> dict:
    """``{step: loss}`` of the training logs in ``log_history`` (trainer_state.json's)."""
    return {e["step"]: e["loss"] for e in log_history if "loss" in e}


def check_steps_per_execution_2(argv, out, folder, rtol: float) -> None:
    """A rerun of ``argv`` with ``--steps_per_execution 2`` into ``folder`` logs at steps 2, 4, ..., 20 the mean of
    the same two steps of the one-step-per-call run in ``out`` (logged every step), within ``rtol``."""
    import json

    history, summary = rerun(argv, folder, "--steps_per_execution", "2")
    ours = step_losses(history)
    theirs = step_losses(json.loads((out / "trainer_state.json").read_text())["log_history"])
    assert sorted(ours) == list(range(2, 21, 2)) and sorted(theirs) == list(range(1, 21))
    np.testing.assert_allclose([ours[s] for s in range(2, 21, 2)],
                               [(theirs[s - 1] + theirs[s]) / 2 for s in range(2, 21, 2)], rtol=rtol)
    assert summary["steps_per_execution"] == 2
