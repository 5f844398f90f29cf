"""hf-tpu-ext: train RoBERTa-style fill-mask models with TensorFlow + XLA and the Hugging Face Hub."""

__version__ = "0.1.0"
