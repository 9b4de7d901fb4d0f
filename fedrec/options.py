"""Typed algorithm options: one frozen dataclass per algorithm, parsed from ``--set KEY=VALUE``
or the Python API, with one clear error for an unknown key or a value of the wrong type.

An algorithm declares its options as a subclass of `Options` whose fields carry their types
and defaults (LensKit's component configs, RecBole's per-model defaults), each with a ``#:``
comment above it that says what it does (as Sphinx's autodoc reads attribute comments; `Options.help`
reads them for `fedrec algorithms NAME`). `Options.parse` turns strings and Python values into
those types, and `check` is the one validation helper: it takes ``(bad, message)`` pairs and
raises on the first bad one.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Literal, TypeVar

from fedrec.errors import FedrecError

T = TypeVar("T", bound="Options")
#: the largest float32, the type of every parameter: a rate above it cannot be applied to one
FLOAT32_MAX = 3.4028234663852886e38
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def is_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number (Python's or numpy's), not true/false."""
    import numpy as np

    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def check(*problems: tuple[bool, str]) -> None:
    """Raise a `FedrecError` with the message of the first ``(bad, message)`` pair that is bad."""
    for bad, message in problems:
        if bad:
            raise FedrecError(message)


def typed(cls: type, values: typing.Mapping[str, Any], what: str,
          only: typing.Collection[str] | None = None) -> dict[str, Any]:
    """``values`` converted to the types of dataclass ``cls``'s fields (those in ``only``, if
    given); an unknown key or a value of the wrong type is one `FedrecError` (``what`` names the
    values in it)."""
    hints = typing.get_type_hints(cls)
    if only is not None:
        hints = {k: v for k, v in hints.items() if k in only}
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise FedrecError(f"unknown {what} {', '.join(unknown)}; known: {', '.join(sorted(hints))}")
    return {k: _convert(v, hints[k], k, f" ({what})") for k, v in values.items()}


def internal(default: Any) -> Any:
    """A field of an algorithm's description that the algorithm sets, not the user: its class
    gives the value (FedMF's score function, GPFedRec's method), `Options.for_split` what the
    data decides (the loss). Not parsed, listed or recorded as an option."""
    return field(default=default, metadata={"option": False})


def option_fields(cls: type) -> list[Field[Any]]:
    """The fields of dataclass ``cls`` a user sets (all but `internal` ones), in order."""
    return [f for f in fields(cls) if f.metadata.get("option", True)]


@dataclass(frozen=True)
class Options:
    """Base of every algorithm's options (see the module docstring).

    An algorithm's options class is its model description too where it subclasses the
    description (``class RAPOptions(RAPSpec, Options)``): `for_split` then returns it as the
    run's model, with what the data decides filled in, and no builder copies fields across.
    """

    def for_split(self, split: Any) -> Any:
        """The model description for ``split`` (an algorithm's builder where it has none):
        these options, with what the data decides filled in by a subclass."""
        return self

    def values(self) -> dict[str, Any]:
        """The options as set (`internal` fields left out): what a results file records."""
        return {f.name: getattr(self, f.name) for f in option_fields(type(self))}

    @classmethod
    def parse(cls: type[T], values: typing.Mapping[str, Any], *, algorithm: str = "",
              fixed: typing.Mapping[str, Any] | None = None) -> T:
        """``values`` (strings or Python values) as typed options; ``fixed`` are options the
        algorithm itself sets (a variant such as ``fedrap-no``), which a value may not contradict."""
        hints = typing.get_type_hints(cls)
        known = {f.name for f in option_fields(cls)}
        who = f" of '{algorithm}'" if algorithm else ""
        unknown = sorted(k for k in values if k.replace("-", "_") not in known)
        if unknown:
            raise FedrecError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}{who}; "
                              f"known: {', '.join(sorted(known)) or 'none'}")
        typed = {k.replace("-", "_"): v for k, v in values.items()}
        out = {k: _convert(v, hints[k], k, who) for k, v in typed.items()}
        for k, v in (fixed or {}).items():
            want = _convert(v, hints[k], k, who)
            if k in out and out[k] != want:
                raise FedrecError(f"'{algorithm}' fixes {k}={v}; it cannot be set to {typed[k]!r}")
            out[k] = want
        opts = cls(**out)
        opts.validate()
        return opts

    def validate(self) -> None:
        """Reject impossible values (override with `check`)."""

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Each option's type, for listings and error messages."""
        hints = typing.get_type_hints(cls)
        return {f.name: _type_name(hints[f.name]) for f in option_fields(cls)}

    @classmethod
    def help(cls) -> dict[str, str]:
        """Each option's one-line description: the ``#:`` comment above its field, in this class
        or in the class it inherits the field from ("" where there is none)."""
        found: dict[str, str] = {}
        for klass in cls.__mro__:
            for name, text in _field_comments(klass).items():
                found.setdefault(name, text)
        return {f.name: found.get(f.name, "") for f in option_fields(cls)}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each option's default value."""
        out = {}
        for f in option_fields(cls):
            if f.default is not MISSING:
                out[f.name] = f.default
            elif f.default_factory is not MISSING:
                out[f.name] = f.default_factory()
        return out


_FIELD = re.compile(r"([A-Za-z_]\w*)\s*:")


@functools.cache
def _field_comments(klass: type) -> dict[str, str]:
    """``{field: text}`` of the ``#:`` comment lines right above each field of ``klass``'s own
    body (empty where its source cannot be read)."""
    try:
        lines, _ = inspect.getsourcelines(klass)
    except (OSError, TypeError):
        return {}
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("class "))
    body = [line for line in lines[start + 1:] if line.strip()]
    indent = min((len(line) - len(line.lstrip()) for line in body), default=0)
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in body:
        if len(line) - len(line.lstrip()) != indent:
            continue  # inside a method or a multi-line docstring
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
            continue
        match = _FIELD.match(text)
        if match and pending:
            out[match.group(1)] = " ".join(pending)
        pending = []
    return out


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return f"{_type_name(typing.get_args(tp)[0])}s a/b/c"
    return {bool: "true|false", int: "integer", float: "number", str: "text",
            type(None): "none"}.get(tp, str(tp))


def _convert(value: Any, tp: Any, key: str, who: str) -> Any:
    """``value`` as type ``tp`` (bool, int, float, str, Literal, ``X | None``, ``tuple[X, ...]``)."""
    origin = typing.get_origin(tp)
    try:
        if origin in (typing.Union, types.UnionType):
            args = typing.get_args(tp)
            if value is None or (isinstance(value, str) and value.lower() in ("none", "")):
                if type(None) in args:
                    return None
            for a in args:
                if a is type(None):
                    continue
                try:
                    return _convert(value, a, key, who)
                except FedrecError:
                    continue
            raise ValueError
        if origin is Literal:
            choices = typing.get_args(tp)
            for c in choices:
                if value == c or str(value) == str(c):
                    return c
            raise FedrecError(f"option {key}{who} must be one of {', '.join(map(str, choices))} "
                              f"(got {value!r})")
        if origin is tuple:
            inner = typing.get_args(tp)[0]
            parts = value if isinstance(value, list | tuple) else str(value).replace(",", "/").split("/")
            return tuple(_convert(p, inner, key, who) for p in parts if str(p).strip() != "")
        if tp is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in _TRUE | _FALSE:
                return str(value).lower() in _TRUE
            raise ValueError
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            return str(value)
    except FedrecError:
        raise
    except (TypeError, ValueError) as e:
        raise FedrecError(f"option {key}{who} expects {_type_name(tp)} (got {value!r})") from e
    return value


def parse_named(text: str, flag: str) -> tuple[str, dict[str, str]]:
    """``NAME`` or ``NAME:KEY=VALUE,...`` (a ``--server-opt`` or ``--client-objective``) as the
    name and its settings as strings (`typed` converts them); one `FedrecError` line for a
    setting that is not KEY=VALUE."""
    name, _, rest = text.strip().partition(":")
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise FedrecError(f"{flag} {text!r}: settings are KEY=VALUE, separated by commas")
        values[key.strip()] = value.strip()
    return name.strip(), values
