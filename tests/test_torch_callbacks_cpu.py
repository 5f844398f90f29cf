"""The Trainer recompile guard off XLA (transformers 4.57 here; tests/current runs a transformers 5 Trainer).

On a CPU/GPU model it counts the graphs ``torch.compile`` builds; with eager PyTorch it says it has nothing to
guard instead of passing silently. The hooks are driven directly, as the Trainer calls them.
"""

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
