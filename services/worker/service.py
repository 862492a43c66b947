"""The worker service: the process on an instance that runs job attempts and reports them.

HTTP on ``127.0.0.1:{port}`` (the scheduler dispatches and cancels; ingest reads logs):

* ``POST /api/v1alpha/jobs`` with ``{batch_id, job_id, attempt_id, user, spec?, cores_mcpu,
  resources?}`` starts the attempt in the background and answers 200 at once. It is idempotent
  by (batch_id, job_id, attempt_id) (invariant 7): a repeated delivery of a running or finished
  attempt is 200 ``{"attempt": "running" | "finished"}`` and starts nothing. 409 when the free
  cores do not cover ``cores_mcpu``, 400 for a malformed body (an inline ``spec`` included),
  503 while shutting down. Without ``spec`` (how the scheduler dispatches), the attempt reads it
  from the :class:`SpecStore` after its MJS. A spec that is not there, or that is there but
  malformed, ends the attempt in an MJC ``Error`` saying so, not in a 400: ingest stored and
  validated the spec before the job existed, so a dispatch again would fail the same way.
* ``DELETE /api/v1alpha/jobs/{batch_id}/{job_id}/{attempt_id}`` cancels the attempt: its process
  group is killed and its MJC says ``Cancelled``. 200 for a known (or finished) attempt, else 404.
* ``GET /api/v1alpha/jobs/{batch_id}/{job_id}/{attempt_id}/log/{container}``: the log's bytes
  from the :class:`LogStore` (404 if none), also while the job runs.
* ``GET /healthcheck``: 200 with the instance name and free cores.

Events: ``InstanceActivated`` once the server listens; per attempt ``JobStarted`` (MJS) once it
has run ``start_report_ms`` and ``JobCompleted`` (MJC) with the status document (:mod:`status`)
after it ends (an attempt that ends sooner has no MJS: its MJC carries the start); every
``heartbeat_s`` one ``AttemptHeartbeat`` per running attempt (billing rollup). MJS and MJC go
through the :class:`~services.worker.outbox.Outbox`, which publishes what gathers within
``linger_ms`` together, the MJCs of one batch as one ``JobsCompleted``; they are published
until the log takes them (retryable :class:`LogError`s are retried with
backoff), so a broker hiccup never loses a completion; a duplicate is harmless because consumers
are idempotent by attempt. A lost heartbeat is not retried: the next one supersedes it. Only the
main container runs: a spec with input or output files ends in ``Error`` (not supported yet).

Shutdown (leaving the context, idempotent) refuses new jobs, kills running attempts *without*
reporting them, lets attempts that already ended finish reporting (up to
``shutdown_report_s``), then stops the server and the publisher. An attempt killed because its
worker went away was not cancelled by anyone: an MJC ``Cancelled`` would end the job for good,
whereas the scheduler must see it as lost and run a new attempt. Only a DELETE yields an MJC
``Cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Self

import msgspec
from aiohttp import web

from schemas.base import AttemptResource
from schemas.events import AnyEvent
from schemas.execution import AttemptHeartbeat, JobStarted
from schemas.infra import InstanceActivated
from services.common.log import LogError, Publisher
from services.common.metrics import metrics_handler
from services.common.settings import LogSettings
from services.common.specstore import SpecStore
from services.common.storage import open_log_store, open_spec_store
from services.worker import metrics as worker_metrics
from services.worker.logstore import LogStore, LogWriter, valid_name
from services.worker.outbox import Outbox
from services.worker.runtime import (
    ContainerRuntime,
    FileLogSink,
    LocalProcessRuntime,
    Outcome,
    RunRequest,
    request_from_spec,
    time_ms,
)
from services.worker.status import attempt_completed

log = logging.getLogger(__name__)

MAX_RETRY_S = 60.0
FINISHED_MEMORY = 10_000  # finished attempts remembered for idempotence (most recent first out)
JOB_PATH = "/api/v1alpha/jobs/{batch_id}/{job_id}/{attempt_id}"
# The shortest time between two sweeps of the MJS due (an MJS goes out at most this early).
_START_SWEEP_S = 0.05
# A working directory freed this recently is reused without making it again (see Worker).
FRESH_WORKDIR_S = 60.0


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """One worker process: its identity, capacity and timings."""

    instance_name: str
    port: int
    cores_mcpu: int
    log_dir: str
    # The spec store's root, for dispatches without a spec (the shared HS_SPEC_DIR).
    spec_dir: str = "var/specs"
    heartbeat_s: float = 60.0
    # First delay between attempts to publish an MJS/MJC; it doubles up to MAX_RETRY_S.
    report_retry_s: float = 1.0
    shutdown_report_s: float = 10.0
    region: str | None = None
    # Where attempts get their working directories (None: the system's temporary directory).
    scratch_dir: str | None = None
    # The interface to listen on and the host announced in InstanceActivated: a worker on a
    # cloud VM listens on 0.0.0.0 and announces the VM's internal IP (drivers/cloud.py).
    host: str = "127.0.0.1"
    advertise_host: str | None = None  # None: ``host``
    # How long MJS/MJC wait in the outbox for others to share a produce request, where the MJCs
    # of a batch become one record (None: the log's linger). Every request is a record batch
    # the broker stores and its consumers fetch; a worker finishing hundreds of jobs a second
    # sends fewer, bigger ones with a linger of some milliseconds (measured: 459 vs 393 no-op
    # jobs/s end to end at 25 vs 5 ms, before the MJC bunches). With the bunches, the linger is
    # on every job's round trip more than on the consumers' costs: 15 ms against 25 gave +2.2%
    # no-op jobs/s (interval +0.03%..+4.4%, higher in 3 of 3 pairs) and 1% less of the stack's
    # own CPU per job; 8 ms against 15 changed nothing (bench.ab --together, 2026-11-29).
    linger_ms: int | None = 15
    # How long an attempt runs before its MJS is published. An attempt that ends sooner
    # reports its start in its MJC alone (the MJC carries the start time and resources, so
    # the MJS would add nothing): short jobs cost one event less on every stage. The job is
    # Running from its SJ on; only its start time waits for this. On the one-machine stack
    # (256 slots on two cores) a no-op job can wait long enough behind the others' starts to
    # outlast 100 ms, and its MJS then costs every stage an event: with 1,000 (and the stack's
    # 60 ms fetch wait and 32 worker cores) the projector spent 28% less CPU per job (bench.ab).
    # 0 (or less) publishes every MJS at once.
    start_report_ms: int = 1_000


class JobRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The body of a dispatch: one attempt of one job."""

    batch_id: int
    job_id: int
    attempt_id: str
    user: str
    spec: dict[str, Any] | None = None  # None: read it from the spec store
    cores_mcpu: Annotated[int, msgspec.Meta(ge=0)]
    resources: list[AttemptResource] = []


AttemptKey = tuple[int, int, str]


@dataclass(eq=False)
class _Attempt:
    job: JobRequest
    request: RunRequest | None  # None until the spec is read from the spec store
    task: asyncio.Task[None] | None = None
    running: bool = False  # in the runtime's run: a DELETE cancels the task, the run ends it
    outcome: Outcome | None = None  # set when the process ended: its cores are free
    start_ms: int = 0  # when the worker started the attempt (its MJS's start time)
    start_due: bool = False  # its MJS waits in the worker's sweep, unless it ends first
    started: asyncio.Task[None] | None = None  # the MJS being published
    cancel_requested: bool = False  # a DELETE: report Cancelled
    abandoned: bool = False  # the worker shuts down: report nothing

    @property
    def key(self) -> AttemptKey:
        return (self.job.batch_id, self.job.job_id, self.job.attempt_id)


class Worker:
    """The worker service, an async context manager (see the module docstring)."""

    def __init__(self, settings: WorkerSettings, log_settings: LogSettings, *,
                 store: LogStore | None = None, specs: SpecStore | None = None,
                 runtime: ContainerRuntime | None = None,
                 publisher: Publisher | None = None,
                 clock: Callable[[], int] = time_ms) -> None:
        self._settings = settings
        # Local directories, or GCS with HS_STORAGE_URL (services.common.storage).
        self._store = store or open_log_store(settings.log_dir)
        self._specs = specs or open_spec_store(settings.spec_dir)
        self._runtime = runtime or LocalProcessRuntime(clock=clock)
        # The outbox lingers instead of the producer, and bunches the MJCs it gathers.
        linger_ms = log_settings.linger_ms if settings.linger_ms is None else settings.linger_ms
        self._publisher = publisher or Publisher(
            msgspec.structs.replace(log_settings, linger_ms=0))
        self._outbox = Outbox(self._publisher, linger_s=linger_ms / 1000,
                              retry_s=settings.report_retry_s, max_retry_s=MAX_RETRY_S)
        self._clock = clock
        self._scratch = os.path.join(settings.scratch_dir or tempfile.gettempdir(),
                                     f"hs-worker-{settings.instance_name}")
        # Working directories an attempt left empty, for the next ones. Creating and removing
        # one per job cost ~0.6 ms of blocking file-system calls on this machine's disk (an
        # ext4 with online discard: rmdir alone ~0.4 ms), on the event loop, for every job.
        # Each with when it was freed: one freed moments ago is still there for the next
        # attempt, which skips the mkdir (2.9 us a job here); an older one is made again if
        # something (a temporary-files cleaner) removed it meanwhile.
        self._free_workdirs: list[tuple[str, float]] = []
        self._ready_workdirs: set[str] = set()  # taken fresh from the free ones: they exist
        self._spec_reads: dict[int, asyncio.Future[None]] = {}  # by batch: see _spec_text
        self._n_workdirs = 0
        self._attempts: dict[AttemptKey, _Attempt] = {}
        # Attempts whose MJS is due at a loop time, in that order (one delay for all): one
        # timer sweeps them, not a timer per attempt that the job's end mostly cancels.
        self._starts_due: deque[tuple[float, _Attempt]] = deque()
        self._start_sweep: asyncio.TimerHandle | None = None
        # The cores of the attempts whose process has not ended (counted, not summed over the
        # attempts for every dispatch: a worker holds a hundred or more at once).
        self._busy_mcpu = 0
        self._finished: OrderedDict[AttemptKey, None] = OrderedDict()
        self._runner: web.AppRunner | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._accepting = False
        self._stopped = False

    @property
    def address(self) -> str:
        return f"{self._settings.advertise_host or self._settings.host}:{self._settings.port}"

    @property
    def free_mcpu(self) -> int:
        return self._settings.cores_mcpu - self._busy_mcpu

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        s = self._settings
        await self._publisher.start()
        app = web.Application()
        app.add_routes([
            web.post("/api/v1alpha/jobs", self._post_job),
            web.post("/api/v1alpha/attempts", self._post_attempts),
            web.delete(JOB_PATH, self._delete_job),
            web.get(JOB_PATH + "/log/{container}", self._get_log),
            web.get("/healthcheck", self._healthcheck),
            web.get("/metrics", metrics_handler),
        ])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, s.host, s.port).start()
        self._accepting = True
        # Announced once listening, so the scheduler may dispatch as soon as it reads this.
        await self._report(InstanceActivated(instance_name=s.instance_name, address=self.address,
                                             cores_mcpu=s.cores_mcpu))
        self._heartbeats = asyncio.create_task(self._heartbeat_loop(), name="heartbeats")

    async def stop(self) -> None:
        """Shut down (idempotent): running attempts are killed and left unreported."""
        if self._stopped:
            return
        self._stopped = True
        self._accepting = False
        if self._start_sweep is not None:  # no MJS after this: the attempts end unreported
            self._start_sweep.cancel()
            self._start_sweep = None
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
        running, reporting = [], []
        for attempt in self._attempts.values():
            assert attempt.task is not None
            if attempt.outcome is None:
                attempt.abandoned = True
                attempt.task.cancel()
                running.append(attempt.task)
            else:
                reporting.append(attempt.task)
        if reporting:
            _, late = await asyncio.wait(reporting, timeout=self._settings.shutdown_report_s)
            for task in late:
                task.cancel()
        await asyncio.gather(*running, *reporting, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        await self._outbox.close()
        await self._publisher.stop()
        for workdir, _ in self._free_workdirs:
            with contextlib.suppress(OSError):
                os.rmdir(workdir)
        self._free_workdirs.clear()
        with contextlib.suppress(OSError):  # empty unless jobs left files behind
            os.rmdir(self._scratch)

    # HTTP

    async def _post_job(self, request: web.Request) -> web.Response:
        if not self._accepting:
            return _error(503, "the worker is shutting down")
        try:
            job = msgspec.json.decode(await request.read(), type=JobRequest)
        except msgspec.DecodeError as e:
            return _error(400, f"invalid job: {e}")
        status, body = self._accept(job)
        return web.json_response(body, status=status)

    async def _post_attempts(self, request: web.Request) -> web.Response:
        """Several deliveries in one request; one answer per attempt, in order."""
        if not self._accepting:
            return _error(503, "the worker is shutting down")
        try:
            jobs = msgspec.json.decode(await request.read(), type=list[JobRequest])
        except msgspec.DecodeError as e:
            return _error(400, f"invalid attempts: {e}")
        answers = []
        for job in jobs:
            status, body = self._accept(job)
            answers.append({"status": status, **body})
        # msgspec: the standard library's encoder took 25 us a delivery of 64, this 4.
        return web.Response(body=msgspec.json.encode(answers), content_type="application/json")

    def _accept(self, job: JobRequest) -> tuple[int, dict[str, str]]:
        """Start ``job``'s attempt unless it is known: (HTTP status, body)."""
        if not valid_name(job.attempt_id):
            return 400, {"message": f"invalid attempt id {job.attempt_id!r}"}
        key = (job.batch_id, job.job_id, job.attempt_id)
        if key in self._attempts or key in self._finished:
            return 200, {"attempt": "finished" if key in self._finished else "running"}
        run_request = None
        if job.spec is not None:
            try:
                run_request = self._run_request(job, job.spec)
            except (KeyError, TypeError, ValueError) as e:
                return 400, {"message": f"invalid job spec: {type(e).__name__}: {e}"}
        free = self.free_mcpu
        if job.cores_mcpu > free:
            return 409, {"message": f"not enough free cores: the job needs {job.cores_mcpu} "
                                    f"mCPU, {free} of {self._settings.cores_mcpu} mCPU are free"}
        attempt = _Attempt(job=job, request=run_request)
        self._attempts[key] = attempt
        self._busy_mcpu += job.cores_mcpu
        attempt.task = asyncio.create_task(self._attempt(attempt), name=f"attempt-{key}")
        worker_metrics.holding(attempt.task)
        return 200, {"attempt": "started"}

    async def _delete_job(self, request: web.Request) -> web.Response:
        key = _key(request)
        attempt = self._attempts.get(key) if key is not None else None
        if attempt is None:
            if key in self._finished:
                return web.json_response({"attempt": "finished"})
            return _error(404, "no such attempt")
        if attempt.outcome is None and not attempt.cancel_requested:
            attempt.cancel_requested = True
            if attempt.running:
                assert attempt.task is not None
                attempt.task.cancel()  # the runtime kills the process and returns Cancelled
        return web.json_response({"attempt": "cancelling"})

    async def _get_log(self, request: web.Request) -> web.Response:
        key, container = _key(request), request.match_info["container"]
        if key is None or not valid_name(container):
            return _error(404, "no such log")
        data = await asyncio.to_thread(self._store.read, *key, container)
        if data is None and container == "main" and (key in self._attempts
                                                      or key in self._finished):
            data = b""  # an attempt here that has written nothing: its log is made lazily
        if data is None:
            return _error(404, "no such log")
        return web.Response(body=data, content_type="application/octet-stream")

    async def _healthcheck(self, request: web.Request) -> web.Response:
        return web.json_response({"instance_name": self._settings.instance_name,
                                  "free_mcpu": self.free_mcpu, "accepting": self._accepting})

    # Attempts

    async def _attempt(self, attempt: _Attempt) -> None:
        job = attempt.job
        try:
            start = attempt.start_ms = self._clock()
            self._report_start(attempt)
            spec, error = job.spec, None
            if attempt.request is None and not attempt.cancel_requested:
                spec, error = await self._load_spec(attempt)
            outcome = None
            if error is None:
                outcome, error = await self._execute(attempt, spec or {})
                if outcome is not None and outcome.exit_code is not None:  # it started
                    worker_metrics.spawned(start, outcome.start_time_ms)
            ended = outcome if outcome is not None else Outcome(
                state="Error", start_time_ms=start, end_time_ms=self._clock())
            self._ended(attempt, ended)
            if attempt.abandoned:
                return
            outcomes = {} if outcome is None else {"main": outcome}
            if attempt.start_due:  # ended before its MJS was due: the MJC says it
                attempt.start_due = False
                worker_metrics.start_coalesced()
            if attempt.started is not None:
                await attempt.started  # the log keeps MJS before MJC
            await self._report(attempt_completed(
                spec=spec or {}, outcomes=outcomes,
                batch_id=job.batch_id, job_id=job.job_id, attempt_id=job.attempt_id,
                user=job.user, worker=self._settings.instance_name,
                region=self._settings.region, start_time_ms=start,
                end_time_ms=ended.end_time_ms, resources=job.resources, error=error,
                start_reported=attempt.started is not None))
        except Exception:  # the attempt's top level: log what went wrong, keep the worker up
            log.exception("attempt %s failed in the worker", attempt.key)
        finally:
            attempt.start_due = False  # the sweep skips it
            if attempt.started is not None and not attempt.started.done():
                attempt.started.cancel()  # abandoned or failed: a pending MJS must not outlive it
            if attempt.outcome is None:  # failed in the worker before its process ended
                self._busy_mcpu -= job.cores_mcpu
            self._attempts.pop(attempt.key, None)
            if not attempt.abandoned:
                self._remember(attempt.key)

    def _ended(self, attempt: _Attempt, outcome: Outcome) -> None:
        """The attempt's process ended (or never started): its cores are free."""
        attempt.outcome = outcome
        self._busy_mcpu -= attempt.job.cores_mcpu

    def _report_start(self, attempt: _Attempt) -> None:
        """Publish the MJS once the attempt has run ``start_report_ms`` (at once for 0).

        It goes to the log while the job runs (not before: that would add a broker round trip
        to every job), and the MJC is published only after it, so the log keeps their order.
        """
        delay_ms = self._settings.start_report_ms
        if delay_ms <= 0:
            self._publish_start(attempt)
            return
        loop = asyncio.get_running_loop()
        attempt.start_due = True
        self._starts_due.append((loop.time() + delay_ms / 1000, attempt))
        if self._start_sweep is None:
            self._start_sweep = loop.call_at(self._starts_due[0][0], self._sweep_starts)

    def _sweep_starts(self) -> None:
        """Publish the MJS of every attempt that has not ended and is due within
        ``_START_SWEEP_S``, and come back when the next one is due.

        An MJS goes out up to that much early, never late: an attempt that runs just its delay
        (a job with a timeout as long as the delay) still reports its start, and sweeps stay at
        least that far apart.
        """
        loop = asyncio.get_running_loop()
        horizon = loop.time() + _START_SWEEP_S
        due = self._starts_due
        while due and due[0][0] <= horizon:
            attempt = due.popleft()[1]
            if attempt.start_due:
                self._publish_start(attempt)
        self._start_sweep = loop.call_at(due[0][0], self._sweep_starts) if due else None

    def _publish_start(self, attempt: _Attempt) -> None:
        job = attempt.job
        attempt.start_due = False
        attempt.started = asyncio.create_task(self._report(JobStarted(
            batch_id=job.batch_id, job_id=job.job_id, attempt_id=job.attempt_id,
            instance_name=self._settings.instance_name, start_time_ms=attempt.start_ms,
            resources=job.resources)))

    def _run_request(self, job: JobRequest, spec: Any) -> RunRequest:
        """The main container of ``spec``; KeyError, TypeError or ValueError if malformed."""
        if not isinstance(spec, dict):
            raise TypeError(f"a job spec is a JSON object, not {type(spec).__name__}")
        workdir = self._take_workdir()
        try:
            return request_from_spec(
                spec, cwd=workdir, extra_env={
                    "HAIL_BATCH_ID": str(job.batch_id), "HAIL_JOB_ID": str(job.job_id),
                    "HAIL_ATTEMPT_ID": job.attempt_id})
        except BaseException:
            self._give_back(workdir)
            raise

    async def _load_spec(self, attempt: _Attempt) -> tuple[dict[str, Any] | None, str | None]:
        """Read the job's spec from the spec store and prepare its run: (spec, None), or
        (None, the error the MJC reports)."""
        job = attempt.job
        what = f"job {job.batch_id}/{job.job_id}"
        try:
            text = await self._spec_text(job.batch_id, job.job_id)
        except (OSError, ValueError) as e:  # ValueError: an undecodable bunch file
            return None, f"worker error: cannot read the spec of {what}: {type(e).__name__}: {e}"
        if text is None:
            return None, f"spec of {what} not found in the spec store"
        try:
            spec = msgspec.json.decode(text)
            attempt.request = self._run_request(job, spec)
        except (KeyError, TypeError, ValueError) as e:  # msgspec.DecodeError is a ValueError
            return None, f"invalid job spec of {what}: {type(e).__name__}: {e}"
        return spec, None

    async def _spec_text(self, batch_id: int, job_id: int) -> str | None:
        """The job's spec from the store, one read of a batch's specs at a time.

        Jobs of one bunch arrive together, and after the first read the rest are in memory:
        the others of a delivery wait for that read instead of each reading (and decoding) the
        same bunch in a thread of their own.
        """
        text = self._specs.cached(batch_id, job_id)
        while text is None and (reading := self._spec_reads.get(batch_id)) is not None:
            await asyncio.shield(reading)
            text = self._specs.cached(batch_id, job_id)
        if text is not None:
            return text
        done = self._spec_reads[batch_id] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.to_thread(self._specs.read, batch_id, job_id)
        finally:
            del self._spec_reads[batch_id]
            done.set_result(None)

    async def _execute(self, attempt: _Attempt, spec: dict[str, Any]
                       ) -> tuple[Outcome | None, str | None]:
        """Run the main container: its outcome, or None and a worker error."""
        job = attempt.job
        if attempt.cancel_requested or spec.get("input_files") or spec.get("output_files"):
            if attempt.request is not None:
                self._give_back(attempt.request.cwd)  # unused
            if attempt.cancel_requested:
                return self._never_started(), None
            return None, "input and output files are not supported by this worker yet"
        assert attempt.request is not None
        workdir = attempt.request.cwd
        sink: LogWriter | None = None
        outcome: Outcome | None = None
        try:
            sink = self._prepare(workdir, job)
            if attempt.cancel_requested:  # a DELETE while we prepared
                return self._never_started(), None
            # In this task (a task of its own per run cost every job its creation and steps):
            # a DELETE cancels this task while it runs, and the runtime consumes that.
            attempt.running = True
            try:
                outcome = await self._runtime.run(attempt.request, sink)
                return outcome, None
            except asyncio.CancelledError:
                if attempt.abandoned or not attempt.cancel_requested:
                    raise
                _uncancel()
                return self._never_started(), None  # a DELETE before the process started
            finally:
                attempt.running = False
        except OSError as e:
            return None, f"worker error: {type(e).__name__}: {e}"
        finally:
            if _left_empty(sink, workdir, outcome):
                self._free_workdirs.append((workdir, time.monotonic()))  # the next attempt's
            else:
                await asyncio.to_thread(_clean_up, sink, workdir)

    def _prepare(self, workdir: str, job: JobRequest) -> LogWriter:
        """The attempt's working directory and log writer.

        On the event loop: a few local file-system calls cost less than a thread hop, which
        was a measurable share of a short job's cost. A log store's writer only opens a local
        file (GCS spools locally and uploads at close).
        """
        if workdir in self._ready_workdirs:
            self._ready_workdirs.discard(workdir)
            return self._store.writer(job.batch_id, job.job_id, job.attempt_id, "main")
        try:
            os.mkdir(workdir)
        except FileExistsError:
            pass  # one an earlier attempt left empty
        except FileNotFoundError:  # the scratch directory is not there (yet)
            os.makedirs(workdir, exist_ok=True)
        return self._store.writer(job.batch_id, job.job_id, job.attempt_id, "main")

    async def _report(self, event: AnyEvent) -> None:
        """Publish ``event`` (through the outbox) until the log takes it; give up only on a
        fatal error."""
        await self._outbox.put(event)
        worker_metrics.reported(event)

    async def _heartbeat_loop(self) -> None:
        s = self._settings
        while True:
            await asyncio.sleep(s.heartbeat_s)
            now = self._clock()
            beats = [AttemptHeartbeat(batch_id=a.job.batch_id, job_id=a.job.job_id,
                                      attempt_id=a.job.attempt_id, instance_name=s.instance_name,
                                      rollup_time_ms=now)
                     for a in self._attempts.values()
                     # its MJS went first (it may still wait in the outbox: the next beat)
                     if a.started is not None and a.started.done() and a.outcome is None]
            if beats:
                try:
                    await self._publisher.publish_many(beats)
                except LogError as e:
                    log.warning("heartbeats not published (the next ones cover them): %s", e)

    def _never_started(self) -> Outcome:
        now = self._clock()
        return Outcome(state="Cancelled", start_time_ms=now, end_time_ms=now)

    def _remember(self, key: AttemptKey) -> None:
        self._finished[key] = None
        while len(self._finished) > FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def _take_workdir(self) -> str:
        """A working directory for one attempt: one an earlier attempt left empty, or a new
        name (made by :meth:`_prepare`). A job that leaves files behind has its directory
        removed, so no attempt ever sees another's files."""
        if self._free_workdirs:
            workdir, freed = self._free_workdirs.pop()
            if time.monotonic() - freed < FRESH_WORKDIR_S:
                self._ready_workdirs.add(workdir)
            return workdir
        self._n_workdirs += 1
        return f"{self._scratch}/work-{self._n_workdirs}"

    def _give_back(self, workdir: str) -> None:
        """A working directory taken for an attempt that will not use it: free again if it is
        known to be there and empty (a new name was never made, and an old one is dropped)."""
        if workdir in self._ready_workdirs:
            self._ready_workdirs.discard(workdir)
            self._free_workdirs.append((workdir, time.monotonic()))


def _uncancel() -> None:
    """A DELETE's cancellation is consumed (the MJC reports it): tell the task."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _key(request: web.Request) -> AttemptKey | None:
    info = request.match_info
    with contextlib.suppress(ValueError):
        if valid_name(info["attempt_id"]):
            return (int(info["batch_id"]), int(info["job_id"]), info["attempt_id"])
    return None


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"message": message}, status=status)


def _left_empty(sink: LogWriter | None, workdir: str, outcome: Outcome | None) -> bool:
    """The cheap common case, on the event loop: a local log file (closed here) and a job that
    left its working directory empty, for the next attempt (the runtime may have seen it
    empty already). False: run :func:`_clean_up` in a thread (the log may upload; the
    directory is removed)."""
    if sink is not None and not isinstance(sink, FileLogSink):
        return False  # closing may upload the log
    if sink is not None:
        sink.close()
    if outcome is not None and outcome.workdir_empty:
        return True
    try:
        with os.scandir(workdir) as entries:
            return next(entries, None) is None
    except OSError:  # never made, or gone
        return False


def _clean_up(sink: LogWriter | None, workdir: str) -> None:
    """Close the log and remove the working directory (in a thread: file system calls)."""
    if sink is not None:
        sink.close()
    shutil.rmtree(workdir, True)
