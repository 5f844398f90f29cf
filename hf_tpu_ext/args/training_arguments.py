"""``TrainingArguments``: how ``hf-tpu train`` trains (names and defaults of :class:`transformers.TrainingArguments`
where it has the field)."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass, field
from typing import List, Optional

from hf_tpu_ext.args.checks import check_number, check_repo_id, resolve_report_to
from hf_tpu_ext.args.fsdp import check_fsdp
from hf_tpu_ext.args.defaults import (BACKENDS, BEST_METRICS, DEFAULT_CALLBACKS, HUB_STRATEGIES, LR_SCHEDULER_TYPES,
                                      OPTIMIZERS, STRATEGIES)
from hf_tpu_ext.console import resolve_backend
from hf_tpu_ext.errors import ArgumentError, DataError, check_choice
from hf_tpu_ext.precision import parse_bf16

logger = logging.getLogger("hf_tpu_ext")


@dataclass
class TrainingArguments:
    """How to train: names and defaults follow :class:`transformers.TrainingArguments` where it has the field."""

    output_dir: str = field(default="hf-tpu-output", metadata={"help": "Where the model, checkpoints, logs and card are written."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Allow training into a non-empty output_dir: an earlier run's checkpoints, run state and results are removed first (once the checks pass), so a resume or hf-tpu push never takes them."})
    resume_from_checkpoint: Optional[str] = field(
        default=None,
        metadata={"help": "A checkpoint folder, 'true' for the latest in output_dir, or a Hub repo id 'user/name[@revision]' holding last-checkpoint/."},
    )
    backend: Optional[str] = field(default=None, metadata={"help": f"Training backend: one of {', '.join(BACKENDS)}. Unset: keras when Keras 3 and JAX are installed, else tensorflow, else torch_xla."})
    do_train: bool = field(default=True, metadata={"help": "Train (run_mlm's flag). `hf-tpu train` always trains: false is refused."})
    do_eval: Optional[bool] = field(
        default=None,
        metadata={"help": "Evaluate on the validation split: false turns every evaluation off; true with --eval_strategy no evaluates once at the end. Unset: true unless --eval_strategy is no."},
    )
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Batch size per replica for training."})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Batch size per replica for evaluation."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Peak learning rate of AdamW (after warmup)."})
    weight_decay: float = field(default=0.01, metadata={"help": "Decoupled weight decay (not applied to LayerNorm and biases)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Global gradient-norm clipping (0 disables)."})
    optim: str = field(
        default="adamw_torch",
        metadata={"help": f"Optimizer: {', '.join(OPTIMIZERS)}. Every adamw name is AdamW with decoupled weight decay (not on LayerNorm/biases); adafactor without relative steps (transformers' Trainer settings); sgd with weight decay added to the gradient (torch.optim.SGD)."},
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={"help": "Micro-batches summed per optimizer step (TensorFlow: inside the one compiled step, static shapes). Steps, logging and schedules count optimizer steps."},
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={"help": "Recompute each encoder layer's activations in the backward pass instead of keeping them "
                          "(Keras: jax.checkpoint per layer, matmul outputs kept; torch_xla: the Trainer's). Same "
                          "losses, less memory, more compute. Not with --backend tensorflow."},
    )
    lr_scheduler_type: str = field(
        default="linear",
        metadata={"help": f"Learning-rate schedule after warmup, transformers' formulas: {', '.join(LR_SCHEDULER_TYPES)}."},
    )
    warmup_ratio: float = field(default=0.0, metadata={"help": "Share of the total steps used for linear warmup, in [0, 1]."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear warmup steps (give this or warmup_ratio, not both)."})
    num_train_epochs: float = field(default=3.0, metadata={"help": "Epochs to train (ignored when max_steps > 0)."})
    max_steps: int = field(default=-1, metadata={"help": "Total optimizer steps; > 0 overrides num_train_epochs; -1: unset (another negative is refused)."})
    logging_steps: int = field(default=10, metadata={"help": "Log the training loss every N global steps."})
    eval_strategy: str = field(default="epoch", metadata={"help": "When to evaluate: no, steps or epoch (--eval_steps N alone means steps)."})
    evaluation_strategy: Optional[str] = field(
        default=None, metadata={"help": "Deprecated spelling of --eval_strategy (transformers < 4.46); sets it."},
    )
    eval_on_start: bool = field(default=False, metadata={"help": "Evaluate once before the first step (the untrained baseline)."})
    eval_steps: Optional[int] = field(default=None, metadata={"help": "Evaluate every N global steps with eval_strategy=steps (default: logging_steps)."})
    probe_file: Optional[str] = field(
        default=None,
        metadata={"help": "Cloze probes scored at each evaluation (TensorFlow and Keras backends): lines 'The capital "
                          "of France is <mask>. => Paris', CSV or JSONL; top-1/top-5 accuracy and MRR go to the log "
                          "history (probe_top1, probe_top5, probe_mrr) and the card. Same scoring as `hf-tpu probe`."},
    )
    save_strategy: str = field(default="epoch", metadata={"help": "When to write a checkpoint: no, steps or epoch (--save_steps N alone means steps)."})
    save_steps: int = field(default=500, metadata={"help": "Checkpoint every N global steps with save_strategy=steps."})
    save_total_limit: Optional[int] = field(default=2, metadata={"help": "Checkpoints kept in output_dir (oldest removed first)."})
    save_on_signal_timeout: float = field(default=25.0, metadata={"help": "Seconds after SIGINT/SIGTERM for saving the step reached and pushing it (25: fits the 30 s preemption notice); what did not land is reported."})
    load_best_model_at_end: bool = field(
        default=False,
        metadata={"help": "Export and push the weights of the best evaluation instead of the last (needs matching eval/save strategies, as in transformers)."},
    )
    metric_for_best_model: Optional[str] = field(
        default=None,
        metadata={"help": f"Metric that picks the best model: {', '.join(BEST_METRICS)} (default with load_best_model_at_end: loss)."},
    )
    greater_is_better: Optional[bool] = field(
        default=None, metadata={"help": "Whether a larger metric_for_best_model is better (default: false for loss/perplexity, true otherwise)."},
    )
    report_to: Optional[List[str]] = field(
        default=None,
        metadata={"help": "Where logs go: tensorboard, trackio (when installed), all (every installed one) or none. Unset: tensorboard."},
    )
    seed: int = field(default=42, metadata={"help": "Seed of initialization, shuffling and masking."})
    bf16: Optional[str] = field(
        default=None,
        metadata={"help": "Mixed bfloat16 compute, float32 weights and loss: true, false or auto (bf16 where the hardware "
                          "has it natively: TPU, GPU with compute capability >= 8.0, CPU with AVX512-BF16/AMX when the step runs on "
                          "TensorFlow's kernels or the Keras backend's bf16 x bf16 -> float32 dots; another XLA:CPU step keeps "
                          "float32). "
                          "Unset: auto on a TPU, float32 elsewhere. See hf_tpu_ext/precision.py.",
                  "nargs": "?", "const": "true"},
    )
    fp16: bool = field(default=False, metadata={"help": "float16 mixed precision: refused (no float16 compute on CPU/TPU, no loss scaling in the XLA step); use --bf16."})
    jit_compile: Optional[bool] = field(
        default=None,
        metadata={"help": "XLA-compile the training step (unset: yes, except bf16 on a CPU with native bf16, "
                          "where TensorFlow's oneDNN kernels are faster and XLA fuses only the element-wise ops "
                          "between them; false: no XLA at all). On one device the whole step (forward, "
                          "backward, AdamW) is one XLA program; with a distribution strategy, the per-replica forward/backward. "
                          "Dropout then uses counter-based masks (XLA's own RNG is slow on CPU, see benchmarks/NOTES.md)."},
    )
    fsdp: Optional[str] = field(
        default=None,
        metadata={"help": "Fully sharded data parallel (transformers' name): full_shard (weights, gradients and optimizer "
                          "state sharded over the devices) or shard_grad_op (gradients and optimizer state sharded), "
                          "optionally with auto_wrap. --backend keras and torch_xla (FSDPv2); see --fsdp_config."},
    )
    fsdp_config: Optional[str] = field(
        default=None,
        metadata={"help": "FSDP settings, a JSON object or file: min_num_params (weights with fewer elements stay "
                          "replicated) and, on --backend keras, mesh {\"data\": D, \"fsdp\": F} (data parallel over D "
                          "groups of F devices, FSDP within each; default: every device on fsdp)."},
    )
    steps_per_execution: int = field(default=1, metadata={"help": "Train steps run per call into the device (TPU: 50-200 hides host overhead)."})
    tpu_name: Optional[str] = field(default=None, metadata={"help": "TPU to use: a name, a grpc:// address, or 'local' on a TPU VM."})
    tpu_zone: Optional[str] = field(default=None, metadata={"help": "GCP zone of the TPU (TPU Nodes)."})
    gcp_project: Optional[str] = field(default=None, metadata={"help": "GCP project of the TPU (TPU Nodes)."})
    callbacks: str = field(default=DEFAULT_CALLBACKS, metadata={"help": "Comma-separated registered callback names (see `hf-tpu callbacks`); '' for none."})
    logging_dir: Optional[str] = field(default=None, metadata={"help": "TensorBoard folder (default: output_dir/runs)."})
    disable_tqdm: bool = field(default=False, metadata={"help": "Turn the progress bar off."})
    log_level: str = field(
        default="passive",
        metadata={"help": "Terminal output, transformers' names: passive (default) shows this package's INFO lines "
                          "without TensorFlow's C++ start-up lines and transformers' deprecation warnings; debug, "
                          "info or warning set that level and bring them back; error or critical quieten this "
                          "package too.",
                  "choices": ["passive", "debug", "info", "warning", "error", "critical"]},
    )
    push_to_hub: bool = field(default=False, metadata={"help": "Push the model and its card to the Hub while training runs."})
    hub_model_id: Optional[str] = field(default=None, metadata={"help": "Repo id 'user/name' to push to (default: the output_dir name under your account)."})
    hub_strategy: str = field(default="every_save", metadata={"help": f"What is pushed when: one of {', '.join(HUB_STRATEGIES)} (as in transformers)."})
    hub_token: Optional[str] = field(default=None, metadata={"help": "Hub token (default: HF_TOKEN or the cached login). Never printed."})
    hub_private_repo: Optional[bool] = field(default=None, metadata={"help": "Create the repo private."})
    hub_revision: Optional[str] = field(default=None, metadata={"help": "Branch to push to; unset pushes to main."})
    hub_space_id: Optional[str] = field(default=None, metadata={"help": "Deploy the fill-mask demo to this Space when training ends."})
    hub_allow_push_failure: bool = field(default=False, metadata={"help": "Exit 0 even when the final push to the Hub failed (the failure is still logged and in training_summary.json)."})
    hub_commit_budget: int = field(default=100, metadata={"help": "At most this many commits per hour to the repo (the Hub allows 128): saves beyond it are folded into the next push; the final push always goes."})
    license: Optional[str] = field(default=None, metadata={"help": "License written in the model card (a Hub license id, e.g. apache-2.0). Unset: none, or the license of the Hub model --model_name_or_path continues (said so)."})
    language: Optional[str] = field(default=None, metadata={"help": "Language written in the model card (e.g. en). Unset: none."})

    def __post_init__(self):
        try:
            self.bf16 = parse_bf16(self.bf16)
        except ValueError as e:
            raise ArgumentError(str(e)) from None
        self.backend = resolve_backend(self.backend, BACKENDS)  # unset: keras, else tensorflow, else one line
        if not self.do_train:
            raise ArgumentError(
                "--do_train false (evaluation only) is not supported: `hf-tpu train` always trains. Drop --do_train; "
                "to evaluate a finished model, train 0 more steps is not possible either: use transformers' run_mlm.py "
                "--do_eval on the output folder."
            )
        if self.fp16:
            raise ArgumentError(
                "--fp16 is not supported: CPUs and TPUs have no float16 compute and the XLA training step has no loss "
                "scaling, which float16 needs. Use --bf16 true (bfloat16 mixed precision, no loss scaling needed) or "
                "--bf16 auto (bfloat16 where the hardware has it), or float32."
            )
        self._eval_strategy_as_passed = self.eval_strategy  # before the old spelling overwrites it
        if self.evaluation_strategy is not None:
            logger.warning("--evaluation_strategy is deprecated (transformers renamed it in 4.46): use --eval_strategy %s.",
                           self.evaluation_strategy)
            self.eval_strategy = self.evaluation_strategy
        # what was asked before do_eval below may turn it off (check_user_flags reports conflicts)
        self._asked_eval_strategy = self.eval_strategy
        for name, choices in (("eval_strategy", STRATEGIES), ("save_strategy", STRATEGIES), ("hub_strategy", HUB_STRATEGIES)):
            check_choice(getattr(self, name), choices, f"--{name}")
        if self.lr_scheduler_type not in LR_SCHEDULER_TYPES:
            raise ArgumentError(f"--lr_scheduler_type {self.lr_scheduler_type!r} is not supported; choose one of: "
                                f"{', '.join(LR_SCHEDULER_TYPES)}.")
        if self.optim not in OPTIMIZERS:
            raise ArgumentError(f"--optim {self.optim!r} is not supported; choose one of: {', '.join(OPTIMIZERS)}.")
        self._check_numbers()
        if self.optim == "adafactor" and self.backend == "tensorflow":
            raise ArgumentError(
                "--optim adafactor is not available with --backend tensorflow: tf_keras has Adafactor only in its new "
                "optimizer API, which this trainer's XLA step and checkpoints do not use. Use --optim adamw_torch or "
                "sgd, or --backend keras or torch_xla (transformers' Adafactor)."
            )
        if self.gradient_checkpointing and self.backend == "tensorflow":
            raise ArgumentError("--gradient_checkpointing is not available with --backend tensorflow (transformers' TF "
                                "models have none); use --backend keras or torch_xla, or drop it.")
        if self.lr_scheduler_type == "constant" and (self.warmup_steps > 0 or self.warmup_ratio > 0):
            raise ArgumentError("--lr_scheduler_type constant has no warmup (as in transformers); use "
                                "--lr_scheduler_type constant_with_warmup, or drop --warmup_steps/--warmup_ratio.")
        if self.lr_scheduler_type == "polynomial" and self.learning_rate <= 1e-7:
            raise ArgumentError(f"--lr_scheduler_type polynomial decays to 1e-07, so --learning_rate must be larger, got "
                                f"{self.learning_rate}.")
        self._check_step_counts()
        if not (isinstance(self.save_on_signal_timeout, (int, float)) and 0 <= self.save_on_signal_timeout < math.inf):
            raise ArgumentError(f"--save_on_signal_timeout must be a number of seconds >= 0, got "
                                f"{self.save_on_signal_timeout!r}.")
        self.report_to = resolve_report_to(self.report_to, self.backend)
        if self.do_eval is None:
            self.do_eval = self.eval_strategy != "no"
        elif not self.do_eval:
            self.eval_strategy = "no"  # run_mlm's meaning: no evaluation at all
        if self.eval_steps is None:
            self.eval_steps = self.logging_steps
        if isinstance(self.resume_from_checkpoint, str) and self.resume_from_checkpoint.lower() in ("false", "none", ""):
            self.resume_from_checkpoint = None
        if self.probe_file:
            self._check_probe_file()
        if self.hub_model_id is not None:
            check_repo_id(self.hub_model_id, "--hub_model_id")  # before TensorFlow starts, not at the first push
        if self.hub_space_id and not self.push_to_hub:
            raise ArgumentError("--hub_space_id deploys a Space for the pushed model: add --push_to_hub (and --hub_model_id).")
        if self.logging_dir is None:
            self.logging_dir = os.path.join(self.output_dir, "runs")
        self._resolve_best_metric()
        self._check_combinations()
        check_fsdp(self)  # --fsdp / --fsdp_config read and refused where the backend cannot shard

    def _refuse_tensorflow_only(self, given, fields, why: str) -> None:
        """Raise ``ArgumentError`` naming the TensorFlow-only flags of ``fields`` (and ``--jit_compile false``)
        that were given to another backend, with ``why`` that backend does without them."""
        ignored = [f for f in fields if f in given]
        if "jit_compile" in given and self.jit_compile is False:
            ignored.append("jit_compile")
        if ignored:
            raise ArgumentError(f"{', '.join('--' + n for n in ignored)} only appl{'ies' if len(ignored) == 1 else 'y'} "
                                f"to --backend tensorflow ({why}); drop {'it' if len(ignored) == 1 else 'them'}.")

    def _check_numbers(self) -> None:
        """Counts >= 1 and float hyper-parameters finite and in range (part of ``__post_init__``).

        Raises:
            ArgumentError: naming the flag and its allowed range.
        """
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "steps_per_execution", "logging_steps",
                     "save_steps", "gradient_accumulation_steps", "hub_commit_budget"):
            if getattr(self, name) < 1:
                raise ArgumentError(f"--{name} must be >= 1, got {getattr(self, name)}.")
        if self.eval_steps is not None and self.eval_steps < 1:
            raise ArgumentError(f"--eval_steps must be >= 1, got {self.eval_steps}.")
        # every float hyper-parameter: finite and in range, named by its flag
        check_number("learning_rate", self.learning_rate, low=0.0, low_open=True)
        check_number("weight_decay", self.weight_decay, low=0.0)
        check_number("adam_beta1", self.adam_beta1, low=0.0, high=1.0, high_open=True)
        check_number("adam_beta2", self.adam_beta2, low=0.0, high=1.0, high_open=True)
        check_number("adam_epsilon", self.adam_epsilon, low=0.0, low_open=True)
        check_number("max_grad_norm", self.max_grad_norm, low=0.0)
        check_number("warmup_ratio", self.warmup_ratio, low=0.0, high=1.0)
        check_number("num_train_epochs", self.num_train_epochs, low=0.0)

    def _resolve_best_metric(self) -> None:
        """``metric_for_best_model`` (``loss`` with ``load_best_model_at_end``) and ``greater_is_better`` (transformers'
        rule when unset) for the best model (part of ``__post_init__``).

        Raises:
            ArgumentError: a metric this trainer does not evaluate; a larger loss called better.
        """
        if self.load_best_model_at_end and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"  # transformers' default
        if self.metric_for_best_model is not None:
            if self.metric_for_best_model not in BEST_METRICS:
                raise ArgumentError(f"--metric_for_best_model {self.metric_for_best_model!r} is not an evaluation metric "
                                    f"of this trainer; choose one of: {', '.join(BEST_METRICS)}.")
            if self.greater_is_better is None:  # transformers' rule: a loss is minimized, anything else maximized
                self.greater_is_better = BEST_METRICS[self.metric_for_best_model] != "eval_loss"
            elif self.greater_is_better and BEST_METRICS[self.metric_for_best_model] == "eval_loss":
                raise ArgumentError(f"--greater_is_better true with --metric_for_best_model {self.metric_for_best_model}: "
                                    "a larger loss/perplexity is never better; drop --greater_is_better.")

    def _check_combinations(self):
        """Checks across fields (strategies, evaluation, best model)."""
        if self.eval_on_start and not self.do_eval:
            raise ArgumentError("--eval_on_start needs evaluation, but --do_eval is false; drop one of them.")
        if self.load_best_model_at_end:
            if not self.do_eval or self.eval_strategy == "no":
                raise ArgumentError("--load_best_model_at_end needs evaluations to compare: set --eval_strategy steps or "
                                    "epoch (and the same --save_strategy).")
            # transformers' own checks (TrainingArguments.__post_init__), same wording
            if self.eval_strategy != self.save_strategy:
                raise ArgumentError(
                    "--load_best_model_at_end requires the save and eval strategy to match, but found\n- Evaluation "
                    f"strategy: {self.eval_strategy}\n- Save strategy: {self.save_strategy}"
                )
            if self.eval_strategy == "steps" and self.save_steps % self.eval_steps != 0:
                raise ArgumentError(
                    "--load_best_model_at_end requires the saving steps to be a round multiple of the evaluation "
                    f"steps, but found {self.save_steps}, which is not a round multiple of {self.eval_steps}."
                )

    @staticmethod
    def implied_by(given) -> dict:
        """Defaults implied by the flags the user passed: ``--save_steps N`` / ``--eval_steps N`` without a
        strategy mean the ``steps`` strategy (transformers' default strategy is ``steps``; ours is ``epoch``).

        Args:
            given: field names passed on the command line or in the JSON config (see :func:`given_field_names`).

        Returns:
            ``{field: value}`` to use as parser defaults (explicit values still win).
        """
        implied = {}
        if "save_steps" in given and "save_strategy" not in given:
            implied["save_strategy"] = "steps"
        if "eval_steps" in given and not ({"eval_strategy", "evaluation_strategy"} & set(given)):
            implied["eval_strategy"] = "steps"
        return implied

    def _check_step_counts(self) -> None:
        """Warmup, ``max_steps``/``num_train_epochs`` and ``save_total_limit`` counts (part of ``__post_init__``).

        Raises:
            ArgumentError: a negative count (``max_steps`` -1 is transformers' "unset"), both warmups, no length.
        """
        if self.warmup_steps < 0:
            raise ArgumentError(f"--warmup_steps must be >= 0, got {self.warmup_steps}.")
        if self.warmup_steps > 0 and self.warmup_ratio > 0:
            raise ArgumentError(f"Both --warmup_steps {self.warmup_steps} and --warmup_ratio {self.warmup_ratio} are set; "
                                "pass one of them (transformers would silently use warmup_steps).")
        if self.max_steps < -1:  # another negative is a typo, never "train by epochs"
            raise ArgumentError(f"--max_steps must be > 0 (or -1: train --num_train_epochs), got {self.max_steps}.")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ArgumentError("Set --max_steps > 0 or --num_train_epochs > 0.")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ArgumentError("--save_total_limit must be >= 1 (or unset to keep every checkpoint).")

    def check_user_flags(self, given, config_fields=None) -> None:
        """Refuse a passed flag that would have no effect, with the reason (after :meth:`implied_by`).

        ``given`` holds the field names passed on the command line or in the JSON config (not inferred from
        values, so ``--save_steps 500`` counts although 500 is the default); ``config_fields`` is ``(config file,
        the names only it set)`` when a JSON config was read (a refusal it caused names the file).

        Raises:
            ArgumentError: ``--save_steps``/``--eval_steps`` with another strategy or ``--do_eval false``;
                ``--do_eval false`` with an evaluation strategy; both spellings of the eval strategy, disagreeing.
        """
        given = set(given)
        eval_flag = "--evaluation_strategy" if "evaluation_strategy" in given else "--eval_strategy"
        if {"eval_strategy", "evaluation_strategy"} <= given and self.evaluation_strategy != self._eval_strategy_as_passed:
            raise ArgumentError(f"--evaluation_strategy {self.evaluation_strategy} and --eval_strategy "
                                f"{self._eval_strategy_as_passed} disagree; pass only --eval_strategy (the current name).")
        if "eval_steps" in given and "do_eval" in given and not self.do_eval:
            raise ArgumentError(f"--eval_steps {self.eval_steps} has no effect with --do_eval false; drop one of them.")
        for steps, strategy, flag, asked in (("save_steps", "save_strategy", "--save_strategy", self.save_strategy),
                                             ("eval_steps", "eval_strategy", eval_flag, self._asked_eval_strategy)):
            if steps in given and asked != "steps":
                raise ArgumentError(f"--{steps} {getattr(self, steps)} only applies with {flag} steps, but {flag} is "
                                    f"{asked}; drop --{steps} or pass {flag} steps.")
        if "do_eval" in given and not self.do_eval and ({"eval_strategy", "evaluation_strategy"} & given):
            if self._asked_eval_strategy != "no":
                raise ArgumentError(f"--do_eval false turns evaluation off, but {eval_flag} {self._asked_eval_strategy} "
                                    "asks for it; drop one of them.")
        hub_only = sorted(n for n in ("hub_model_id", "hub_strategy", "hub_private_repo", "hub_revision",
                                      "hub_commit_budget") if n in given)
        config, file_only = config_fields or (None, set())
        if hub_only and not self.push_to_hub and set(hub_only) <= set(file_only):
            raise ArgumentError(f"{config} sets {', '.join(hub_only)}, which only apply when pushing: add "
                                "--push_to_hub true, or --push_to_hub false to leave them unused.")
        if hub_only and not self.push_to_hub:
            raise ArgumentError(f"{', '.join('--' + n for n in hub_only)} only appl{'ies' if len(hub_only) == 1 else 'y'} "
                                f"when pushing: add --push_to_hub, or drop {'it' if len(hub_only) == 1 else 'them'}.")
        if "save_total_limit" in given and self.save_strategy == "no":
            raise ArgumentError("--save_total_limit limits saved checkpoints, but --save_strategy is no; drop one of them.")
        if "logging_dir" in given and "tensorboard" not in self.report_to:
            raise ArgumentError("--logging_dir is the TensorBoard folder, but --report_to does not include tensorboard; "
                                "drop --logging_dir or add --report_to tensorboard.")
        if self.backend == "torch_xla":
            # the torch_xla backend runs every step as an XLA graph through transformers.Trainer, one step per call
            self._refuse_tensorflow_only(given, ("steps_per_execution", "tpu_name", "tpu_zone", "gcp_project"),
                                         "torch_xla compiles every step itself and finds its TPU through PJRT_DEVICE")
        if self.backend == "keras":
            # the Keras backend finds its devices through JAX (--steps_per_execution: steps per call, as TensorFlow)
            self._refuse_tensorflow_only(given, ("tpu_name", "tpu_zone", "gcp_project"),
                                         "--backend keras compiles every step with XLA and uses every device JAX sees")
        if "max_steps" in given and self.max_steps == 0:  # transformers' "unset" too: said, not silently epochs
            logger.warning("--max_steps 0 sets no step count (as in transformers, a count <= 0 means: train by "
                           "epochs): this run trains --num_train_epochs %s; pass --max_steps N > 0 for N steps.",
                           f"{self.num_train_epochs:g}")
        if "max_steps" in given and "num_train_epochs" in given and self.max_steps > 0:
            logger.info("--max_steps %d overrides --num_train_epochs %s (as in transformers).", self.max_steps,
                        self.num_train_epochs)

    def _check_probe_file(self) -> None:
        """Parse ``probe_file`` now (a bad file fails before any data or compute work)."""
        from hf_tpu_ext import probes  # numpy (+0.1 s) stays out of hf-tpu train --help

        if self.backend not in ("tensorflow", "keras"):
            raise ArgumentError(f"--probe_file is scored by the TensorFlow and Keras backends' evaluation; with "
                                f"--backend {self.backend} score the pushed revisions with `hf-tpu probe` instead.")
        try:
            probes.read_probe_file(self.probe_file)
        except probes.ProbeError as err:
            raise DataError(f"--probe_file {err}") from None

    @property
    def resume_latest(self) -> bool:
        """True when ``resume_from_checkpoint`` asks for the latest checkpoint in ``output_dir``."""
        return isinstance(self.resume_from_checkpoint, str) and self.resume_from_checkpoint.lower() == "true"

    @property
    def callback_names(self) -> List[str]:
        return [n.strip() for n in (self.callbacks or "").split(",") if n.strip()]

    def total_steps(self, steps_per_epoch: int) -> int:
        """Optimizer steps of the whole run: ``max_steps`` if > 0, else ``ceil(num_train_epochs * steps_per_epoch)``."""
        if self.max_steps > 0:
            return self.max_steps
        return int(math.ceil(self.num_train_epochs * steps_per_epoch))

    def num_warmup_steps(self, total_steps: int) -> int:
        """``warmup_steps`` if > 0, else ``ceil(warmup_ratio * total_steps)`` (transformers' rule)."""
        return self.warmup_steps if self.warmup_steps > 0 else int(math.ceil(self.warmup_ratio * total_steps))

    def to_sanitized_dict(self) -> dict:
        """The arguments as a JSON-able dict with ``hub_token`` redacted (for training_args.json and the card)."""
        d = asdict(self)
        if d.get("hub_token"):
            d["hub_token"] = "<redacted>"
        return d

    def __repr__(self):  # keep the token out of logs and tracebacks
        items = ", ".join(f"{k}={v!r}" for k, v in self.to_sanitized_dict().items())
        return f"TrainingArguments({items})"

    __str__ = __repr__
