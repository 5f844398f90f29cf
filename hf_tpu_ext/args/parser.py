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
    ``"true"``/unset), ``fsdp`` (also a list of options or a boolean) and ``fsdp_config`` (also an object).

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
        if name in ("fsdp", "fsdp_config") and isinstance(value, (list, dict, bool)):
            out[name] = value  # transformers' JSON forms: a list of options, an object (read by args/fsdp.py)
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


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def negative_numbers_joined(argv: List[str]) -> List[str]:
    """``--flag -1e-3`` as ``--flag=-1e-3``: argparse takes a value like ``-1e-3`` (its negative-number pattern has
    no exponent) for an option and says "expected one argument"; joined, the value reaches the range checks."""
    out: List[str] = []
    for token in argv:
        if (token.startswith("-") and _is_number(token) and out and out[-1].startswith("--")
                and "=" not in out[-1]):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


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
    argv = negative_numbers_joined(argv)
    given = given_field_names(argv, known)
    if argv and not argv[0].startswith("-") and not (argv[0].endswith(".json") and os.path.isfile(argv[0])):
        raise ArgumentError(positional_argument_error(argv[0]))
    config, file_only, unused = None, set(), []
    if argv and argv[0].endswith(".json"):
        # a config file, optionally followed by flags that override it
        config = argv[0]
        data = read_config(config, dataclass_types, known)
        unused = unused_hub_fields(data, argv[1:], given)
        for name in unused:
            del data[name]
        parser.set_defaults(**data)
        file_only = set(data) - given
        given |= set(data)
        argv = argv[1:]
    # a passed --save_steps/--eval_steps means the steps strategy unless one is given
    parser.set_defaults(**TrainingArguments.implied_by(given))
    try:
        model_args, data_args, training_args = _parse_and_check(parser, argv, known, given, config, file_only)
    except ArgumentError as err:
        raise ArgumentError(name_the_config(str(err), config, file_only)) from None
    if config and unused:
        training_args.config_note = (f"{config}: {', '.join(unused)} unused (--push_to_hub false: nothing is "
                                     "pushed).")
    # which fields the user set (command line or config): a resumed checkpoint decides the others
    training_args.passed_flags = frozenset(given)
    return model_args, data_args, training_args


def _parse_and_check(parser, argv, known, given, config, file_only):
    """The three dataclasses of ``argv`` (config values already the parser's defaults), checked."""
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
    training_args.check_user_flags(given, config_fields=(config, file_only) if config else None)
    model_args.check_user_flags(given)
    check_arguments(model_args, data_args, training_args)
    return model_args, data_args, training_args


def read_config(path: str, dataclass_types, known) -> dict:
    """The typed fields of the JSON config ``path`` (:func:`check_config_types`).

    Raises:
        ArgumentError: not JSON, not an object, an unknown field, a value of the wrong type (each naming ``path``).
    """
    with open(os.path.abspath(path)) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ArgumentError(f"Config file {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ArgumentError(f"Config file {path} must hold a JSON object of argument names and values.")
    unknown = sorted(set(data) - known)
    if unknown:
        raise ArgumentError(f"Config file {path} has unknown fields: {', '.join(unknown)}." + _suggest(unknown, known))
    # argparse never converts defaults: the JSON values are typed here, before anything runs
    return check_config_types(data, dataclass_types, f"Config file {path}")


_FALSE = ("false", "no", "n", "f", "0")


def _command_line_push(argv: List[str]) -> Optional[bool]:
    """``--push_to_hub`` as the command line ``argv`` gives it (HfArgumentParser's bool forms: ``--push_to_hub``,
    ``--push_to_hub false``, ``--push_to_hub=false``; its false spellings :data:`_FALSE`); ``None`` when not given."""
    value = None
    for i, token in enumerate(argv):
        if token == "--push_to_hub":
            following = argv[i + 1] if i + 1 < len(argv) else ""
            value = not (following.lower() in _FALSE) if following and not following.startswith("-") else True
        elif token.startswith("--push_to_hub="):
            value = token.split("=", 1)[1].lower() not in _FALSE
    return value


def unused_hub_fields(data: dict, argv: List[str], given_on_command_line: set) -> List[str]:
    """The ``hub_*`` fields of a JSON config (``data``) that a run with ``--push_to_hub false`` (the command line's,
    else the file's own ``push_to_hub: false``) leaves unused, sorted; the command line's own hub flags are not
    among them (:meth:`TrainingArguments.check_user_flags` refuses those)."""
    push = _command_line_push(argv)
    if push is None:
        push = data.get("push_to_hub")
    if push is not False:
        return []
    return sorted(n for n in data if n.startswith("hub_") and n not in given_on_command_line)


def name_the_config(message: str, config: Optional[str], file_only: set) -> str:
    """``message`` with the config file named after it when a ``--flag`` it names was set only there."""
    import re

    named = [n for n in dict.fromkeys(re.findall(r"--(\w+)", message)) if n in file_only]
    if not config or not named or config in message:
        return message
    return f"{message} ({', '.join('--' + n for n in named)}: set in {config})"


def _suggest(names, known) -> str:
    import difflib

    hints = []
    for name in names:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        if close:
            hints.append(f"--{close[0]} (for {name})")
    return f" Did you mean: {', '.join(hints)}?" if hints else ""
