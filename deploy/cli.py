"""The `perftracker` command line. Every command loads settings once and passes them down.

Exit status: 0 done; 1 a runtime failure (a `PerftrackerError`: the stack is
down, a job is unknown, Kafka or Grafana cannot be reached...); 2 a usage
error (click's own: a bad option or argument; and a `ConfigError`: a setting
that cannot be used); 130 interrupted. Errors are one line on stderr, names
from user code made inert (:func:`.output.printable`), never a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from urllib.parse import urlsplit

import click

from ..schemas.errors import ConfigError, PerftrackerError
from ..schemas.logs import setup_logging
from ..schemas.redact import install_redaction, redact_configured
from ..schemas.settings import Settings
from ..schemas.settings_loader import check_env_names, load_settings_with_sources, setting_rows
from .demo.runner import FAULTS, MODELS
from .extras import GRAFANA, STACK, WORKER, needs_server
from .output import format_diagnosis, format_status, printable

EXIT_RUNTIME = 1
EXIT_USAGE = 2

# `-h` is `--help` on every command (subcommands inherit the group's context settings)
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
# libraries whose retry warnings would print before our one-line error (urllib3's "Retrying ...
# NewConnectionError", clickhouse-connect's "Unexpected Http Driver Exception"): the command
# says what failed and what to check itself (urllib3.connectionpool by name: importing
# clickhouse-connect resets the level of "urllib3")
QUIET_LIBRARIES = ("urllib3", "urllib3.connectionpool", "clickhouse_connect")


def _settings(ctx: click.Context) -> Settings:
    return ctx.obj["settings"]


def _echo_line(line: str) -> None:
    """Progress lines of long commands (they quote incident summaries and job ids)."""
    click.echo(printable(line))


class HttpUrl(click.ParamType):
    """An absolute http(s) URL with a host, checked before anything is sent."""

    name = "url"

    def convert(self, value: str, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 (raises on a port that is not a number)
        except ValueError:
            self.fail(f"{value!r} is not a valid URL (a port must be a number, an IPv6 host in [...]); "
                      "expected e.g. https://grafana.example.com", param, ctx)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.fail(f"{value!r} is not an http(s) URL; expected e.g. https://grafana.example.com", param, ctx)
        return value


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="perftracker-ml", prog_name="perftracker")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="TOML or YAML config file (default: $PERFTRACKER_CONFIG, ./perftracker.toml|yaml).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="State, logs and chDB data of the embedded stack (default .perftracker).")
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None, data_dir: Path | None) -> None:
    """perftracker: find the rank, function and cause slowing a distributed training job."""
    check_env_names()  # a misspelt PERFTRACKER_* variable is refused, as a misspelt file key is
    settings, sources = load_settings_with_sources(config_path)
    if data_dir is not None:
        settings = dataclasses.replace(settings, data_dir=data_dir)
        sources["data_dir"] = "option --data-dir"
    setup_logging(settings, "cli", to_file=False)  # `worker` and `sink` add their log file
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.ERROR)
    ctx.obj = {"settings": settings, "sources": sources}


@cli.command()
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Faust worker processes (default from config: 1).")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Broker port (default: a free port) on kafka.embedded_listen_host (default 127.0.0.1).")
@click.option("--force", is_flag=True,
              help="If the recorded broker died (its topics are lost), stop the rest and start afresh.")
@click.pass_context
@needs_server(*STACK)
def up(ctx: click.Context, workers: int | None, port: int | None, force: bool) -> None:
    """Start the embedded stack (tansu broker, sink on chDB, stream workers) in the background.
    On a stack already recorded, restart only what died; the broker and its port are kept."""
    from .stack import up as stack_up

    result = stack_up(_settings(ctx), workers=workers, port=port, force=force)
    if result.already_running:
        verb = "already running"
    elif "broker" in result.started:
        verb = "started"
    else:
        verb = f"restarted {', '.join(result.started)} (broker kept)"
    click.echo(f"perftracker stack {verb}: broker {result.state.bootstrap}, "
               f"{len(result.state.worker_pids)} worker(s), query API {result.state.query_url or '-'}")


@cli.command()
@click.pass_context
def down(ctx: click.Context) -> None:
    """Stop what `up` started (data is kept)."""
    from .stack import down as stack_down

    stopped = stack_down(_settings(ctx))
    click.echo("stopped: " + ", ".join(stopped) if stopped else "perftracker stack was not running")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--job", default=None,
              help="A job's ranks instead: expected (its world size) vs reporting, the missing ones named.")
@click.option("--recent", "recent_s", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="With --job: a rank whose last event is more than this many seconds older "
                   "than the job's newest is missing.")
@click.pass_context
def status(ctx: click.Context, as_json: bool, job: str | None, recent_s: float) -> None:
    """Show whether the embedded stack runs, and each process's health; with --job, which of
    the job's ranks report (exit status 1 when some are missing)."""
    if job is not None:
        _job_status(_settings(ctx), job, recent_s, as_json)
        return
    from .stack import status as stack_status

    info = stack_status(_settings(ctx))
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for line in format_status(info):
            click.echo(line)
    if not info["running"]:  # the same exit status in both modes
        sys.exit(EXIT_RUNTIME)


@needs_server()  # only when it opens chDB itself (no running sink): the import names the extra
def _job_status(settings: Settings, job: str, recent_s: float, as_json: bool) -> None:
    from .job_status import fetch_job_ranks
    from .output import format_job_ranks

    ranks = fetch_job_ranks(settings, job, recent_s)
    if as_json:
        click.echo(json.dumps(ranks.as_dict(), indent=2))
    else:
        for line in format_job_ranks(ranks):
            click.echo(line)
    if ranks.missing or not ranks.world_size:
        sys.exit(EXIT_RUNTIME)


@cli.command()
@click.pass_context
@needs_server(*WORKER)
def worker(ctx: click.Context) -> None:
    """Run one production stream worker (Faust) in the foreground.
    With the embedded stack running, it joins it (`status` shows it, `down` stops it)."""
    from ..streams.worker import run_worker
    from .members import worker_member

    with worker_member(_settings(ctx)) as settings:
        run_worker(settings)


@cli.command()
@click.option("--ready-file", type=click.Path(path_type=Path), default=None,
              help="Write the query API address here once serving.")
@click.pass_context
@needs_server("clickhouse_connect")
def sink(ctx: click.Context, ready_file: Path | None) -> None:
    """Run the store sink and alert dispatcher in the foreground.
    With the embedded stack running and its sink down, it becomes the stack's sink."""
    from ..sinks.service import run_sink
    from .members import sink_member

    with sink_member(_settings(ctx), ready_file) as ready:
        run_sink(_settings(ctx), ready_file=ready)


@cli.command()
@click.option("--job", required=True, help="Job id.")
@click.option("--json", "as_json", is_flag=True, help="JSON list, most costly first.")
@click.option("--explain", "explain", type=int, default=None, metavar="RANK",
              help="Why RANK was or was not named in the job's incidents (resolved ones included).")
@click.pass_context
@needs_server()  # only when it opens chDB itself (no running sink): the import names the extra
def diagnose(ctx: click.Context, job: str, as_json: bool, explain: int | None) -> None:
    """Current root causes of a job, most costly first."""
    from ..sinks.client import diagnose as fetch
    from .lookup import reading_store, require_job

    settings = _settings(ctx)
    with reading_store(settings):
        rows = fetch(settings, job, include_resolved=explain is not None)
        if not rows:
            require_job(settings, job)
    if explain is not None:
        from ..sinks.explain import explain_rank

        click.echo(explain_rank(job, explain, rows))
        return
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo(format_diagnosis(job, rows))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--job", default=None, help="Job id (default: the launcher's run id, or a new one).")
@click.option("--relay", is_flag=True, help="Run a relay on this host for the command's ranks: one Kafka "
              "message per flush for all of them (`perftracker relay`).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def launch(ctx: click.Context, job: str | None, relay: bool, command: tuple[str, ...]) -> None:
    """Run an unmodified training command (torchrun ... / python ...) with collectors attached."""
    from ..collectors.launch import run as run_launch

    sys.exit(run_launch(list(command), job, _settings(ctx), relay=relay))


@cli.command()
@click.option("--socket", "path", required=True, type=click.Path(dir_okay=False),
              help="The Unix socket the host's ranks send to (their PERFTRACKER_COLLECTOR_RELAY_SOCKET).")
@click.option("--host", default="", help="This host's name in the messages' keys (default: the hostname).")
@click.option("--linger-s", type=click.FloatRange(0.0, 5.0), default=0.2, show_default=True,
              help="How long the first message of a job waits for the host's other ranks.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve the relay's counters for Prometheus at http://127.0.0.1:PORT/metrics.")
@click.pass_context
def relay(ctx: click.Context, path: str, host: str, linger_s: float, metrics_port: int | None) -> None:
    """Relay the messages of this host's ranks to Kafka, one message per job and flush, until SIGTERM."""
    import socket as socket_mod

    from ..collectors.relay_server import RelayCounters, serve
    from ..schemas.metrics import MetricsServer, registry_of
    from ..schemas.stackfile import resolve_bootstrap

    settings = _settings(ctx)
    bootstrap = settings.collector.bootstrap_servers or resolve_bootstrap(settings)
    if not bootstrap:
        raise ConfigError("the relay needs a Kafka broker: set PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS or run "
                          "`perftracker up`")
    conf = {**settings.kafka.client_conf(), "bootstrap.servers": bootstrap}
    host = host or settings.collector.host or socket_mod.gethostname()
    counters = RelayCounters()
    server = None if metrics_port is None else MetricsServer(registry_of(counters, const_labels={"host": host}),
                                                             metrics_port)
    try:
        serve(path, conf, host, linger_s, counters=counters)
    finally:
        if server is not None:
            server.close()
    click.echo("perftracker relay: " + json.dumps(counters.snapshot()), err=True)


@cli.command()
@click.option("--fault", type=click.Choice(FAULTS), default="slow-dataloader", show_default=True,
              help="Fault injected on one rank ('none' for a clean run).")
@click.option("--ranks", type=int, default=4, show_default=True)
@click.option("--steps", type=int, default=900, show_default=True)
@click.option("--model", type=click.Choice(list(MODELS)), default="mlp", show_default=True,
              help="mlp: a small MLP under DDP; transformer: a GPT-style model, tensor parallel x FSDP2 "
                   "over a (dp, tp) mesh; transformer-pp: two pipeline stages x data parallel; "
                   "transformer-fsdp2: FSDP2 alone.")
@click.pass_context
@needs_server(*STACK, "rich")
def demo(ctx: click.Context, fault: str, ranks: int, steps: int, model: str) -> None:
    """Train for real (torchrun, gloo) with a fault injected on rank 2, and watch it diagnosed."""
    from .demo.runner import run_demo
    from .progress import progress_for

    with progress_for() as progress:
        result = run_demo(_settings(ctx), fault=fault, ranks=ranks, steps=steps, echo=progress.echo,
                          phase=progress.phase, model=model)
    click.echo(format_diagnosis(result.job, result.rows))
    verdict = "correct" if result.culprit_correct else "NOT the injected fault"
    detect = f" in {result.seconds_to_detect:.1f} s" if result.seconds_to_detect is not None else ""
    click.echo(f"\ninjected {fault} on rank {result.fault_rank}: diagnosis {verdict}{detect}; "
               f"demo took {result.seconds_total:.0f} s")
    for label, path in (("HTML report", result.report_html), ("JSON diagnosis", result.report_json)):
        if path:
            click.echo(f"{label}: {printable(path)}")


@cli.command()
@click.option("--job", default=None, help="Job id (default: synth-<time>).")
@click.option("--ranks", type=int, default=8, show_default=True)
@click.option("--seconds", type=float, default=30.0, show_default=True, help="Simulated seconds of training.")
@click.option("--slow-rank", type=int, default=5, show_default=True, help="-1 for no fault.")
@click.option("--function", "slow_function", default="forward", show_default=True,
              type=click.Choice(["dataloader", "forward", "backward", "optimizer"]))
@click.option("--slowdown", type=float, default=1.4, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True)
@click.pass_context
@needs_server(*STACK)
def synth(ctx: click.Context, job: str | None, ranks: int, seconds: float, slow_rank: int,
          slow_function: str, slowdown: float, timeout_s: float) -> None:
    """Send a synthetic data-parallel job (no torch needed) through the stack and print its diagnosis."""
    import time

    from .synth_cmd import run_synthetic
    from .workloads.synthetic import SyntheticJob

    if not 2 <= ranks <= 4096 or slow_rank >= ranks:
        raise click.BadParameter("need 2..4096 ranks and --slow-rank below --ranks")
    cfg = SyntheticJob(job or f"synth-{int(time.time())}", ranks=ranks, seconds=seconds,
                       slow_rank=slow_rank, slow_function=slow_function, slowdown=slowdown)
    rows = run_synthetic(_settings(ctx), cfg, timeout_s, _echo_line)
    click.echo(format_diagnosis(cfg.job, rows))


@cli.command()
@click.option("--job", required=True, help="Job id.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="HTML file to write.")
@click.pass_context
@needs_server()  # only when it opens chDB itself (no running sink): the import names the extra
def report(ctx: click.Context, job: str, out: Path) -> None:
    """Self-contained HTML report of a job (and its JSON diagnosis beside it)."""
    from ..sinks.report import json_path_for, write_report
    from .lookup import reading_store, require_job

    settings = _settings(ctx)
    with reading_store(settings):
        require_job(settings, job)
        path = write_report(settings, job, out)
    click.echo(f"HTML report: {printable(path)}\nJSON diagnosis: {printable(json_path_for(path))}")


@cli.command()
@click.option("--job", default=None, help="Job id (required unless --spool holds one job).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Recording to write (.ptrec).")
@click.option("--spool", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Read the files collectors wrote with PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=spool:DIR "
                   "instead of Kafka.")
@click.option("--follow", is_flag=True,
              help="The job is running: read on until it has been silent for --idle-s.")
@click.option("--idle-s", type=click.FloatRange(min=1.0), default=20.0, show_default=True,
              help="With --follow: stop once the job sent nothing for this long.")
@click.option("--wait-s", type=click.FloatRange(min=1.0), default=120.0, show_default=True,
              help="With --follow: give up when the job sent nothing by then.")
@click.option("--note", default="", help="Free text kept in the recording (how the run was made).")
@click.pass_context
def record(ctx: click.Context, job: str | None, out: Path, spool: Path | None, follow: bool, idle_s: float,
           wait_s: float, note: str) -> None:
    """Save a job's input messages exactly as they arrived (a running job with --follow, else what
    the topics still retain, or a spool directory), to replay with `perftracker replay`."""
    from .record import RecordOptions, record_job, record_spool

    if spool is not None:
        name, n = record_spool(spool, out, job, note)
        click.echo(f"recorded {n} messages of {printable(name)} from the spool into {printable(out)}")
        return
    if job is None:
        raise click.UsageError("--job is required when reading Kafka")
    options = RecordOptions(job=job, follow=follow, idle_s=idle_s, wait_s=wait_s, note=note)
    n = record_job(_settings(ctx), out, options, _echo_line)
    click.echo(f"recorded {n} messages of {printable(job)} into {printable(out)}")


@cli.command()
@click.argument("path", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Every Anomaly record emitted, in order (JSON lines).")
@click.pass_context
def replay(ctx: click.Context, path: Path, as_json: bool) -> None:
    """Diagnose a recording through the stream topology on its recorded clock (no stack needed)."""
    from ..schemas.recording import Recording
    from ..streams.detect import DetectionPolicy
    from ..streams.replay import replay as run_replay

    settings = _settings(ctx)
    rec = Recording(path)
    result = run_replay(rec.messages(), DetectionPolicy.from_settings(settings.detection, settings.streams))
    if as_json:
        sys.stdout.buffer.write(result.canonical())
        return
    click.echo(f"{printable(rec.header.job)}: {result.messages} messages, {result.records} records replayed"
               + (f", {sum(result.rejected.values())} rejected" if result.rejected else ""))
    last = {a["incident_id"]: a for a in result.anomalies}
    if not last:
        click.echo("no incident")
    for a in last.values():
        click.echo(printable(f"{a['status']:<9}{a['cause']:<22}ranks {a['ranks']}: {a['summary']}"))


@cli.command("import-traces")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--job", required=True, help="Job id to report the traces under.")
@click.option("--json", "as_json", is_flag=True, help="JSON list, most costly first.")
@click.option("--no-store", is_flag=True, help="Diagnose only: keep nothing in the store.")
@click.pass_context
@needs_server("numpy", "rich")
def import_traces_cmd(ctx: click.Context, path: Path, job: str, as_json: bool, no_store: bool) -> None:
    """Diagnose PyTorch profiler (Kineto) traces of many ranks with the same detection, and keep
    the result in the store (through the running stack's sink, else in the data dir's chDB) so
    that `diagnose` and `report` read the job afterwards."""
    from .progress import progress_for
    from .trace_import import run_import, stored_lines

    settings = _settings(ctx)
    # the importer's offline policy (one window, persistence 1, a p-value reachable in one step)
    with progress_for(as_json) as progress:
        outcome = run_import(settings, path, job, progress, store=not no_store)
    notes = stored_lines(outcome, settings, job)
    if as_json:
        click.echo(json.dumps(outcome.rows, indent=2, default=str))
        for line in notes:
            click.echo(printable(line), err=True)
        return
    report = outcome.report
    click.echo(f"imported {len(report.batches)} rank trace(s) from {printable(path)}; "
               f"skipped {len(report.skipped_files)} file(s), {sum(report.skipped_events.values())} event(s)")
    for skip in report.skipped_files:
        click.echo(f"  skipped {printable(skip)}")
    click.echo(format_diagnosis(job, outcome.rows))
    for line in notes:
        click.echo(printable(line))


@cli.group()
def grafana() -> None:
    """Grafana dashboards, datasource and alert rules."""


@grafana.command("push")
@click.option("--url", required=True, type=HttpUrl(),
              help="Grafana base URL, e.g. https://grafana.example.com")
@click.option("--token-file", type=click.Path(path_type=Path), default=None,
              help="File holding the API token (default: $PERFTRACKER_GRAFANA_TOKEN).")
@needs_server(*GRAFANA)
def grafana_push(url: str, token_file: Path | None) -> None:
    """Upload datasource, folder, dashboards and alert rules (idempotent)."""
    import os

    from ..grafana.push import push, read_token

    for line in push(url, read_token(os.environ, token_file)):
        click.echo(printable(line))


@cli.command("config")
@click.option("--json", "as_json", is_flag=True,
              help="JSON list: setting, env, type, default, value, source, range, doc.")
@click.pass_context
def show_config(ctx: click.Context, as_json: bool) -> None:
    """Print every setting's value in effect, where it came from (default, the config file, the
    environment), its allowed range and its doc (secrets masked)."""
    from .config_view import config_json, config_text, print_config_table

    rows = setting_rows(_settings(ctx), ctx.obj["sources"])
    if as_json:
        click.echo(config_json(rows))
    elif not print_config_table(rows):  # no rich: the slim install
        for line in config_text(rows):
            click.echo(line)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one clear line instead of a traceback for every expected error; configured
    secrets masked in every log line, error and traceback (:func:`install_redaction`)."""
    install_redaction()
    try:
        code = cli.main(args=argv, prog_name="perftracker", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("perftracker: interrupted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except PerftrackerError as exc:
        click.echo(f"perftracker: error: {printable(redact_configured(str(exc)))}", err=True)
        sys.exit(EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_RUNTIME)
    if isinstance(code, int) and code:  # ctx.exit(code), e.g. from --version or --help
        sys.exit(code)


if __name__ == "__main__":
    main()
