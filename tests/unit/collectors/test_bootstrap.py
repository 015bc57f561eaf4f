import subprocess
import sys

from perftracker_ml.collectors.bootstrap import SITECUSTOMIZE, is_launcher, should_attach
from perftracker_ml.collectors.launch import job_from_command

BASE = {"PERFTRACKER_COLLECTOR_ATTACH": "1", "PERFTRACKER_COLLECTOR_LAUNCHER_PID": "10"}


def test_attaches_in_ranks_and_direct_python_children_only():
    assert should_attach({**BASE, "RANK": "3"}, pid=50, ppid=20, cmdline=["python", "train.py"])
    assert should_attach(BASE, pid=11, ppid=10, cmdline=["python", "train.py"])
    assert not should_attach(BASE, pid=11, ppid=10, cmdline=["/usr/bin/torchrun", "x.py"])
    assert not should_attach(BASE, pid=11, ppid=10, cmdline=["python", "-m", "torch.distributed.run"])
    assert not should_attach(BASE, pid=12, ppid=99, cmdline=["python", "helper.py"])
    child_of_rank = {**BASE, "RANK": "0", "PERFTRACKER_COLLECTOR_ATTACHED_PID": "50"}
    assert not should_attach(child_of_rank, pid=77, ppid=50, cmdline=["python", "-c", "x"])
    assert not should_attach({"RANK": "0"}, pid=1, ppid=10, cmdline=["python"])


def test_is_launcher():
    assert is_launcher(["torchrun", "--nproc-per-node", "4", "t.py"])
    assert not is_launcher(["python", "t.py", "torchrun"][:2])


def test_job_from_command():
    assert job_from_command(["torchrun", "--rdzv-id", "abc", "t.py"], {}) == "abc"
    assert job_from_command(["torchrun", "--rdzv_id=xyz", "t.py"], {}) == "xyz"
    assert job_from_command(["python", "t.py"], {"TORCHELASTIC_RUN_ID": "r1"}) == "r1"
    assert job_from_command(["python", "t.py"], {"SLURM_JOB_ID": "4711"}) == "4711"
    assert job_from_command(["python", "t.py"], {"TORCHELASTIC_RUN_ID": "none"}) == ""
    assert job_from_command(["python", "t.py"], {}) == ""  # the ranks agree on rank 0's id


def test_user_sitecustomize_still_runs(tmp_path):
    boot, user = tmp_path / "boot", tmp_path / "user"
    boot.mkdir()
    user.mkdir()
    (boot / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (user / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    out = subprocess.run([sys.executable, "-c", "import builtins; print(builtins.USER_SITE_RAN)"],
                         env={"PYTHONPATH": f"{boot}:{user}", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
