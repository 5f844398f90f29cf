"""The registered callbacks as ``transformers.TrainerCallback`` subclasses (the torch/torch_xla backend).

Same names and jobs as the ``tf_keras`` callbacks of :mod:`hf_tpu_ext.callbacks`; they work in
``hf-tpu train --backend torch_xla`` and can be appended to any existing ``Trainer`` script::

    from hf_tpu_ext.callbacks import get_callback

    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=collator, callbacks=[
        get_callback("throughput", framework="torch", seq_length=128),
        get_callback("xla_recompile_guard", framework="torch"),
        get_callback("masked_lm_metrics", framework="torch", eval_dataset=eval_ds, data_collator=collator),
        get_callback("push_to_hub", framework="torch", hub_model_id="me/my-model"),
    ])

The global step is ``state.global_step`` (optimizer steps, true across epochs, gradient accumulation and
resumes). Device reads are kept off the per-step path: on XLA a host read forces the pending graph to run.
"""


def wait_device() -> None:
    """Block until the device finished the work queued so far (XLA: ``xm.wait_device_ops``; CUDA: synchronize)."""
    try:
        import torch_xla.core.xla_model as xm
    except Exception:  # not on XLA
        xm = None
    if xm is not None:
        try:
            xm.wait_device_ops()
            return
        except Exception:  # no XLA device in use
            pass
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
