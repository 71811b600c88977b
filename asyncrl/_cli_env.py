"""``ASYNCRL_*`` environment variables as defaults for every ``asyncrl`` command-line option.

One rule for every option of every command: ``--peer-timeout`` is read from
``ASYNCRL_PEER_TIMEOUT`` (``ASYNCRL_`` + the long option, upper case, ``-`` as
``_``). A container or a systemd unit then configures ``asyncrl worker`` with
its environment alone. The command line wins over the variable, the variable
over the built-in default. An option with the same name means the same thing
in every command (``--connect``, ``--keys``, ``--peer-timeout``), so one
variable serves them all.

Values are read as the option reads its argument (its type and choices), and a
bad one is a usage error that names the variable (raised by
:func:`check_environment` once the command is known: a bad variable of another
command does not stop this one). Flags (``--reconnect``) take
``1/true/yes/on`` or ``0/false/no/off`` (or empty); options given several
times on the command line (``action="append"``) take a comma-separated list (values
given on the command line are added to it).
Positional arguments have no variable.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

PREFIX = "ASYNCRL_"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _action_class(**kwargs: Any) -> type[argparse.Action]:
    """The class argparse makes for ``add_argument(**kwargs)``.

    argparse's action classes are private (``_StoreTrueAction``...); the action
    that ``add_argument`` returns is not, so its type names the kind publicly.
    """
    return type(argparse.ArgumentParser(add_help=False).add_argument("--x", **kwargs))


_STORE_TRUE = _action_class(action="store_true")
_STORE_FALSE = _action_class(action="store_false")
_APPEND = _action_class(action="append")
_SUBCOMMANDS = type(argparse.ArgumentParser().add_subparsers())
#: Options that are not settings: asking for help or the version.
_SKIPPED = (_action_class(action="help"), _action_class(action="version", version=""))


def variable_name(option: str) -> str:
    """``--peer-timeout`` -> ``ASYNCRL_PEER_TIMEOUT``."""
    return PREFIX + option.lstrip("-").upper().replace("-", "_")


def option_variables(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every variable ``parser`` reads (its own options, not its subcommands')."""
    return {variable_name(_long_option(action)): action for action in _settings(parser)}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``parser``'s commands by name (``"worker"``, ``"keys generate"``), nested ones too."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in _actions(parser):
        if isinstance(action, _SUBCOMMANDS):
            for name, sub in action.choices.items():
                found[name] = sub
                found.update({f"{name} {k}": v for k, v in subparsers(sub).items()})
    return found


def apply_environment(parser: argparse.ArgumentParser,
                      environ: Mapping[str, str] | None) -> None:
    """Show each option's variable in its help; with ``environ``, take defaults from it.

    ``environ`` None only documents the variables (a parser built to be inspected).
    """
    for sub in (parser, *subparsers(parser).values()):
        for action in _settings(sub):
            name = variable_name(_long_option(action))
            action.help = f"{action.help or ''} [env: {name}]".strip()
            if environ is not None and name in environ:
                try:
                    action.default = _convert(action, name, environ[name])
                except ValueError as exc:
                    action.default = InvalidVariable(str(exc))
                action.required = False  # given by the environment


class InvalidVariable:
    """The default of an option whose variable does not parse: the error, for later."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"<invalid: {self.message}>"


def check_environment(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2) naming the variable, if an option of this command took a bad one."""
    for value in vars(args).values():
        if isinstance(value, InvalidVariable):
            parser.error(value.message)


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every option and subcommand of ``parser``: the one place read from argparse's privates
    (it has no public list of what ``add_argument`` added)."""
    return parser._actions


def _settings(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in _actions(parser)
            if a.option_strings and not isinstance(a, _SKIPPED) and _has_long(a)]


def with_long_option(parser: argparse.ArgumentParser, option: str) -> argparse.Action | None:
    """``parser``'s own action for the long ``option`` (``"--connect"``), or None."""
    return next((a for a in _settings(parser) if _long_option(a) == option), None)


def _has_long(action: argparse.Action) -> bool:
    return any(o.startswith("--") for o in action.option_strings)


def _long_option(action: argparse.Action) -> str:
    return next(o for o in action.option_strings if o.startswith("--"))


def _convert(action: argparse.Action, name: str, text: str) -> Any:
    """The option's value from the variable's text; ValueError naming the variable."""
    if isinstance(action, (_STORE_TRUE, _STORE_FALSE)):
        word = text.strip().lower()
        if word not in _TRUE + _FALSE:
            raise ValueError(f"environment variable {name}={text!r}: expected one of "
                             f"{', '.join(_TRUE)} or {', '.join(f for f in _FALSE if f)} "
                             "(or empty)")
        given = word in _TRUE
        return given if isinstance(action, _STORE_TRUE) else not given
    if isinstance(action, _APPEND):
        return [_one_value(action, name, part.strip())
                for part in text.split(",") if part.strip()]
    return _one_value(action, name, text)


def _one_value(action: argparse.Action, name: str, text: str) -> Any:
    convert = action.type if callable(action.type) else str
    try:
        value = convert(text)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        kind = getattr(convert, "__name__", "value")
        raise ValueError(f"environment variable {name}={text!r}: not a valid {kind} for "
                         f"{_long_option(action)} ({exc})") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ValueError(f"environment variable {name}={text!r}: {_long_option(action)} "
                         f"takes one of {choices}")
    return value


__all__ = ["PREFIX", "InvalidVariable", "apply_environment", "check_environment",
           "option_variables", "subparsers", "variable_name", "with_long_option"]
