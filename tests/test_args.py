"""`hf-tpu train` arguments: transformers' names and meanings, flags that always take effect, range checks."""

import importlib.machinery
import json
import sys
import types

import pytest

from hf_tpu_ext.args import (DEFAULTS_DIFFERING_FROM_TRANSFORMERS, DataTrainingArguments, ModelArguments,
                             TrainingArguments, parse_args)
from hf_tpu_ext.errors import ArgumentError


def _training(*argv):
    return parse_args(["--output_dir", "o", *argv])[2]


def _error(*argv) -> str:
    with pytest.raises(ArgumentError) as err:
        parse_args(["--output_dir", "o", *argv])
    return str(err.value)


# ----------------------------------------------------------------------------- a passed flag takes effect


@pytest.mark.parametrize("argv, strategy, value", [
    (["--save_steps", "100"], "save_strategy", "steps"),
    (["--save_steps", "500"], "save_strategy", "steps"),  # the default value, passed: still means steps
    (["--eval_steps", "7"], "eval_strategy", "steps"),
])
def test_steps_flag_alone_implies_steps_strategy(argv, strategy, value):
    args = _training(*argv)
    assert getattr(args, strategy) == value
    assert _training().save_strategy == "epoch" and _training().eval_strategy == "epoch"


def test_steps_flag_with_another_strategy_is_refused():
    assert _error("--save_steps", "100", "--save_strategy", "epoch") == (
        "--save_steps 100 only applies with --save_strategy steps, but --save_strategy is epoch; drop --save_steps or "
        "pass --save_strategy steps.")
    assert _error("--eval_steps", "5", "--eval_strategy", "no") == (
        "--eval_steps 5 only applies with --eval_strategy steps, but --eval_strategy is no; drop --eval_steps or pass "
        "--eval_strategy steps.")
    assert _error("--eval_steps", "5", "--do_eval", "false") == "--eval_steps 5 has no effect with --do_eval false; drop one of them."


def test_flags_without_effect_are_refused():
    assert _error("--hub_model_id", "me/x", "--hub_strategy", "end") == (
        "--hub_model_id, --hub_strategy only apply when pushing: add --push_to_hub, or drop them.")
    assert _error("--save_total_limit", "3", "--save_strategy", "no") == (
        "--save_total_limit limits saved checkpoints, but --save_strategy is no; drop one of them.")
    assert _error("--logging_dir", "tb", "--report_to", "none") == (
        "--logging_dir is the TensorBoard folder, but --report_to does not include tensorboard; drop --logging_dir "
        "or add --report_to tensorboard.")
    assert _error("--backend", "torch_xla", "--steps_per_execution", "10", "--report_to", "none") == (
        "--steps_per_execution only applies to --backend tensorflow (torch_xla compiles every step itself and finds "
        "its TPU through PJRT_DEVICE); drop it.")
    assert _error("--hub_revision", "dev") == "--hub_revision only applies when pushing: add --push_to_hub, or drop it."
    assert _training("--hub_model_id", "me/x", "--push_to_hub").hub_model_id == "me/x"


def test_steps_flag_from_json_config(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"output_dir": "o", "save_steps": 50}))
    assert parse_args([str(cfg)])[2].save_strategy == "steps"
    cfg.write_text(json.dumps({"output_dir": "o", "save_steps": 50, "save_strategy": "epoch"}))
    with pytest.raises(ArgumentError, match="--save_steps 50 only applies with --save_strategy steps"):
        parse_args([str(cfg)])


def test_the_command_line_overrides_a_json_config_and_its_refusals_name_it(tmp_path):
    cfg = tmp_path / "c.json"
    hub = {"hub_model_id": "me/x", "hub_strategy": "checkpoint", "hub_token": "hf_secret_value"}
    cfg.write_text(json.dumps({"output_dir": "o", "push_to_hub": True, "learning_rate": 1e-4, **hub}))
    for off in (["--push_to_hub", "false"], ["--push_to_hub=false"], ["--push_to_hub", "no"]):
        _, _, args = parse_args([str(cfg), *off, "--learning_rate", "3e-4"])
        assert (args.push_to_hub, args.hub_model_id, args.hub_token, args.learning_rate) == (False, None, None, 3e-4)
        assert args.config_note == (f"{cfg}: hub_model_id, hub_strategy, hub_token unused (--push_to_hub false: "
                                    "nothing is pushed).")
        assert "hub_model_id" not in args.passed_flags
    assert parse_args([str(cfg)])[2].hub_model_id == "me/x"  # the file's push: its hub fields are used
    # the file's own push_to_hub false, hub fields beside it: unused too
    cfg.write_text(json.dumps({"output_dir": "o", "push_to_hub": False, **hub}))
    assert parse_args([str(cfg)])[2].hub_strategy == "every_save"
    # not pushing (the default) with the file's hub fields: the refusal names the file, not "drop them"
    cfg.write_text(json.dumps({"output_dir": "o", **hub}))
    with pytest.raises(ArgumentError) as err:
        parse_args([str(cfg)])
    assert str(err.value) == (f"{cfg} sets hub_model_id, hub_strategy, which only apply when pushing: add --push_to_hub "
                              "true, or --push_to_hub false to leave them unused.")
    # the command line's own hub flag with pushing off stays the user's to drop
    with pytest.raises(ArgumentError) as err:
        parse_args([str(cfg), "--push_to_hub", "false", "--hub_revision", "dev"])
    assert str(err.value) == "--hub_revision only applies when pushing: add --push_to_hub, or drop it."
    # any other refusal a file's value caused names the file
    cfg.write_text(json.dumps({"output_dir": "o", "save_total_limit": 2, "save_strategy": "no"}))
    with pytest.raises(ArgumentError) as err:
        parse_args([str(cfg)])
    assert str(err.value) == ("--save_total_limit limits saved checkpoints, but --save_strategy is no; drop one of "
                              f"them. (--save_total_limit, --save_strategy: set in {cfg})")
    with pytest.raises(ArgumentError) as err:  # the command line's value: the line as it was
        parse_args([str(cfg), "--save_strategy", "no"])
    assert str(err.value).endswith(f"(--save_total_limit: set in {cfg})")


def test_do_eval_and_the_old_evaluation_strategy(caplog):
    off = _training("--do_eval", "false")
    assert (off.do_eval, off.eval_strategy) == (False, "no")
    assert _training().do_eval is True
    assert _training("--eval_strategy", "no").do_eval is False
    final_only = _training("--do_eval", "true", "--eval_strategy", "no")
    assert (final_only.do_eval, final_only.eval_strategy) == (True, "no")
    assert _error("--do_eval", "false", "--eval_strategy", "steps") == (
        "--do_eval false turns evaluation off, but --eval_strategy steps asks for it; drop one of them.")
    with caplog.at_level("WARNING", logger="hf_tpu_ext"):
        assert _training("--evaluation_strategy", "steps").eval_strategy == "steps"
    assert "--evaluation_strategy is deprecated (transformers renamed it in 4.46): use --eval_strategy steps." in caplog.text
    assert _error("--evaluation_strategy", "steps", "--eval_strategy", "epoch") == (
        "--evaluation_strategy steps and --eval_strategy epoch disagree; pass only --eval_strategy (the current name).")


def test_do_train_false_and_fp16_are_refused_with_the_reason():
    assert _error("--do_train", "false").startswith(
        "--do_train false (evaluation only) is not supported: `hf-tpu train` always trains.")
    assert _training("--do_train").do_train is True  # run_mlm's flag is accepted
    assert _error("--fp16") == (
        "--fp16 is not supported: CPUs and TPUs have no float16 compute and the XLA training step has no loss "
        "scaling, which float16 needs. Use --bf16 true (bfloat16 mixed precision, no loss scaling needed) or "
        "--bf16 auto (bfloat16 where the hardware has it), or float32.")


def test_run_mlm_data_flags():
    _, data_args, _ = parse_args(["--pad_to_max_length", "--line_by_line", "false"])
    assert data_args.pad_to_max_length is True and data_args.line_by_line is False
    assert _error("--line_by_line") == (
        "--line_by_line true is not supported: the texts are concatenated and cut into full blocks of "
        "--max_seq_length tokens (run_mlm's default grouping), so every position is a real token and every batch "
        "has the same static shape for XLA. Drop --line_by_line (or pass --line_by_line false).")


# ----------------------------------------------------------------------------- names with transformers' meaning


def test_lr_scheduler_and_optim_names():
    args = _training("--lr_scheduler_type", "cosine", "--optim", "sgd", "--gradient_accumulation_steps", "4")
    assert (args.lr_scheduler_type, args.optim, args.gradient_accumulation_steps) == ("cosine", "sgd", 4)
    assert _error("--lr_scheduler_type", "reduce_lr_on_plateau") == (
        "--lr_scheduler_type 'reduce_lr_on_plateau' is not supported; choose one of: linear, cosine, "
        "cosine_with_restarts, polynomial, constant, constant_with_warmup, inverse_sqrt.")
    assert _error("--optim", "lion_32bit") == (
        "--optim 'lion_32bit' is not supported; choose one of: adamw_torch, adamw_torch_fused, adamw_torch_xla, "
        "adamw_tf, adamw, adafactor, sgd.")
    assert _error("--optim", "adafactor").startswith(
        "--optim adafactor is not available with --backend tensorflow: tf_keras has Adafactor only in its new "
        "optimizer API")
    assert _training("--optim", "adafactor", "--backend", "torch_xla").optim == "adafactor"
    assert _error("--lr_scheduler_type", "constant", "--warmup_steps", "10") == (
        "--lr_scheduler_type constant has no warmup (as in transformers); use --lr_scheduler_type "
        "constant_with_warmup, or drop --warmup_steps/--warmup_ratio.")
    assert _error("--warmup_steps", "10", "--warmup_ratio", "0.1") == (
        "Both --warmup_steps 10 and --warmup_ratio 0.1 are set; pass one of them (transformers would silently use "
        "warmup_steps).")
    assert _error("--gradient_accumulation_steps", "0") == "--gradient_accumulation_steps must be >= 1, got 0."


def test_best_model_arguments():
    args = _training("--load_best_model_at_end")
    assert (args.metric_for_best_model, args.greater_is_better) == ("loss", False)
    assert _training("--metric_for_best_model", "accuracy").greater_is_better is True
    assert _training("--metric_for_best_model", "perplexity").greater_is_better is False
    # transformers' own wording for the strategy checks
    assert _error("--load_best_model_at_end", "--eval_strategy", "steps") == (
        "--load_best_model_at_end requires the save and eval strategy to match, but found\n- Evaluation strategy: "
        "steps\n- Save strategy: epoch")
    assert _error("--load_best_model_at_end", "--eval_steps", "30", "--save_steps", "45") == (
        "--load_best_model_at_end requires the saving steps to be a round multiple of the evaluation steps, but "
        "found 45, which is not a round multiple of 30.")
    assert _training("--load_best_model_at_end", "--eval_steps", "30", "--save_steps", "60").save_strategy == "steps"
    assert _error("--load_best_model_at_end", "--do_eval", "false").startswith(
        "--load_best_model_at_end needs evaluations to compare")
    assert _error("--metric_for_best_model", "bleu") == (
        "--metric_for_best_model 'bleu' is not an evaluation metric of this trainer; choose one of: loss, eval_loss, "
        "perplexity, eval_perplexity, accuracy, eval_accuracy.")


def test_report_to(monkeypatch):
    assert _training().report_to == ["tensorboard"]
    assert _training("--report_to", "none").report_to == []
    assert _training("--report_to", "all").report_to == ["tensorboard"]
    assert _error("--report_to", "wandb") == (
        "--report_to 'wandb' is not supported; choose from: tensorboard, trackio, all, none.")
    assert _error("--report_to", "trackio") == (
        "--report_to trackio needs the 'trackio' package, which is not installed: `pip install trackio`, or pass "
        "--report_to none.")
    fake = types.ModuleType("trackio")
    fake.__spec__ = importlib.machinery.ModuleSpec("trackio", None)
    monkeypatch.setitem(sys.modules, "trackio", fake)
    assert _training("--report_to", "tensorboard", "trackio").report_to == ["tensorboard", "trackio"]
    assert _training("--report_to", "all").report_to == ["tensorboard", "trackio"]


# ----------------------------------------------------------------------------- range checks, up front


@pytest.mark.parametrize("argv, message", [
    (["--learning_rate", "nan"], "--learning_rate must be a finite number, got nan."),
    (["--learning_rate", "inf"], "--learning_rate must be a finite number, got inf."),
    (["--learning_rate", "0"], "--learning_rate must be in (0, inf), got 0.0."),
    # a negative number in exponent form is a value, not an option (argparse alone: "expected one argument")
    (["--learning_rate", "-1e-3"], "--learning_rate must be in (0, inf), got -0.001."),
    (["--adam_epsilon", "-1E-8"], "--adam_epsilon must be in (0, inf), got -1e-08."),
    (["--weight_decay", "-0.1"], "--weight_decay must be in [0, inf), got -0.1."),
    (["--adam_beta1", "1"], "--adam_beta1 must be in [0, 1), got 1.0."),
    (["--adam_beta2", "nan"], "--adam_beta2 must be a finite number, got nan."),
    (["--adam_epsilon", "0"], "--adam_epsilon must be in (0, inf), got 0.0."),
    (["--max_grad_norm", "inf"], "--max_grad_norm must be a finite number, got inf."),
    (["--warmup_ratio", "1.5"], "--warmup_ratio must be in [0, 1], got 1.5."),
    (["--num_train_epochs", "nan"], "--num_train_epochs must be a finite number, got nan."),
    (["--mlm_probability", "1"], "--mlm_probability must be in (0, 1), got 1.0."),
    (["--mlm_probability", "nan"], "--mlm_probability must be a finite number, got nan."),
    (["--hidden_dropout_prob", "1"], "--hidden_dropout_prob must be in [0, 1), got 1.0."),
    (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size must be >= 1, got 0."),
    (["--per_device_eval_batch_size", "-1"], "--per_device_eval_batch_size must be >= 1, got -1."),
    (["--eval_steps", "0"], "--eval_steps must be >= 1, got 0."),
    # run_mlm keeps min(n, len) examples and only None means all: 0 or -1 would select nothing (-1 here used to
    # drop the last block, 0 used to mean all)
    (["--max_train_samples", "-1"], "--max_train_samples must be >= 1 (leave it unset to keep every block, as in "
                                    "transformers' run_mlm), got -1."),
    (["--max_eval_samples", "0"], "--max_eval_samples must be >= 1 (leave it unset to keep every block, as in "
                                  "transformers' run_mlm), got 0."),
    (["--hidden_size", "0"], "--hidden_size must be >= 1, got 0."),
    (["--preprocessing_num_workers", "0"], "--preprocessing_num_workers must be >= 1, got 0."),
])
def test_hyper_parameters_checked_up_front(argv, message):
    assert _error(*argv) == message


def test_warmup_ratio_one_is_allowed():
    assert _training("--warmup_ratio", "1").num_warmup_steps(10) == 10


def test_max_seq_length_from_scratch_has_no_fixed_cap():
    """The position table decides later (model_config.check_scratch_positions), not a fixed from-scratch cap:
    ModernBERT's 8,192 (and longer) parse."""
    assert parse_args(["--max_seq_length", "8192", "--model_type", "modernbert"])[1].max_seq_length == 8192
    assert parse_args(["--max_seq_length", "100000"])[1].max_seq_length == 100000

# ----------------------------------------------------------------------------- run_mlm-style JSON config


def test_run_mlm_json_config_parses(tmp_path):
    cfg = tmp_path / "run_mlm.json"
    cfg.write_text(json.dumps({
        "output_dir": "o", "overwrite_output_dir": True, "do_train": True, "do_eval": True,
        "evaluation_strategy": "steps", "eval_steps": 10, "gradient_accumulation_steps": 2,
        "lr_scheduler_type": "cosine", "report_to": "none", "line_by_line": False, "pad_to_max_length": True,
        "optim": "adamw_torch", "fp16": False, "load_best_model_at_end": True, "save_steps": 10,
        "metric_for_best_model": "eval_loss", "greater_is_better": False,
    }))
    _, data_args, args = parse_args([str(cfg)])
    assert (args.eval_strategy, args.save_strategy, args.gradient_accumulation_steps) == ("steps", "steps", 2)
    assert args.report_to == [] and args.lr_scheduler_type == "cosine" and data_args.pad_to_max_length


@pytest.mark.parametrize("config, message", [
    ({"max_steps": 10.5}, '"max_steps" must be a whole number, got 10.5 (a number).'),
    ({"max_steps": "10"}, '"max_steps" must be a whole number, got "10" (a string).'),
    ({"dataset_config_name": 2}, '"dataset_config_name" must be a string, got 2 (a number); write it in quotes: "2".'),
    ({"do_eval": "yes"}, '"do_eval" must be true or false (a JSON boolean, without quotes), got "yes" (a string).'),
    ({"learning_rate": True}, '"learning_rate" must be a number, got true (a boolean).'),
    ({"report_to": ["tensorboard", 3]}, '"report_to" must be a string or a list of strings, got ["tensorboard", 3] '
                                        '(a list).'),
    ({"log_level": "loud"}, '"log_level" must be one of passive, debug, info, warning, error, critical, got "loud" '
                            '(a string).'),
    ({"seed": None}, '"seed" must be given (it has no unset value; drop the field for its default 42), got null (null).'),
])
def test_json_config_values_are_typed(tmp_path, config, message):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"output_dir": "o", **config}))
    with pytest.raises(ArgumentError) as err:
        parse_args([str(cfg)])
    assert str(err.value) == f"Config file {cfg}: {message}"


def test_json_config_whole_numbers_and_booleans(tmp_path):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"output_dir": "o", "max_steps": 10.0, "resume_from_checkpoint": False, "bf16": "auto"}))
    model_args, data_args, args = parse_args([str(cfg), "--seed", "7"])
    assert args.max_steps == 10 and isinstance(args.max_steps, int) and args.resume_from_checkpoint is None
    assert args.passed_flags == {"output_dir", "max_steps", "resume_from_checkpoint", "bf16", "seed"}
    assert "max_seq_length" not in args.passed_flags  # a default: a resumed checkpoint may decide it


def test_json_float_for_an_integer_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    from hf_tpu_ext.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"output_dir": "out", "max_steps": 10.5}))
    assert main(["train", "run.json"]) == 1
    assert capsys.readouterr().err == ('hf-tpu train: error: Config file run.json: "max_steps" must be a whole number, '
                                       'got 10.5 (a number).\n')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no out/, no tokenizer files, no runs/


RULE = ("The only positional argument of hf-tpu train is a JSON config file (a name ending in .json, holding argument "
        "names and values); every other argument is a --name value pair.")


def test_positional_argument_is_explained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArgumentError) as err:
        parse_args(["config.jsn"])
    assert str(err.value) == f"No such JSON config file: config.jsn. {RULE}"
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ArgumentError) as err:
        parse_args(["config.jsn", "--max_steps", "3"])
    assert str(err.value) == f"No such JSON config file: config.jsn. Did you mean config.json? {RULE}"
    with pytest.raises(ArgumentError) as err:
        parse_args(["missing.json"])
    assert str(err.value) == f"No such JSON config file: missing.json. {RULE}"
    (tmp_path / "notes.cfg").write_text("{}")
    with pytest.raises(ArgumentError) as err:
        parse_args(["notes.cfg"])
    assert str(err.value) == f"notes.cfg is not a JSON config file (its name does not end in .json). {RULE}"
    data = ("mytext.txt looks like training data, which goes in --train_file: `hf-tpu train --train_file mytext.txt "
            "[--validation_file FILE] ...`. The only positional argument of hf-tpu train is a JSON config file.")
    for argv in (["mytext.txt"], ["--output_dir", "o", "mytext.txt"]):  # first, or after the flags
        with pytest.raises(ArgumentError) as err:
            parse_args(argv)
        assert str(err.value) == data


# ----------------------------------------------------------------------------- schedules = transformers' formulas


@pytest.mark.parametrize("kind", ["linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
                                  "constant_with_warmup", "inverse_sqrt"])
def test_tf_schedule_matches_transformers(kind):
    torch = pytest.importorskip("torch")
    from transformers import get_scheduler

    from hf_tpu_ext.backends.tensorflow.optimization import TransformersSchedule

    lr, warmup, total = 1e-3, 0 if kind == "constant" else 4, 12
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=lr)
    sched = get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=total)
    expected = []
    for _ in range(total + 2):
        expected.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    ours = TransformersSchedule(kind, lr, warmup, total)
    got = [float(ours(step)) for step in range(total + 2)]
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-10)


# ----------------------------------------------------------------------------- the README's defaults table


def test_listed_default_differences_are_real():
    from dataclasses import fields

    from transformers import TrainingArguments as HF

    ours = {f.name: f for dc in (ModelArguments, DataTrainingArguments, TrainingArguments) for f in fields(dc)}
    theirs = {f.name: f.default for f in fields(HF)}
    # transformers' __post_init__ values for None defaults, and run_mlm's own field
    theirs.update(output_dir="trainer_output", report_to="all", max_seq_length=None)
    if theirs["optim"] == "adamw_torch":  # transformers picks the fused kernel only when torch >= 2.8 is installed
        theirs["optim"] = "adamw_torch_fused"
    for name, (their_default, why) in DEFAULTS_DIFFERING_FROM_TRANSFORMERS.items():
        assert name in ours and why, name
        assert their_default == theirs[name], f"{name}: transformers' default is {theirs[name]!r}"
        assert ours[name].default != their_default, f"{name}: same default as transformers"
    # and every shared field with another default is listed (transformers turns disable_tqdm=None into False)
    for name, f in ours.items():
        if name in theirs and f.default != theirs[name] and not (name == "disable_tqdm" and f.default is False):
            assert name in DEFAULTS_DIFFERING_FROM_TRANSFORMERS, f"{name} differs but is not listed"


def test_optim_sgd_is_torch_sgd_with_weight_decay():
    """``--optim sgd``: ``w - lr * (g + weight_decay * w)`` (torch.optim.SGD), no decay on biases/LayerNorm."""
    import numpy as np
    import tensorflow as tf

    from hf_tpu_ext.backends.tensorflow.optimization import SGDWithWeightDecay, make_optimizer

    args = _training("--optim", "sgd", "--learning_rate", "0.1", "--weight_decay", "0.5",
                     "--lr_scheduler_type", "constant")
    opt, schedule = make_optimizer(args, total_steps=10)
    assert isinstance(opt, SGDWithWeightDecay) and float(schedule(3)) == pytest.approx(0.1)
    kernel = tf.Variable([1.0, -2.0], name="dense/kernel")
    bias = tf.Variable([1.0, -2.0], name="dense/bias")
    grad = tf.constant([0.5, 0.5])
    opt.apply_gradients([(grad, kernel), (grad, bias)])
    np.testing.assert_allclose(kernel.numpy(), [1.0 - 0.1 * (0.5 + 0.5 * 1.0), -2.0 - 0.1 * (0.5 - 0.5 * 2.0)], rtol=1e-6)
    np.testing.assert_allclose(bias.numpy(), [1.0 - 0.05, -2.0 - 0.05], rtol=1e-6)
    # an adamw name with weight decay: transformers' AdamWeightDecay, LayerNorm/bias excluded
    adamw, _ = make_optimizer(_training("--optim", "adamw_torch_fused"), total_steps=10)
    assert type(adamw).__name__ == "AdamWeightDecay" and adamw._exclude_from_weight_decay == ["LayerNorm", "layer_norm", "bias"]


def test_max_steps_zero_says_it_trains_by_epochs(caplog):
    """transformers reads a --max_steps <= 0 as unset (train by epochs): 0 is accepted, as there, and said."""
    with caplog.at_level("WARNING", logger="hf_tpu_ext"):
        args = _training("--max_steps", "0", "--num_train_epochs", "2")
    assert (args.max_steps, args.num_train_epochs) == (0, 2.0)
    assert [r.getMessage() for r in caplog.records] == [
        "--max_steps 0 sets no step count (as in transformers, a count <= 0 means: train by epochs): this run trains "
        "--num_train_epochs 2; pass --max_steps N > 0 for N steps."]
    caplog.clear()
    with caplog.at_level("WARNING", logger="hf_tpu_ext"):
        _training("--max_steps", "-1")  # transformers' own default: nothing to say
    assert caplog.records == []
