"""hf-tpu-ext: train RoBERTa-style fill-mask models with TensorFlow + XLA and the Hugging Face Hub."""

__version__ = "0.1.0"

# before anything imports TensorFlow: with triton installed (CUDA torch), TensorFlow 2.20/2.21 would load its
# LLVM globally and a later `import triton` (transformers' TF classes -> torch._dynamo) would crash the process
from hf_tpu_ext.native_loading import keep_tensorflow_symbols_local as _keep_tf_local  # noqa: E402

_keep_tf_local()
