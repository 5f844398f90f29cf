"""The Keras 3 backend of ``hf-tpu train`` (``--backend keras``: JAX by default, ``KERAS_BACKEND=tensorflow`` too):
:class:`~hf_tpu_ext.backends.keras.backend.KerasBackend` and its modules. Importing this package imports nothing;
each module imports Keras (or JAX) itself."""
