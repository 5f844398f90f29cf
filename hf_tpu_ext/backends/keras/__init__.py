"""The Keras 3 backend of ``hf-tpu train`` (``--backend keras``: Keras 3 on JAX):
:class:`~hf_tpu_ext.backends.keras.backend.KerasBackend` and its modules. Importing this package imports only
:mod:`hf_tpu_ext.errors`; each module imports Keras (or JAX) itself."""

from hf_tpu_ext.errors import BackendError


def refuse_keras_backend(keras_backend: str) -> None:
    """Refuse a Keras backend other than JAX (``KERAS_BACKEND``, or what Keras was imported with): ``--backend
    keras`` trains on JAX only; TensorFlow's users have ``--backend tensorflow`` (its ``tf.distribute`` strategies).

    Args:
        keras_backend: the Keras backend's name, as ``KERAS_BACKEND`` holds it (``"jax"`` passes).

    Raises:
        BackendError: one line naming the value and what to do.
    """
    if keras_backend == "jax":
        return
    tensorflow = ", or use --backend tensorflow for TensorFlow's strategies" if keras_backend == "tensorflow" else ""
    raise BackendError(f"--backend keras trains on JAX, but KERAS_BACKEND={keras_backend}: unset it (or set "
                       f"KERAS_BACKEND=jax){tensorflow}.")
