"""Job arguments: bound to parameter names, encoded as JSON for the ``args`` column, and
decoded and fitted to the function again when the job runs; and tasks' results, encoded
for the ``result`` column by the same rules. Pure: no I/O.

What can be stored: JSON values, without NaN or infinities, NUL characters or lone
surrogates (PostgreSQL's text holds neither), within a size cap.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from itertools import chain
from typing import Any

from asyncq.errors import (
    ArgumentsError,
    InvalidName,
    PayloadTooLarge,
    TaskArgumentsMismatch,
    UndecodableArguments,
)

MAX_NAME_LENGTH = 200
MAX_RESULT_BYTES = 1024 * 1024  # a task's result, as JSON, larger than this is not stored

# A NUL in JSON text is the escape \u0000 whose backslash is not itself escaped.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _unserialisable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json_encoder() -> Callable[[Any], str]:
    """Compact UTF-8 JSON without NaN. json's own API builds its C encoder anew on each
    call, which is most of the cost for a job's few arguments: this one is built once.
    Without the circular-reference check, a cycle ends in RecursionError instead."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return encoder.encode
    encode = make(
        None, _unserialisable, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    return lambda value: "".join(encode(value, 0))


to_json = _json_encoder()


def validate_name(kind: str, value: object) -> str:
    """Queue and task names: non-empty text without control characters."""
    if not isinstance(value, str) or not value:
        raise InvalidName(f"a {kind} name must be a non-empty string, not {value!r}")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidName(f"a {kind} name must be at most {MAX_NAME_LENGTH} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise InvalidName(f"a {kind} name must not contain control characters: {value!r}")
    if not value.isascii() and not is_text(value):
        raise InvalidName(f"a {kind} name must not contain a lone surrogate: {value!r}")
    return value


def storable(text: str, what: str) -> int:
    """The UTF-8 size of ``text``; `ArgumentsError` if it holds a lone surrogate."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ArgumentsError(
            f"{what} contain a lone surrogate (a code point in U+D800-U+DFFF that is not"
            " half of a pair): it is not text PostgreSQL can store"
        ) from None


def encode(task_name: str, stored: Any, max_bytes: int) -> str:
    """``stored`` (arguments by name, or a list of them) as JSON text that PostgreSQL can
    store; `ArgumentsError` (a TypeError) or `PayloadTooLarge` if it cannot be."""
    what = f"arguments of {task_name}"
    return _storable_json(stored, what, max_bytes, "App(max_args_bytes=...)", plural=True)


def encode_result(task_name: str, result: Any, max_bytes: int = MAX_RESULT_BYTES) -> str:
    """What a task returned as JSON text that PostgreSQL can store, by the rules of
    arguments; `ArgumentsError` or `PayloadTooLarge` says why it cannot be."""
    return _storable_json(result, f"the result of {task_name}", max_bytes, "the cap of results")


def encode_json(value: Any, what: str, max_bytes: int, cap: str) -> str:
    """``value`` (``what``, as an error names it) as JSON text that PostgreSQL can store,
    within ``max_bytes`` (``cap`` names the limit)."""
    return _storable_json(value, what, max_bytes, cap)


def _storable_json(value: Any, what: str, max_bytes: int, cap: str, *, plural: bool = False) -> str:
    if plural:
        are, contain, refer = "are", "contain", "refer to themselves"
    else:
        are, contain, refer = "is", "contains", "refers to itself"
    try:
        text = to_json(value)
    except (TypeError, ValueError) as exc:
        raise ArgumentsError(f"{what} must be JSON-serialisable: {exc}") from None
    except RecursionError:
        raise ArgumentsError(f"{what} {are} nested too deeply, or {refer}") from None
    if "\\u0000" in text and _NUL.search(text):
        raise ArgumentsError(f"{what} {contain} a NUL character")
    size = len(text) if text.isascii() else storable(text, what)
    if size > max_bytes:
        raise PayloadTooLarge(f"{what} {are} {size} bytes as JSON; the cap is {max_bytes} ({cap})")
    return text


def encode_many(task_name: str, stored: Sequence[Any], max_bytes: int) -> str:
    """The arguments of many jobs as one JSON array; each job's must be storable alone."""
    try:
        text = to_json(stored)
    except (TypeError, ValueError, RecursionError):
        text = ""  # the job at fault is found below
    # Within the cap as a whole, each job is; over it, or with a NUL or a surrogate
    # somewhere, find the job at fault (and its own error) by encoding each alone.
    if (
        not text
        or len(text) * 4 > max_bytes
        or ("\\u0000" in text and _NUL.search(text))
        or not (text.isascii() or is_text(text))
    ):
        for args in stored:
            encode(task_name, args, max_bytes)
        if not text:
            raise ArgumentsError(f"arguments of {task_name} are nested too deeply")
    return text


def is_text(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_DECODER = json.JSONDecoder()
# The decoder's scanner, called without raw_decode's Python frame around it.
_SCAN: Callable[[str, int], tuple[Any, int]] = vars(_DECODER)["scan_once"]


def decode(text: str) -> Any:
    """The arguments stored as ``text``; `UndecodableArguments` says why they cannot be read."""
    try:
        # PostgreSQL writes jsonb as text without surrounding white space: the decoder's
        # own scan for it (two regular expressions a call) is skipped when there is none.
        try:
            value, end = _SCAN(text, 0)
            if end == len(text):
                return value
        except (StopIteration, ValueError):
            pass
        return json.loads(text)  # or says why not
    except RecursionError:
        raise UndecodableArguments(
            "the stored arguments cannot be decoded: they are nested too deeply for Python's json"
        ) from None
    except ValueError as exc:  # a number too long for int(), say
        raise UndecodableArguments(f"the stored arguments cannot be decoded: {exc}") from None


class ArgsCodec:
    """Binds a call's arguments to parameter names (a JSON object) and back."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.signature = inspect.signature(fn)
        self.params = self.signature.parameters
        kinds = {p.kind for p in self.params.values()}
        self.keywords_only = not kinds & {
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.VAR_POSITIONAL,
        }
        # Parameters that are all plain names (no /, *args or **kwargs) bind by a set check.
        self.plain = kinds <= {
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        }
        self.positional = [
            p.name
            for p in self.params.values()
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        ]
        self.names = frozenset(self.params)
        self.required = frozenset(
            p.name for p in self.params.values() if p.default is inspect.Parameter.empty
        )

    def bind(self, task_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments by parameter name; ``kwargs`` (the call's own dict) may be
        returned as it is."""
        if self.plain and len(args) <= len(self.positional):
            if args:
                fast = dict(zip(self.positional, args, strict=False))
                clash = fast.keys() & kwargs.keys()
                fast.update(kwargs)
            else:
                fast, clash = kwargs, None
            keys = fast.keys()
            if not clash and keys >= self.required and keys <= self.names:
                return fast
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{task_name}: {exc}") from None
        stored: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if self.params[name].kind is inspect.Parameter.VAR_KEYWORD:
                clash = stored.keys() & value.keys()
                if clash:
                    raise TypeError(f"{task_name}: ambiguous argument names {sorted(clash)}")
                stored.update(value)
            else:
                stored[name] = value
        return stored

    def bind_keywords(self, task_name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """`bind` for a call by keyword; the dict given may be returned as it is."""
        if self.plain and type(kwargs) is dict and self.required <= kwargs.keys() <= self.names:
            return kwargs
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"{task_name}: expected a mapping of keyword arguments, not {kwargs!r}")
        return self.bind(task_name, (), dict(kwargs))

    def bind_many(self, task_name: str, kwargs_list: Sequence[Mapping[str, Any]]) -> list[Any]:
        if self.plain and set(map(type, kwargs_list)) == {dict}:
            # Every call a dict that fits as it is: checked a list at a time, in C (a
            # call of bind_keywords per job costs more than encoding its arguments).
            required = self.required
            if self.names.issuperset(chain.from_iterable(kwargs_list)) and (
                not required or all(map(required.issubset, kwargs_list))
            ):
                return list(kwargs_list)
        return [self.bind_keywords(task_name, kwargs) for kwargs in kwargs_list]

    def call(
        self, fn: Callable[..., Coroutine[Any, Any, Any]], stored: Any
    ) -> Coroutine[Any, Any, Any]:
        """``fn`` called with ``stored`` arguments; `TaskArgumentsMismatch` if they do not fit."""
        if self.keywords_only and isinstance(stored, dict):
            # Calling an async def binds its arguments before any of its body runs, so a
            # TypeError here is about the arguments; this skips a second, slower bind.
            try:
                return fn(**stored)
            except TypeError as exc:
                raise TaskArgumentsMismatch(
                    f"arguments do not fit {fn.__qualname__}: {exc}"
                ) from None
        positional, keywords = self.arguments(fn, stored)
        return fn(*positional, **keywords)

    def arguments(self, fn: Callable[..., Any], stored: Any) -> tuple[list[Any], dict[str, Any]]:
        """The positional and keyword arguments of a call of ``fn`` with ``stored``
        arguments, bound (nothing of ``fn`` runs); `TaskArgumentsMismatch` if they do not fit."""
        if not isinstance(stored, dict):
            raise TaskArgumentsMismatch(
                "arguments must be a JSON object keyed by parameter name,"
                f" not {type(stored).__name__}"
            )
        positional: list[Any] = []
        keywords = dict(stored)
        # Parameters before *args must be passed by position, in order and without a gap.
        gap = False
        for param in self.params.values():
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                extra = keywords.pop(param.name, [])
                if not isinstance(extra, list):
                    raise TaskArgumentsMismatch(f"*{param.name} must be stored as a JSON array")
                if extra and gap:
                    raise TaskArgumentsMismatch(
                        f"*{param.name} is given but an earlier positional argument is not"
                    )
                positional.extend(extra)
            elif param.kind in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                if gap or param.name not in keywords:
                    gap = True
                else:
                    positional.append(keywords.pop(param.name))
        try:
            self.signature.bind(*positional, **keywords)
        except TypeError as exc:
            raise TaskArgumentsMismatch(f"arguments do not fit {fn.__qualname__}: {exc}") from None
        return positional, keywords
