"""The Trainer recompile guard off XLA (transformers 4.57 here; tests/current runs a transformers 5 Trainer).

On a CPU/GPU model it counts the graphs ``torch.compile`` builds; with eager PyTorch it says it has nothing to
guard instead of passing silently. The hooks are driven directly, as the Trainer calls them.
"""

import statistics
import warnings
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_tpu_ext.callbacks import get_callback  # noqa: E402
from hf_tpu_ext.errors import RecompilationError  # noqa: E402


def _state(step):
    return SimpleNamespace(global_step=step, log_history=[], epoch=0.0, is_world_process_zero=True)


def test_eager_model_on_cpu_has_nothing_to_guard():
    guard = get_callback("xla_recompile_guard", framework="torch", action="raise")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guard.on_train_begin(SimpleNamespace(torch_compile=False), _state(0), SimpleNamespace(),
                             model=torch.nn.Linear(4, 4))
        for step in range(3):  # hooks after that are no-ops, never an error
            guard.on_step_begin(None, _state(step), None)
        guard.on_train_end(None, _state(3), None)
    assert guard.mode is None
    assert [str(w.message) for w in caught] == [
        "XLARecompileGuard: nothing to guard: the model runs eagerly on cpu (no XLA device, no torch.compile), so "
        "no graph is ever compiled. Use a torch_xla device or TrainingArguments(torch_compile=True) to guard "
        "compilations, or drop this callback."]


def test_torch_compile_recompilation_after_warmup_raises():
    model = torch.compile(torch.nn.Linear(4, 4), backend="eager")
    guard = get_callback("xla_recompile_guard", framework="torch", action="raise", warmup_steps=1)
    guard.on_train_begin(SimpleNamespace(torch_compile=False), _state(0), SimpleNamespace(), model=model)
    assert guard.mode == "torch_compile"

    def step(k, batch):
        guard.on_step_begin(None, _state(k), None)
        model(torch.ones(batch, 4))

    step(0, 8)  # warm-up: the first graph
    step(1, 8)
    step(2, 8)  # same shape: cached, nothing new
    guard.on_step_begin(None, _state(3), None)
    assert (guard.compilations, guard.compilations_after_warmup) == (1, 0)
    model(torch.ones(3, 4))  # a short batch: TorchDynamo compiles again
    with pytest.raises(RecompilationError) as err:
        guard.on_step_begin(None, _state(4), None)
    assert str(err.value).startswith("torch.compile compiled 1 new graph(s) at global step 4 (window: a plain train "
                                     "step), after warm-up; 2 in all.")
    assert guard.compilations_after_warmup == 1



def test_throughput_figures_reach_the_printed_trainer_log(capsys):
    # the Trainer's own wiring (no accelerate needed): the default callbacks, the user's, then the printer
    # (Trainer.__init__ adds PrinterCallback/ProgressCallback after the user's callbacks)
    import ast

    from transformers import RobertaConfig, RobertaForMaskedLM, TrainerControl, TrainerState
    from transformers.trainer import DEFAULT_CALLBACKS
    from transformers.trainer_callback import CallbackHandler, PrinterCallback

    config = RobertaConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=40)
    model = RobertaForMaskedLM(config)
    cb = get_callback("throughput", framework="torch", seq_length=32, warmup_steps=1, peak_flops=1e12)
    handler = CallbackHandler(DEFAULT_CALLBACKS + [cb], model, None, None, None)
    handler.add_callback(PrinterCallback)
    args = SimpleNamespace(per_device_train_batch_size=2, world_size=1, gradient_accumulation_steps=1,
                           logging_first_step=False, logging_strategy="no", eval_strategy="no", save_strategy="no",
                           disable_tqdm=True, bf16=False)
    state, control = TrainerState(), TrainerControl()
    state.is_local_process_zero = state.is_world_process_zero = True
    handler.on_train_begin(args, state, control)
    batch = torch.randint(5, 100, (2, 32))
    for step in range(8):
        state.global_step = step
        handler.on_step_begin(args, state, control)
        model(input_ids=batch, labels=batch).loss.backward()
        if step in (3, 7):
            state.global_step = step + 1
            logs = {"loss": 4.5, "learning_rate": 1e-4}
            state.log_history.append({**logs, "step": state.global_step})  # what Trainer.log does first
            handler.on_log(args, state, control, logs)
    state.global_step = 8
    handler.on_train_end(args, state, control)
    printed = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines()
               if line.startswith("{") and "'loss'" in line]
    assert len(printed) == 2
    for logs in printed:
        for key in ("samples_per_second", "tokens_per_second", "tokens_per_second_per_replica",
                    "step_time_ms_median", "model_flops_per_second", "mfu"):
            assert logs[key] > 0, key
        assert logs["tokens_per_second"] == pytest.approx(logs["samples_per_second"] * 32, rel=1e-3)
        assert logs["mfu"] == pytest.approx(logs["model_flops_per_second"] / 1e12, abs=1e-6)  # logged to 6 decimals
    assert state.log_history[-1]["mfu"] == printed[-1]["mfu"]
    assert cb.summary["mfu"] > 0 and cb.summary["global_batch_size"] == 2


def test_padded_batch_tokens_per_second_counts_real_tokens(caplog):
    # a collator that pads to the batch's longest line: 2 x 32 positions, 11 + 7 = 18 of them real tokens
    import logging

    from transformers import RobertaConfig, RobertaForMaskedLM

    config = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=40)
    model = RobertaForMaskedLM(config)
    cb = get_callback("throughput", framework="torch", seq_length=32, warmup_steps=1, peak_flops=1e12)
    args = SimpleNamespace(per_device_train_batch_size=2, world_size=1, gradient_accumulation_steps=1, bf16=False)
    ids = torch.randint(5, 100, (2, 32))
    mask = torch.zeros(2, 32, dtype=torch.long)
    mask[0, :11], mask[1, :7] = 1, 1
    state = _state(0)
    cb.on_train_begin(args, state, None, model=model)
    with caplog.at_level(logging.INFO, logger="hf_tpu_ext"):
        for step in range(4):
            state.global_step = step
            cb.on_step_begin(args, state, None)
            model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
            model.eval()
            model(input_ids=ids, attention_mask=torch.ones_like(mask))  # an eval forward is not counted
            model.train()
        state.global_step = 4
        state.log_history.append({"loss": 4.5, "step": 4})
        logs = {"loss": 4.5}
        cb.on_step_begin(args, state, None)  # closes step 3's window, as the next step's begin does
        cb.on_log(args, state, None, logs)
    assert caplog.records == []  # the Trainer's printed dict is the one throughput line
    cb.log_line = True  # a Trainer without its printer (hf-tpu train --disable_tqdm true): the callback's line
    with caplog.at_level(logging.INFO, logger="hf_tpu_ext"):
        cb.on_log(args, state, None, {"loss": 4.5})
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["step 4"]
    assert cb._measured_steps == 3  # steps 1-3 (step 0 is warm-up)
    # the steady rate is the median step's (hf-tpu train's): 18 real tokens per step / the median step time
    median = statistics.median(cb._step_times)
    assert len(cb._step_times) == 3 and logs["step_time_ms_median"] == pytest.approx(round(median * 1e3, 6))
    assert logs["tokens_per_second"] == pytest.approx(round(18 / median, 6))
    assert logs["samples_per_second"] == pytest.approx(round(2 / median, 6))
    facts = cb.card_facts(4)
    assert facts["tokens_seen"] == 4 * 18  # every step's real tokens, warm-up included: not 4 x 2 x 32
    assert facts["steady_tokens_per_second"] == pytest.approx(18 / median)
    # whole run: the 72 tokens over the wall time since train begin (longer than the 3 measured steps)
    assert 0 < facts["train_tokens_per_second"] < 72 / cb._measured_seconds
    cb.on_train_end(args, state, None)
    assert cb.summary["tokens_measured"] == 54 and cb.summary["tokens_counted"] == "real tokens (attention_mask sum)"
    assert cb.summary["tokens_seen"] == 72 and cb.summary["step_time_ms_mean"] == pytest.approx(
        cb._measured_seconds / 3 * 1e3)
    assert cb._hook is None and not model._forward_pre_hooks  # the hook goes with the run


def test_mfu_is_the_mfu_meters_and_a_rate_above_the_peak_leaves_it_out(caplog):
    # one MFU policy (hf_tpu_ext.mfu.MFUMeter): a peak below the measured FLOP rate is wrong for this machine,
    # so MFU is left out, said once, and the card says why
    import logging

    cb = get_callback("throughput", framework="torch", seq_length=8, warmup_steps=0, peak_flops=1.0,
                      flops_per_token=1e6, count_tokens="seq_length")
    args = SimpleNamespace(per_device_train_batch_size=2, world_size=1, gradient_accumulation_steps=1, bf16=False)
    state = _state(0)
    cb.on_train_begin(args, state, None, model=None)
    with caplog.at_level(logging.WARNING, logger="hf_tpu_ext"):
        for step in range(3):
            state.global_step = step
            cb.on_step_begin(args, state, None)
        state.global_step = 3
        state.log_history.append({"loss": 1.0, "step": 3})
        logs = {"loss": 1.0}
        cb.on_step_begin(args, state, None)
        cb.on_log(args, state, None, logs)
        cb.on_log(args, state, None, {"loss": 1.0})
    assert "mfu" not in logs and logs["model_flops_per_second"] > 1.0
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and notes[0].startswith("MFU left out: the model FLOP rate ")
    assert notes[0].endswith("is above the peak 1 FLOP/s (given (peak_flops)); the peak is too low for this machine.")
    facts = cb.card_facts(3)
    assert "mfu" not in facts and facts["mfu_note"] == notes[0][:-1]
    assert facts["tokens_seen"] == 3 * 2 * 8  # seq_length per sequence
