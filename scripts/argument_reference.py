"""Print the `hf-tpu train` argument reference (Markdown) from the argument dataclasses.

The README's "Argument reference" section is this script's output: `python scripts/argument_reference.py`.
"""

from dataclasses import MISSING, fields

from hf_tpu_ext.args import (DEFAULTS_DIFFERING_FROM_TRANSFORMERS, DataTrainingArguments, ModelArguments,
                             TrainingArguments)


def reference() -> str:
    lines = []
    for dc, title in ((ModelArguments, "Model"), (DataTrainingArguments, "Data"), (TrainingArguments, "Training")):
        lines += [f"#### {title} (`{dc.__name__}`)", "", "| argument | default | meaning |", "|---|---|---|"]
        for f in fields(dc):
            default = f.default if f.default is not MISSING else ""
            text = f.metadata.get("help", "").replace("|", "\\|")
            lines.append(f"| `--{f.name}` | `{default}` | {text} |")
        lines.append("")
    defaults = {f.name: f.default for dc in (ModelArguments, DataTrainingArguments, TrainingArguments) for f in fields(dc)}
    lines += ["#### Defaults that differ from transformers", "",
              "| argument | here | transformers | why |", "|---|---|---|---|"]
    for name, (theirs, why) in DEFAULTS_DIFFERING_FROM_TRANSFORMERS.items():
        ours = {"report_to": "tensorboard"}.get(name, defaults[name])  # report_to: resolved from None
        lines.append(f"| `--{name}` | `{ours}` | `{theirs}` | {why} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference())
