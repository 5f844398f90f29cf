"""The PyTorch/XLA backend of ``hf-tpu train``: ``transformers.Trainer`` on the XLA device.

The backend boundary (the same for ``backends/tensorflow``):

* shared, backend-neutral: arguments (:mod:`hf_tpu_ext.args`), text loading and blocking
  (:mod:`hf_tpu_ext.data.loading`, :mod:`hf_tpu_ext.data.blocks`), the tokenizer
  (:func:`hf_tpu_ext.data.run_data.load_or_train_tokenizer`), the ``masked_lm`` metric module, the output files
  (:mod:`hf_tpu_ext.outputs`), the model card, Hub preflight and push queue (:mod:`hf_tpu_ext.hub`) and
  the callback registry (:mod:`hf_tpu_ext.callbacks`, one class per name and backend) and the run's lifecycle
  (:mod:`hf_tpu_ext.run`: checks, resume, outputs, card, pushes, Space);
* owned here: the device (:mod:`.device`: ``PJRT_DEVICE``, device kind/count, compile metrics), the
  static-shape batches (:mod:`.data`), the model and its masked-position loss (:mod:`.model`) and the
  train loop (:mod:`.trainer`: ``transformers.Trainer`` with a non-fused AdamW).

Nothing here is imported by the TensorFlow backend; importing this package does not import torch.
"""
