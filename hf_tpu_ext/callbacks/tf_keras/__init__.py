"""tf_keras callbacks (``tf_keras.callbacks.Callback``) under the built-in names, for ``hf-tpu train
--backend tensorflow`` and tf_keras / transformers-TF ``model.fit`` scripts (extra ``[tensorflow]``):
``push_to_hub``, ``throughput``, ``xla_recompile_guard``, ``masked_lm_metrics``. Get them by name with
``get_callback(name, framework="tf_keras")`` (or ``model=``); the framework-free cores they share with the
Keras 3 and torch callbacks (``throughput_meter``, ``fit_history``, ``xla_compile_log``) stay in
:mod:`hf_tpu_ext.callbacks`.
"""
