"""The engine thread's inbox: new jobs, cancels and calls from any thread, and the
queue's limit.

`put`, `cancel` and `call` (any thread) only append under one lock; the engine thread takes
them at the start of each step (`take`). With nothing to do it waits on that
lock's condition (`wait_for`): it never spins. Requests on the prepare threads, in the inbox
and in the scheduler's waiting queue all hold a place in the queue of `max_queue`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from edgeserve.engine.jobs import AnyJob
from edgeserve.errors import EngineOverloaded, EngineStopped

Call = tuple[Callable[[], Any], Future[Any]]  # a function to run on the engine thread, its future
_NOTHING: tuple[tuple[()], tuple[()], tuple[()]] = ((), (), ())  # what `take` finds most steps


class Inbox:
    """New jobs and cancels on their way to the engine thread (see the module docstring)."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self._jobs: deque[AnyJob] = deque()
        self._cancels: deque[AnyJob] = deque()
        self._calls: deque[Call] = deque()
        self._queued = 0  # jobs in the scheduler's waiting queue
        self._preparing = 0  # requests on the prepare threads
        self._arrived = 0.0  # when a request last began or ended preparing, or was put
        self._accepting = True
        self._running = True
        self._next_id = 0

    # ---- any thread -------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """False once the engine refuses new requests (draining or closed)."""
        return self._accepting

    @property
    def waiting(self) -> int:
        """Requests holding a queue place: being prepared, in the inbox, or queued."""
        with self._cond:
            return self._waiting()

    def _waiting(self) -> int:
        return self._preparing + len(self._jobs) + self._queued

    def _check_room(self) -> None:
        """Under the lock: raise unless a new request may queue."""
        if not self._accepting or not self._running:
            raise EngineStopped("the engine is not accepting requests")
        waiting = self._waiting()
        if waiting >= self.max_queue:
            raise EngineOverloaded(f"{waiting} requests are waiting")

    def begin_prepare(self) -> None:
        """A request goes to a prepare thread, holding a queue place (EngineOverloaded when
        there is none, EngineStopped once closed); `end_prepare` gives it back."""
        with self._cond:
            self._check_room()
            self._preparing += 1
            self._arrive()

    def end_prepare(self, _future: object = None) -> None:
        """A request left its prepare thread (done, failed or cancelled before it ran)."""
        with self._cond:
            self._preparing -= 1
            self._arrive()

    def put(self, job: AnyJob) -> None:
        """Number a new job and hand it to the engine thread (raises when it may not queue)."""
        with self._cond:
            self._check_room()
            self._next_id += 1
            job.rid = self._next_id
            self._jobs.append(job)
            self._arrive()

    def _arrive(self) -> None:
        """Under the lock: a request moved on its way in (for `linger`)."""
        self._arrived = time.monotonic()
        self._cond.notify()

    def cancel(self, job: AnyJob) -> None:
        """Ask the engine thread to end `job` at the start of its next step."""
        with self._cond:
            self._cancels.append(job)
            self._cond.notify()

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn()` on the engine thread at the start of its next step (after that step's
        new jobs are queued): a Future of its result (EngineStopped once the thread ends)."""
        future: Future[Any] = Future()
        with self._cond:
            if not self._running:
                raise EngineStopped("the engine is not running")
            self._calls.append((fn, future))
            self._cond.notify()
        return future

    def stop_accepting(self) -> None:
        """Refuse new requests from now on."""
        with self._cond:
            self._accepting = False

    def stop(self) -> None:
        """Refuse new requests and tell the engine thread to end."""
        with self._cond:
            self._accepting = False
            self._running = False
            self._cond.notify()

    def wake(self, _future: object = None) -> None:
        """Wake the engine thread (a detached sample arrived)."""
        with self._cond:
            self._cond.notify()

    # ---- the engine thread ------------------------------------------------------------------

    def take(self) -> tuple[Sequence[AnyJob], Sequence[AnyJob], Sequence[Call]]:
        """The new jobs (they now count as queued in the scheduler), the cancels, and the
        calls to run on the engine thread, in order: all under one take of the lock."""
        with self._cond:
            if not (self._jobs or self._cancels or self._calls):
                return _NOTHING
            jobs, self._jobs = self._jobs, deque()
            cancels, self._cancels = self._cancels, deque()
            calls, self._calls = self._calls, deque()
            self._queued += len(jobs)
        return jobs, cancels, calls

    def set_queued(self, queued: int) -> None:
        """How many jobs wait in the scheduler's queue after a step."""
        with self._cond:
            self._queued = queued

    def wait_for(
        self,
        work: Callable[[], bool],
        timeout: Callable[[], float | None],
        idle: Callable[[], None],
    ) -> bool:
        """Block until there is something to do (the inbox is not empty, or `work()`): False
        when the thread should end. While waiting, `idle()` runs outside the lock each time
        the wait times out or wakes (`timeout()`: seconds until it is due, None: never)."""
        while True:
            with self._cond:
                if not self._running:
                    return False
                if self._jobs or self._cancels or self._calls or work():
                    return True
                self._cond.wait(timeout())
            idle()

    def linger(self, quiet: float, most: float) -> None:
        """While another request is on its way in (on a prepare thread), wait until requests
        stop arriving, so that a burst reaches the inbox before the first step: until none is
        on a prepare thread and none began or ended preparing or was put for `quiet` seconds,
        and at most `most` seconds (unless the thread is told to end). With none on its way,
        return at once: a lone request is not held."""
        deadline = time.monotonic() + most
        with self._cond:
            if not self._preparing:
                return
            while self._running:
                now = time.monotonic()
                settled = deadline if self._preparing else self._arrived + quiet
                if min(settled, deadline) <= now:
                    return
                self._cond.wait(min(settled, deadline) - now)

    def hold(self, done: Callable[[], bool], deadline: float) -> None:
        """Wait until `done()` (checked at each `wake`), `deadline` (time.monotonic), anything
        in the inbox (a request, a cancel, a call: none is held) or the end of the thread."""
        with self._cond:
            while self._running and not (self._jobs or self._cancels or self._calls or done()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def close(self) -> list[AnyJob]:
        """Stop, and return the jobs still in the inbox (for their owners to be told); calls
        not run yet fail with EngineStopped."""
        with self._cond:
            self._running = False
            leftovers = list(self._jobs)
            self._jobs.clear()
            self._cancels.clear()
            calls, self._calls = self._calls, deque()
            self._queued = 0
        for _, future in calls:
            future.set_exception(EngineStopped("the engine stopped"))
        return leftovers
