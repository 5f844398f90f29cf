"""Reading ``hf-tpu train``'s command line and JSON config into the three argument dataclasses.

:class:`transformers.HfArgumentParser` does the parsing, loaded from ``transformers/hf_argparser.py`` without
importing transformers (``--help`` and an argument error import no framework); a JSON config's values are typed
here (argparse never converts defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from typing import List, Optional, Tuple

from hf_tpu_ext.args.checks import check_arguments
from hf_tpu_ext.args.data_arguments import DataTrainingArguments
from hf_tpu_ext.args.defaults import DATA_FILE_EXTENSIONS, SHORT_USAGE
from hf_tpu_ext.args.model_arguments import ModelArguments
from hf_tpu_ext.args.training_arguments import TrainingArguments
from hf_tpu_ext.errors import ArgumentError


def hf_argument_parser_class():
    """:class:`transformers.HfArgumentParser`, without importing the ``transformers`` package when it is not loaded.

    ``import transformers`` imports torch (and its CUDA libraries) whenever torch is installed: 3 s or more
    before ``hf-tpu train --help`` or an argument error could print anything. The parser's module
    (``transformers/hf_argparser.py``) needs only the standard library and PyYAML, so it is loaded from the
    installed package's file on its own; where that fails (a future release importing the package from it),
    the ordinary import is used.

    Returns:
        The ``HfArgumentParser`` class (the installed transformers' code either way).
    """
    if "transformers" not in sys.modules:
        import importlib.util

        name = "hf_tpu_ext._transformers_hf_argparser"
        if name in sys.modules:
            return sys.modules[name].HfArgumentParser
        package = importlib.util.find_spec("transformers")
        for folder in (package.submodule_search_locations or []) if package else []:
            spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "hf_argparser.py"))
            if spec is None or spec.loader is None:
                continue
            module = importlib.util.module_from_spec(spec)
            try:
                sys.modules[name] = module  # dataclass and typing machinery look modules up by name
                spec.loader.exec_module(module)
                return module.HfArgumentParser
            except Exception:  # e.g. a relative import in a newer release: use the package below
                sys.modules.pop(name, None)
    from transformers import HfArgumentParser

    return HfArgumentParser


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each default said once: argparse's ``(default: X)`` is added only where the help text
    does not state the default itself ("default", "Unset: ...") and the default is not ``None`` (an unset
    optional field says nothing more than its help). HfArgumentParser's own formatter adds it to every option."""

    def _get_help_string(self, action):
        text = action.help or ""
        lowered = text.lower()
        # HfArgumentParser's --no_<flag> complement of a True default is a store_false action whose own
        # default (False) is not the field's: stating it would mislead
        if (action.default is None or "default" in lowered or "unset" in lowered
                or isinstance(action, argparse._StoreFalseAction)):
            return text
        return super()._get_help_string(action)


def _field_types(dataclass_types) -> dict:
    """``{field name: (type hint, dataclasses.Field)}`` of the argument dataclasses (string annotations resolved)."""
    import typing

    types = {}
    for dc in dataclass_types:
        hints = typing.get_type_hints(dc)
        for f in fields(dc):
            types[f.name] = (hints[f.name], f)
    return types


def _json_kind(value) -> str:
    """How a JSON value is named in a message: ``10.5 (a number)``, ``'yes' (a string)``."""
    kind = ("a boolean" if isinstance(value, bool) else "a number" if isinstance(value, (int, float))
            else "a string" if isinstance(value, str) else "a list" if isinstance(value, list)
            else "an object" if isinstance(value, dict) else "null")
    return f"{json.dumps(value)} ({kind})"


def check_config_types(data: dict, dataclass_types, source: str) -> dict:
    """Type-check the values of a JSON config before they become parser defaults (which argparse never converts).

    The command line is typed by argparse (``--max_steps 10.5`` is refused there); a JSON config is not, so
    ``"max_steps": 10.5`` would reach the training loop. Each value must have its field's type: ``int`` fields a
    whole number (``10.0`` is taken as 10), ``float`` fields a number, ``bool`` fields true/false, ``str`` fields a
    string, ``List[str]`` a string or a list of strings; ``null`` only for optional fields; ``choices`` respected.
    Exceptions with their own parsing: ``bf16`` (true/false/"auto"), ``resume_from_checkpoint`` (a boolean means
    ``"true"``/unset).

    Args:
        data: the config's object (unknown names already refused).
        dataclass_types: the argument dataclasses.
        source: how the config is named in messages (``"Config file run.json"``).

    Returns:
        ``data`` with whole-number floats as ints and booleans of ``resume_from_checkpoint`` as strings.

    Raises:
        ArgumentError: e.g. ``Config file run.json: "max_steps" must be a whole number, got 10.5 (a number).``
    """
    import typing

    types = _field_types(dataclass_types)
    out = {}
    for name, value in data.items():
        hint, f = types[name]
        args = typing.get_args(hint)
        optional = typing.get_origin(hint) is typing.Union and type(None) in args
        base = next((a for a in args if a is not type(None)), hint) if optional else hint

        def refuse(what, advice=""):
            raise ArgumentError(f"{source}: {json.dumps(name)} must be {what}, got {_json_kind(value)}{advice}.")

        if value is None:
            if not optional:
                refuse(f"given (it has no unset value; drop the field for its default {f.default!r})")
            out[name] = None
            continue
        if name == "resume_from_checkpoint" and isinstance(value, bool):
            out[name] = "true" if value else None
            continue
        if name == "bf16":
            if not isinstance(value, (bool, str)):
                refuse('true, false or "auto"')
            out[name] = value
            continue
        if base is bool:
            if not isinstance(value, bool):
                refuse("true or false (a JSON boolean, without quotes)")
        elif base is int:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                refuse("a whole number")
        elif base is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                refuse("a number")
        elif base is str:
            if not isinstance(value, str):
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                refuse("a string", f"; write it in quotes: {json.dumps(str(value))}" if number else "")
        elif typing.get_origin(base) in (list, List):
            if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
                refuse("a string or a list of strings")
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            refuse(f"one of {', '.join(map(str, choices))}")
        out[name] = value
    return out


def positional_argument_error(token: str) -> str:
    """The message for a positional argument of ``hf-tpu train`` that is not an existing ``.json`` config.

    The only positional argument is a JSON config file (as in transformers' examples). A data file (``.txt``,
    ``.csv``, ..., or a folder) is pointed to ``--train_file``; a missing ``.json``-like name is "no such JSON
    config file", with a close ``*.json`` file of its folder when there is one.
    """
    import difflib

    ext = os.path.splitext(token)[1].lower()
    if ext in DATA_FILE_EXTENSIONS or (os.path.isdir(token) and not token.endswith(".json")):
        return (f"{token} looks like training data, which goes in --train_file: `hf-tpu train --train_file {token} "
                "[--validation_file FILE] ...`. The only positional argument of hf-tpu train is a JSON config file.")
    rule = ("The only positional argument of hf-tpu train is a JSON config file (a name ending in .json, holding "
            "argument names and values); every other argument is a --name value pair.")
    if os.path.isfile(token):
        return f"{token} is not a JSON config file (its name does not end in .json). {rule}"
    folder = os.path.dirname(token) or "."
    try:
        candidates = [n for n in os.listdir(folder) if n.endswith(".json")]
    except OSError:
        candidates = []
    close = difflib.get_close_matches(os.path.basename(token), candidates, n=1, cutoff=0.8)
    hint = f" Did you mean {os.path.join(os.path.dirname(token), close[0])}?" if close else ""
    return f"No such JSON config file: {token}.{hint} {rule}"


def given_field_names(argv: List[str], known) -> set:
    """Field names passed as ``--name``, ``--name=value`` or ``--no_name`` (HfArgumentParser's bool complement)."""
    names = set()
    for token in argv:
        if not token.startswith("--"):
            continue
        name = token[2:].split("=", 1)[0]
        if name not in known and name.startswith("no_") and name[3:] in known:
            name = name[3:]
        if name in known:
            names.add(name)
    return names


def parse_args(argv: Optional[List[str]] = None) -> Tuple[ModelArguments, DataTrainingArguments, TrainingArguments]:
    """Parse ``hf-tpu train`` arguments.

    A single argument ending in ``.json`` is read as a config file holding the fields of the three
    dataclasses (as in transformers' examples); its values are typed by :func:`check_config_types`. The
    returned ``training_args.passed_flags`` (a frozenset of field names) says which fields the command line or
    the config set: a resumed checkpoint decides the ones left at their defaults.

    Raises:
        ArgumentError: an invalid value or combination, with what to change; a positional argument that is not
            an existing ``.json`` file (:func:`positional_argument_error`).
        SystemExit: unknown command-line flags (argparse's own message).
    """
    HfArgumentParser = hf_argument_parser_class()
    argv = list(sys.argv[1:] if argv is None else argv)
    dataclass_types = (ModelArguments, DataTrainingArguments, TrainingArguments)
    parser = HfArgumentParser(dataclass_types, formatter_class=HelpFormatter)
    parser.prog = "hf-tpu train"
    parser.usage = SHORT_USAGE  # argparse errors print this, not every flag
    parser.allow_abbrev = False  # `--num_train_epoch` must not silently mean `--num_train_epochs`
    known = {f.name for dc in dataclass_types for f in fields(dc)}
    given = given_field_names(argv, known)
    if argv and not argv[0].startswith("-") and not (argv[0].endswith(".json") and os.path.isfile(argv[0])):
        raise ArgumentError(positional_argument_error(argv[0]))
    if argv and argv[0].endswith(".json"):
        # a config file, optionally followed by flags that override it
        path = os.path.abspath(argv[0])
        with open(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ArgumentError(f"Config file {argv[0]} is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ArgumentError(f"Config file {argv[0]} must hold a JSON object of argument names and values.")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ArgumentError(f"Config file {argv[0]} has unknown fields: {', '.join(unknown)}."
                                + _suggest(unknown, known))
        # argparse never converts defaults: the JSON values are typed here, before anything runs
        data = check_config_types(data, dataclass_types, f"Config file {argv[0]}")
        parser.set_defaults(**data)
        given |= set(data)
        argv = argv[1:]
    # a passed --save_steps/--eval_steps means the steps strategy unless one is given
    parser.set_defaults(**TrainingArguments.implied_by(given))
    *parsed, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if remaining:
        # the flag names only: `--hub_tokn=hf_...` must not print the token
        flags = [a.split("=", 1)[0] for a in remaining if a.startswith("-")]
        if not flags:  # a stray positional argument (a data file, a misspelt config name)
            raise ArgumentError(positional_argument_error(remaining[0]))
        raise ArgumentError(
            f"Unknown argument(s): {' '.join(flags)}." + _suggest([a.lstrip('-').split('=')[0] for a in flags], known)
            + " Run `hf-tpu train --help` for the list."
        )
    model_args, data_args, training_args = parsed
    training_args.check_user_flags(given)
    check_arguments(model_args, data_args, training_args)
    # which fields the user set (command line or config): a resumed checkpoint decides the others
    training_args.passed_flags = frozenset(given)
    return model_args, data_args, training_args


def _suggest(names, known) -> str:
    import difflib

    hints = []
    for name in names:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        if close:
            hints.append(f"--{close[0]} (for {name})")
    return f" Did you mean: {', '.join(hints)}?" if hints else ""
