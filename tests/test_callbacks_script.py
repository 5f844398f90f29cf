"""An existing plain Keras MLM script gains our callbacks by name, and their numbers land in History."""

import importlib.util
import math
import os

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "plain_tpu_mlm.py")


def _load_script():
    spec = importlib.util.spec_from_file_location("plain_tpu_mlm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def script_run():
    from hf_tpu_ext.callbacks import get_callback
    from hf_tpu_ext.flops import flops_per_token

    script = _load_script()
    args = script.parse_args(["--epochs", "2", "--steps_per_execution", "2", "--jit_compile"])
    _, model, train_ds, eval_ds = script.build(args)
    fpt = flops_per_token(model.config, args.max_length)  # the stock model runs its head at every position
    callbacks = [
        get_callback("throughput", model=model, global_batch_size=args.batch_size, seq_length=args.max_length,
                     flops_per_token=fpt, peak_flops=1e12),
        get_callback("xla_recompile_guard", model=model, action="raise"),
        get_callback("masked_lm_metrics", model=model, eval_dataset=eval_ds),
    ]
    history = script.train(model, train_ds, eval_ds, args, callbacks=callbacks)
    return dict(script=script, args=args, model=model, train_ds=train_ds, eval_ds=eval_ds, fpt=fpt,
                callbacks=callbacks, history=history.history)


def test_history_has_throughput(script_run):
    h, args = script_run["history"], script_run["args"]
    assert len(h["loss"]) == 2
    for sps, tps, tpr, mfu in zip(h["samples_per_second"], h["tokens_per_second"],
                                  h["tokens_per_second_per_replica"], h["mfu"]):
        assert tps > 0
        assert tps == pytest.approx(sps * args.max_length)
        assert tpr == pytest.approx(tps)  # one replica
        assert mfu == pytest.approx(tpr * script_run["fpt"] / 1e12)
    assert all(t > 0 for t in h["step_time_ms_median"])
    summary = script_run["callbacks"][0].summary
    # 48 blocks / batch 8 = 6 steps per epoch, 12 in all; the first call (2 steps) is warm-up
    assert summary["steps_measured"] == 10
    assert summary["tokens_per_second"] > 0


def test_history_has_one_compilation(script_run):
    assert script_run["history"]["xla_compilations"] == [1, 1]
    assert script_run["callbacks"][1].events == []


def test_history_has_masked_lm_metrics(script_run):
    h = script_run["history"]
    for loss, ppl, acc, tokens in zip(h["eval_loss"], h["perplexity"], h["eval_accuracy"], h["eval_tokens"]):
        assert math.isfinite(loss) and 0 < loss < 10
        assert math.isfinite(ppl) and ppl == pytest.approx(math.exp(loss), rel=1e-12)
        assert 0.0 <= acc <= 1.0
        assert tokens > 0
    assert h["eval_tokens"][0] == h["eval_tokens"][1]  # cached eval masks: same tokens each time
    assert h["eval_loss"][1] < h["eval_loss"][0]  # it learns something


def test_callback_numbers_equal_direct_evaluation(script_run):
    from hf_tpu_ext.metrics.masked_lm_tf import evaluate_masked_lm

    direct = evaluate_masked_lm(script_run["model"], script_run["eval_ds"])
    h = script_run["history"]
    assert direct["eval_loss"] == pytest.approx(h["eval_loss"][-1], rel=1e-6)
    assert direct["eval_accuracy"] == pytest.approx(h["eval_accuracy"][-1], abs=1e-9)
    assert direct["eval_tokens"] == h["eval_tokens"][-1]
    one = evaluate_masked_lm(script_run["model"], script_run["eval_ds"], steps=1)
    assert 0 < one["eval_tokens"] < direct["eval_tokens"]


def test_every_n_steps_evaluation(script_run):
    from hf_tpu_ext.callbacks import get_callback

    from hf_tpu_ext.metrics.masked_lm_tf import make_eval_step

    model = script_run["model"]
    start = int(model.optimizer.iterations.numpy())
    step_fn = make_eval_step(model, model.distribute_strategy, None)  # the cached one the callback uses
    traces = step_fn.experimental_get_tracing_count()
    assert traces >= 1
    cb = get_callback("masked_lm_metrics", model=script_run["model"], eval_dataset=script_run["eval_ds"], eval_steps=1, every_n_steps=2)
    history = model.fit(script_run["train_ds"], epochs=1, callbacks=[cb], verbose=0)
    # steps_per_execution=2: calls end at start+2, +4, +6, each crossing a multiple of 2
    assert [e["step"] for e in cb.history] == [start + 2, start + 4, start + 6]
    assert history.history["eval_loss"] == [cb.history[-1]["eval_loss"]]
    assert step_fn.experimental_get_tracing_count() == traces  # repeated evaluations do not retrace


def test_evaluation_errors(script_run):
    from hf_tpu_ext.metrics.masked_lm_tf import evaluate_masked_lm
    from hf_tpu_ext.errors import DataError

    with pytest.raises(DataError, match="yielded no batch"):
        evaluate_masked_lm(script_run["model"], script_run["eval_ds"].take(0))
    no_labels = script_run["eval_ds"].map(lambda b: {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]})
    with pytest.raises(DataError, match="masked_lm_positions.*or labels"):
        evaluate_masked_lm(script_run["model"], no_labels)
