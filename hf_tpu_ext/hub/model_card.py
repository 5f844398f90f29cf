"""Model cards (``README.md``) for trained fill-mask models: the public names, in three modules with one job each.

- render (:mod:`hf_tpu_ext.hub.card_render`): the card of a model folder from the package template
  ``hf_tpu_ext/templates/model_card.md`` and ``training_summary.json`` (else what the folder shows):
  :func:`render_model_card`, :func:`load_summary`, :func:`initialization_fields`, :func:`progress_note`;
- guard and merge (:mod:`hf_tpu_ext.hub.card_guard`): a README.md is never lost. A generated card starts with
  :data:`GENERATED_MARKER` (a checksum of its body), so :func:`write_card` replaces only an unchanged generated
  card and merges the metadata hf-tpu-ext owns into any other (:func:`merge_card`); on the Hub a card is never an
  LFS pointer (:func:`keep_card_out_of_lfs`, called by the pusher's preflight);
- check (:mod:`hf_tpu_ext.hub.card_check`): the metadata offline and with the Hub (:func:`validate_model_card`,
  :func:`validate_card_file`), and the metadata the Hub parsed, read back after the final push
  (:func:`check_card_on_hub`, called by :meth:`hf_tpu_ext.hub.push_session.PushSession.finish`).

:func:`save_model_card` is the three in a row: render, check, write.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Optional

from hf_tpu_ext.hub.card_check import (KNOWN_LICENSES, card_expectations, check_card_metadata,  # noqa: F401
                                       check_card_on_hub, validate_card_file, validate_model_card)
from hf_tpu_ext.hub.card_facts import eval_results_from_logs, framework_versions, strategy_label  # noqa: F401
from hf_tpu_ext.hub.card_guard import (CARD_FILE, CARD_MODES, GENERATED_MARKER, OWNED_METADATA,  # noqa: F401
                                       README_NOT_LFS_LINE, card_origin, keep_card_out_of_lfs, lfs_rule_for,
                                       mark_generated, merge_card, write_card)
from hf_tpu_ext.hub.card_render import (default_template_path, initialization_fields, keras_preset_folder,  # noqa: F401
                                        load_summary, progress_note, render_model_card, weight_formats)


@functools.lru_cache(maxsize=16)
def base_model_license(name_or_path: Optional[str], revision: Optional[str] = None) -> Optional[str]:
    """The ``license`` in the card metadata of the Hub model a run continues (``--model_name_or_path`` a Hub repo
    id: :func:`initialization_fields`), logged once with where it comes from; ``None`` for a local folder, a model
    without one, or a Hub that cannot be asked (the card then names no license)."""
    base = initialization_fields(name_or_path)["base_model"]
    if not base:
        return None
    from huggingface_hub import HfApi, constants

    try:
        data = HfApi(endpoint=constants.ENDPOINT).model_info(base, revision=revision).card_data
        license = (data or {}).get("license") if hasattr(data, "get") else getattr(data, "license", None)
    except Exception:  # noqa: BLE001 (offline, gated, removed: no license is claimed)
        return None
    if isinstance(license, str) and license:
        logging.getLogger("hf_tpu_ext").info("model card license: %s, the license of the base model %s (--license "
                                             "to choose another).", license, base)
        return license
    return None


def save_model_card(output_dir: str, repo_id: Optional[str] = None, summary: Optional[dict] = None, *,
                    validate: bool = False, token: Optional[str] = None, card_mode: str = "merge",
                    **card_fields) -> str:
    """Render the card of ``output_dir`` and write it to ``output_dir/README.md`` (see :func:`write_card`).

    A README.md hf-tpu-ext did not write (or that was edited) keeps its text; the metadata hf-tpu-ext owns is
    merged into it (``card_mode="merge"``).

    Args:
        output_dir, repo_id, summary, **card_fields: see :func:`render_model_card`.
        validate: also run :func:`validate_model_card` before writing.
        token: passed to :func:`validate_model_card`.
        card_mode: ``"merge"``, ``"overwrite"`` or ``"keep"`` (see :func:`write_card`).

    Returns:
        The path of the written README.md.

    Raises:
        ModelCardError: ``validate`` is set and the card does not validate (nothing is written).
    """
    card = render_model_card(output_dir, repo_id=repo_id, summary=summary, **card_fields)
    if validate:
        validate_model_card(card, token=token)
    write_card(output_dir, card, mode=card_mode,
               explicit=tuple(k for k in ("license", "language") if card_fields.get(k) is not None))
    return os.path.join(output_dir, "README.md")
