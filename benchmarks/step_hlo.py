"""The Keras backend's compiled training step as optimized HLO text, for before/after guards of a code change.

Builds the small preset's model (:func:`hf_tpu_ext.backends.keras.model.build_masked_lm`: 4 layers x 256, vocab
8000), AdamW and the backend's trainer (:class:`hf_tpu_ext.backends.keras.trainer.JaxTrainer`: its compiled step on
its placed state, as a run has them; ``--steps_per_execution 1``), lowers the step
(:meth:`~hf_tpu_ext.backends.keras.trainer.JaxTrainer.lower_train_step`) and compiles it for this machine and writes
the optimized HLO module's text with its ``metadata={...}``
and the module's source-location tables stripped, so moving code between files is no change. Prints one JSON
line: the text's sha256, its dot count and the dtypes of the dots' results.

Usage (from the repository root, the current-releases venv)::

    python -m benchmarks.step_hlo --out before_f32.hlo          # then again after the change
    python -m benchmarks.step_hlo --bf16 --out before_bf16.hlo
    diff before_f32.hlo after_f32.hlo                            # empty: the same program
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re

#: ``metadata={...}`` of an HLO instruction (no nested braces in it)
METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")
#: ``%name = f32[...]{...} dot(...)``: the result dtype of each dot
DOT = re.compile(r"=\s*(\w+)\[[^\]]*\][^ ]*\s+dot\(")


def step_hlo(batch: int = 32, seq: int = 128, bf16: bool = False) -> str:
    """Optimized HLO text of the jitted train step at ``[batch, seq]`` int32 inputs, metadata stripped."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    import numpy as np
    from transformers import RobertaConfig

    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.placement import Placement
    from hf_tpu_ext.backends.keras.trainer import JaxTrainer
    from hf_tpu_ext.data.masking import default_max_predictions

    config = RobertaConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=1024, max_position_embeddings=seq + 2, type_vocab_size=1)
    model = build_masked_lm(config, dtype="mixed_bfloat16" if bf16 else "float32", seed=42)
    optimizer = keras.optimizers.AdamW(learning_rate=5e-4, weight_decay=0.01)
    optimizer.build(model.trainable_variables)
    on_cpu = jax.default_backend() == "cpu"  # the run's PrecisionPlan routes the dots on an XLA:CPU step only
    # only the step is lowered: no batches, schedule, evaluation, writers or checkpoints are read
    trainer = JaxTrainer(model, optimizer, Placement(), batches=None, schedule=None, evaluate=None,
                         summary_writer=None, checkpoints=None, bf16_dots=on_cpu, seed=42, accumulation=1,
                         steps_per_execution=1)
    p = default_max_predictions(seq)
    host = {"input_ids": np.zeros((1, batch, seq), np.int32), "attention_mask": np.ones((1, batch, seq), np.int32),
            "masked_lm_positions": np.zeros((1, batch, p), np.int32),
            "masked_lm_ids": np.zeros((1, batch, p), np.int32), "masked_lm_weights": np.ones((1, batch, p), np.float32)}
    text = trainer.lower_train_step(host).compile().as_text()
    return strip_debug_info(text)


def strip_debug_info(text: str) -> str:
    """HLO text without source locations: each instruction's ``metadata={...}`` and the module's debug tables
    (``FileNames``, ``FunctionNames``, ``FileLocations``, ``StackFrames``: everything between the ``HloModule`` line
    and the first computation)."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(("%", "ENTRY "))), len(lines))
    kept = lines[:1] + [""] + lines[first:]
    return METADATA.sub("", "\n".join(kept) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="file for the HLO text")
    parser.add_argument("--bf16", action="store_true", help="mixed_bfloat16 (bf16 compute, float32 variables)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args(argv)
    text = step_hlo(args.batch, args.seq, args.bf16)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    dots = collections.Counter(DOT.findall(text))
    print(json.dumps({"sha256": hashlib.sha256(text.encode()).hexdigest(), "dots": sum(dots.values()),
                      "dot_result_dtypes": dict(sorted(dots.items())), "bf16": args.bf16}))


if __name__ == "__main__":
    main()
