"""Backend selection errors and the torch callback registry; no torch_xla needed (these run in every venv)."""

import importlib.metadata
import importlib.util
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest

from hf_tpu_ext.errors import ArgumentError, BackendError, RecompilationError, UnknownCallbackError

INSTALL = "pip install 'hf-tpu-ext[torch-xla]'"

# `hf-tpu train` with importlib's view of torch_xla removed: the same path as a venv without torch_xla
_NO_TORCH_XLA = (
    "import importlib.util, sys\n"
    "_find = importlib.util.find_spec\n"
    "importlib.util.find_spec = lambda name, *a, **k: None if name.split('.')[0] == 'torch_xla' else _find(name, *a, **k)\n"
    "from hf_tpu_ext.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_unknown_backend_is_an_argument_error_listing_the_backends():
    from hf_tpu_ext.args import parse_args

    with pytest.raises(ArgumentError) as err:
        parse_args(["--backend", "jax", "--output_dir", "x"])
    assert str(err.value) == "Unknown --backend 'jax'; choose one of: tensorflow, torch_xla, keras."


@pytest.mark.parametrize("report_to", [[], ["--report_to", "none"]])
def test_cli_backend_torch_xla_without_torch_xla_names_the_extra(tmp_path, report_to):
    # the extra is checked first: without it, --report_to tensorboard (the default) would be named first
    out = tmp_path / "out"
    missing = ", ".join(m for m in ("torch", "torch_xla", "transformers", "accelerate")
                        if m == "torch_xla" or importlib.util.find_spec(m) is None)
    for spelling in (["--backend", "torch_xla"], ["--backend=torch_xla"]):
        proc = subprocess.run([sys.executable, "-c", _NO_TORCH_XLA, "train", *spelling, "--output_dir", str(out),
                               "--max_steps", "1", *report_to], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr[-2000:]
        torch = importlib.util.find_spec("torch") and importlib.metadata.version("torch")
        # beside another torch (the main venv's 2.13) the extra is named for a venv of its own
        assert proc.stderr.strip().splitlines()[-1] == (
            f"hf-tpu train: error: --backend torch_xla needs: {INSTALL} (missing: {missing})."
            if not torch or torch.startswith("2.9.1") else
            f"hf-tpu train: error: --backend torch_xla needs [torch-xla] in a venv of its own (missing here: {missing}; "
            f"installing it here would replace torch {torch}, which [torch-xla] pins to torch==2.9.1, "
            "transformers>=4.57,<5, huggingface_hub>=0.36,<1.0): "
            "python -m venv .venv-xla && .venv-xla/bin/pip install 'hf-tpu-ext[torch-xla]'.")
        assert not out.exists()  # nothing written before the check


def test_require_torch_xla_messages(monkeypatch):
    import importlib.util

    from hf_tpu_ext.backends.torch_xla import device

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == "torch_xla" else real(name, *a, **k))
    with pytest.raises(BackendError) as err:
        device.require_torch_xla()
    assert INSTALL in str(err.value) and "--backend tensorflow" in str(err.value)
    assert isinstance(err.value, ArgumentError)  # BackendError is an ArgumentError


def test_default_pjrt_device(monkeypatch):
    from hf_tpu_ext.backends.torch_xla.device import default_pjrt_device

    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert default_pjrt_device() == "TPU"
    monkeypatch.delenv("PJRT_DEVICE")
    monkeypatch.setattr("glob.glob", lambda pattern: [])
    monkeypatch.setattr("os.path.isdir", lambda path: False)
    assert default_pjrt_device() == "CPU"


def test_callback_backend_names():
    import hf_tpu_ext.callbacks as registry

    assert registry.normalize_backend("torch_xla") == "torch"
    assert registry.normalize_backend("tensorflow") == "tf_keras"
    with pytest.raises(ArgumentError, match="Unknown callback framework 'jax'"):
        registry.normalize_backend("jax")
    builtins = ["masked_lm_metrics", "push_to_hub", "throughput", "xla_recompile_guard"]
    assert [n for n in registry.available_callbacks("torch") if n in builtins] == builtins
    assert registry.available_callbacks("torch")["throughput"] == registry.available_callbacks()["throughput"]
    with pytest.raises(UnknownCallbackError) as err:
        registry.resolve_callbacks(["throughput", "nope"], backend="torch")
    msg = str(err.value)
    assert msg.startswith("Unknown callback 'nope' for the torch framework. Known callbacks: ")
    assert all(name in msg for name in builtins)


# ---------------------------------------------------------------------------------- torch callbacks (need torch)
def test_torch_callbacks_resolve_to_trainer_callbacks():
    pytest.importorskip("torch")
    from transformers import TrainerCallback

    import hf_tpu_ext.callbacks as registry

    names = ["throughput", "xla_recompile_guard", "masked_lm_metrics", "push_to_hub"]
    classes = registry.resolve_callbacks(names, backend="torch_xla")
    assert [c.__name__ for c in classes] == ["ThroughputCallback", "XLARecompileGuard", "MaskedLMMetricsCallback",
                                             "PushToHubCallback"]
    assert all(issubclass(c, TrainerCallback) for c in classes)
    assert [c.__module__ for c in classes] == [f"hf_tpu_ext.callbacks.torch.{m}" for m in (
        "throughput", "xla_recompile_guard", "masked_lm_metrics", "push_to_hub")]
    cb = registry.get_callback("throughput", backend="torch", seq_length=128)
    assert (cb.seq_length, cb.global_batch_size, cb.warmup_steps) == (128, None, 3)
    with pytest.raises(ArgumentError, match="must decorate a transformers.TrainerCallback subclass"):
        registry.register_callback("not_a_trainer_cb", backend="torch")(dict)
    with pytest.raises(ArgumentError, match="already registered"):
        @registry.register_callback("throughput", backend="torch")
        class Other(TrainerCallback):
            pass


def _hook_args(step, history=None):
    state = SimpleNamespace(global_step=step, log_history=history if history is not None else [], epoch=step / 10,
                            is_world_process_zero=True)
    return SimpleNamespace(), state, SimpleNamespace()


def test_recompile_guard_windows(monkeypatch):
    pytest.importorskip("torch")
    from hf_tpu_ext.callbacks.torch import xla_recompile_guard as guard_mod

    counter = {"n": 0}
    monkeypatch.setattr(guard_mod, "_xla_compile_count", lambda: counter["n"])
    monkeypatch.setattr(guard_mod, "_model_device_type", lambda model: "xla")
    guard = guard_mod.XLARecompileGuard(warmup_steps=2)

    def step(k, compiles=0, events=()):
        args, state, control = _hook_args(k)
        guard.on_step_begin(args, state, control)
        counter["n"] += compiles
        for e in events:
            getattr(guard, "on_" + e)(args, state, control)

    guard.on_train_begin(*_hook_args(0))
    step(0, compiles=2)  # warm-up windows
    step(1, compiles=1)
    step(2)
    step(3, compiles=3, events=("log",))  # the first window with a log: its graphs are expected
    step(4)
    step(5, events=("log",))
    assert guard.events == [] and guard.compilations_after_warmup == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(6, compiles=1)  # a plain step compiling again: a recompilation
        step(7)
    assert guard.compilations_after_warmup == 1 and guard.compilations == 7
    assert guard.events[0].startswith("XLA compiled 1 new graph(s) at global step 7 (window: a plain train step)")
    assert [str(w.message) for w in caught] == guard.events

    strict = guard_mod.XLARecompileGuard(warmup_steps=1, action="raise")
    guard = strict
    counter["n"] = 0
    guard.on_train_begin(*_hook_args(0))
    step(0, compiles=1)
    step(1)
    step(2, compiles=1)
    with pytest.raises(RecompilationError, match="at global step 3"):
        step(3)
    with pytest.raises(ArgumentError, match="action must be 'warn' or 'raise'"):
        guard_mod.XLARecompileGuard(action="ignore")


def test_throughput_windows_leave_out_warmup_and_evaluation(monkeypatch):
    pytest.importorskip("torch")
    from hf_tpu_ext.callbacks.torch import throughput

    clock = {"t": 0.0}
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(throughput, "wait_device", lambda: None)
    cb = throughput.ThroughputCallback(seq_length=32, global_batch_size=8, num_replicas=2, flops_per_token=1e3,
                                       peak_flops=1e6, warmup_steps=2)
    args = SimpleNamespace(per_device_train_batch_size=4, world_size=2, gradient_accumulation_steps=1)
    history = []
    state = SimpleNamespace(global_step=0, log_history=history)
    cb.on_train_begin(args, state, None)
    for k, seconds in enumerate([5.0, 5.0, 0.1, 0.3, 9.0, 0.2]):  # two warm-up steps, one window with an evaluation
        state.global_step = k
        cb.on_step_begin(args, state, None)
        clock["t"] += seconds
        if k == 4:
            cb.on_evaluate(args, state, None)
    state.global_step = 6
    history.append({"loss": 2.0, "step": 6})
    cb.on_log(args, state, None, logs={"loss": 2.0})
    cb.on_train_end(args, state, None)
    # measured: steps 2, 3, 5 in 0.6 s -> 3 * 8 / 0.6 = 40 samples/s
    assert cb.summary["steps_measured"] == 3
    assert cb.summary["samples_per_second"] == pytest.approx(40.0)
    assert cb.summary["tokens_per_second"] == pytest.approx(1280.0)
    assert cb.summary["tokens_per_second_per_replica"] == pytest.approx(640.0)
    assert cb.summary["step_time_ms_median"] == pytest.approx(200.0)
    assert cb.summary["mfu"] == pytest.approx(640.0 * 1e3 / 1e6)
    # at the log the window of step 5 was still open: steps 2 and 3 in 0.4 s
    assert history[-1]["tokens_per_second"] == pytest.approx(2 * 8 * 32 / 0.4)
    assert history[-1]["step_time_ms_median"] == pytest.approx(200.0)


def test_torch_backend_maps_transformers_argument_names():
    """Our TrainingArguments names reach transformers.TrainingArguments with their meaning."""
    pytest.importorskip("accelerate")  # transformers.TrainingArguments with torch needs it
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.backends.torch_xla.trainer import hf_training_arguments

    _, _, ours = parse_args(["--output_dir", "o", "--backend", "torch_xla", "--optim", "adamw_torch_fused",
                             "--gradient_accumulation_steps", "2", "--lr_scheduler_type", "cosine", "--warmup_ratio",
                             "0.25", "--load_best_model_at_end", "--metric_for_best_model", "perplexity",
                             "--report_to", "none"])
    hf = hf_training_arguments(ours, 100)
    assert (hf.optim, hf.gradient_accumulation_steps, hf.lr_scheduler_type, hf.warmup_steps) == (
        "adamw_torch", 2, "cosine", 25)
    assert (hf.load_best_model_at_end, hf.metric_for_best_model, hf.greater_is_better, hf.report_to) == (
        True, "eval_loss", False, [])
