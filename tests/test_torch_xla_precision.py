"""--backend torch_xla resolves --bf16 through hf_tpu_ext.precision (the one owner), like the other backends."""

import pytest

from hf_tpu_ext.backends.torch_xla import backend as xla_backend
from hf_tpu_ext.precision import AUTO_XLA_CPU_REASON


@pytest.mark.parametrize("native_cpu", [True, False])
def test_a_cpu_keeps_float32_unless_bf16_is_asked_for(monkeypatch, native_cpu):
    monkeypatch.setattr("hf_tpu_ext.precision.cpu_flags", lambda: frozenset({"avx512_bf16"} if native_cpu else {"avx2"}))
    plans = {bf16: xla_backend._precision_plan(bf16, "CPU") for bf16 in (None, "auto", True, False)}
    assert {k: p.precision for k, p in plans.items()} == {None: "float32", "auto": "float32", True: "bf16 mixed",
                                                          False: "float32"}
    assert all(p.jit_compile and p.compiler == "XLA" for p in plans.values())
    assert plans["auto"].reason == (AUTO_XLA_CPU_REASON if native_cpu
                                    else "--bf16 auto: this CPU has no native bf16, float32 is faster")


def test_a_tpu_and_an_ampere_gpu_take_bf16_under_auto(monkeypatch):
    tpu = {bf16: xla_backend._precision_plan(bf16, "TPU") for bf16 in (None, "auto", False)}
    assert [(p.bf16, p.reason) for p in tpu.values()] == [
        (True, "bf16 by default on a TPU"), (True, "--bf16 auto: this TPU has native bf16"), (False, "--bf16 false")]
    for capable, expected in ((True, True), (False, False)):
        monkeypatch.setattr(xla_backend, "_cuda_has_native_bf16", lambda: capable)
        assert xla_backend._precision_plan("auto", "GPU").bf16 is expected
    assert xla_backend._precision_plan(None, "GPU").bf16 is False  # unset: float32 off a TPU
