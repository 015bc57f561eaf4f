"""The `perftracker` command line. Every command loads settings once and passes them down."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click

from ..schemas.errors import PerftrackerError
from ..schemas.logs import setup_logging
from ..schemas.settings import Settings
from ..schemas.settings_loader import describe_settings, load_settings
from .demo.runner import FAULTS


def _settings(ctx: click.Context) -> Settings:
    return ctx.obj["settings"]


@click.group()
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="TOML or YAML config file (default: $PERFTRACKER_CONFIG, ./perftracker.toml|yaml).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="State, logs and chDB data of the embedded stack (default .perftracker).")
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None, data_dir: Path | None) -> None:
    """perftracker: find the rank, function and cause slowing a distributed training job."""
    settings = load_settings(config_path)
    if data_dir is not None:
        settings = dataclasses.replace(settings, data_dir=data_dir)
    setup_logging(settings, "cli", to_file=False)  # `worker` and `sink` add their log file
    ctx.obj = {"settings": settings}


@cli.command()
@click.option("--workers", type=int, default=None, help="Faust worker processes (default from config: 1).")
@click.option("--port", type=int, default=None, help="Broker port on 127.0.0.1 (default: a free port).")
@click.pass_context
def up(ctx: click.Context, workers: int | None, port: int | None) -> None:
    """Start the embedded stack (tansu broker, sink on chDB, stream workers) in the background."""
    from .stack import up as stack_up

    result = stack_up(_settings(ctx), workers=workers, port=port)
    verb = "already running" if result.already_running else "started"
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
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show whether the embedded stack runs, and each process's health."""
    from .stack import status as stack_status

    info = stack_status(_settings(ctx))
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    if "broker" not in info:
        click.echo(f"perftracker stack is not running (data dir {info['data_dir']})")
        sys.exit(1)
    click.echo(f"running: {info['running']}  data dir: {info['data_dir']}")
    b, s = info["broker"], info["sink"]
    click.echo(f"  broker  pid {b['pid']:>7}  {'up' if b['alive'] else 'DOWN'}  {b['bootstrap']}")
    click.echo(f"  sink    pid {s['pid']:>7}  {'up' if s['alive'] else 'DOWN'}  {s['query_url']}")
    for w in info["workers"]:
        assigned = len((w.get("stats") or {}).get("assigned", []))
        click.echo(f"  worker  pid {w['pid']:>7}  {'up' if w['alive'] else 'DOWN'}  {assigned} partitions")
    if not info["running"]:
        sys.exit(1)


@cli.command()
@click.pass_context
def worker(ctx: click.Context) -> None:
    """Run one production stream worker (Faust) in the foreground."""
    from ..streams.worker import run_worker

    run_worker(_settings(ctx))


@cli.command()
@click.option("--ready-file", type=click.Path(path_type=Path), default=None,
              help="Write the query API address here once serving.")
@click.pass_context
def sink(ctx: click.Context, ready_file: Path | None) -> None:
    """Run the store sink and alert dispatcher in the foreground."""
    from ..sinks.service import run_sink

    run_sink(_settings(ctx), ready_file=ready_file)


@cli.command()
@click.option("--job", required=True, help="Job id.")
@click.option("--json", "as_json", is_flag=True, help="JSON list, most costly first.")
@click.pass_context
def diagnose(ctx: click.Context, job: str, as_json: bool) -> None:
    """Current root causes of a job, most costly first."""
    from ..sinks.client import diagnose as fetch

    rows = fetch(_settings(ctx), job)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo(format_diagnosis(job, rows))


def format_diagnosis(job: str, rows: list[dict[str, Any]]) -> str:
    """A table an on-call engineer reads at 3 a.m.: one line per root cause, then its summary."""
    if not rows:
        return f"job {job}: no anomaly found"
    lines = [f"job {job}: {len(rows)} root cause(s), most costly first",
             f"{'cause':<22}{'ranks':<12}{'hosts':<18}{'function':<34}{'ms/step':>9}{'score':>8}"]
    for r in rows:
        ranks = ",".join(str(x) for x in r.get("ranks", []))[:11]
        hosts = ",".join(r.get("hosts", []))[:17]
        lines.append(f"{r['cause']:<22}{ranks:<12}{hosts:<18}{str(r['function'])[:33]:<34}"
                     f"{r['impact_ms_per_step']:>9.1f}{r['score']:>8.1f}")
        if r.get("summary"):
            lines.append(f"    {r['summary']}")
    return "\n".join(lines)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--job", default=None, help="Job id (default: the launcher's run id, or a new one).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def launch(ctx: click.Context, job: str | None, command: tuple[str, ...]) -> None:
    """Run an unmodified training command (torchrun ... / python ...) with collectors attached."""
    from ..collectors.launch import run as run_launch

    sys.exit(run_launch(list(command), job, _settings(ctx)))


@cli.command()
@click.option("--fault", type=click.Choice(FAULTS), default="slow-dataloader", show_default=True,
              help="Fault injected on one rank ('none' for a clean run).")
@click.option("--ranks", type=int, default=4, show_default=True)
@click.option("--steps", type=int, default=600, show_default=True)
@click.pass_context
def demo(ctx: click.Context, fault: str, ranks: int, steps: int) -> None:
    """Train for real (torchrun, gloo) with a fault injected on rank 2, and watch it diagnosed."""
    from .demo.runner import run_demo

    result = run_demo(_settings(ctx), fault=fault, ranks=ranks, steps=steps, echo=click.echo)
    click.echo(format_diagnosis(result.job, result.rows))
    verdict = "correct" if result.culprit_correct else "NOT the injected fault"
    detect = f" in {result.seconds_to_detect:.1f} s" if result.seconds_to_detect is not None else ""
    click.echo(f"\ninjected {fault} on rank {result.fault_rank}: diagnosis {verdict}{detect}; "
               f"demo took {result.seconds_total:.0f} s")
    for label, path in (("HTML report", result.report_html), ("JSON diagnosis", result.report_json)):
        if path:
            click.echo(f"{label}: {path}")


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
def synth(ctx: click.Context, job: str | None, ranks: int, seconds: float, slow_rank: int,
          slow_function: str, slowdown: float, timeout_s: float) -> None:
    """Send a synthetic data-parallel job (no torch needed) through the stack and print its diagnosis."""
    import time

    from .synth_cmd import run_synthetic
    from .synthetic import SyntheticJob

    if not 2 <= ranks <= 4096 or slow_rank >= ranks:
        raise click.BadParameter("need 2..4096 ranks and --slow-rank below --ranks")
    cfg = SyntheticJob(job or f"synth-{int(time.time())}", ranks=ranks, seconds=seconds,
                       slow_rank=slow_rank, slow_function=slow_function, slowdown=slowdown)
    rows = run_synthetic(_settings(ctx), cfg, timeout_s, click.echo)
    click.echo(format_diagnosis(cfg.job, rows))


@cli.command()
@click.option("--job", required=True, help="Job id.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="HTML file to write.")
@click.pass_context
def report(ctx: click.Context, job: str, out: Path) -> None:
    """Self-contained HTML report of a job (and its JSON diagnosis beside it)."""
    from ..sinks.report import json_path_for, write_report

    path = write_report(_settings(ctx), job, out)
    click.echo(f"HTML report: {path}\nJSON diagnosis: {json_path_for(path)}")


@cli.command("import-traces")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--job", required=True, help="Job id to report the traces under.")
@click.option("--json", "as_json", is_flag=True, help="JSON list, most costly first.")
@click.pass_context
def import_traces_cmd(ctx: click.Context, path: Path, job: str, as_json: bool) -> None:
    """Diagnose PyTorch profiler (Kineto) traces of many ranks with the same detection."""
    from ..streams.traces.importer import import_traces_with_report

    # the importer's offline policy (one window, persistence 1, a p-value reachable in one step)
    rows, report = import_traces_with_report(path, job, None)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo(f"imported {len(report.batches)} rank trace(s) from {path}; "
               f"skipped {len(report.skipped_files)} file(s), {sum(report.skipped_events.values())} event(s)")
    for skip in report.skipped_files:
        click.echo(f"  skipped {skip}")
    click.echo(format_diagnosis(job, rows))


@cli.group()
def grafana() -> None:
    """Grafana dashboards, datasource and alert rules."""


@grafana.command("push")
@click.option("--url", required=True, help="Grafana base URL, e.g. https://grafana.example.com")
@click.option("--token-file", type=click.Path(path_type=Path), default=None,
              help="File holding the API token (default: $PERFTRACKER_GRAFANA_TOKEN).")
def grafana_push(url: str, token_file: Path | None) -> None:
    """Upload datasource, folder, dashboards and alert rules (idempotent)."""
    import os

    from ..grafana.push import push, read_token

    for line in push(url, read_token(os.environ, token_file)):
        click.echo(line)


@cli.command("config")
@click.pass_context
def show_config(ctx: click.Context) -> None:
    """Print every setting with its environment variable, default and doc (secrets masked)."""
    for env_name, typ, default, doc in describe_settings():
        click.echo(f"{env_name:<48}{typ:<8}{default:<28}{doc}")


def main(argv: list[str] | None = None) -> None:
    """Entry point: one clear line instead of a traceback for every expected error."""
    try:
        cli.main(args=argv, prog_name="perftracker", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("perftracker: interrupted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except PerftrackerError as exc:
        click.echo(f"perftracker: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("perftracker: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
