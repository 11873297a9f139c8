"""AWS job completion: the user-data script a job's VM runs (built, then run with ``sh`` here), the console
parser, and the adapter reading a VM's end from ``GetConsoleOutput`` against moto in server mode."""

from __future__ import annotations

import base64
import dataclasses
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest

from broker.errors import InvalidRequestError
from broker.model import CheckpointSpec, InstanceState
from providers.aws import (
    CONSOLE_READS,
    CONSOLES,
    USER_DATA_MAX_BYTES,
    AwsProvider,
    completion_script,
    parse_exit_code,
)
from providers.base import TAG_JOB
from providers.bootstrap import TIMEOUT_EXIT_CODE, job_script, parse_report, runtime_limit_seconds, script_for

from .builders import make_job, make_offer
from .faultproxy import FaultProxy, ec2_call, ec2_console_output

REGION = "us-east-1"
SH = shutil.which("sh") or ""


# -- the script ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptCase:
    id: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    exit_code: int = 0
    stdout: str = ""  # what the command writes to ./out.txt (in its working directory)


SCRIPT_CASES = [
    ScriptCase("arguments with spaces and both quote kinds reach the command unchanged",
               ("sh", "-c", 'printf "%s|%s" "$1" "$2" > out.txt', "x", "a b 'c'", 'd "e" $HOME `f`'),
               stdout="a b 'c'|d \"e\" $HOME `f`"),
    ScriptCase("env values with spaces, quotes and dollars reach the command",
               ("sh", "-c", 'printf "%s/%s" "$GREETING" "$B" > out.txt'),
               env={"GREETING": "hello 'big' \"world\"", "B": "$(echo no) ;x"},
               stdout="hello 'big' \"world\"/$(echo no) ;x"),
    ScriptCase("a non-zero exit code is reported", ("sh", "-c", "echo ran > out.txt; exit 3"), exit_code=3,
               stdout="ran\n"),
    ScriptCase("exit code 255 is reported", ("sh", "-c", "exit 255"), exit_code=255),
    ScriptCase("a command that is not found reports 127", ("hb-no-such-command-xyz",), exit_code=127),
]


@pytest.mark.skipif(not SH, reason="no sh on PATH to run the generated script with")
@pytest.mark.parametrize("case", SCRIPT_CASES, ids=[c.id for c in SCRIPT_CASES])
def test_the_generated_script_runs_the_command_reports_its_exit_code_then_powers_off(
    case: ScriptCase, tmp_path: Path
) -> None:
    workdir = tmp_path / "job dir 'w'"
    console = tmp_path / "console"
    marker = tmp_path / "poweroff"
    # the second console cannot be opened: its error is ignored, like a missing /dev/ttyS0
    script = completion_script(case.command, case.env, str(workdir),
                               consoles=(str(console), str(tmp_path / "missing" / "tty")),
                               poweroff=f'echo "off $(cat {console})" > {marker}')
    assert script.rstrip("\n").splitlines()[-1].startswith("echo \"off")  # poweroff is the last step
    proc = subprocess.run([SH, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    report = parse_report(console.read_text())
    assert report.exit_code == case.exit_code
    assert console.read_text().endswith(f"HB-EXIT-CODE={case.exit_code}\n")
    assert marker.read_text().endswith(f"HB-EXIT-CODE={case.exit_code}\n")  # console written before poweroff
    if case.stdout:
        assert (workdir / "out.txt").read_text() == case.stdout


@pytest.mark.skipif(not SH, reason="no sh on PATH to run the generated script with")
def test_without_a_workdir_the_command_runs_in_a_fresh_directory_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "pwd.txt"
    script = completion_script(("sh", "-c", f"pwd > {out}"), consoles=(str(tmp_path / "c"),), poweroff=":")
    subprocess.run([SH, "-c", script], cwd=tmp_path, check=True, timeout=30)
    ran_in = Path(out.read_text().strip())
    try:
        assert ran_in.name.startswith("hb-job.") and ran_in != tmp_path and ran_in.is_dir()
    finally:
        shutil.rmtree(ran_in, ignore_errors=True)


@pytest.mark.skipif(not SH, reason="no sh on PATH to run the generated script with")
def test_a_workdir_that_cannot_be_entered_reports_125_without_running_the_command(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ran = tmp_path / "ran"
    script = completion_script(("touch", str(ran)), workdir=str(blocker / "sub"),
                               consoles=(str(tmp_path / "c"),), poweroff=":")
    subprocess.run([SH, "-c", script], cwd=tmp_path, check=True, timeout=30, capture_output=True)
    assert parse_exit_code((tmp_path / "c").read_text()) == 125 and not ran.exists()


@pytest.mark.skipif(not SH, reason="no sh on PATH to run the generated script with")
def test_the_log_tail_of_stdout_and_stderr_is_reported_base64_so_it_cannot_fake_a_code(tmp_path: Path) -> None:
    console = tmp_path / "c"
    cmd = ("sh", "-c", "for i in 1 2 3; do echo line-$i; done; echo HB-EXIT-CODE=0; echo oops >&2; exit 4")
    script = job_script(cmd, consoles=(str(console),), poweroff=":", log_tail_bytes=40)
    subprocess.run([SH, "-c", script], cwd=tmp_path, check=True, timeout=30)
    report = parse_report(console.read_text())
    assert report.exit_code == 4  # the job printing the marker does not count: its output is base64
    assert report.log_tail.endswith("line-3\nHB-EXIT-CODE=0\noops\n") and "line-1" not in report.log_tail


@pytest.mark.skipif(not SH or not shutil.which("timeout"), reason="no sh/timeout on PATH")
def test_a_job_over_its_runtime_limit_is_stopped_with_code_124(tmp_path: Path) -> None:
    console = tmp_path / "c"
    script = job_script(("sleep", "30"), consoles=(str(console),), poweroff=":", runtime_limit_seconds=1)
    subprocess.run([SH, "-c", script], cwd=tmp_path, check=True, timeout=30)
    assert parse_exit_code(console.read_text()) == TIMEOUT_EXIT_CODE


@pytest.mark.skipif(not SH, reason="no sh on PATH to run the generated script with")
def test_hb_consoles_in_the_environment_redirects_the_report(tmp_path: Path) -> None:
    console = tmp_path / "serial"
    script = job_script(("true",), poweroff=":")
    subprocess.run([SH, "-c", script], cwd=tmp_path, check=True, timeout=30,
                   env={"PATH": "/usr/bin:/bin", "HB_CONSOLES": str(console)})
    assert parse_exit_code(console.read_text()) == 0


def test_the_runtime_limit_defaults_to_twice_the_estimate_plus_an_hour() -> None:
    job = make_job("j", command=("true",))
    assert runtime_limit_seconds(job) == int((2 * job.request.duration_hours + 1) * 3600)
    assert runtime_limit_seconds(job, 0.5) == 1800


def test_the_default_script_reports_on_both_serial_consoles_and_powers_off() -> None:
    script = completion_script(("true",))
    assert script.startswith("#!/bin/sh\n") and script.rstrip("\n").splitlines()[-1] == "poweroff"
    assert all(c in script for c in CONSOLES)


BAD_SCRIPTS = [
    ("an empty command is refused", (), {}),
    ("an env name holding '=' is refused", ("true",), {"A=B": "1"}),
    ("an empty env name is refused", ("true",), {"": "1"}),
    ("a NUL byte is refused", ("echo", "a\0b"), {}),
    ("a script over EC2's user-data limit is refused", ("echo", "x" * USER_DATA_MAX_BYTES), {}),
]


@pytest.mark.parametrize(("command", "env"), [b[1:] for b in BAD_SCRIPTS], ids=[b[0] for b in BAD_SCRIPTS])
def test_bad_scripts_are_refused_with_a_fix(command: tuple[str, ...], env: dict[str, str]) -> None:
    with pytest.raises(InvalidRequestError, match="To fix"):
        completion_script(command, env)


PARSE_CASES = [
    ("no marker gives None", "Linux version 6.1\nreached target poweroff\n", None),
    ("one marker gives its code", "boot\nHB-EXIT-CODE=3\nreboot: Power down\n", 3),
    ("the last marker wins", "HB-EXIT-CODE=1\nHB-EXIT-CODE=0\n", 0),
    ("serial CRLF line ends are accepted", "x\r\nHB-EXIT-CODE=42\r\ny\r\n", 42),
    ("a marker inside a line does not count", "echo HB-EXIT-CODE=5\n", None),
    ("codes above 255 do not count", "HB-EXIT-CODE=300\n", None),
]


@pytest.mark.parametrize(("text", "want"), [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_console_parsing(text: str, want: int | None) -> None:
    assert parse_exit_code(text) == want


# -- against moto -------------------------------------------------------------------------------------------

pytest_moto = pytest.mark.network


@pytest.fixture
def aws(ec2_faults: FaultProxy) -> Iterator[AwsProvider]:
    yield AwsProvider([REGION], endpoint_url=ec2_faults.url, access_key="testing", secret_key="testing")


def _ec2(moto_endpoint: str):  # type: ignore[no-untyped-def]
    return boto3.client("ec2", endpoint_url=moto_endpoint, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def _launch(aws: AwsProvider, command: tuple[str, ...] = ("sh", "-c", "exit 3")) -> tuple[str, str]:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    job = make_job(job_id, command=command, env={"MODE": "a b"})
    [inst] = aws.launch(make_offer("aws", REGION, "m5.large", 0.096), 1, f"req-{job_id}", tags={TAG_JOB: job_id},
                        job=job)
    return job_id, inst.id


def _console_calls(faults: FaultProxy, instance_id: str) -> int:
    return sum(1 for c in faults.calls if c.action == "GetConsoleOutput" and c.param("InstanceId") == instance_id)


@pytest_moto
def test_a_launch_with_a_command_passes_the_script_and_terminate_on_shutdown(
    aws: AwsProvider, moto_endpoint: str
) -> None:
    _, iid = _launch(aws)
    ec2 = _ec2(moto_endpoint)
    data = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
    limit = runtime_limit_seconds(make_job("x", command=("true",)))
    assert base64.b64decode(data).decode() == completion_script(("sh", "-c", "exit 3"), {"MODE": "a b"},
                                                                runtime_limit_seconds=limit)
    behaviour = ec2.describe_instance_attribute(InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    aws.terminate([iid], "cleanup")


@pytest_moto
def test_a_launch_without_a_command_passes_no_user_data(aws: AwsProvider, moto_endpoint: str) -> None:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    [inst] = aws.launch(make_offer("aws", REGION, "m5.large", 0.096), 1, f"req-{job_id}", tags={TAG_JOB: job_id},
                        job=make_job(job_id))
    attr = _ec2(moto_endpoint).describe_instance_attribute(InstanceId=inst.id, Attribute="userData")
    assert not (attr.get("UserData") or {}).get("Value")
    aws.terminate([inst.id], "cleanup")


@pytest_moto
@pytest.mark.parametrize(
    ("end", "code", "state"),
    [("terminate_instances", 3, InstanceState.FAILED), ("stop_instances", 0, InstanceState.SUCCEEDED)],
    ids=["a VM that powered off (terminated) after exit 3 is FAILED with code 3",
         "a VM that powered off (stopped) after exit 0 is SUCCEEDED"],
)
def test_an_ended_vm_reports_the_exit_code_its_console_shows(
    aws: AwsProvider, ec2_faults: FaultProxy, moto_endpoint: str, end: str, code: int, state: InstanceState
) -> None:
    job_id, iid = _launch(aws)
    assert [i.state for i in aws.instances({TAG_JOB: job_id})] in ([InstanceState.PENDING], [InstanceState.RUNNING])
    assert _console_calls(ec2_faults, iid) == 0  # running instances cost no console call
    getattr(_ec2(moto_endpoint), end)(InstanceIds=[iid])  # the VM's own poweroff, as AWS shows it
    tail = base64.b64encode(b"epoch 3 loss 0.1\n").decode()
    ec2_faults.add(ec2_call("GetConsoleOutput", InstanceId=iid),
                   ec2_console_output(iid, f"[  OK  ] cloud-init\r\nHB-LOG-TAIL={tail}\r\nHB-EXIT-CODE={code}\r\n"
                                           "reboot: Power down\r\n"),
                   times=-1)
    [inst] = aws.instances({TAG_JOB: job_id})
    assert (inst.id, inst.state, inst.exit_code, inst.log_tail) == (iid, state, code, "epoch 3 loss 0.1\n")
    assert all(c.param("Latest") == "true" for c in ec2_faults.calls if c.action == "GetConsoleOutput")
    assert [i.state for i in aws.instances({TAG_JOB: job_id})] == [state]
    assert _console_calls(ec2_faults, iid) == 1  # cached per instance id
    aws.terminate([iid], "cleanup")
    assert [i.exit_code for i in aws.instances({TAG_JOB: job_id})] == [code]  # still the job's outcome


@pytest_moto
def test_an_instance_the_broker_terminated_stays_terminated_without_reading_its_console(
    aws: AwsProvider, ec2_faults: FaultProxy
) -> None:
    job_id, iid = _launch(aws)
    aws.terminate([iid], f"{job_id}:cancel")
    ec2_faults.add(ec2_call("GetConsoleOutput", InstanceId=iid), ec2_console_output(iid, "HB-EXIT-CODE=0\n"),
                   times=-1)
    [inst] = aws.instances({TAG_JOB: job_id})
    assert (inst.state, inst.exit_code) == (InstanceState.TERMINATED, None)
    assert _console_calls(ec2_faults, iid) == 0


@pytest_moto
def test_an_ended_vm_without_the_marker_is_believed_terminated_after_a_few_console_reads(
    aws: AwsProvider, ec2_faults: FaultProxy, moto_endpoint: str
) -> None:
    job_id, iid = _launch(aws)
    _ec2(moto_endpoint).terminate_instances(InstanceIds=[iid])  # e.g. reclaimed: moto's console has no marker
    # the console may lag the state: still ending for CONSOLE_READS - 1 reads, then believed, then cached
    states = [aws.instances({TAG_JOB: job_id})[0].state for _ in range(CONSOLE_READS + 1)]
    assert states == [InstanceState.RUNNING] * (CONSOLE_READS - 1) + [InstanceState.TERMINATED] * 2
    assert aws.instances({TAG_JOB: job_id})[0].exit_code is None
    assert _console_calls(ec2_faults, iid) == CONSOLE_READS


def test_rotating_credentials_reach_libcloud_without_a_restart() -> None:
    """Instance/task roles and SSO hand out keys that expire: boto3 refreshes them and the adapter's Libcloud
    driver is rebuilt with the new keys, instead of signing with the first frozen copy forever."""
    from datetime import timedelta

    from botocore.credentials import RefreshableCredentials

    issued = iter(range(1, 100))

    def refresh() -> dict[str, str]:
        n = next(issued)
        return {"access_key": f"AKIA{n:04d}", "secret_key": f"s{n}", "token": f"t{n}",
                "expiry_time": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}

    aws = AwsProvider([REGION], endpoint_url="http://127.0.0.1:9", access_key="x", secret_key="y")
    creds = RefreshableCredentials.create_from_metadata(refresh(), refresh, "test-role")
    aws._session._session._credentials = creds  # what boto3 builds for a role, SSO or assumed role
    first = aws._driver(REGION)
    assert first.key == "AKIA0001"
    assert aws._driver(REGION) is first  # same keys: the same driver
    creds._expiry_time = datetime.now(UTC) - timedelta(seconds=1)  # the role's keys expired
    again = aws._driver(REGION)
    assert again is not first and (again.key, again.secret) == ("AKIA0002", "s2")


@pytest.mark.skipif(not SH, reason="no sh on PATH to run the generated script with")
@pytest.mark.parametrize("cloud", ["aws", "azure", "gcp"])
def test_a_spot_interruption_notice_stops_the_job_to_checkpoint_and_is_reported(cloud: str, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    notice = tmp_path / "notice"
    curl = bin_dir / "curl"  # the metadata server: each cloud's interruption check succeeds once notice exists
    curl.write_text(f"#!/bin/sh\n[ -e '{notice}' ] || exit 22\necho TRUE\necho '\"Preempt\"'\n")
    curl.chmod(0o755)
    started = tmp_path / "started"
    job = make_job("spot", command=("sh", "-c", f'trap "echo saved to $HB_CHECKPOINT_PATH; exit 0" TERM; '
                                               f'touch {started}; while :; do sleep 0.1; done'))
    job = dataclasses.replace(job, checkpoint=CheckpointSpec("/ckpt"))
    script = script_for(job, cloud, max_bytes=USER_DATA_MAX_BYTES, spot=True)
    console = tmp_path / "console"
    proc = subprocess.Popen([SH, "-c", script.replace("\npoweroff\n", "\n:\n")], cwd=tmp_path,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HB_CONSOLES": str(console),
                                 "HB_INTERRUPT_POLL": "0.1", "TMPDIR": str(tmp_path)})
    for _ in range(200):  # bounded: until the job runs
        if started.exists():
            break
        time.sleep(0.05)
    notice.touch()
    assert proc.wait(timeout=30) == 0
    report = parse_report(console.read_text())
    assert report.preempted and report.exit_code == 0 and report.log_tail.endswith("saved to /ckpt\n")


def test_without_a_notice_a_spot_job_is_not_reported_preempted() -> None:
    assert not parse_report("HB-LOG-TAIL=\nHB-EXIT-CODE=0\n").preempted
    assert parse_report("HB-PREEMPTED=1\r\nHB-EXIT-CODE=143\r\n").preempted


# -- GPU VMs whose driver a VM extension installs after boot (Azure's NvidiaGpuDriverLinux)


def _gpu_env(tmp_path: Path, driver: bool) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n[ -e '{tmp_path / 'driver'}' ] || exit 9\n")
    smi.chmod(0o755)
    if driver:
        (tmp_path / "driver").touch()
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HB_GPU_POLL": "0.2", "HB_STATE_DIR": str(tmp_path / "state"),
            "HB_PER_BOOT_DIR": str(tmp_path / "per-boot"), "TMPDIR": str(tmp_path)}


@pytest.mark.skipif(not SH, reason="no sh on PATH to run the generated script with")
def test_without_a_working_gpu_driver_in_time_the_command_does_not_run_and_the_log_says_why(tmp_path: Path) -> None:
    console, ran = tmp_path / "c", tmp_path / "ran"
    script = tmp_path / "user-data"
    script.write_text(job_script(("touch", str(ran)), consoles=(str(console),), poweroff=":",
                                 wait_gpu_driver_seconds=1))
    subprocess.run([SH, str(script)], cwd=tmp_path, env=_gpu_env(tmp_path, driver=False), check=True, timeout=30)
    report = parse_report(console.read_text())
    assert report.exit_code == 125 and not ran.exists()
    assert "no working NVIDIA driver (nvidia-smi) after 1 s" in report.log_tail


@pytest.mark.skipif(not SH, reason="no sh on PATH to run the generated script with")
def test_a_reboot_while_waiting_for_the_driver_starts_the_job_again_and_it_runs_once(tmp_path: Path) -> None:
    console, runs = tmp_path / "c", tmp_path / "runs"
    script = tmp_path / "user-data"
    script.write_text(job_script(("sh", "-c", f"echo run >> {runs}"), consoles=(str(console),), poweroff=":",
                                 wait_gpu_driver_seconds=60))
    env = _gpu_env(tmp_path, driver=False)
    first = subprocess.Popen([SH, str(script)], cwd=tmp_path, env=env, start_new_session=True)
    per_boot = tmp_path / "per-boot" / "hb-job.sh"
    deadline = time.monotonic() + 10
    while not per_boot.exists():
        assert time.monotonic() < deadline, "the script did not install itself for the next boot"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the extension reboots the VM while the script waits
    first.wait()
    env = _gpu_env(tmp_path, driver=True)  # after the reboot the driver works; cloud-init runs per-boot scripts
    subprocess.run([SH, str(per_boot)], cwd=tmp_path, env=env, check=True, timeout=30)
    assert runs.read_text() == "run\n" and parse_exit_code(console.read_text()) == 0
    assert not per_boot.exists(), "it removed itself from per-boot once the job started"
    subprocess.run([SH, str(script)], cwd=tmp_path, env=env, check=True, timeout=30)  # a later boot
    assert runs.read_text() == "run\n", "never twice"
