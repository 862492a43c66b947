"""``python -m services.audit``: a batch's or job's event history, and rebuild-and-diff.

``history --batch B [--job J] [--json]`` prints the events of batch B (or of its job J) from the
log, one line each (position, time, tag, key fields) or as JSON lines (whole envelopes). Exit 1
if the batch or job is not on the log.

``rebuild [--database NAME] [--keep] [--wait-s S] [--lanes N] [--no-bulk]`` replays the log
into a fresh database (two lane processes per core by default, batches of the common lifecycle
folded whole: :mod:`services.audit.bulk`) and diffs it against the live one (see
:mod:`services.audit.rebuild`): every difference is printed on stdout, progress on stderr. Exit 0
with no difference, 1 with differences, 2 when the audit could not run (the target exists, the
live projector lags too far behind, the log is unreachable).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from schemas.codec import DecodeError
from services.audit.diff import Difference, format_difference
from services.audit.history import job_history, load_batch, render
from services.audit.rebuild import AuditError, RebuildOptions, Reporter, rebuild
from services.audit.replay import Progress as OnProgress
from services.audit.replay import ReplayError, Span
from services.common import eventloop
from services.common.cpus import usable_cores
from services.common.log import LogError
from services.common.settings import load_settings

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Audit: a batch's or job's event history from the log; rebuild the "
                  "projections from the log and diff them against the live ones.")
DIFFERENCES, FAILED = 1, 2


class _Rate(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} events/s" if speed else "", style="progress.data.speed")


class RichReporter(Reporter):
    """Progress and news on stderr (a rich progress bar), differences on stdout."""

    def __init__(self) -> None:
        self._err = Console(stderr=True)
        self._progress: Progress | None = None

    def message(self, text: str) -> None:
        self._err.print(text, highlight=False, markup=False)

    def replaying(self, todo: list[Span], title: str) -> OnProgress:
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            _Rate(), TimeElapsedColumn(), TimeRemainingColumn(),
                            console=self._err)
        self.message(title)
        task = progress.add_task("replay", total=sum(s.size for s in todo))
        progress.start()
        self._progress = progress

        def advance(span: Span, n: int) -> None:
            progress.update(task, advance=n, description=f"replay {span.label}")

        return advance

    def done_replaying(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def difference(self, d: Difference) -> None:
        typer.echo(format_difference(d))


@app.command()
def history(
    batch: Annotated[int, typer.Option(help="The batch id.")],
    job: Annotated[int | None, typer.Option(help="Only the events of this job.")] = None,
    json_lines: Annotated[bool, typer.Option("--json", help="JSON lines: whole envelopes.")]
    = False,
) -> None:
    """Print the event history of a batch, or of one of its jobs, from the log."""
    settings = load_settings()
    try:
        entries = asyncio.run(load_batch(settings.log, batch))
    except (LogError, KafkaError, DecodeError) as e:
        typer.echo(f"error: {e!r}" if isinstance(e, KafkaError) else f"error: {e}", err=True)
        raise typer.Exit(FAILED) from None
    if not entries:
        typer.echo(f"error: batch {batch} has no events on the log "
                   f"({settings.log.topic('batch-events')})", err=True)
        raise typer.Exit(1)
    if job is not None:
        selected = job_history(entries, job)
        if selected is None:
            typer.echo(f"error: batch {batch} has no job {job} on the log", err=True)
            raise typer.Exit(1)
        entries = selected
    for line in render(entries, as_json=json_lines):
        typer.echo(line)


SINK_LANES = 2 * usable_cores()
"""Lane processes through the sink alone (``--no-bulk``): two per core, as a sink lane waits on
MariaDB for about a third of its time; one per core left the machine 30% idle (measured: 2,778
events/s with 2 lanes, 3,378 with 4, on 2 cores). Cores are those this process may use: a CPU
quota (a container's limit) counts (:mod:`core.cpu_capacity`)."""
BULK_LANES = usable_cores()
"""Bulk lane processes (the default): one per core this process may use. A bulk lane keeps its
core busy, and each process costs about 0.65 s of CPU to start (measured, 20k jobs on 2 cores:
14,191 events/s with 2 lanes, 11,619 with 4; held to one core's worth, 71,962 with 2 lanes and
79,864 with 1)."""


@app.command("rebuild")
def rebuild_command(
    database: Annotated[str | None, typer.Option(
        help="The rebuilt database (must not exist). Default: the live one + '_rebuild'.")]
    = None,
    keep: Annotated[bool, typer.Option(help="Keep the rebuilt database.")] = False,
    wait_s: Annotated[float, typer.Option(
        help="How long to wait for the live projector to catch up.")] = 120.0,
    batch_size: Annotated[int, typer.Option(help="Records per replay transaction.")] = 5_000,
    lanes: Annotated[int | None, typer.Option(
        help="Partitions replayed at the same time, each lane a process of its own "
             "(1: one after the other, in this process). Default: one per core, or two per "
             "core with --no-bulk.", min=1)]
    = None,
    bulk: Annotated[bool, typer.Option(
        help="Fold each batch of the common lifecycle at once, writing its rows once in their "
             "final state; --no-bulk: every event through the projector's sink.")] = True,
) -> None:
    """Replay the log into a fresh database and diff it against the live projections."""
    settings = load_settings()
    reporter = RichReporter()
    options = RebuildOptions(database=database, keep=keep, wait_s=wait_s,
                             batch_size=batch_size,
                             lanes=lanes or (BULK_LANES if bulk else SINK_LANES), bulk=bulk)
    try:
        result = eventloop.run(rebuild(settings, options, reporter),
                               eventloop.service_loop("audit"))
    except (AuditError, LogError, KafkaError, DecodeError, ReplayError) as e:
        reporter.message(f"error: {e!r}" if isinstance(e, KafkaError) else f"error: {e}")
        raise typer.Exit(FAILED) from None
    n = len(result.differences)
    where = f"kept in {result.database}" if result.kept else f"{result.database} dropped"
    reporter.message(f"{n} difference{'s' if n != 1 else ''} in {result.tables} tables "
                     f"({where})")
    if n:
        raise typer.Exit(DIFFERENCES)


def main() -> None:
    app()
