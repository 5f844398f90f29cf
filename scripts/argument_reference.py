"""Print the `hf-tpu train` argument reference (Markdown) from the argument dataclasses.

The README's "Argument reference" section is this script's output: `python scripts/argument_reference.py`.
"""

from dataclasses import MISSING, fields

from hf_tpu_ext.args import DataTrainingArguments, ModelArguments, TrainingArguments


def reference() -> str:
    lines = []
    for dc, title in ((ModelArguments, "Model"), (DataTrainingArguments, "Data"), (TrainingArguments, "Training")):
        lines += [f"#### {title} (`{dc.__name__}`)", "", "| argument | default | meaning |", "|---|---|---|"]
        for f in fields(dc):
            default = f.default if f.default is not MISSING else ""
            text = f.metadata.get("help", "").replace("|", "\\|")
            lines.append(f"| `--{f.name}` | `{default}` | {text} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference())
