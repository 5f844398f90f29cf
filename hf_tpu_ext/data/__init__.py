"""Backend-neutral data layer: text sources -> tokenizer -> fixed-length blocks -> TFRecords / tf.data.

Modules (imported lazily by callers; this package imports nothing heavy):

* :mod:`~hf_tpu_ext.data.corpus` -- the embedded default corpus (CPython's built-in documentation).
* :mod:`~hf_tpu_ext.data.loading` -- text files / Hub datasets -> ``DatasetDict`` with train/validation.
* :mod:`~hf_tpu_ext.data.tokenizer` -- train a byte-level BPE RoBERTa tokenizer, or load one.
* :mod:`~hf_tpu_ext.data.blocks` -- tokenize, concatenate and cut into ``[N, max_seq_length]`` int32 blocks.
* :mod:`~hf_tpu_ext.data.masking` -- stateless TensorFlow MLM masking (the training-batch contract).
* :mod:`~hf_tpu_ext.data.tfrecord` -- TFRecord shards + manifest (local folders or ``gs://``).
* :mod:`~hf_tpu_ext.data.pipeline` -- resumable, deterministic ``tf.data`` train/eval pipelines.
* :mod:`~hf_tpu_ext.data.streaming` -- ``--streaming``: a ``datasets`` IterableDataset, one slice per process, its
  position saved with each checkpoint.
"""
