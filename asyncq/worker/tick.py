"""The tick: a timer that wakes the worker's event loop every `PERIOD` (on uvloop, just
after each millisecond) while short attempts run, so that their own timers
(``asyncio.sleep``, a timeout) fire close to when they fall due.

Why: an event loop waits for its next timer with a timeout in whole milliseconds,
counted from a clock it read at the start of its turn (uvloop keeps that clock in whole
milliseconds too). So a timer fires late by the rest of its millisecond and by whatever
the loop ran since it last read the clock; the busier the loop, the later. A task that
sleeps 5 ms holds its slot a few percent longer than it asked for, for nothing. Woken
every `PERIOD`, the loop reads its clock again and runs what has fallen due.

Only while attempts run, and only while they are short (`SHORT`, on average): a wake-up
costs the process 10-40 µs of CPU (more when the loop had nothing else to do), so the
ticks take a few percent of a core, worth it only while the lateness is a share of each
job. An attempt that starts on the loop arms it (not one of a plain ``def`` task: it
runs in a thread); the first tick that finds no attempt running, or attempts no longer
short, disarms it. Only timers gain: a job that waits on a socket is woken by the
socket, tick or not.

On uvloop, whose timers fall due on the millisecond of the system's monotonic clock, the
tick comes `AFTER` each millisecond, every millisecond: a timer runs as soon as it is
due, with half the wake-ups. (Not where libuv reads the kernel's coarse clock instead,
which steps at the kernel's own ticks, out of step with the millisecond: there, and on
asyncio's loop, whose timers fall due at any moment, the tick comes every `PERIOD`.)

A Linux ``timerfd``, read on the loop (``loop.add_reader``). Where there is none (not
Linux, or a loop without ``add_reader``), there is no tick, and timers are as late as
their loop makes them.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import sys
import time

from asyncq.worker.slots import Slots

PERIOD = 0.0005  # seconds between ticks while armed
MILLISECOND = 0.001  # the same on a loop whose timers fall due on the millisecond
AFTER = 0.00002  # seconds after the millisecond: the loop's clock has reached it by then
SHORT = 0.02  # attempts this long on average, or longer, are not ticked for
_CLOCK_MONOTONIC = 1  # the clock of time.monotonic() and of libuv's
_CLOCK_MONOTONIC_COARSE = 6
_TFD_TIMER_ABSTIME = 1
_MILLISECOND_NS = round(MILLISECOND * 1e9)
_AFTER_NS = round(AFTER * 1e9)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library's symbols, as the interpreter has them (no search for the file:
    ``ctypes.util.find_library`` runs a process), if it has ``timerfd_create``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "timerfd_create") else None


def _timespec(nanoseconds: int) -> _Timespec:
    return _Timespec(*divmod(nanoseconds, 1_000_000_000))


def _spec(seconds: float) -> _Itimerspec:
    every = _timespec(round(seconds * 1e9))
    return _Itimerspec(every, every)


def _on_the_millisecond(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop``'s timers fall due on the millisecond of CLOCK_MONOTONIC: uvloop's,
    unless libuv reads CLOCK_MONOTONIC_COARSE (it does where that steps at least every
    millisecond)."""
    if type(loop).__module__.partition(".")[0] != "uvloop":
        return False
    try:
        return time.clock_getres(_CLOCK_MONOTONIC_COARSE) > 0.001
    except OSError:  # no coarse clock: libuv reads CLOCK_MONOTONIC
        return True


class Tick:
    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.resting = False  # made and disarmed: the next short attempt arms it
        self._fd: int | None = None
        self._libc: ctypes.CDLL | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._armed = _spec(PERIOD)
        self._disarmed = _spec(0.0)
        self._every_millisecond = _Timespec(0, _MILLISECOND_NS)
        self._on_the_millisecond = False

    def start(self) -> None:
        """Make the timer, disarmed, on the running loop; nothing where it cannot be."""
        libc = _libc()
        if libc is None:
            return
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return
        loop = asyncio.get_running_loop()
        try:
            loop.add_reader(fd, self._ticked)
        except NotImplementedError:
            os.close(fd)
            return
        self._fd, self._libc, self._loop = fd, libc, loop
        self._on_the_millisecond = _on_the_millisecond(loop)
        self.resting = True

    def arm(self) -> None:
        """An attempt starts: tick while attempts run, if they are short."""
        average = self.slots.average
        if average is None or average < SHORT:
            if self._on_the_millisecond:
                first = (time.monotonic_ns() // _MILLISECOND_NS + 1) * _MILLISECOND_NS + _AFTER_NS
                spec = _Itimerspec(self._every_millisecond, _timespec(first))
                self._set(spec, _TFD_TIMER_ABSTIME)
            else:
                self._set(self._armed)
            self.resting = False

    def _ticked(self) -> None:
        assert self._fd is not None
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        average = self.slots.average
        if not self.slots.used or (average is not None and average >= SHORT):
            self._set(self._disarmed)
            self.resting = True

    def _set(self, spec: _Itimerspec, flags: int = 0) -> None:
        assert self._libc is not None
        if self._libc.timerfd_settime(self._fd, flags, ctypes.byref(spec), None) < 0:
            self.close()  # not to be: the timers go back to their loop's own precision

    def close(self) -> None:
        fd = self._fd
        if fd is None:
            return
        self._fd = None
        self.resting = False
        assert self._loop is not None
        self._loop.remove_reader(fd)
        os.close(fd)
