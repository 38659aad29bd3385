"""What a worker loads: heavy libraries only where a config needs them (each is megabytes resident a worker,
and issue 36 holds the gateway to 70 MB with 200 streams open).

- botocore (~13 MB): only for its credential chain or a region from a profile; keys in the config never load it
  (``adapters._aws.StaticCredentials``).
- pydantic (~7 MB with Litestar's plugins for it): installed beside the gateway whenever the ``anthropic`` SDK
  is, and Litestar adds its Pydantic plugins whenever it is importable; the gateway's Litestar does not
  (``gateway.http.app._Litestar``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A worker served in-process by uvicorn with the app's lifespan, one request answered by the mock provider,
# one signed for a Bedrock target with keys in the config (no upstream: the signing is what loads botocore).
CHILD = r"""
import asyncio, json, socket, sys, threading, time, urllib.request
import uvicorn
from gateway.http.app import create_app
from gateway.settings import parse_settings

settings = parse_settings('''
auth: {open: true}
store: {enabled: false}
providers:
  m: {kind: mock}
  b: {kind: bedrock, region: us-east-1, base_url: "http://127.0.0.1:9", access_key_id: AK, secret_access_key: SK}
models:
  "bedrock-*": {targets: [{provider: b}]}
  "*": {targets: [{provider: m}]}
''', environ={})
app = create_app(settings)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning", ws="none"))
threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True).start()
while not server.started:
    time.sleep(0.01)
base = f"http://127.0.0.1:{sock.getsockname()[1]}"
statuses = []
for model in ("claude-sonnet-4-6", "bedrock-claude"):
    body = json.dumps({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(base + "/v1/messages", body, {"content-type": "application/json"})
    try:
        statuses.append(urllib.request.urlopen(request, timeout=10).status)
    except urllib.error.HTTPError as exc:
        statuses.append(exc.code)
statuses.append(urllib.request.urlopen(base + "/v1/gateway/status", timeout=10).status)
server.should_exit = True
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"botocore", "pydantic", "pydantic_core"})
plugins = sorted(type(p).__name__ for p in app.litestar.plugins)
print(json.dumps({"statuses": statuses, "loaded": loaded, "plugins": plugins}))
"""


def test_a_worker_with_keys_in_its_config_loads_neither_botocore_nor_pydantic() -> None:
    import pydantic  # noqa: F401  # installed here (the anthropic SDK's dependency): Litestar would load its plugins

    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    # the mock answered; the Bedrock request was signed and then refused for its unreachable upstream (5xx)
    assert report["statuses"][0] == 200 and report["statuses"][1] >= 500 and report["statuses"][2] == 200
    assert report["loaded"] == []
    assert not [name for name in report["plugins"] if "Pydantic" in name or "Attrs" in name]
