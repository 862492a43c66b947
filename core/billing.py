"""Billing arithmetic: what an attempt is billed for, how usage accrues, and what it costs.

A *resource* is ``product/version`` (``compute/standard-preemptible/1``) with a rate in USD per
unit of usage; a rate never changes for a version (a new rate is a new version, and new attempts
are billed at the latest version of each product). An attempt records, per resource, a
*quantity* per millisecond of runtime in the reference's units (hail-api.md): compute and the
service fee in mCPU, memory in MiB, the IP fee in 1/1024 of a worker. *Usage* is quantity times
milliseconds, an integer, so every total is an exact sum of its parts; only cost (usage times
rate) is a decimal.

Usage accrues from the attempt's start to its last *rollup time*: each heartbeat moves the rollup
time forward and bills the interval since the previous one; the completion (or the loss) bills
the rest up to the end time. Intervals that cross midnight UTC are split by day for the
per-date rollups.

Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

import msgspec

from core.resources import JOB_PRIVATE, WORKER_MEMORY_PER_CORE_MIB, WorkerType
from schemas.base import AttemptResource

SERVICE_FEE: Final = "service-fee"
IP_FEE: Final = "ip-fee/1024"
FIRST_VERSION: Final = "1"
RATE_QUANTUM: Final = Decimal("1e-30")
"""Rates are stored with 30 decimal places (``resources.rate``)."""
DAY_MS: Final = 86_400_000
_HOUR_MS: Final = 3_600_000
_MACHINE_TYPE: Final = re.compile(r"[^-]+-(highcpu|standard|highmem)-\d+")


def compute_product(worker_type: str, preemptible: bool) -> str:
    """The compute product of a worker type, e.g. ``compute/highmem-nonpreemptible``."""
    return f"compute/{worker_type}-{_preemptibility(preemptible)}"


def memory_product(worker_type: str, preemptible: bool) -> str:
    """The memory product of a worker type, e.g. ``memory/standard-preemptible``."""
    return f"memory/{worker_type}-{_preemptibility(preemptible)}"


def _preemptibility(preemptible: bool) -> str:
    return "preemptible" if preemptible else "nonpreemptible"


def _per_ms(usd_per_hour: str, units: int) -> Decimal:
    """A rate in USD per unit*ms from a price per hour of ``units`` units (30 places)."""
    return (Decimal(usd_per_hour) / units / _HOUR_MS).quantize(RATE_QUANTUM)


# Hourly prices of the reference's n1 machines (a core, a GiB of memory), the service fee per
# core, and the IP fee per worker; highcpu, standard and highmem differ in memory per core.
_CORE_HOUR: Final = {True: "0.006655", False: "0.031611"}
_GIB_HOUR: Final = {True: "0.000892", False: "0.004237"}
_SERVICE_FEE_CORE_HOUR: Final = "0.01"
_IP_FEE_WORKER_HOUR: Final = "0.004"


def default_rates() -> dict[str, Decimal]:
    """The local deployment's rates, per resource at the first version.

    Covers every worker type (highcpu, standard, highmem; job-private machines bill at their
    type's rates), preemptible or not, plus the service and IP fees. Operators change a rate by
    setting a new version (``python -m services.ingest.admin set-rate``).
    """
    rates: dict[str, Decimal] = {}
    for worker_type in (*WORKER_MEMORY_PER_CORE_MIB, JOB_PRIVATE):
        for preemptible in (True, False):
            rates[f"{compute_product(worker_type, preemptible)}/{FIRST_VERSION}"] = _per_ms(
                _CORE_HOUR[preemptible], 1000)
            rates[f"{memory_product(worker_type, preemptible)}/{FIRST_VERSION}"] = _per_ms(
                _GIB_HOUR[preemptible], 1024)
    rates[f"{SERVICE_FEE}/{FIRST_VERSION}"] = _per_ms(_SERVICE_FEE_CORE_HOUR, 1000)
    rates[f"{IP_FEE}/{FIRST_VERSION}"] = _per_ms(_IP_FEE_WORKER_HOUR, 1024)
    return rates


def split_resource(resource: str) -> tuple[str, str]:
    """``(product, version)`` of ``product/version`` (a name without a slash is version 1)."""
    product, _, version = resource.rpartition("/")
    return (product, version) if product else (resource, FIRST_VERSION)


def newer_version(current: str | None, candidate: str) -> bool:
    """Whether ``candidate`` supersedes ``current`` (numeric versions compare as numbers)."""
    if current is None:
        return True
    if current.isdigit() and candidate.isdigit():
        return int(candidate) > int(current)
    return candidate > current


def fold_version(latest: dict[str, str], resource: str) -> None:
    """Record a resource's version in ``latest`` (product -> version) if it is the newest."""
    product, version = split_resource(resource)
    if newer_version(latest.get(product), version):
        latest[product] = version


@dataclass(frozen=True, slots=True)
class Machine:
    """What an attempt runs on, as billing sees it."""

    worker_type: str
    preemptible: bool
    worker_cores_mcpu: int
    """Cores of the whole worker (the IP fee is shared by the attempts on it)."""

    @property
    def memory_per_core_mib(self) -> int:
        return WORKER_MEMORY_PER_CORE_MIB.get(_worker_type(self.worker_type), 3840)


def machine_of(inst_coll: str, machine_type: str, preemptible: bool,
               cores_mcpu: int) -> Machine:
    """The billing view of an instance, from what the autoscaler requested.

    A pool's worker type is its collection's name (``highmem-np`` is highmem, not
    preemptible); a job-private machine named like ``n1-highmem-8`` bills as its type, one named
    otherwise (the local driver's ``job-private``) as ``job-private`` with standard memory.
    """
    match = _MACHINE_TYPE.fullmatch(machine_type)
    if match is not None:
        worker_type = match.group(1)
    elif inst_coll == JOB_PRIVATE:
        worker_type = JOB_PRIVATE
    else:
        worker_type = inst_coll.removesuffix("-np")
    return Machine(worker_type, preemptible, cores_mcpu)


def _worker_type(name: str) -> WorkerType:
    match name:
        case "highcpu":
            return "highcpu"
        case "highmem":
            return "highmem"
        case _:
            return "standard"


def attempt_resources(cores_mcpu: int, machine: Machine,
                      latest: Mapping[str, str] | None = None) -> list[AttemptResource]:
    """The resources an attempt of ``cores_mcpu`` on ``machine`` is billed for, per ms.

    Args:
        cores_mcpu: Cores the attempt holds (a job-private attempt holds the whole machine).
        machine: The worker's type, preemptibility and size.
        latest: Latest version per product; products not in it bill at version 1.

    Returns:
        Sorted by resource name; quantities are positive.

    """
    versions = latest or {}
    quantities = {
        compute_product(machine.worker_type, machine.preemptible): cores_mcpu,
        memory_product(machine.worker_type, machine.preemptible):
            cores_mcpu * machine.memory_per_core_mib // 1000,
        SERVICE_FEE: cores_mcpu,
        IP_FEE: max(1, 1024 * cores_mcpu // max(1, machine.worker_cores_mcpu)),
    }
    return sorted((AttemptResource(resource=f"{p}/{versions.get(p, FIRST_VERSION)}", quantity=q)
                   for p, q in quantities.items() if q > 0), key=lambda r: r.resource)


_RESOURCES_JSON: Final = msgspec.json.Encoder(order="sorted")
_RESOURCES_TYPE: Final = dict[str, int]


def resources_text(resources: Mapping[str, int]) -> str | None:
    """An attempt's resources (resource -> quantity per ms) as its ``attempts.resources``.

    A JSON object with its keys sorted, so the same resources are the same text whatever order
    they arrived in (a rebuild diffs it against the live row); None for none.
    """
    return _RESOURCES_JSON.encode(resources).decode() if resources else None


def resources_of_text(text: str | None) -> dict[str, int]:
    """The inverse of :func:`resources_text`: an empty dict for NULL.

    Raises ValueError (a ``msgspec.DecodeError``) for text that is not an object of integer
    quantities.
    """
    if text is None:
        return {}
    return msgspec.json.decode(text, type=_RESOURCES_TYPE)


_USAGE_JSON: Final = msgspec.json.Encoder()
_USAGE_TYPE: Final = list[tuple[str, int]]


def usage_text(usage_by_resource: Mapping[str, int]) -> str | None:
    """A job's usage (resource -> quantity times ms) as its ``jobs.resource_usage``.

    A JSON array of ``[resource, usage]`` pairs sorted by resource, without zero usages: the
    same usage is the same text however it accrued (a rebuild diffs it against the live row),
    and SQL reads it with ``JSON_TABLE(..., '$[*]' ...)`` (an object's keys cannot be
    iterated there). None for no usage.
    """
    pairs = sorted((r, u) for r, u in usage_by_resource.items() if u)
    return _USAGE_JSON.encode(pairs).decode() if pairs else None


class UsageFormat(msgspec.Struct, frozen=True, gc=False):
    """:func:`usage_text` of a set of quantities, for any positive number of milliseconds."""

    fmt: str
    """A %-format with a ``%d`` per resource billed (its JSON text's other ``%`` doubled)."""
    per_ms: tuple[int, ...]
    """The quantities the ``%d`` take, in order: each times the milliseconds."""
    pieces: tuple[str, ...]
    """The text between the numbers (one more than ``per_ms``): what SQL concatenates."""

    def text(self, ms: int) -> str:
        return self.fmt % tuple([q * ms for q in self.per_ms])


class JobUsage(msgspec.Struct, frozen=True, gc=False):
    """A job's usage as its ``jobs.resource_usage`` will hold it: ``format``'s text of ``ms``.

    What the rebuild's fold gives for a job billed at one set of quantities (nearly every
    job), so that a load can send MariaDB the milliseconds and have it render the texts, all
    alike but for their numbers (:mod:`services.audit.load`); :meth:`text` is the text.
    """

    format: UsageFormat
    ms: int

    def text(self) -> str:
        return self.format.text(self.ms)


class UsageTexts:
    """:func:`usage_text` of usage at fixed quantities per ms, for many durations.

    A rebuild renders the usage of every job of a batch, nearly all billed at one set of
    quantities for some milliseconds: the text of each set is made once as a %-format, and a
    job's usage is that format of its quantities times its milliseconds (``usage_text``
    built, sorted and encoded a list per job: 1.5-3% of a bulk lane, py-spy 2026-11-30).
    """

    def __init__(self) -> None:
        self._formats: dict[tuple[tuple[str, int], ...], UsageFormat | None] = {}

    def usage(self, quantities: tuple[tuple[str, int], ...], ms: int) -> JobUsage | None:
        """``quantities`` (resource, quantity per ms) used for ``ms`` > 0, as a usage.

        None where :func:`usage_text` gives no text (every quantity zero). The jobs of one set
        of quantities share its :class:`UsageFormat`.
        """
        if ms <= 0:
            raise ValueError(f"usage of {ms} ms: only a positive duration has a usage text")
        try:
            found = self._formats[quantities]
        except KeyError:
            found = self._formats[quantities] = _usage_format(quantities)
        return None if found is None else JobUsage(found, ms)

    def text(self, quantities: tuple[tuple[str, int], ...], ms: int) -> str | None:
        """``usage_text`` of ``quantities`` (resource, quantity per ms) used for ``ms`` > 0."""
        usage = self.usage(quantities, ms)
        return None if usage is None else usage.text()


def _usage_format(quantities: tuple[tuple[str, int], ...]) -> UsageFormat | None:
    """:func:`usage_text`'s text of ``quantities`` times a positive ms, as a format.

    None where every quantity is zero (no text).
    """
    pairs = sorted((r, q) for r, q in dict(quantities).items() if q)
    if not pairs:
        return None
    names = [_USAGE_JSON.encode(r).decode() for r, _ in pairs]
    pieces = ["[[" + names[0] + ","] + ["],[" + n + "," for n in names[1:]] + ["]]"]
    fmt = "%d".join(p.replace("%", "%%") for p in pieces)
    return UsageFormat(fmt, tuple(q for _, q in pairs), tuple(pieces))


def usage_of_text(text: str | None) -> dict[str, int]:
    """The inverse of :func:`usage_text`: an empty dict for NULL.

    Raises ValueError (a ``msgspec.DecodeError``) for text that is not such an array.
    """
    if text is None:
        return {}
    return dict(msgspec.json.decode(text, type=_USAGE_TYPE))


def add_usage(into: dict[str, int], quantities: Mapping[str, int], ms: int) -> None:
    """Add ``quantities`` (resource -> quantity per ms) used for ``ms`` to ``into``."""
    for resource, quantity in quantities.items():
        into[resource] = into.get(resource, 0) + quantity * ms


def billable(start_ms: int | None, rollup_ms: int | None, end_ms: int | None,
             to_ms: int) -> tuple[int, int] | None:
    """The interval to bill when an attempt reports ``to_ms`` (a heartbeat or its end).

    Args:
        start_ms: When the attempt started (None: not known to have started).
        rollup_ms: Up to when it is billed already (None: not billed yet).
        end_ms: When it ended, if known; nothing after it is billed.
        to_ms: The reported time.

    Returns:
        ``(from_ms, to_ms)`` with ``from_ms < to_ms``, or None when there is nothing to bill
        (never started, already billed that far, a stale or duplicate report).

    """
    base = rollup_ms if rollup_ms is not None else start_ms
    if base is None:
        return None
    upper = to_ms if end_ms is None else min(to_ms, end_ms)
    return (base, upper) if upper > base else None


def usage(resources: Iterable[AttemptResource], from_ms: int, to_ms: int) -> dict[str, int]:
    """Usage per resource over ``[from_ms, to_ms)`` (zero-length intervals give nothing)."""
    ms = max(0, to_ms - from_ms)
    out: dict[str, int] = {}
    if ms == 0:
        return out
    for r in resources:
        out[r.resource] = out.get(r.resource, 0) + r.quantity * ms
    return out


def by_day(from_ms: int, to_ms: int) -> list[tuple[dt.date, int, int]]:
    """``[from_ms, to_ms)`` split at midnight UTC: ``(date, from, to)`` per day touched."""
    out = []
    start = from_ms
    while start < to_ms:
        midnight = (start // DAY_MS + 1) * DAY_MS
        end = min(to_ms, midnight)
        out.append((usage_date(start), start, end))
        start = end
    return out


def usage_date(ms: int) -> dt.date:
    """The UTC day of a millisecond timestamp."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).date()


@functools.lru_cache(maxsize=64)
def day_name(day: int) -> str:
    """The ISO date of day number ``day`` since the epoch (UTC; ``ms // DAY_MS``).

    Remembered: a fold bills many intervals of the same few days, and making the date and its
    text was a twentieth of a rebuild's fold (profiled).
    """
    return usage_date(day * DAY_MS).isoformat()


def cost(usages: Mapping[str, int], rates: Mapping[str, Decimal]) -> Decimal:
    """USD for usage per resource; a resource without a rate costs nothing."""
    return sum((Decimal(u) * rates.get(r, Decimal(0)) for r, u in usages.items()), Decimal(0))


def cost_breakdown(usages: Mapping[str, int], rates: Mapping[str, Decimal]
                   ) -> list[tuple[str, Decimal]]:
    """``(resource, cost)`` per resource with usage, sorted by resource."""
    return [(r, Decimal(u) * rates.get(r, Decimal(0))) for r, u in sorted(usages.items())]


def over_limit(accrued: Decimal, limit: Decimal | None) -> bool:
    """Whether a billing project with ``accrued`` cost is at or over ``limit`` (None: none)."""
    return limit is not None and accrued >= limit


def msec_mcpu(usages: Mapping[str, int]) -> int:
    """The reference's ``msec_mcpu``: compute usage (mCPU*ms) over all compute resources."""
    return sum(u for r, u in usages.items() if r.startswith("compute/"))


def merge(parts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Usage per resource summed over ``parts``."""
    out: dict[str, int] = {}
    for part in parts:
        for r, u in part.items():
            out[r] = out.get(r, 0) + u
    return out


def cost_str(usd: Decimal) -> str:
    """A cost as the reference prints it: ``$0.0123``, ``<$0.0001`` for a tiny positive one."""
    if usd == 0:
        return "$0.0000"
    if 0 < usd < Decimal("0.0001"):
        return "<$0.0001"
    return f"${usd:.4f}"
