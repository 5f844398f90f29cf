"""The ``--fsdp`` rules (backends/keras/sharding.py), the mesh (placement.py) and the memory line (memory.py),
without devices: which dimension each variable is sharded on, what stays replicated, what is refused and how."""

from types import SimpleNamespace

import pytest

pytest.importorskip("jax")

from hf_tpu_ext.backends.keras.memory import check_fits, memory_line  # noqa: E402
from hf_tpu_ext.backends.keras.placement import mesh_shape  # noqa: E402
from hf_tpu_ext.backends.keras.sharding import logical_axes, plan_state, shard_dim  # noqa: E402
from hf_tpu_ext.errors import BackendError  # noqa: E402

CONFIG = SimpleNamespace(vocab_size=300, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                         max_position_embeddings=34)


def _var(path, shape, dtype="float32"):
    return SimpleNamespace(path=path, shape=shape, dtype=dtype)


def test_logical_axes_come_from_the_config():
    assert logical_axes((300, 32), CONFIG) == ("vocab", "embed")
    assert logical_axes((32, 2, 16), CONFIG) == ("embed", "heads", "dim")
    assert logical_axes((32, 64)) == ("dim", "dim")


def test_the_largest_dimension_the_axis_divides_is_sharded():
    assert shard_dim((300, 32), 4, CONFIG) == 0  # vocab 300 = 4 x 75: the larger
    assert shard_dim((302, 32), 4, CONFIG) == 1  # 302 is not a multiple of 4: embed
    assert shard_dim((64, 64), 4) == 0  # equals: the first
    assert shard_dim((3, 5), 4) is None and shard_dim((), 4) is None


def test_weights_moments_and_scalars():
    trainable = [_var("emb", (300, 32)), _var("ln/gamma", (32,)), _var("odd", (3, 5))]
    optimizer = [_var("adam/iteration", (), "int32"), _var("adam/emb_momentum", (300, 32)),
                 _var("adam/ln_gamma_momentum", (32,)), _var("adam/odd_momentum", (3, 5))]
    plan = plan_state(trainable, [_var("seed", (2,), "uint32")], optimizer, "full_shard", 4, config=CONFIG)
    assert plan.trainable == [("fsdp", None), ("fsdp",), ()]
    assert plan.grads == plan.trainable
    assert plan.optimizer == [(), ("fsdp", None), ("fsdp",), ()]  # each moment as its weight, the step count whole
    assert (plan.non_trainable, plan.replicated_small) == ([()], ["odd"])
    grad_op = plan_state(trainable, [], optimizer, "shard_grad_op", 4, config=CONFIG)
    assert grad_op.trainable == [(), (), ()] and grad_op.grads == plan.trainable
    assert grad_op.optimizer == plan.optimizer
    small = plan_state(trainable, [], optimizer, "full_shard", 4, min_num_params=100, config=CONFIG)
    assert small.trainable == [("fsdp", None), (), ()]  # 32 and 15 elements < 100
    assert plan_state(trainable, [], optimizer, "full_shard", 1).trainable == [(), (), ()]  # one fsdp device


def test_a_large_weight_left_replicated_is_refused_by_name():
    big = _var("encoder/intermediate/kernel", (65, 4097))
    with pytest.raises(BackendError) as err:
        plan_state([big], [], [], "full_shard", 4)
    assert str(err.value) == (
        "--fsdp cannot shard encoder/intermediate/kernel (65, 4097) (1.02 MiB): the fsdp mesh axis (4 devices) "
        "divides none of its dimensions, so every device would hold it whole; use a device count or --fsdp_config "
        "mesh whose fsdp size divides one of them, or resize the model.")
    # under 1 MiB (bf16: half the bytes) it stays replicated, listed
    assert plan_state([_var("k", (65, 4097), "bfloat16")], [], [], "full_shard", 4).replicated_small == ["k"]


def test_the_mesh_covers_the_devices():
    assert mesh_shape(None, 8) == {"data": 1, "fsdp": 8}
    assert mesh_shape({"data": 2}, 8) == {"data": 2, "fsdp": 4}
    assert mesh_shape({"fsdp": 2}, 8) == {"data": 4, "fsdp": 2}
    with pytest.raises(BackendError) as err:
        mesh_shape({"data": 2, "fsdp": 4}, 4)
    assert str(err.value) == ("--fsdp_config mesh data 2 x fsdp 4 does not cover the run's 4 devices (data x fsdp "
                              "must equal them); pass sizes whose product is 4.")


FIGURES = {"state_bytes": 6 << 30, "argument_bytes": 6 << 30, "output_bytes": 6 << 30, "alias_bytes": 6 << 30,
           "temp_bytes": 4 << 30, "total_bytes": 10 << 30}


def test_the_memory_line_and_the_refusal_where_the_limit_is_known():
    assert memory_line(FIGURES, 16 << 30, None, 8) == (
        "Memory per device of the compiled training step: state 6144.00 MiB (replicated on each of 8 devices), "
        "arguments 6144.00 MiB, outputs 6144.00 MiB (6144.00 MiB of them in place), temporaries 4096.00 MiB: "
        "10240.00 MiB in all; the device has 16384 MiB.")
    check_fits(FIGURES, 16 << 30, None, "TPU v5 lite")  # fits: nothing said
    check_fits(FIGURES, None, None, "cpu")  # no limit known: nothing to check
    with pytest.raises(BackendError) as err:
        check_fits(FIGURES, 8 << 30, None, "TPU v2")
    assert str(err.value) == (
        "The training step needs 10240 MiB per device (state 6144 MiB, temporaries 4096 MiB), more than the 8192 MiB "
        "of a TPU v2: try --fsdp full_shard (weights, gradients and optimizer state split over the devices), or "
        "--gradient_checkpointing (activations recomputed in the backward pass), or a smaller "
        "--per_device_train_batch_size (with --gradient_accumulation_steps to keep the batch).")
    with pytest.raises(BackendError, match=r"of a TPU v2: try --gradient_checkpointing \(activations"):
        check_fits(FIGURES, 8 << 30, "full_shard", "TPU v2")
