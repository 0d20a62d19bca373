"""Fixtures for the end-to-end tests: a real `strata serve` on a loopback port.

Nothing is built here. The binary comes from STRATA_BIN (default: target/release/strata under
the repository root) and the model from STRATA_MODEL (default: the Gemma-3 270M GGUF that
scripts/fetch-models.sh downloads). Without the model file every test is skipped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
MODEL = Path(os.environ.get("STRATA_MODEL", REPO / "models" / "gemma-3-270m-q4_k_m.gguf"))
BIN = Path(os.environ.get("STRATA_BIN", REPO / "target" / "release" / "strata"))
MODEL_NAME = MODEL.stem
# A small pool keeps startup, rebuilds and the pool checks quick; it holds far more than any test
# asks for at once.
KV_BUDGET_BYTES = int(os.environ.get("STRATA_E2E_KV_BUDGET", str(64 << 20)))
STARTUP_TIMEOUT_S = 120.0
# The shared server's --max-model-len: a rebuild may not go below this many tokens.
MAX_MODEL_LEN = 4096


def pytest_collection_modifyitems(config, items):
    if MODEL.is_file():
        return
    skip = pytest.mark.skip(
        reason=f"model file {MODEL} is absent: run scripts/fetch-models.sh (or set STRATA_MODEL)"
    )
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(skip)


@dataclass
class Server:
    proc: subprocess.Popen
    base: str  # http://127.0.0.1:PORT
    log_path: Path
    api_key: str | None
    model_name: str
    admin_key: str | None = None

    @property
    def v1(self) -> str:
        return self.base + "/v1"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # graceful shutdown path
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_server(log_dir: Path, *extra: str, api_key: str | None = None, name: str = "server",
                 model: Path | None = None, admin_key: str | None = None) -> Server:
    """Starts `strata serve` on 127.0.0.1 with port 0 and reads the bound port from its log
    (the suite's model, or `model`)."""
    if not BIN.is_file():
        pytest.fail(
            f"strata binary {BIN} not found: cargo build --release -p strata-server (or set STRATA_BIN)",
            pytrace=False,
        )
    log_path = log_dir / f"{name}.log"
    args = [str(BIN), "serve", "--model", str(model or MODEL), "--host", "127.0.0.1", "--port", "0",
            "--kv-budget-bytes", str(KV_BUDGET_BYTES), *extra]
    if api_key is not None:
        args += ["--api-key", api_key]
    if admin_key is not None:
        args += ["--admin-api-key", admin_key]
    env = dict(os.environ)
    env.pop("STRATA_API_KEY", None)
    env.pop("STRATA_ADMIN_API_KEY", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    base = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"strata serve exited with {proc.returncode}:\n{log_path.read_text(errors='replace')}")
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log_path.read_text(errors="replace"))
        if m:
            base = m.group(1)
            break
        time.sleep(0.1)
    if base is None:
        proc.kill()
        raise RuntimeError(f"strata serve did not start in {STARTUP_TIMEOUT_S} s:\n{log_path.read_text(errors='replace')}")
    # Anything else on this port would be a mistake; /health must answer from our process.
    while time.monotonic() < deadline:
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                served = (model or MODEL).stem
                for i, a in enumerate(extra):
                    if a == "--served-model-name":
                        served = extra[i + 1]
                return Server(proc, base, log_path, api_key, served, admin_key)
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"/health never answered:\n{log_path.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("strata-e2e")


@pytest.fixture(scope="session")
def server(log_dir):
    """The shared server: default flags plus --enable-timings-report."""
    # --max-model-len keeps the smallest pool a rebuild may leave (one request of that length)
    # small enough for the rebuild tests.
    s = start_server(log_dir, "--enable-timings-report", "--max-model-len", str(MAX_MODEL_LEN),
                     name="main", admin_key="e2e-admin")
    yield s
    s.stop()
    # A crash during the session shows up here even if every test passed.
    assert s.proc.returncode in (0, -signal.SIGINT, 130), f"server exited with {s.proc.returncode}:\n{s.log_tail()}"


SMOL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smol(log_dir):
    """A server on SmolLM2-135M (a byte-level BPE model with a small vocabulary)."""
    if not SMOL.is_file():
        pytest.skip(f"{SMOL} is absent: run scripts/fetch-models.sh")
    # Past the default prompt-byte limit (64 bytes a token of context), so that the hardening
    # tests' megabyte prompt reaches the tokenizer.
    # Its template cannot show tools: --tool-call-parser has Strata describe them (Hermes).
    s = start_server(log_dir, "--max-prompt-bytes", "4000000", "--tool-call-parser", "hermes",
                     name="smol", model=SMOL)
    yield s
    s.stop()
    assert s.proc.returncode in (0, -signal.SIGINT, 130), s.log_tail()


@pytest.fixture(scope="session")
def auth_server(log_dir):
    """A second server with --api-key, a custom model name and no timings report."""
    s = start_server(log_dir, "--served-model-name", "e2e-model", api_key="e2e-secret", name="auth")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(autouse=True)
def _server_still_up(request):
    """After every test that used a server, that server must still be running."""
    yield
    for name in ("server", "auth_server", "smol"):
        if name in request.fixturenames:
            s = request.getfixturevalue(name)
            assert s.alive(), f"{name} died during {request.node.name}:\n{s.log_tail()}"
