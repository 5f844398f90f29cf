"""The Keras backend's masked LM, built by the architecture of the config's ``model_type``
(:mod:`hf_tpu_ext.backends.keras.architectures`: RoBERTa, XLM-RoBERTa, CamemBERT, ... one module each).

Model contract (every architecture, so the step, dropout, bf16 dots, probes and export are shared): see
:mod:`hf_tpu_ext.backends.keras.architectures.base`. In short: inputs ``{"token_ids": int32 [B, L],
"padding_mask": int32 [B, L], "mask_positions": int32 [B, P]}``; output logits ``[B, P, vocab]`` in the compute
dtype (bfloat16 under ``--bf16``; variables always float32); ``model.config`` is the transformers config it was
built from (:func:`hf_tpu_ext.model_config.build_config`, or the ``--model_name_or_path`` one), which the run records
(``config.json``, the card, the FLOPs count).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Dict, Optional

import numpy as np

from hf_tpu_ext.backends.keras.architectures import architecture_for
from hf_tpu_ext.backends.keras.hf_convert import read_transformers_checkpoint, read_transformers_config, read_weights
from hf_tpu_ext.backends.keras.sliced_load import fsdp_shardings, sliced_state

logger = logging.getLogger("hf_tpu_ext")


def keras_global_state():
    """Keras' process-wide state module, ``keras.src.backend.common.global_state`` (``get_global_attribute`` /
    ``set_global_attribute``: the global seed, the seed generator, the automatic layer names' counters).

    The one adapter over this private module. The public alternative: ``keras.utils.set_random_seed`` for the seed
    (it imports TensorFlow wherever it is installed); the layer-name counters have none.

    Raises:
        ImportError: another Keras layout (the callers fall back to Keras' public behaviour).
    """
    from keras.src.backend.common import global_state

    return global_state


def _keras_seed_keys():
    """``(seed_generator module, GLOBAL_RANDOM_SEED)``: where Keras keeps its global seed and seed generator
    (``keras.src.random.seed_generator``, ``keras.src.utils.rng_utils``), keys of :func:`keras_global_state`.

    The one adapter over these private modules. The public alternative: ``keras.utils.set_random_seed`` (it imports
    TensorFlow wherever it is installed).

    Raises:
        ImportError: another Keras layout.
    """
    from keras.src.random import seed_generator
    from keras.src.utils.rng_utils import GLOBAL_RANDOM_SEED

    return seed_generator, GLOBAL_RANDOM_SEED


def seed_keras(seed: int) -> None:
    """``keras.utils.set_random_seed`` without seeding TensorFlow: that function imports TensorFlow wherever it is
    installed (``[keras]``'s keras-hub brings it), and the Keras backend's process imports none."""
    try:
        global_state = keras_global_state()
        seed_generator, global_random_seed = _keras_seed_keys()
    except ImportError:  # another Keras layout: its public function (may import TensorFlow)
        import keras

        keras.utils.set_random_seed(seed)
        return
    global_state.set_global_attribute(global_random_seed, seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)  # recreated from the seed
    random.seed(seed)
    np.random.seed(seed)


def build_masked_lm(config, dtype: str = "float32", seed: Optional[int] = None):
    """A new masked LM of ``config``'s architecture and sizes (the architecture's initialization).

    Args:
        config: a transformers config (:func:`hf_tpu_ext.model_config.build_config`); ``config.model_type`` picks
            the architecture.
        dtype: Keras dtype policy: ``"float32"``, or ``"mixed_bfloat16"`` (bfloat16 compute, float32 variables).
        seed: seeds the initializers (Keras' global seed, :func:`seed_keras`).

    Returns:
        the masked LM; ``model.config`` is ``config``.

    Raises:
        ArgumentError: ``config.model_type`` has no architecture (the message names the supported ones).
        CheckpointError: the architecture cannot hold the config (its ``check_config``).
    """
    arch = architecture_for(config)
    if seed is not None:
        seed_keras(int(seed))
    return arch.build(config, dtype)


def initialize_remaining(model) -> None:
    """Initialize ``model``'s variables still without a value and take them off Keras' list of variables to
    initialize (a later ``initialize_all_variables`` would otherwise refuse those already assigned).

    For a model built inside ``keras.StatelessScope(initialize_variables=False)`` (Keras keeps each variable's
    initializer: the build allocates no weights) whose checkpoint weights were then assigned: what remains (the
    seed states, a head the checkpoint lacks) runs the initializers the build kept (their seeds were fixed when
    made: the seed states equal an eager build's, so the losses equal a replicated load's).

    The one adapter over Keras' private variable state (``_value``, ``_deferred_initialize``, the global
    ``uninitialized_variables`` list); no public API initializes one variable.
    """
    ours = {id(v) for v in model.variables}
    for variable in model.variables:
        if getattr(variable, "_value", 0) is None:
            variable._deferred_initialize()
    state = keras_global_state()
    pending = state.get_global_attribute("uninitialized_variables", [])
    state.set_global_attribute("uninitialized_variables", [v for v in pending if id(v) not in ours])


def load_pretrained(model_name_or_path: str, dtype: str, revision: Optional[str] = None,
                    overrides: Optional[Dict[str, Any]] = None, placement=None):
    """The masked LM of a transformers checkpoint (a folder or Hub repo): its config read, the model built and
    filled by its architecture. Replicated: the weights read once, whole (:func:`hf_convert.
    read_transformers_checkpoint`). Under ``--fsdp`` (``placement.strategy``) from ``model.safetensors`` (or its
    shards) each sharded weight is read by the blocks this process's devices hold, straight onto the sharding
    ``placement.put_state`` gives it (:mod:`.sliced_load`; ``put_state`` keeps those arrays), and the model is built
    with its variables uninitialized (``keras.StatelessScope``) until then, so no process holds a whole host copy
    of the weights; the weights kept whole and a ``pytorch_model.bin`` are read whole.

    Args:
        overrides: config attributes set before the model is built (the dropout rates of ``--hidden_dropout_prob``).
        placement: the run's :class:`~hf_tpu_ext.backends.keras.placement.Placement` (None: replicated).

    Returns:
        ``(model, config)``.

    Raises:
        CheckpointError: no architecture for the checkpoint's ``model_type``, or its weights do not fit.
        BackendError: under ``--fsdp``, a weight of 1 MiB or more no dimension lets shard (named).
    """
    if placement is None or placement.strategy is None:
        config, state = read_transformers_checkpoint(model_name_or_path, revision)
    else:
        config, folder = read_transformers_config(model_name_or_path, revision)
    for name, value in (overrides or {}).items():
        setattr(config, name, value)
    if placement is None or placement.strategy is None:
        model = build_masked_lm(config, dtype=dtype)
        architecture_for(config).assign(model, state, config)
        return model, config
    import keras

    with keras.StatelessScope(initialize_variables=False):  # the variables wait for their checkpoint values
        model = build_masked_lm(config, dtype=dtype)
    with sliced_state(folder, fsdp_shardings(model, placement, config)) as (sliced, count):
        architecture_for(config).assign(model, sliced if sliced is not None else
                                        read_weights(folder, str(model_name_or_path)), config)
    initialize_remaining(model)  # the seed states, a head the checkpoint lacks
    if count.weights:
        logger.info("Weights of %s read by slices onto --fsdp %s's shardings: %d sharded weights, %.2f MiB read by "
                    "this process, the largest block %.2f MiB.", model_name_or_path, placement.strategy,
                    count.weights, count.bytes / 2**20, count.largest_block / 2**20)
    return model, config


def count_parameters(model) -> int:
    """Trainable parameters (the tied embedding counted once: it is one variable)."""
    return int(sum(int(np.prod([int(d) for d in v.shape])) for v in model.trainable_variables))
