"""benchmarks/continue_base.py (issue 42's continue-pretraining figure) end to end at tiny shapes, and its
argument checks and round order.

Runs in the current-releases venv (``KERAS_BACKEND=jax JAX_PLATFORMS=cpu``): the benchmark's children run
``hf-tpu train`` on the default backend (Keras 3 on JAX) and build the model folder with transformers + torch.
"""

import json
import os
import tempfile

import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("the default backend's JAX run", allow_module_level=True)

from benchmarks import continue_base  # noqa: E402

TINY = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64"


def test_tiny_run_prints_the_figures_and_removes_its_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the benchmark's temp folder lands here
    continue_base.main(["--steps", "3", "--seq", "32", "--batch", "4", "--config_overrides", TINY])
    out = capsys.readouterr().out
    first, _, rest = out.partition("\n")
    row, summary = json.loads(first), json.loads(rest)
    assert (row["variant"], row["round"], row["steps"], row["tokens_per_step"]) == ("base", 1, 3, 4 * 32)
    for key in ("peak_rss_mb", "first_step_seconds", "step_seconds"):
        assert row[key] > 0, key
    # the first call compiles: it is slower than a steady step, and the peak holds at least Python + JAX
    assert row["first_step_seconds"] > row["step_seconds"]
    assert row["peak_rss_mb"] > 100
    model = summary["model"]
    assert (model["hidden_size"], model["num_hidden_layers"], model["vocab_size"]) == (32, 1, 30522)
    assert 0 < model["tokenizer_tokens"] <= model["vocab_size"]
    assert summary["base"]["peak_rss_mb"] == [row["peak_rss_mb"]]
    assert summary["base"]["median_step_seconds"] == row["step_seconds"]
    assert list(tmp_path.iterdir()) == []  # model folder, run output and logs removed


def test_round_order_variant_by_variant_or_alternating():
    variants = [("a", []), ("b", ["--backend", "tensorflow"])]
    assert [(r, n) for r, n, _ in continue_base.rounds_order(variants, 2, False)] == [(1, "a"), (2, "a"),
                                                                                      (1, "b"), (2, "b")]
    assert [(r, n) for r, n, _ in continue_base.rounds_order(variants, 2, True)] == [(1, "a"), (1, "b"),
                                                                                     (2, "a"), (2, "b")]


def test_one_step_is_refused_before_any_child(capsys):
    with pytest.raises(SystemExit) as exc:
        continue_base.parse_args(["--steps", "1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --steps must be >= 2 (the first step compiles), --rounds, --seq and --batch >= 1")
