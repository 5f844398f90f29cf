"""Export of a state sharded over processes (issue 50 item 3): no process holds a whole copy of it.

2 processes x 2 CPU devices with ``--fsdp full_shard`` (6 steps, a checkpoint at 3 and 6) export what 1 process x 4
devices exports; process 0 makes each weight from the blocks every process wrote at the last checkpoint, one at a
time (its log line counts the reads and the largest), and no process gathers the state at a save or at fit's end.
The peak host memory of a save and the export on each of 2 processes is measured by
``benchmarks/export_rss.py --processes 2`` at a small size: below the whole-state gather of before by more than the
model's size.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import os
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("keras_hub")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

from test_keras_multiprocess import _start, mp_args, start_cluster  # noqa: E402  (the same tiny run, launcher)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
EXTRA = ("--max_steps", "6", "--save_steps", "3", "--fsdp", "full_shard")
READS = re.compile(r"export of the state sharded over processes: (\d+) weight reads from the blocks of "
                   r"checkpoint-6, one at a time \(largest ([0-9.]+) MiB\); no process gathered the state")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("export-processes")
    procs = [_start(mp_args(root / "one", *EXTRA), JAX_NUM_CPU_DEVICES=4),
             *start_cluster([root / "pair", root / "pair-1"], extra=EXTRA)]
    ends = [(p.communicate(timeout=600), p.returncode) for p in procs]
    for (out, err), rc in ends:
        assert rc == 0, err[-4000:]
    return root, [err for (_, err), _ in ends]


def test_two_processes_export_what_one_process_of_four_exports(exports):
    from safetensors.numpy import load_file

    root, errs = exports
    ours, ref = load_file(str(root / "pair" / "model.safetensors")), load_file(str(root / "one" / "model.safetensors"))
    assert sorted(ours) == sorted(ref) and len(ref) > 30
    for key in ref:
        np.testing.assert_allclose(ours[key], ref[key], atol=1e-6, rtol=0, err_msg=key)
    assert not (root / "pair-1" / "model.safetensors").exists()  # process 0 alone exports


def test_process_zero_reads_each_weight_from_the_blocks_and_none_gathers(exports):
    from safetensors.numpy import load_file

    root, errs = exports
    found = [READS.search(err) for err in errs]
    assert found[0] is None and found[2] is None  # the 1 x 4 run holds its state whole; process 1 never exports
    reads, largest = int(found[1].group(1)), float(found[1].group(2))
    exported = load_file(str(root / "pair" / "model.safetensors"))
    # model.safetensors and the keras-hub preset each read every weight once: all tensors but RoBERTa's
    # token_type_embeddings (made as zeros: the Keras model has no token types)
    assert reads == 2 * (len(exported) - 1)
    assert largest == pytest.approx(max(a.nbytes for a in exported.values()) / 2**20, abs=0.01)


def test_a_save_and_the_export_hold_no_whole_copy_on_any_process(monkeypatch):
    """2 processes x 2 devices, hidden 256 x 4 layers, vocab 16384 (28.9 MiB of weights, 86.6 MiB of state): the
    save and process 0's export stay below one copy of the model on each process (the largest tensor is the 16 MiB
    embedding), and below the whole-state gather of before by more than the model; the same bytes exported, and the
    best weights gathered one collective at a time equal the checkpoint's."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from benchmarks.export_rss_processes import run

    figures = run(hidden=256, layers=4, vocab=16384)
    assert figures["same_export"] is True and figures["by_tensor"][0]["best_equal"] is True, figures
    for before, now in zip(figures["gathered"], figures["by_tensor"]):
        model = now["model_mib"]
        assert 25 < model < 35 and 80 < now["state_mib"] < 95, figures
        assert now["peak_above_mib"] < model, figures
        assert now["peak_above_mib"] + model < before["peak_above_mib"], figures
