"""``--fsdp`` / ``--fsdp_config`` (issue 50 items 1 and 6): read before any framework starts, refused in one line
where a backend cannot shard, handed to transformers' Trainer as FSDPv2 on ``--backend torch_xla``."""

import json

import pytest

from hf_tpu_ext.args import parse_args
from hf_tpu_ext.args.fsdp import fsdp_strategy, parse_fsdp, parse_fsdp_config
from hf_tpu_ext.errors import ArgumentError


def _training(*extra, backend="keras"):
    return parse_args(["--output_dir", "o", "--max_steps", "2", "--report_to", "none", "--backend", backend,
                       *extra])[2]


def test_transformers_values_are_read():
    assert parse_fsdp("full_shard auto_wrap") == "full_shard auto_wrap"
    assert parse_fsdp(["shard_grad_op"]) == "shard_grad_op"
    assert parse_fsdp("FULL_SHARD,auto_wrap") == "full_shard auto_wrap"
    assert (parse_fsdp(True), parse_fsdp("false"), parse_fsdp(""), parse_fsdp(None)) == ("full_shard", None, None, None)
    assert (fsdp_strategy("full_shard auto_wrap"), fsdp_strategy("shard_grad_op"), fsdp_strategy(None)) == (
        "full_shard", "shard_grad_op", None)


def test_a_config_given_as_json_or_as_a_file(tmp_path):
    assert parse_fsdp_config('{"fsdp_min_num_params": 1000, "mesh": {"data": 2, "fsdp": 4}}') == {
        "min_num_params": 1000, "mesh": {"data": 2, "fsdp": 4}}
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"min_num_params": 7}))
    args = _training("--fsdp", "full_shard", "--fsdp_config", str(path))
    assert (args.fsdp, args.fsdp_config) == ("full_shard", {"min_num_params": 7})
    assert _training().fsdp is None and _training().fsdp_config is None


@pytest.mark.parametrize("extra, message", [
    (("--fsdp", "offload"), "--fsdp offload is not supported: there is no host offload of the XLA step; use --fsdp "
                            "full_shard alone."),
    (("--fsdp", "hybrid_shard"), "--fsdp hybrid_shard is not supported: on --backend keras pass --fsdp full_shard "
                                 "with --fsdp_config '{\"mesh\": {\"data\": D, \"fsdp\": F}}'."),
    (("--fsdp", "full_shard shard_grad_op"), "--fsdp 'full_shard shard_grad_op' needs exactly one of full_shard or "
                                             "shard_grad_op."),
    (("--fsdp", "zero3"), "--fsdp 'zero3' is not an FSDP option; choose full_shard or shard_grad_op (optionally with "
                          "auto_wrap)."),
    (("--fsdp_config", '{"min_num_params": 5}'), "--fsdp_config configures --fsdp: add --fsdp full_shard (or "
                                                 "shard_grad_op), or drop --fsdp_config."),
    (("--fsdp", "full_shard", "--fsdp_config", '{"min_num_params": -1}'),
     "--fsdp_config min_num_params must be a whole number >= 0, got -1."),
    (("--fsdp", "full_shard", "--fsdp_config", '{"mesh": {"data": 2, "model": 2}}'),
     "--fsdp_config mesh must be an object of the axes data and fsdp, e.g. {\"data\": 2, \"fsdp\": 4}; got "
     "{\"data\": 2, \"model\": 2}."),
    (("--fsdp", "full_shard", "--fsdp_config", '{"cpu_ram_efficient_loading": true}'),
     "--fsdp_config key 'cpu_ram_efficient_loading' is not read here; known keys: min_num_params, mesh, xla, "
     "xla_fsdp_v2, xla_fsdp_grad_ckpt, transformer_layer_cls_to_wrap."),
    (("--fsdp", "full_shard", "--fsdp_config", '{"xla": true}'),
     "--fsdp_config xla is read by --backend torch_xla only; --backend keras reads min_num_params, mesh."),
    (("--fsdp", "full_shard", "--fsdp_config", "no-such-file.json"),
     "--fsdp_config 'no-such-file.json' is neither a JSON object nor a file; pass e.g. --fsdp_config "
     "'{\"min_num_params\": 1000000}' or a JSON file."),
])
def test_bad_input_is_refused_in_one_line(extra, message):
    with pytest.raises(ArgumentError) as err:
        _training(*extra)
    assert str(err.value) == message


def test_tensorflow_refuses_fsdp_naming_the_keras_backend():
    with pytest.raises(ArgumentError) as err:
        _training("--fsdp", "full_shard", backend="tensorflow")
    assert str(err.value) == ("--fsdp is not implemented by --backend tensorflow (its strategies replicate the "
                              "weights); pass --backend keras (or torch_xla), or drop --fsdp.")


def test_torch_xla_refuses_what_fsdpv2_does_not_do():
    with pytest.raises(ArgumentError, match=r"^--fsdp shard_grad_op is not available with --backend torch_xla: "):
        _training("--fsdp", "shard_grad_op", backend="torch_xla")
    with pytest.raises(ArgumentError, match=r"^--fsdp_config mesh is read by --backend keras only "):
        _training("--fsdp", "full_shard", "--fsdp_config", '{"mesh": {"fsdp": 2}}', backend="torch_xla")


def test_torch_xla_hands_fsdp_to_the_trainer_as_fsdpv2():
    """The transformers.TrainingArguments the torch_xla backend builds: transformers' FSDP options and its
    fsdp_config with FSDPv2 on XLA switched on; without --fsdp, none."""
    pytest.importorskip("accelerate")  # transformers.TrainingArguments with torch needs it
    from hf_tpu_ext.backends.torch_xla.trainer import hf_training_arguments

    ours = _training("--fsdp", "full_shard auto_wrap", "--fsdp_config", '{"min_num_params": 1000}',
                     backend="torch_xla")
    hf = hf_training_arguments(ours, 100)
    assert [o.value for o in hf.fsdp] == ["full_shard", "auto_wrap"]
    assert {k: hf.fsdp_config[k] for k in ("xla", "xla_fsdp_v2", "min_num_params")} == {
        "xla": True, "xla_fsdp_v2": True, "min_num_params": 1000}
    plain = hf_training_arguments(_training(backend="torch_xla"), 100)
    assert (plain.fsdp, plain.fsdp_config.get("xla", False)) == ([], False)


def test_a_json_config_holds_them_as_transformers_writes_them(tmp_path):
    """``"fsdp": [...]`` and ``"fsdp_config": {...}`` in the run's JSON config, as in a transformers config."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"output_dir": "o", "max_steps": 2, "backend": "keras", "report_to": "none",
                                  "fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {"min_num_params": 9}}))
    args = parse_args([str(config)])[2]
    assert (args.fsdp, args.fsdp_config) == ("full_shard auto_wrap", {"min_num_params": 9})
