"""XLA fusion of the element-wise ops around TensorFlow's kernels: the flags, the switch and the precision plan."""

import pytest

from hf_tpu_ext.backends.tensorflow import fusion
from hf_tpu_ext.precision import resolve_precision

FLAGS = "--tf_xla_cpu_global_jit --tf_xla_ops_to_cluster=" + fusion.OPS_TO_CLUSTER


@pytest.fixture
def fresh_tensorflow(monkeypatch):
    """As if TensorFlow had not initialized its devices yet (this test process's has)."""
    monkeypatch.setattr(fusion, "_devices_initialized", lambda: False)


def test_prepare_adds_the_flags_and_keeps_the_users_others(fresh_tensorflow):
    env = {}
    assert fusion.prepare(env).state == fusion.READY and env["TF_XLA_FLAGS"] == FLAGS
    env = {"TF_XLA_FLAGS": "--tf_xla_min_cluster_size=2"}
    assert fusion.prepare(env).state == fusion.READY and env["TF_XLA_FLAGS"] == "--tf_xla_min_cluster_size=2 " + FLAGS
    env = {"TF_XLA_FLAGS": "--tf_xla_cpu_global_jit"}  # one of ours already: the other is added
    assert fusion.prepare(env).state == fusion.READY and env["TF_XLA_FLAGS"] == FLAGS
    env = {"TF_XLA_FLAGS": FLAGS}
    assert fusion.prepare(env).state == fusion.READY and env["TF_XLA_FLAGS"] == FLAGS  # nothing added twice


@pytest.mark.parametrize("user_flags, note", [
    ("--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit", ", XLA auto-clustering as TF_XLA_FLAGS sets it"),
    ("--tf_xla_ops_to_cluster=PW", ""),           # no auto-clustering switched on: TensorFlow clusters nothing
    ("--tf_xla_cpu_global_jit=false", ""),        # an opt-out, not overridden
])
def test_prepare_leaves_a_users_clustering_flags_alone_and_says_so(fresh_tensorflow, user_flags, note):
    env = {"TF_XLA_FLAGS": user_flags}
    setup = fusion.prepare(env)
    assert setup.state == fusion.USER and env == {"TF_XLA_FLAGS": user_flags}
    assert setup.compiler_note == note
    mine = " ".join(f for f in user_flags.split() if f != "--tf_xla_cpu_global_jit")
    assert setup.not_fused_message() == (
        f"element-wise ops not fused by hf-tpu: your TF_XLA_FLAGS set XLA auto-clustering ({mine}), so TensorFlow "
        "clusters as they say (see hf_tpu_ext/backends/tensorflow/fusion.py).")


def test_prepare_after_tensorflow_started_changes_nothing():
    import tensorflow as tf

    tf.config.list_physical_devices("CPU")  # TensorFlow has read TF_XLA_FLAGS now
    env = {}
    setup = fusion.prepare(env)
    assert setup.state == fusion.STARTED and env == {}
    assert setup.compiler_note == ""


def test_elementwise_fusion_switches_auto_clustering_on_and_back():
    import tensorflow as tf

    before = tf.config.optimizer.get_jit()
    with fusion.elementwise_fusion(False):
        assert tf.config.optimizer.get_jit() == before
    with fusion.elementwise_fusion():
        assert tf.config.optimizer.get_jit() == "autoclustering"
    assert tf.config.optimizer.get_jit() == before


@pytest.mark.parametrize("bf16, jit_compile, accelerator, native, fused", [
    (True, None, "CPU", True, True),        # the bf16 path --jit_compile unset takes on a native-bf16 CPU
    ("auto", None, "CPU", True, True),
    (True, False, "CPU", True, False),      # an explicit --jit_compile false: TensorFlow's kernels alone
    (True, None, "CPU", False, False),      # emulated bf16: the XLA step
    (False, None, "CPU", True, False),      # float32: the XLA step
    (True, None, "GPU", True, False),
])
def test_precision_plan_fuses_only_on_the_native_bf16_cpu_kernels_path(bf16, jit_compile, accelerator, native, fused):
    plan = resolve_precision(bf16, jit_compile, accelerator, native, elementwise_fusion=True)
    assert plan.fuse_elementwise is fused
    assert plan.compiler.endswith(", element-wise ops fused by XLA") is fused
    assert ("with the element-wise ops between them fused by XLA" in plan.reason) is fused
    unfused = resolve_precision(bf16, jit_compile, accelerator, native, elementwise_fusion=False)
    assert not unfused.fuse_elementwise and "fused" not in unfused.compiler
    assert (unfused.bf16, unfused.jit_compile) == (plan.bf16, plan.jit_compile)
