"""The warm trainer (kiln_gpu.forkserver, docs/train-stage.md §8.1): a run
through it is a run of `python -m kiln_gpu.train`, a client that leaves
takes its run with it, and SIGTERM stops the server and its runs."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from planio import segment, write_plan

GPU_DIR = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not running: its server has not reaped it yet
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _wait(pred, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def server(tmp_path):
    path = str(tmp_path / "trainer.sock")
    env = {**os.environ, "PYTHONPATH": str(GPU_DIR)}
    p = subprocess.Popen([sys.executable, "-m", "kiln_gpu.forkserver", "--socket", path], env=env,
                         stderr=subprocess.PIPE, text=True)

    def up() -> bool:
        assert p.poll() is None, p.stderr.read()
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)  # a connection that asks nothing: the health check
            return True
        except OSError:
            return False
        finally:
            s.close()

    _wait(up, "the server's socket", 120)
    yield p, path
    if p.poll() is None:
        p.kill()
        p.wait()


def _plan(tmp_path: Path, tiny: Path, steps: int) -> Path:
    g = torch.Generator().manual_seed(0)
    step = [[segment(g, 1000, 6, 5, r, 1.0 if r % 2 else -1.0) for r in range(2)]]
    return write_plan(tmp_path / "batches", tiny, [step] * steps, tmp_path / "out", optimizer={"lr": 1e-4})


def _start(path: str, plan: Path, cwd: Path):
    """Sends one run; returns the connection, its stdout and stderr read
    ends, and the first reply."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    c = socket.socket(socket.AF_UNIX)
    c.connect(path)
    req = json.dumps({"plan": str(plan), "cwd": str(cwd), "env": {"KILN_TEST_MARK": "1"}}) + "\n"
    socket.send_fds(c, [req.encode()], [devnull, out_w, err_w])
    for fd in (devnull, out_w, err_w):
        os.close(fd)
    f = c.makefile("r")
    return c, f, os.fdopen(out_r), os.fdopen(err_r), json.loads(f.readline())


def test_a_run_is_the_module_run(server, tiny_checkpoint, tmp_path):
    _, path = server
    plan = _plan(tmp_path, tiny_checkpoint, 1)
    c, replies, out, err, first = _start(path, plan, tmp_path)
    assert first["pid"] > 0
    events = [json.loads(x) for x in out.read().splitlines()]
    err.read()
    assert json.loads(replies.readline()) == {"exit": 0}
    assert [e["event"] for e in events] == ["start", "step", "saved"]
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    # the same plan again is the trainer's own refusal, exit 2, not a crash
    replies.close()
    c.close()
    c, replies, out, err, first = _start(path, plan, tmp_path)
    out.read()
    assert "exists" in err.read()
    assert json.loads(replies.readline()) == {"exit": 2}


def test_bad_requests_are_refused_by_name(server, tmp_path):
    _, path = server
    c = socket.socket(socket.AF_UNIX)
    c.connect(path)
    c.sendall(b'{"plan": "/x/plan.json"}\n')  # no descriptors
    assert "want 3 file descriptors" in json.loads(c.makefile("r").readline())["error"]
    c.close()
    _, replies, _, _, first = _start(path, Path("relative/plan.json"), tmp_path)
    assert "ABSOLUTE_PATH" in first["error"]


def test_a_client_that_leaves_takes_its_run(server, tiny_checkpoint, tmp_path):
    p, path = server
    plan = _plan(tmp_path, tiny_checkpoint, 400)
    c, replies, out, err, first = _start(path, plan, tmp_path)
    pid = first["pid"]
    assert json.loads(out.readline())["event"] == "start"
    assert _alive(pid)
    replies.close()  # the socket closes with its last file object
    c.close()
    _wait(lambda: not _alive(pid), f"run {pid} to be killed")
    assert not (tmp_path / "out").exists()
    assert p.poll() is None, "the server keeps serving"


def test_sigterm_stops_the_server_and_its_runs(server, tiny_checkpoint, tmp_path):
    p, path = server
    plan = _plan(tmp_path, tiny_checkpoint, 400)
    c, replies, out, err, first = _start(path, plan, tmp_path)
    pid = first["pid"]
    assert json.loads(out.readline())["event"] == "start"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0
    _wait(lambda: not _alive(pid), f"run {pid} to die with its server")
    assert not Path(path).exists()
