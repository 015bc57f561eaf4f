import subprocess
import sys

import pytest
from perftracker_ml.collectors.bootstrap import (
    SITECUSTOMIZE,
    is_launcher,
    should_attach,
    slurm_task,
)
from perftracker_ml.collectors.identity import identity_from_env
from perftracker_ml.collectors.launch import (
    LaunchRefused,
    Route,
    job_from_command,
    per_task_form,
    route,
)

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
    assert is_launcher(["/venv/bin/python", "/venv/bin/perftracker", "launch", "--", "python", "t.py"])
    assert is_launcher(["python", "-m", "perftracker_ml.deploy.cli", "launch"])


SLURM_TASK = {**BASE, "SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "77"}


def test_srun_tasks_attach_on_any_node_but_not_the_batch_script_or_a_per_task_launch():
    # a task of `perftracker launch -- srun ...` on another node: its parent is slurmstepd
    assert slurm_task(SLURM_TASK) and should_attach(SLURM_TASK, pid=500, ppid=499, cmdline=["python", "t.py"])
    for step in ("batch", "extern", "4294967294", ""):
        env = {**SLURM_TASK, "SLURM_STEP_ID": step}
        assert not slurm_task(env) and not should_attach(env, pid=500, ppid=499, cmdline=["python", "t.py"])
    # `srun perftracker launch -- python t.py` under an outer launch: the per-task launch is not a rank
    assert not should_attach(SLURM_TASK, pid=500, ppid=499,
                             cmdline=["/v/bin/python", "/v/bin/perftracker", "launch", "--", "python", "t.py"])
    # `srun torchrun ...`: the agent never, its workers (RANK) do
    assert not should_attach(SLURM_TASK, pid=500, ppid=499, cmdline=["torchrun", "t.py"])
    assert should_attach({**SLURM_TASK, "RANK": "5"}, pid=501, ppid=500, cmdline=["python", "t.py"])


def test_rank_identity_from_torchrun_slurm_and_mpi_variables():
    def who(**env):
        i = identity_from_env("j", env, host="h")
        return i.rank, i.local_rank, i.world_size

    assert who(RANK="3", LOCAL_RANK="1", WORLD_SIZE="8", SLURM_PROCID="0", SLURM_NTASKS="2") == (3, 1, 8)
    assert who(SLURM_PROCID="1", SLURM_LOCALID="1", SLURM_NTASKS="2") == (1, 1, 2)
    assert who(OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_SIZE="4") == (2, 0, 4)
    assert who(PMI_RANK="5", PMI_SIZE="6") == (5, 0, 6)
    assert who(RANK="x", SLURM_PROCID="4") == (4, 0, 1)
    assert who() == (0, 0, 1)


def test_local_commands_attach_through_the_pth_else_a_written_sitecustomize():
    for command in (["python", "t.py"], ["torchrun", "--nproc-per-node", "4", "t.py"], ["bash", "run.sh"]):
        assert route(command, {}, pth=True, job="") == Route(remote=False, sitecustomize=False)
        assert route(command, {}, pth=False, job="") == Route(remote=False, sitecustomize=True)


def test_srun_attaches_every_task_through_the_installed_pth():
    assert route(["srun", "-n", "2", "python", "t.py"], {}, pth=True, job="") == Route(remote=True, sitecustomize=False)
    assert route(["/usr/bin/srun", "--export=ALL,X=1", "python", "t.py"], {}, pth=True, job="").remote
    assert route(["srun", "python", "t.py", "--export=NONE"], {}, pth=True, job="").remote  # the program's


def test_srun_without_the_pth_or_without_the_environment_is_refused_with_the_per_task_form():
    with pytest.raises(LaunchRefused, match="perftracker_ml_attach.pth") as no_pth:
        route(["srun", "-n", "2", "python", "t.py"], {}, pth=False, job="")
    assert "srun -n 2 perftracker launch -- python t.py" in str(no_pth.value)
    for command, env in ((["srun", "--export=NONE", "-n", "2", "python", "t.py"], {}),
                         (["srun", "--export", "HOME,PATH", "python", "t.py"], {}),
                         (["srun", "-n", "2", "python", "t.py"], {"SLURM_EXPORT_ENV": "NONE"})):
        with pytest.raises(LaunchRefused, match="does not pass perftracker's environment"):
            route(command, env, pth=True, job="")


@pytest.mark.parametrize("command, shown", [
    (["mpirun", "-n", "4", "python", "train.py"], "mpirun -n 4 perftracker launch --job j1 -- python train.py"),
    (["mpiexec", "-f", "hosts", "./train.py"], "mpiexec -f hosts perftracker launch --job j1 -- ./train.py"),
    (["ssh", "node2", "torchrun", "--nnodes", "2", "t.py"],
     "ssh node2 perftracker launch --job j1 -- torchrun --nnodes 2 t.py"),
    (["pdsh", "-w", "n[1-4]", "python3", "t.py"], "pdsh -w 'n[1-4]' perftracker launch --job j1 -- python3 t.py"),
    (["clush", "-w", "n1", "./run.sh"], "clush <its options> perftracker launch --job j1 -- python train.py"),
])
def test_launchers_that_do_not_pass_the_environment_are_refused_showing_the_form_that_works(command, shown):
    with pytest.raises(LaunchRefused) as refused:
        route(command, {}, pth=True, job="j1")
    assert shown in str(refused.value) and "on each host" in str(refused.value)


def test_the_per_task_form_names_one_job_for_every_host():
    assert per_task_form(["ssh", "n2", "torchrun", "--rdzv-id", "r9", "t.py"], "") == \
        "ssh n2 perftracker launch --job r9 -- torchrun --rdzv-id r9 t.py"
    fresh = per_task_form(["mpirun", "python", "t.py"], "")
    assert fresh.startswith("mpirun perftracker launch --job job-") and fresh.endswith(" -- python t.py")
    assert per_task_form(["srun", "python", "t.py"], "", name_job=False) == "srun perftracker launch -- python t.py"


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
