"""Optional reference peer: LiteLLM's proxy in a throwaway venv, offline, one worker, on the gateway's core.

``start`` installs ``litellm[proxy]`` into ``/tmp/litellm-venv`` if it is not there yet (PyPI through pip,
the only outside access this harness makes, and only with ``--litellm``), writes a config that routes each
benchmark model to ``anthropic/<model>`` with ``api_base`` = the fake upstream, and starts the proxy with
telemetry, the remote cost map and every optional outside call switched off.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bench.loadgen import Target

if TYPE_CHECKING:
    from bench.run import Proc

__all__ = ["MASTER_KEY", "VENV", "VERSION", "start"]

VENV = Path("/tmp/litellm-venv")
VERSION = "1.108.7"
MASTER_KEY = "sk-bench-master"

OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOG": "ERROR",
    "LITELLM_MODE": "PRODUCTION",
    "DISABLE_ADMIN_UI": "True",
    "DISABLE_SCHEMA_UPDATE": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TIKTOKEN_CACHE_DIR": "",
    "ANTHROPIC_API_KEY": "bench",
    "NO_DOCS": "True",
    "NO_REDOC": "True",
}


def _venv_python() -> Path:
    return VENV / "bin" / "python"


def installed_version() -> str | None:
    python = _venv_python()
    if not python.exists():
        return None
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or None if done.returncode == 0 else None


def install(log: Path) -> str:
    """Create the venv and install LiteLLM's proxy (the pinned version, else the closest pip finds)."""
    version = installed_version()
    if version is not None and (VENV / "bin" / "litellm").exists():
        return version
    with open(log, "ab") as out:
        if not _venv_python().exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], stdout=out, stderr=out, check=True)
        pip = [str(_venv_python()), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        exact = subprocess.run([*pip, f"litellm[proxy]=={VERSION}"], stdout=out, stderr=out, check=False)
        if exact.returncode != 0:
            major_minor = ".".join(VERSION.split(".")[:2])
            subprocess.run([*pip, f"litellm[proxy]~={major_minor}.0"], stdout=out, stderr=out, check=True)
    version = installed_version()
    if version is None:
        raise RuntimeError(f"litellm did not install (see {log})")
    return version


def config_yaml(upstream_port: int, models: list[str]) -> str:
    entries = []
    for model in dict.fromkeys(models):
        params = {"model": f"anthropic/{model}", "api_base": f"http://127.0.0.1:{upstream_port}", "api_key": "bench"}
        entries.append({"model_name": model, "litellm_params": params})
    config = {
        "model_list": entries,
        "litellm_settings": {"telemetry": False, "drop_params": True, "request_timeout": 600, "set_verbose": False},
        "general_settings": {"master_key": MASTER_KEY, "disable_spend_logs": True, "disable_reset_budget": True},
    }
    return json.dumps(config, indent=2)  # JSON is YAML


async def start(
    work: Path, upstream_port: int, models: list[str], *, cpu: int | None, env: dict[str, str]
) -> tuple[Proc, Target, str]:
    """Install if needed, start, wait until ready. Returns (Proc, Target, version)."""
    from bench.run import Proc, _free_port, wait_ready

    log = work / "litellm.log"
    version = await asyncio.get_running_loop().run_in_executor(None, install, log)
    config = work / "litellm.yaml"
    config.write_text(config_yaml(upstream_port, models))
    port = _free_port()
    argv = [
        str(VENV / "bin" / "litellm"),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    proc = Proc("litellm", argv, log, cpu=cpu, env={**env, **OFFLINE_ENV})
    proc.start()
    await wait_ready(proc, port, "/health/liveliness", 240.0)
    headers = (("authorization", f"Bearer {MASTER_KEY}"), ("x-api-key", MASTER_KEY))
    return proc, Target("litellm", "127.0.0.1", port, headers=headers), version
