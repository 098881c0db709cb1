"""The deployment files, checked by the real tools that install here.

Kubernetes manifests against the API schemas (kubernetes-validate, strict);
the compose file by ``docker-compose config`` (Debian's package; ``.ci/run``
installs it); the Prometheus Operator and kustomize objects, which have no
schema there, by their references.
"""

import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.tools import require

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
KUBERNETES = "1.30.0"


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
    # API groups with a dot (monitoring.coreos.com, kustomize) are not Kubernetes' own.
    core = [doc for doc in _documents() if "." not in doc["apiVersion"].split("/")[0]]
    assert sorted(doc["kind"] for doc in core) == [
        "ConfigMap", "Deployment", "Deployment", "HorizontalPodAutoscaler", "Service", "Service",
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


def test_config_keys_are_settings() -> None:
    from blendserve.service.settings import Settings

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
