"""``python -m services.stack up|down|status|setup|db-up``."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer
from rich.console import Console

from services.common.settings import load_settings
from services.stack import lifecycle, status
from services.stack.components import SEAWEED, metrics_urls
from services.stack.config import StackConfig, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The local hailstream stack: MariaDB, broker (tansu), services.")
console = Console(soft_wrap=True)
err_console = Console(stderr=True)

MemoryOpt = Annotated[bool | None, typer.Option(
    "--memory/--durable", help="Broker storage: memory (fast, lost on stop) or SeaweedFS.")]
KafkaPortOpt = Annotated[int | None, typer.Option(
    help="Broker port (default: the port of HS_KAFKA_BOOTSTRAP, 9092).")]
SeaweedPortOpt = Annotated[int | None, typer.Option(
    help="First of the 15 SeaweedFS ports (HS_STACK_SEAWEED_BASE_PORT, default 18300).")]
ServicePortOpt = Annotated[int | None, typer.Option(
    help="First service port (HS_STACK_SERVICE_BASE_PORT, default 18400).")]


def _config(memory: bool | None = None, kafka_port: int | None = None,
            seaweed_base_port: int | None = None,
            service_base_port: int | None = None) -> StackConfig:
    mode = None if memory is None else ("memory" if memory else "durable")
    try:
        return load_config(mode=mode, kafka_port=kafka_port,
                           seaweed_base_port=seaweed_base_port,
                           service_base_port=service_base_port)
    except ValueError as e:
        err_console.print(f"[red]bad setting:[/red] {e}")
        raise typer.Exit(2) from None


def _say(message: str) -> None:
    console.print(message, highlight=False)


def _summary(cfg: StackConfig) -> None:
    st = status.collect(cfg)
    console.print()
    for c in st.components:
        mark = "[green]up[/green]" if c.alive and c.listening else "[red]down[/red]"
        where = f"127.0.0.1:{c.port}" if c.port else "(no port)"
        console.print(f"  {c.name:<10} {mark}  {where}  pid {c.pid}  log {c.log}",
                      highlight=False)
    if cfg.stack.mode == "durable":
        console.print(f"  {SEAWEED} S3 endpoint: "
                      f"http://127.0.0.1:{cfg.stack.seaweed_port('s3')} (bucket tansu, "
                      f"data {cfg.seaweed_dir})", highlight=False)
    db = cfg.settings.db
    console.print(f"  {'mariadb':<10} {db.host}:{db.port} database {db.name}", highlight=False)
    console.print(f"  topics: {', '.join(sorted(st.topics)) or '-'}", highlight=False)
    console.print("\nMetrics (Prometheus; workers serve /metrics on their own ports):")
    for name, url in metrics_urls(cfg).items():
        console.print(f"  {name:<11} {url}", highlight=False)
    console.print("\nClient environment:")
    for key, value in cfg.client_env().items():
        console.print(f"  export {key}={value}", highlight=False, soft_wrap=True)


@app.command()
def up(memory: MemoryOpt = None, kafka_port: KafkaPortOpt = None,
       seaweed_base_port: SeaweedPortOpt = None, service_base_port: ServicePortOpt = None,
       quiet: Annotated[bool, typer.Option(help="No summary at the end.")] = False) -> None:
    """Start MariaDB (if down), the broker, topics, migrations and services. Idempotent."""
    cfg = _config(memory, kafka_port, seaweed_base_port, service_base_port)
    try:
        lifecycle.up(cfg, _say)
    except (lifecycle.StackError, TimeoutError, RuntimeError) as e:
        err_console.print(f"[red]up failed:[/red] {e}")
        err_console.print("Processes that did start keep running; `down` stops them.")
        raise typer.Exit(1) from None
    if not quiet:
        _summary(cfg)


@app.command()
def down(with_db: Annotated[bool, typer.Option(
        help="Also stop MariaDB, if (and only if) `up` started it.")] = False) -> None:
    """Stop the services, the broker and SeaweedFS that `up` started. Idempotent."""
    cfg = _config()
    lifecycle.down(cfg, _say, with_db=with_db)


@app.command()
def setup() -> None:
    """Only create topics and apply migrations where HS_* points (real Kafka and MySQL too)."""
    # The settings as given: the stack's own config points the log at its local broker.
    cfg = dataclasses.replace(_config(), settings=load_settings())
    try:
        lifecycle.setup(cfg, _say)
    except (lifecycle.StackError, TimeoutError) as e:
        err_console.print(f"[red]setup failed:[/red] {e}")
        raise typer.Exit(1) from None


@app.command("db-up")
def db_up() -> None:
    """Only make sure MariaDB answers (start or install it if needed)."""
    cfg = _config()
    try:
        lifecycle.db_up(cfg, _say)
    except (TimeoutError, RuntimeError) as e:
        err_console.print(f"[red]db-up failed:[/red] {e}")
        raise typer.Exit(1) from None


@app.command("status")
def status_cmd(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
               memory: MemoryOpt = None) -> None:
    """Components, topics and consumer lag. Exit code 1 unless everything expected runs."""
    cfg = _config(memory)
    st = status.collect(cfg)
    if as_json:
        print(status.to_json(st))
    else:
        status.render(st, console)
    raise typer.Exit(0 if st.ok else 1)


def main() -> None:
    app()

