"""The processes of the stack: SeaweedFS, tansu, and the services registry.

A new service plugs in by adding one line to ``SERVICES``; `up` starts it after the
infrastructure (with the client environment of the stack), `down` stops it first, and `status`
reports it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import NamedTuple

from services.common import procs
from services.stack.config import SEAWEED_GRPC_PORTS, SEAWEED_PORTS, StackConfig

SEAWEED = "seaweed"
TANSU = "tansu"


class ServiceSpec(NamedTuple):
    """A service run by the stack: ``python <argv...>`` listening on base + ``port_offset``.

    ``{port}`` in ``argv`` is replaced by the service's port, which is also passed as
    ``HS_<NAME>_PORT``. ``port_offset`` None: the service does not listen. ``metrics_offset``:
    its metrics server's port (``HS_METRICS_PORT``, base + offset); None: it serves /metrics
    on its own port, or not at all.
    """

    name: str
    argv: tuple[str, ...]
    port_offset: int | None
    metrics_offset: int | None = None


SERVICES: list[ServiceSpec] = [
    ServiceSpec("projector", ("-m", "services.projector"), port_offset=None, metrics_offset=10),
    ServiceSpec("ingest", ("-m", "services.ingest", "--port", "{port}"), port_offset=0),
    ServiceSpec("scheduler", ("-m", "services.scheduler"), port_offset=None, metrics_offset=11),
    ServiceSpec("completions", ("-m", "services.completions"), port_offset=None,
                metrics_offset=12),
]


@dataclass(frozen=True)
class Component:
    """One process to start: its command, environment, and the ports it owns."""

    name: str
    argv: list[str]
    # The first port is the one `status` checks; all must be free before a start.
    ports: tuple[int, ...]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.ports[0] if self.ports else 0


def seaweed_component(cfg: StackConfig) -> Component:
    """``weed mini`` with every port explicit (its defaults would clash between stacks)."""
    s = cfg.stack
    argv = [
        procs.weed_binary(), "mini",
        f"-dir={cfg.seaweed_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-bucket=tansu",
        "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        "-master.telemetry=false",
        f"-master.port={s.seaweed_port('master')}",
        f"-volume.port={s.seaweed_port('volume')}",
        f"-filer.port={s.seaweed_port('filer')}",
        f"-s3.port={s.seaweed_port('s3')}",
        f"-admin.port={s.seaweed_port('admin')}",
        f"-debug.port={s.seaweed_port('debug')}",
        f"-metricsPort={s.seaweed_port('metrics')}",
    ]
    argv += [f"-{name}.port.grpc={s.seaweed_grpc_port(name)}" for name in SEAWEED_GRPC_PORTS]
    # Checked free before a start; debug is only bound with -debug, so it is left out.
    ports = (s.seaweed_port("s3"),
             *(s.seaweed_port(n) for n in SEAWEED_PORTS if n not in ("s3", "debug")),
             *(s.seaweed_grpc_port(n) for n in SEAWEED_GRPC_PORTS))
    return Component(SEAWEED, argv, ports)


def tansu_component(cfg: StackConfig) -> Component:
    """The tansu broker: on SeaweedFS (durable) or in memory."""
    if cfg.stack.mode == "memory":
        return Component(TANSU, procs.tansu_command(cfg.kafka_port, "memory://tansu/"),
                         (cfg.kafka_port,))
    return Component(TANSU, procs.tansu_command(cfg.kafka_port, "s3://tansu/"), (cfg.kafka_port,),
                     env=procs.s3_env(cfg.stack.seaweed_port("s3")))


def service_port(cfg: StackConfig, spec: ServiceSpec) -> int | None:
    return None if spec.port_offset is None else cfg.stack.service_base_port + spec.port_offset


def service_components(cfg: StackConfig,
                       specs: list[ServiceSpec] | None = None) -> list[Component]:
    """The registered services, configured to use this stack."""
    out = []
    for spec in SERVICES if specs is None else specs:
        port = service_port(cfg, spec)
        env = cfg.client_env()
        argv = [sys.executable]
        if port is not None:
            env[f"HS_{spec.name.upper().replace('-', '_')}_PORT"] = str(port)
            argv += [a.replace("{port}", str(port)) for a in spec.argv]
        else:
            argv += list(spec.argv)
        ports: tuple[int, ...] = () if port is None else (port,)
        if spec.metrics_offset is not None:
            # A service without a port of its own is ready (and checked) on its metrics port.
            env["HS_METRICS_PORT"] = str(cfg.stack.service_base_port + spec.metrics_offset)
            ports += (cfg.stack.service_base_port + spec.metrics_offset,)
        out.append(Component(spec.name, argv, ports, env))
    return out


def metrics_urls(cfg: StackConfig) -> dict[str, str]:
    """Where each service of the stack serves ``/metrics`` (workers announce their own)."""
    out = {}
    for spec in SERVICES:
        port = (cfg.stack.service_base_port + spec.metrics_offset
                if spec.metrics_offset is not None else service_port(cfg, spec))
        if port is not None:
            out[spec.name] = f"http://127.0.0.1:{port}/metrics"
    return out


def stop_rank(name: str) -> int:
    """Order of `down`: services first, then the broker, then its storage."""
    return {TANSU: 1, SEAWEED: 2}.get(name, 0)
