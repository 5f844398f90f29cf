"""Checks shared by the Keras architecture runs (bert, distilbert, modernbert): transformers' own masked-LM loss on a
run's evaluation batches (the reference its ``eval_loss`` is checked against; ``--eval_on_start``: the first
evaluation, before any step, sees the starting weights), reruns with one flag changed, and a resume after kill -9
and SIGTERM that must end equal to the uninterrupted run."""

import numpy as np
import pytest


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


#: log_history keys that are measured, not computed (they differ between any two runs)
TIMING_KEYS = ("tokens_per_second", "mfu")


def _train_process(argv, kill_at=None, signal_at=None):
    """``python -m hf_tpu_ext train argv`` in its own process (this checkout first on ``PYTHONPATH``), with the test
    hooks of :mod:`hf_tpu_ext.interrupts`: ``kill_at`` (SIGKILL) / ``signal_at`` (SIGTERM once) at a fault point."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_TPU_EXT_TEST_")}
    env.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    if kill_at:
        env["HF_TPU_EXT_TEST_KILL_AT"] = kill_at
    if signal_at:
        env["HF_TPU_EXT_TEST_SIGNAL_AT"] = signal_at
    return subprocess.run([sys.executable, "-m", "hf_tpu_ext", "train", *map(str, argv)], env=env,
                          capture_output=True, text=True, timeout=900)


def check_resume_after_kill_and_sigterm(argv, out, folder) -> None:
    """The run ``argv`` (20 steps; its uninterrupted output in ``out``) repeated into ``folder`` with a save every 5
    steps: SIGKILL (kill -9) once checkpoint-5 is written; resumed, SIGTERM after step 13 (a preemption: the run
    saves checkpoint-13 and exits 143); resumed again to the end. Its weights equal ``out``'s (1e-5) and its
    log history (losses, evaluations, probes; timing keys aside) is ``out``'s (rel 1e-5)."""
    import json

    from safetensors.numpy import load_file

    argv = [str(a) for a in argv]
    argv[argv.index("--output_dir") + 1] = str(folder)
    argv += ["--save_steps", "5"]
    proc = _train_process(argv, kill_at="saved@5")
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-5"]
    proc = _train_process(argv + ["--resume_from_checkpoint", "true"], signal_at="train_step@13")
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "checkpoint-13" in {p.name for p in folder.glob("checkpoint-*")}
    assert not (folder / "model.safetensors").exists()
    proc = _train_process(argv + ["--resume_from_checkpoint", "true"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "checkpoint-13" in proc.stderr  # resumed from the SIGTERM's save

    ours, ref = load_file(str(folder / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(ours) == sorted(ref)
    for name in ref:
        np.testing.assert_allclose(ours[name], ref[name], atol=1e-5, rtol=0, err_msg=name)
    got, want = ([{k: v for k, v in e.items() if k not in TIMING_KEYS}
                  for e in json.loads((d / "trainer_state.json").read_text())["log_history"]] for d in (folder, out))
    assert [sorted(e) for e in got] == [sorted(e) for e in want]
    for a, b in zip(got, want):
        for k in b:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (k, a, b)


def check_bf16_trains(argv, folder) -> None:
    """A 10-step rerun of ``argv`` into ``folder`` with ``--bf16 true``: a finite loss at every step, the summary's
    precision ``bf16 mixed``, global step 10."""
    history, summary = rerun(argv, folder, "--bf16", "true", "--max_steps", "10")
    losses = step_losses(history)
    assert sorted(losses) == list(range(1, 11)) and np.isfinite(list(losses.values())).all()
    assert summary["precision"] == "bf16 mixed" and summary["global_step"] == 10


def check_streaming_exports(argv, folder, model_class: str, *extra) -> None:
    """A 10-step rerun of ``argv`` into ``folder`` with ``--streaming true`` (``extra`` appended, e.g. another
    ``--train_file``): a loss at every step, global step 10, and ``AutoModelForMaskedLM`` loads the export as
    ``model_class``."""
    import transformers

    history, summary = rerun(argv, folder, "--streaming", "true", "--max_steps", "10", *extra)
    assert sorted(step_losses(history)) == list(range(1, 11)) and summary["global_step"] == 10
    assert type(transformers.AutoModelForMaskedLM.from_pretrained(folder)).__name__ == model_class
