"""Tasks: registered ``async def`` functions, and how their jobs are written."""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from asyncq.errors import ArgumentsError, InvalidName, PayloadTooLarge, TaskArgumentsMismatch
from asyncq.retry import Backoff
from asyncq.store import NewJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from asyncq.app import App

P = ParamSpec("P")
R = TypeVar("R")

MAX_NAME_LENGTH = 200


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


_to_json = _json_encoder()


def validate_name(kind: str, value: object) -> str:
    """Queue and task names: non-empty text without control characters."""
    if not isinstance(value, str) or not value:
        raise InvalidName(f"a {kind} name must be a non-empty string, not {value!r}")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidName(f"a {kind} name must be at most {MAX_NAME_LENGTH} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise InvalidName(f"a {kind} name must not contain control characters: {value!r}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class DeferOptions:
    conn: AsyncConnection[Any] | None = None
    queue: str
    priority: int = 0
    delay: float = 0.0
    run_at: datetime | None = None
    unique_key: str | None = None
    max_attempts: int


def _check_options(options: DeferOptions) -> DeferOptions:
    validate_name("queue", options.queue)
    if not isinstance(options.max_attempts, int) or options.max_attempts < 1:
        raise ValueError(f"max_attempts must be an int >= 1, not {options.max_attempts!r}")
    if not isinstance(options.priority, int) or not -(2**31) <= options.priority < 2**31:
        raise ValueError(f"priority must be a 32-bit int, not {options.priority!r}")
    if options.run_at is not None and options.run_at.tzinfo is None:
        raise ValueError("run_at must be an aware datetime (with a tzinfo)")
    if options.unique_key is not None and not isinstance(options.unique_key, str):
        raise ValueError(f"unique_key must be a string, not {options.unique_key!r}")
    if options.unique_key is not None and "\x00" in options.unique_key:
        raise ValueError("unique_key must not contain a NUL character")
    return options


class _ArgsCodec:
    """Binds call arguments to parameter names (JSON object) and back."""

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

    def call(
        self, fn: Callable[..., Coroutine[Any, Any, Any]], stored: Any
    ) -> Coroutine[Any, Any, Any]:
        if not isinstance(stored, dict):
            raise TaskArgumentsMismatch(
                "arguments must be a JSON object keyed by parameter name,"
                f" not {type(stored).__name__}"
            )
        if self.keywords_only:
            # Calling an async def binds its arguments before any of its body runs, so a
            # TypeError here is about the arguments; this skips a second, slower bind.
            try:
                return fn(**stored)
            except TypeError as exc:
                raise TaskArgumentsMismatch(
                    f"arguments do not fit {fn.__qualname__}: {exc}"
                ) from None
        positional: list[Any] = []
        keywords = dict(stored)
        if not self.keywords_only:
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
        return fn(*positional, **keywords)


class Task(Generic[P, R]):
    """A registered task: ``await task.defer(...)`` queues a job, ``await task(...)`` runs it."""

    def __init__(
        self,
        app: App,
        fn: Callable[P, Awaitable[R]],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        priority: int,
        retry: Backoff,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@app.task needs an async def function, not {fn!r}")
        self.app = app
        self.fn = fn
        self.name = validate_name("task", name)
        self.retry = retry
        self.defaults = _check_options(
            DeferOptions(queue=queue, max_attempts=max_attempts, priority=priority)
        )
        self._codec = _ArgsCodec(fn)
        self._deferrer: Deferrer[P] = Deferrer(self, self.defaults)

    @property
    def queue(self) -> str:
        return self.defaults.queue

    @property
    def max_attempts(self) -> int:
        return self.defaults.max_attempts

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        return self.fn(*args, **kwargs)

    async def defer(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Write one job and return its id."""
        # The task's own options name no connection and no unique key: the job goes
        # straight to the writer of the App's pool.
        job = self._deferrer.new_job(self.encode(args, kwargs))
        return await self.app.inserter.insert(job)

    async def defer_many(self, kwargs_list: Iterable[Mapping[str, Any]]) -> list[int]:
        """Write one job per dict of keyword arguments in one round trip; returns their ids."""
        return await self._deferrer.defer_many(kwargs_list)

    def options(
        self,
        *,
        conn: AsyncConnection[Any] | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        unique_key: str | None = None,
        max_attempts: int | None = None,
    ) -> Deferrer[P]:
        """The same task with other options for the jobs it writes."""
        if delay is not None and run_at is not None:
            raise ValueError("give delay or run_at, not both")
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if seconds is not None and (
            not isinstance(seconds, int | float) or not (math.isfinite(seconds) and seconds >= 0)
        ):
            raise ValueError(f"delay must be a finite number of seconds >= 0, not {delay!r}")
        changes: dict[str, Any] = {
            "conn": conn,
            "delay": float(seconds or 0.0),
            "run_at": run_at,
            "unique_key": unique_key,
        }
        if priority is not None:
            changes["priority"] = priority
        if queue is not None:
            changes["queue"] = queue
        if max_attempts is not None:
            changes["max_attempts"] = max_attempts
        return Deferrer(self, _check_options(replace(self.defaults, **changes)))

    def encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The job's ``args`` column: arguments bound to parameter names, as JSON."""
        stored = self._codec.bind(self.name, args, kwargs)
        try:
            text = _to_json(stored)
        except (TypeError, ValueError) as exc:
            raise ArgumentsError(
                f"arguments of {self.name} must be JSON-serialisable: {exc}"
            ) from None
        except RecursionError:
            raise ArgumentsError(
                f"arguments of {self.name} are nested too deeply, or refer to themselves"
            ) from None
        if "\\u0000" in text:
            raise ArgumentsError(f"arguments of {self.name} contain a NUL character")
        cap = self.app.max_args_bytes
        size = len(text) if len(text) * 4 <= cap else len(text.encode("utf-8"))
        if size > cap:
            raise PayloadTooLarge(
                f"arguments of {self.name} are {size} bytes as JSON;"
                f" the cap is {cap} (App(max_args_bytes=...))"
            )
        return text

    def encode_many(self, kwargs_list: Sequence[Mapping[str, Any]]) -> str:
        """The ``args`` of one job per dict of keyword arguments, as one JSON array."""
        stored = [self._codec.bind_keywords(self.name, kwargs) for kwargs in kwargs_list]
        try:
            text = _to_json(stored)
        except (TypeError, ValueError, RecursionError):
            text = ""  # the job at fault is found below
        # Within the cap as a whole, each job is; over it, or with a NUL somewhere, find
        # the job at fault (and its own error) by encoding each alone.
        if not text or len(text) * 4 > self.app.max_args_bytes or "\\u0000" in text:
            for args in stored:
                self.encode((), args)
            if not text:
                raise ArgumentsError(f"arguments of {self.name} are nested too deeply")
        return text

    def call_stored(self, stored_args: Any) -> Coroutine[Any, Any, Any]:
        """The coroutine for stored arguments; `TaskArgumentsMismatch` if they do not fit."""
        return self._codec.call(self.fn, stored_args)


class Deferrer(Generic[P]):
    """A task with fixed options; from `Task.options`."""

    def __init__(self, task: Task[P, Any], options: DeferOptions) -> None:
        self.task = task
        self.opts = options

    async def defer(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Write one job and return its id (or the live job's id for a taken unique_key)."""
        job = self.new_job(self.task.encode(args, kwargs))
        if self.opts.conn is not None:
            return await self.task.app.store.insert_job(
                self.opts.conn, job, unique_key=self.opts.unique_key
            )
        if self.opts.unique_key is None:
            return await self.task.app.inserter.insert(job)
        async with self.task.app.connection() as conn:
            return await self.task.app.store.insert_job(conn, job, unique_key=self.opts.unique_key)

    async def defer_many(self, kwargs_list: Iterable[Mapping[str, Any]]) -> list[int]:
        """Write one job per dict of keyword arguments in one round trip; returns their ids."""
        if self.opts.unique_key is not None:
            raise ValueError("defer_many cannot take a unique_key")
        calls = list(kwargs_list)
        if not calls:
            return []
        jobs = self.new_job(self.task.encode_many(calls))
        async with self.task.app.connection(self.opts.conn) as conn:
            return await self.task.app.store.insert_jobs(conn, jobs)

    def new_job(self, args: str) -> NewJob:
        o = self.opts
        return NewJob(self.task.name, o.queue, args, o.priority, o.run_at, o.delay, o.max_attempts)
