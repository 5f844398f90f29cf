"""The TensorFlow backend of ``hf-tpu train``: wires data, strategy, model, trainer, outputs and the Hub."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any, Dict, List

from hf_tpu_ext.errors import CheckpointError, DataError

logger = logging.getLogger("hf_tpu_ext")


def _resolve_resume(training_args, token):
    """Checkpoint path to resume from (None: start fresh).

    Raises:
        CheckpointError: nothing to resume where ``resume_from_checkpoint`` points.
    """
    from hf_tpu_ext.backends.tensorflow.checkpoint import find_latest, resolve_checkpoint

    spec = training_args.resume_from_checkpoint
    if not spec:
        return None
    if training_args.resume_latest:
        return find_latest(training_args.output_dir)
    if os.path.exists(spec) or os.path.exists(spec + ".index"):
        return resolve_checkpoint(spec)
    from hf_tpu_ext.hub.resume import download_last_checkpoint, looks_like_repo_spec

    if looks_like_repo_spec(spec):
        local = os.path.join(training_args.output_dir, "hub-last-checkpoint")
        return download_last_checkpoint(spec, token, local)
    raise CheckpointError(
        f"--resume_from_checkpoint {spec!r} is neither a local checkpoint/folder, 'true', nor a Hub repo id "
        "'user/name[@revision]'."
    )


def _load_blocks(model_args, data_args, training_args, info, resuming):
    """Tokenizer + int32 blocks [N, L] per split (or TFRecord sources)."""
    from hf_tpu_ext.data.loading import is_tfrecord_source
    from hf_tpu_ext.run import load_text_blocks

    if data_args.train_file and is_tfrecord_source(data_args.train_file):
        from hf_tpu_ext.data.tfrecord import check_tfrecord_location, read_manifest, read_tfrecord_blocks
        from hf_tpu_ext.data.tokenizer import check_mlm_tokenizer, load_tokenizer

        check_tfrecord_location(data_args.train_file, info.is_tpu_node)
        name = model_args.tokenizer_name or model_args.model_name_or_path or os.path.join(data_args.train_file, "tokenizer")
        tok = load_tokenizer(name)
        check_mlm_tokenizer(tok)
        train = read_tfrecord_blocks(data_args.train_file, "train")
        try:
            validation = read_tfrecord_blocks(data_args.validation_file or data_args.train_file, "validation")
        except DataError:
            validation = None
        if train[2] != data_args.max_seq_length:
            raise DataError(
                f"The TFRecord shards in {data_args.train_file} hold blocks of {train[2]} tokens but "
                f"--max_seq_length is {data_args.max_seq_length}; pass --max_seq_length {train[2]}."
            )
        if validation is not None and validation[1] == 0:
            validation = None
        return tok, {"train": train, "validation": validation}, read_manifest(data_args.train_file).get("source")
    if info.is_tpu_node:
        raise DataError("A TPU Node reads data from Cloud Storage: run `hf-tpu prepare-data --output_path gs://...` "
                        "and pass that gs:// path as --train_file.")
    return load_text_blocks(model_args, data_args, training_args, resuming)


def _precision_plan(args, accelerator: str):
    """:func:`hf_tpu_ext.precision.resolve_precision` for this machine (GPU details read only on a GPU)."""
    from hf_tpu_ext.precision import NATIVE_BF16_CPU_FLAGS, cpu_flags, gpu_has_native_bf16, resolve_precision

    if accelerator == "GPU":
        native = gpu_has_native_bf16()
    elif accelerator == "CPU":
        native = bool(cpu_flags() & NATIVE_BF16_CPU_FLAGS)
    else:
        native = True
    return resolve_precision(args.bf16, args.jit_compile, accelerator, native)


def train_tensorflow(model_args, data_args, training_args, callback_classes) -> Dict[str, Any]:
    """See :func:`hf_tpu_ext.run.train`."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer
    from hf_tpu_ext.backends.tensorflow.model import build_model
    from hf_tpu_ext.backends.tensorflow.strategy import configure_host_memory, resolve_strategy
    from hf_tpu_ext.backends.tensorflow.trainer import RunContext, TFTrainer, make_optimizer
    from hf_tpu_ext.callbacks import build_callbacks
    from hf_tpu_ext.data.blocks import check_blocks
    from hf_tpu_ext.data.masking import make_mask_fn
    from hf_tpu_ext.data.pipeline import make_eval_dataset, make_train_dataset, steps_per_epoch as count_steps

    args = training_args
    t_total = time.perf_counter()
    host_memory = configure_host_memory()  # before TensorFlow's first allocation
    info = resolve_strategy(args.tpu_name, args.tpu_zone, args.gcp_project)
    strategy = info.strategy
    plan = _precision_plan(args, info.accelerator)
    args.bf16, args.jit_compile = plan.bf16, plan.jit_compile
    replicas = strategy.num_replicas_in_sync
    # sequences per optimizer step: gradient accumulation splits them into micro-batches inside the step
    global_batch = args.per_device_train_batch_size * replicas * args.gradient_accumulation_steps
    global_eval_batch = args.per_device_eval_batch_size * replicas
    logger.info("strategy %s: %d replica(s) on %d %s device(s); global batch %d%s; host memory: %s",
                info.strategy_name, replicas, info.num_devices, info.accelerator, global_batch,
                f" ({args.gradient_accumulation_steps} accumulated micro-batches)"
                if args.gradient_accumulation_steps > 1 else "",
                ", ".join(k for k, v in host_memory.items() if v) or "defaults")

    # Hub access is checked before any data or compute work.
    push_callback = None
    token = None
    if args.push_to_hub or (args.resume_from_checkpoint and "/" in str(args.resume_from_checkpoint)):
        from hf_tpu_ext.hub.preflight import resolve_token

        token = resolve_token(args.hub_token)
    if args.push_to_hub:
        from hf_tpu_ext.callbacks.push_to_hub import PushToHubCallback

        push_callback = PushToHubCallback(
            output_dir=args.output_dir, save_strategy=args.save_strategy, save_steps=args.save_steps,
            hub_model_id=args.hub_model_id or os.path.basename(os.path.abspath(args.output_dir)),
            hub_token=token, hub_strategy=args.hub_strategy, hub_private_repo=args.hub_private_repo,
            hub_revision=args.hub_revision, license=args.license, language=args.language,
            dataset_name=data_args.dataset_name,
        )
        if info.is_chief:
            push_callback.preflight()

    resume_path = _resolve_resume(args, token)
    tok, blocks, corpus_description = _load_blocks(model_args, data_args, args, info, resume_path is not None)

    # sizes: fail before building the model
    L = data_args.max_seq_length
    if isinstance(blocks["train"], np.ndarray):
        check_blocks(blocks, global_batch, "train")
        num_train_blocks = len(blocks["train"])
    else:
        num_train_blocks = blocks["train"][1]
        if num_train_blocks < global_batch:
            from hf_tpu_ext.errors import CorpusTooSmallError

            raise CorpusTooSmallError(
                f"The TFRecord shards in {data_args.train_file} hold {num_train_blocks} training blocks of {L} tokens, "
                f"fewer than one global batch of {global_batch} ({args.per_device_train_batch_size} per device x "
                f"{replicas} replicas x {args.gradient_accumulation_steps} accumulation steps). Prepare more data or "
                "lower --per_device_train_batch_size / --gradient_accumulation_steps."
            )
    has_eval = args.do_eval and blocks.get("validation") is not None
    if has_eval and isinstance(blocks["validation"], np.ndarray):
        check_blocks(blocks, global_eval_batch, "validation")

    spe = count_steps(num_train_blocks, global_batch)
    total = args.total_steps(spe)

    # bf16: bfloat16 compute, float32 variables (so checkpoints and the export stay float32); the loss's
    # softmax runs on float32 logits (model.masked_lm_sums)
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16" if args.bf16 else "float32")
    with strategy.scope():
        model = build_model(model_args, tok, L, seed=args.seed)
        optimizer, schedule = make_optimizer(args, total)
        ckpt_dir = os.path.join(args.output_dir if info.is_chief else tempfile.mkdtemp(prefix="hf-tpu-worker-"),
                                "checkpoints")
        checkpointer = TrainingCheckpointer(model, optimizer, ckpt_dir,
                                            max_to_keep=args.save_total_limit) if args.save_strategy != "no" or resume_path else None
    start_step = 0
    log_history: List[Dict[str, Any]] = []
    if resume_path:
        if checkpointer is None:
            checkpointer = TrainingCheckpointer(model, optimizer, ckpt_dir, max_to_keep=args.save_total_limit)
        checkpointer.validate_compatible(resume_path, model.config)
        start_step = checkpointer.restore(resume_path)
        from hf_tpu_ext.outputs import TrainerState

        state_path = os.path.join(args.output_dir, "trainer_state.json")
        if os.path.isfile(state_path):
            log_history = [e for e in TrainerState.load(state_path).log_history if e.get("step", 0) <= start_step]
        logger.info("resumed from %s at global step %d", resume_path, start_step)
        if start_step >= total:
            # a finished run: leave its results, card and tokenizer exactly as they are
            logger.warning("The checkpoint is at global step %d, the run asks for %d steps: nothing to train. Raise "
                           "--max_steps or --num_train_epochs to train further.", start_step, total)
            from hf_tpu_ext.outputs import read_all_results

            return dict(read_all_results(args.output_dir) or {}, global_step=start_step)

    if info.is_chief:
        os.makedirs(args.output_dir, exist_ok=True)
        tok.save_pretrained(args.output_dir)

    mask_fn = make_mask_fn(tok, data_args.max_predictions_per_seq, data_args.mlm_probability)

    def make_train(start):
        source = blocks["train"] if isinstance(blocks["train"], np.ndarray) else blocks["train"][0]
        kwargs = {} if isinstance(blocks["train"], np.ndarray) else {"num_blocks": num_train_blocks}
        return make_train_dataset(source, global_batch_size=global_batch, seed=args.seed, start_step=start,
                                  mask_fn=mask_fn, **kwargs)

    eval_ds, eval_steps = None, None
    if has_eval:
        val = blocks["validation"]
        source, kwargs = (val, {}) if isinstance(val, np.ndarray) else (val[0], {"num_blocks": val[1]})
        eval_ds, eval_steps = make_eval_dataset(source, global_batch_size=global_eval_batch, seed=args.seed,
                                                mask_fn=mask_fn, **kwargs)

    summary_writer = (tf.summary.create_file_writer(args.logging_dir)
                      if info.is_chief and "tensorboard" in args.report_to else None)
    trackio = _init_trackio(args, model_args) if info.is_chief and "trackio" in args.report_to else None
    run = RunContext(model_args, data_args, args, strategy, info, replicas, global_batch, L, spe, total,
                     eval_ds, eval_steps, tok, checkpointer, model.config, model, args.output_dir)
    callbacks = build_callbacks([c for c in args.callback_names if c != "push_to_hub"], run)
    if push_callback is not None:
        from hf_tpu_ext.backends.tensorflow.export import save_model_folder

        push_callback.tokenizer = tok
        push_callback.checkpointer = checkpointer
        push_callback.save_fn, push_callback.max_steps = save_model_folder, total  # the adapter imports no backend
        callbacks.append(push_callback)

    trainer = TFTrainer(model, optimizer, schedule, args, info, make_train, eval_ds, eval_steps, spe, total, L,
                        checkpointer=checkpointer, callbacks=callbacks, start_step=start_step,
                        log_history=log_history, summary_writer=summary_writer, trackio=trackio)
    if info.is_chief:
        logger.info("precision %s, compiler path: %s (%s)", plan.precision, trainer.compiler_path, plan.reason)
    if args.probe_file and args.eval_strategy != "no":
        from hf_tpu_ext.backends.tensorflow.evaluation import make_probe_scorer

        trainer.probe_scorer = make_probe_scorer(model, tok, args.probe_file, L,
                                                 batch_size=max(8, args.per_device_eval_batch_size))

    def summary_fn():
        return _summary(model_args, data_args, args, info, model, trainer, train_metrics_holder, corpus_description,
                        tok)

    train_metrics_holder: Dict[str, Any] = {}
    if push_callback is not None:
        push_callback.summary_fn = summary_fn

    train_metrics = trainer.train()
    train_metrics_holder.update(train_metrics)
    eval_metrics = trainer.evaluate() if has_eval or trainer.probe_scorer is not None else {}
    # with the best model loaded, the final evaluation repeats the best one (same weights, same masks)
    if eval_metrics and not trainer.loaded_best and not (
            trainer.log_history and trainer.log_history[-1].get("step") == train_metrics["global_step"]
            and any(k in trainer.log_history[-1] for k in ("eval_loss", "probe_mrr"))):
        trainer._log(dict(eval_metrics, epoch=round(train_metrics["epoch"], 4), step=train_metrics["global_step"]))
    results = {**train_metrics, **eval_metrics}
    if trackio is not None:
        trackio.finish()
    if info.is_chief:
        _write_outputs(model_args, data_args, args, model, tok, trainer, results, summary_fn())
    trainer.end_training({**trainer.final_logs, **eval_metrics})
    if info.is_chief and args.hub_space_id and push_callback is not None:
        from hf_tpu_ext.hub.space import deploy_space

        url = deploy_space(push_callback.repo_id, args.hub_space_id, token=token, private=args.hub_private_repo)
        logger.info("deployed the fill-mask demo to %s", url)
    # whole-run rates (train_*_per_second) stay in all_results.json: the terminal shows one throughput figure
    logger.info("done in %.1fs: %s", time.perf_counter() - t_total,
                ", ".join(f"{k}={v:.4g}" for k, v in results.items() if isinstance(v, float)
                          and not k.endswith("_per_second")) + f" | {results['train_step_tokens_per_second']:,.0f} "
                "tokens/s in training steps")
    results["train_function_traces"] = trainer.train_function.experimental_get_tracing_count()
    results["xla_step_traces"] = trainer.step_function.experimental_get_tracing_count()
    return results


def _init_trackio(args, model_args):
    """``trackio.init`` for ``--report_to trackio``: a local project named after ``output_dir``; returns the module."""
    import trackio

    trackio.init(project=os.path.basename(os.path.abspath(args.output_dir)),
                 config={**args.to_sanitized_dict(), "model_name_or_path": model_args.model_name_or_path})
    return trackio


def _summary(model_args, data_args, args, info, model, trainer, train_metrics, corpus_description, tok):
    """The ``training_summary.json`` content (what the model card shows)."""
    from hf_tpu_ext.backends.tensorflow.optimization import optimizer_description
    from hf_tpu_ext.backends.tensorflow.trainer import model_summary_fields
    from hf_tpu_ext.outputs import build_training_summary

    device = {"accelerator": info.accelerator, "num_devices": info.num_devices, "strategy": info.strategy_name,
              "num_replicas": info.num_replicas, "num_workers": info.num_workers}
    return build_training_summary(
        model_args, data_args, args, backend="tensorflow", device=device,
        global_batch_size=trainer.global_batch_size, global_step=int(model.optimizer.iterations.numpy()),
        steps_per_epoch=trainer.steps_per_epoch, total_steps=trainer.total_steps, train_metrics=train_metrics,
        log_history=trainer.log_history, model_fields=model_summary_fields(model),
        optimizer=optimizer_description(args),
        dataset_description=corpus_description, mask_token=tok.mask_token, jit_compile=args.jit_compile,
        steps_per_execution=args.steps_per_execution, compiler=trainer.compiler_path)


def _write_outputs(model_args, data_args, args, model, tok, trainer, results, summary):
    from hf_tpu_ext.backends.tensorflow.export import save_model_folder
    from hf_tpu_ext.flops import flops_per_token
    from hf_tpu_ext.hub.model_card import save_model_card
    from hf_tpu_ext.outputs import (TrainerState, plot_loss_curve, write_all_results, write_training_args,
                                    write_training_summary)

    out = args.output_dir
    save_model_folder(model, out, tokenizer=tok)
    write_training_args(out, model_args, data_args, args)
    state = TrainerState(
        global_step=results["global_step"], epoch=results["epoch"], max_steps=trainer.total_steps,
        num_train_epochs=int(-(-trainer.total_steps // trainer.steps_per_epoch)), logging_steps=args.logging_steps,
        eval_steps=args.eval_steps, save_steps=args.save_steps, train_batch_size=trainer.global_batch_size,
        log_history=trainer.log_history, best_metric=trainer.best_metric,
        best_global_step=trainer.best_global_step, best_model_checkpoint=trainer.best_model_checkpoint,
        num_input_tokens_seen=results["tokens_seen"],
        total_flos=results["tokens_seen"] * flops_per_token(
            model.config, data_args.max_seq_length, data_args.max_predictions_per_seq / data_args.max_seq_length),
    )
    state.save(os.path.join(out, "trainer_state.json"))
    write_all_results(out, {k: v for k, v in results.items() if isinstance(v, (int, float))})
    write_training_summary(out, summary)
    plot_loss_curve(trainer.log_history, os.path.join(out, "loss_curve.png"))
    save_model_card(out, repo_id=args.hub_model_id, summary=summary, license=args.license, language=args.language)
