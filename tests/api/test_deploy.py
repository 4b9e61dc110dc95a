"""The Kubernetes manifests in deploy/ agree with each other and with deploy/nginx.conf (which
test_router.py runs for real): the router names one upstream server per StatefulSet replica,
by the pods' stable DNS names and the port they listen on; each replica journals its sessions
on its own volume; the router mounts the configuration the kustomization generates."""

from __future__ import annotations

import re

import yaml

from conftest import REPO

DEPLOY = REPO / "deploy"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]


def by_kind(items: list[dict], kind: str) -> list[dict]:
    return [d for d in items if d["kind"] == kind]


def test_the_manifests_agree_with_the_router_configuration():
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    for r in kust["resources"]:
        assert (DEPLOY / r).is_file(), r
    generated = kust["configMapGenerator"][0]
    assert generated["files"] == ["nginx.conf"]

    vigil = docs("vigil.yaml")
    (svc,) = by_kind(vigil, "Service")
    (sts,) = by_kind(vigil, "StatefulSet")
    assert svc["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == svc["metadata"]["name"]
    replicas = sts["spec"]["replicas"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    port = container["ports"][0]["containerPort"]
    args = container["args"]
    assert f"--port={port}" in args and "--host=0.0.0.0" in args

    conf = (DEPLOY / "nginx.conf").read_text()
    name = sts["metadata"]["name"]
    for upstream in ("vigil_sessions", "vigil_any"):
        block = re.search(r"upstream %s \{(.*?)\}" % upstream, conf, re.S).group(1)
        servers = re.findall(r"server ([\w.-]+):(\d+)", block)
        assert servers == [(f"{name}-{i}.{svc['metadata']['name']}", str(port)) for i in range(replicas)], (upstream, servers)

    # The journal lives on the pod's own volume.
    state = next(a.split("=", 1)[1] for a in args if a.startswith("--state-dir="))
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert any(state.startswith(path + "/") for path in mounts), (state, mounts)
    claims = [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]]
    assert set(mounts.values()) <= set(claims)

    router = docs("router.yaml")
    (deploy,) = by_kind(router, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    (nginx,) = spec["containers"]
    conf_arg = nginx["args"][nginx["args"].index("-c") + 1]
    (mount,) = nginx["volumeMounts"]
    assert conf_arg == mount["mountPath"] + "/nginx.conf"
    (vol,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert vol["configMap"]["name"] == generated["name"]
    listen = re.search(r"listen (\d+);", conf).group(1)
    assert nginx["ports"][0]["containerPort"] == int(listen)
