"""The deployment files, checked by the real tools that install here.

Kubernetes manifests against the API schemas (kubernetes-validate, strict);
the compose file by ``docker-compose config`` (Debian's package; ``.ci/run``
installs it); the Prometheus Operator, Gateway API, Envoy Gateway and kustomize
objects, which have no schema there, by their references. The ingress's hash key
is checked against the header the shipped settings name a client by.
"""

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from blendserve.scheduler.pool import SHARED_CLIENT
from blendserve.service.security import ClientIds
from blendserve.service.settings import Settings
from starlette.datastructures import Headers

from tests.support.tools import require

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
KUBERNETES = "1.30.0"
#: API groups that are not Kubernetes' own (custom resources, kustomize's file): no schema
#: of theirs is in kubernetes-validate, so their objects are checked by their references.
NOT_OWN = frozenset(
    {
        "monitoring.coreos.com",
        "kustomize.config.k8s.io",
        "gateway.networking.k8s.io",
        "gateway.envoyproxy.io",
    }
)


def _documents() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(MANIFESTS.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def _one(kind: str, name: str = "blendserve") -> dict[str, Any]:
    (doc,) = [d for d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_manifests_match_the_kubernetes_api() -> None:
    core = [doc for doc in _documents() if doc["apiVersion"].rpartition("/")[0] not in NOT_OWN]
    assert sorted(doc["kind"] for doc in core) == [
        "ConfigMap", "Deployment", "Deployment", "HorizontalPodAutoscaler", "Ingress", "Service",
        "Service",
    ]  # fmt: skip
    for doc in core:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_service_monitor_hpa_and_kustomization_point_at_real_objects() -> None:
    service = _one("Service")
    deployment = _one("Deployment")
    monitor = _one("ServiceMonitor")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    assert _one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"] == "blendserve"
    template = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (container,) = template["spec"]["containers"]
    assert container["envFrom"][0]["configMapRef"]["name"] == _one("ConfigMap")["metadata"]["name"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert all((MANIFESTS / r).is_file() for r in kustomization["resources"])


def _shipped_settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings every replica runs with: the ConfigMap's keys, as the Deployment passes
    them (its only environment), over the defaults."""
    (container,) = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert [source["configMapRef"]["name"] for source in container["envFrom"]] == ["blendserve"]
    assert "env" not in container
    for name in os.environ:
        if name.startswith("BLENDSERVE_"):
            monkeypatch.delenv(name)
    for name, value in _one("ConfigMap")["data"].items():
        monkeypatch.setenv(name, value)
    return Settings()


def _client_header(settings: Settings) -> str:
    """The request header that names a client to the service (lower case): the API key's
    with keys, else the client header."""
    keyed = bool(settings.api_keys) or settings.api_key_file is not None
    header = "authorization" if keyed else settings.client_header
    assert header, "the replicas name no client: every request is one shared client"
    ids = ClientIds(keyed, settings.client_header)
    named = [ids.of(Headers({header: value})) for value in ("Bearer one", "Bearer two")]
    assert named[0] != named[1] and SHARED_CLIENT not in named, "the header names no client"
    return header.lower()


def test_the_ingress_keeps_each_client_on_one_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """ingress-nginx hashes each request over the replicas by the header the service names
    its client by, so a client's prior, pacing and trace rule are learnt in one replica."""
    settings = _shipped_settings(monkeypatch)
    header = _client_header(settings)
    ingress = _one("Ingress")
    annotations = ingress["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    # nginx's variable of a request header: lower case, dashes as underscores.
    assert annotations[f"{prefix}upstream-hash-by"] == "$http_" + header.replace("-", "_")
    # Hashed over the endpoints (its default), not the Service's one ClusterIP.
    assert annotations.get(f"{prefix}service-upstream", "false") == "false"
    body_size = re.fullmatch(r"(\d+)m", annotations[f"{prefix}proxy-body-size"])
    assert body_size is not None and int(body_size.group(1)) << 20 == settings.max_body_bytes
    assert ingress["spec"]["ingressClassName"] == "nginx"
    service = _one("Service")
    ports = {p["name"] for p in service["spec"]["ports"]}
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["path"] == "/" and path["pathType"] == "Prefix"
    assert path["backend"]["service"]["name"] == service["metadata"]["name"]
    assert path["backend"]["service"]["port"]["name"] in ports


def test_the_gateway_route_hashes_the_same_header(monkeypatch: pytest.MonkeyPatch) -> None:
    """gateway.yaml, the Gateway API way on Envoy Gateway: the same key, by its policy."""
    header = _client_header(_shipped_settings(monkeypatch))
    route = _one("HTTPRoute")
    policy = _one("BackendTrafficPolicy")
    service = _one("Service")
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"] in {p["port"] for p in service["spec"]["ports"]}
    assert policy["spec"]["targetRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "blendserve"}
    ]
    balancer = policy["spec"]["loadBalancer"]
    assert balancer["type"] == "ConsistentHash"
    assert balancer["consistentHash"] == {"type": "Header", "header": {"name": header}}
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert "ingress.yaml" in kustomization["resources"]
    assert "gateway.yaml" not in kustomization["resources"]  # it needs CRDs of its own


def test_config_keys_are_settings() -> None:
    fields = {f"BLENDSERVE_{name.upper()}" for name in Settings.model_fields}
    assert set(_one("ConfigMap")["data"]) <= fields


@pytest.mark.compose
@pytest.mark.slow
def test_compose_file_is_valid_for_both_profiles() -> None:
    compose = require("docker-compose", "apt-get install docker-compose (Debian's package)")
    for profile in ("gpu", "cpu"):
        checked = subprocess.run(
            [compose, "--profile", profile, "config", "-q"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert checked.returncode == 0, checked.stderr
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert services["blendserve"]["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert services["vllm"]["deploy"]["resources"]["reservations"]["devices"][0][
        "capabilities"
    ] == ["gpu"]
    assert "cpu" in services["blendserve-cpu"]["profiles"]


def test_dockerfile_runs_as_a_user_with_a_healthcheck() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER blendserve$", dockerfile, re.M)
    assert re.search(r"^HEALTHCHECK .*\n.*/health", dockerfile, re.M)
    assert "-slim" in dockerfile


def test_dockerfile_builds_numbas_cache_as_its_user() -> None:
    """Blend-ASC's kernels are compiled at build time, by the user the image runs as, into a
    cache directory of that user's: a new container loads them instead of compiling."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    final = dockerfile[dockerfile.rindex("\nFROM ") :]
    cache = re.search(r"NUMBA_CACHE_DIR=(\S+)", final)
    assert cache is not None and cache.group(1).startswith("/home/blendserve/"), cache
    user = final.index("\nUSER blendserve\n")
    warm = re.search(r"^RUN python -c .*warm_up\(\)", final, re.M)
    assert warm is not None and warm.start() > user, "the kernels are compiled as the user"
    assert "from blendserve.core.policies.blend import warm_up" in warm.group(0)
    from blendserve.core.policies import blend

    assert callable(blend.warm_up)
