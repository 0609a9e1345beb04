"""deploy/helm/streamapp renders, for a local cluster and for a managed Kafka over SASL_SSL, into
objects that Kubernetes' own schemas accept (kubernetes-validate, strict: an unknown field is an
error) and, for the custom resources, the CRD schemas vendored in crd-schemas/; and the numbers
the chart derives from the budgets hold: memory limit >= budget + the headroom docs/operations.md
gives, the join's volume >= its disk budget + the reserve, the autoscaler's maximum <= the
partitions. No cluster: everything is rendered and checked offline.

Helm itself is built from the Go module proxy on first use (a few minutes on 2 cores) and cached.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml

from streamapp.settings import Settings
from streamapp.units import parse_bytes

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "streamapp"
DOC = (REPO / "docs" / "operations.md").read_text()
CRD_SCHEMAS = Path(__file__).parent / "crd-schemas"
HELM_VERSION = "v3.22.1"
# The Kubernetes release whose schemas the objects must satisfy (one kubernetes-validate ships).
KUBERNETES_VERSION = "1.33.0"
VALUE_SETS = {
    "local": [],
    "managed-kafka": ["-f", str(CHART / "values-managed-kafka.yaml"),
                      "--set", "kafka.saslPassword=s3cret-passw0rd", "--set-file", f"kafka.caCert={__file__}"],
}
MIB = 1024**2
WORKER_KINDS = ("Deployment", "StatefulSet")
# Where the chart mounts the Kafka credentials Secret in every worker.
SECRET_MOUNT = "/etc/streamapp/kafka/"


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm binary of HELM_VERSION, built with Go from the module proxy once and cached."""
    target = cache_home() / "streamapp" / f"helm-{HELM_VERSION}"
    binary = target / "helm"
    if not binary.exists():
        go = shutil.which("go")
        if go is None:
            pytest.fail("building helm needs Go (https://go.dev/dl/) on the PATH", pytrace=False)
        env = {**os.environ, "GOBIN": str(target), "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
        finished = subprocess.run([go, "install", f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"],
                                  env=env, capture_output=True, text=True, timeout=1800)
        assert finished.returncode == 0, f"building helm failed:\n{finished.stderr[-3000:]}"
    return binary


def render(helm: Path, *args: str) -> list[dict]:
    finished = subprocess.run([str(helm), "template", "streamapp", str(CHART), *args],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    return [doc for doc in yaml.safe_load_all(finished.stdout) if doc]


@pytest.fixture(scope="module", params=list(VALUE_SETS))
def rendered(request, helm) -> list[dict]:
    return render(helm, *VALUE_SETS[request.param])


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


def named(objects: list[dict], kind: str, suffix: str) -> dict:
    [found] = [obj for obj in of_kind(objects, kind) if obj["metadata"]["name"].endswith(suffix)]
    return found


def workers(objects: list[dict]) -> list[dict]:
    return [obj for obj in objects if obj["kind"] in WORKER_KINDS]


def container(worker: dict) -> dict:
    [only] = worker["spec"]["template"]["spec"]["containers"]
    return only


def environment(objects: list[dict], worker: dict) -> dict[str, str]:
    """What the worker's process sees: the shared ConfigMap, then its own values."""
    env = dict(named(objects, "ConfigMap", "-env")["data"])
    for item in container(worker).get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = next(obj for obj in of_kind(objects, "Secret")
                                     if obj["metadata"]["name"] == ref["name"])["stringData"][ref["key"]]
    return env


def settings_of(env: dict[str, str], secrets: Path) -> Settings:
    """The settings a worker reads, with the files its Secret mounts stood in for under ``secrets``
    (settings refuse a secret or CA file that cannot be read)."""
    mounted = {}
    for name, value in env.items():
        if value.startswith(SECRET_MOUNT):
            mounted[name] = secrets / Path(value).name
            mounted[name].write_text("stand-in for a mounted secret\n")
    return Settings.from_env({**env, **{name: str(path) for name, path in mounted.items()}})


def crd_schema_file(obj: dict) -> Path:
    """Where the vendored schema of a custom resource would be (none for Kubernetes' own kinds)."""
    return CRD_SCHEMAS / f"{obj['apiVersion'].replace('/', '_')}_{obj['kind']}.json"


def validation_errors(obj: dict) -> list[str]:
    if crd_schema_file(obj).exists():
        validator = jsonschema.Draft7Validator(json.loads(crd_schema_file(obj).read_text()))
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


def mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()
    return int(number) * (1024 if unit == "Gi" else 1)


def documented_headroom_mib() -> int:
    match = re.search(r"memory limit is `STREAMAPP_MEMORY_BUDGET` \+ (\d+) MiB", DOC)
    assert match, "docs/operations.md no longer states the container memory headroom"
    return int(match.group(1))


def test_every_rendered_object_validates_strictly(rendered):
    kinds = {obj["kind"] for obj in rendered}
    assert {"Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "Job", "ConfigMap"} <= kinds
    errors = {f"{obj['kind']}/{obj['metadata']['name']}": validation_errors(obj) for obj in rendered}
    assert {name: found for name, found in errors.items() if found} == {}


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_helm_lint_strict_passes(helm, value_set):
    finished = subprocess.run([str(helm), "lint", "--strict", str(CHART), *VALUE_SETS[value_set]],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stdout + finished.stderr


def test_managed_kafka_renders_the_custom_resources_and_the_secret(helm):
    objects = render(helm, *VALUE_SETS["managed-kafka"])
    assert {"ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule", "Secret"} <= {
        obj["kind"] for obj in objects}


@pytest.mark.parametrize("kind, path, wrong", [
    ("Deployment", ("spec", "template", "spec", "containers", 0), {"imagePullPolicyy": "Always"}),
    ("ScaledObject", ("spec",), {"maxReplicas": 4}),
    ("ServiceMonitor", ("spec", "endpoints", 0), {"intervall": "15s"}),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0), {"fore": "1m"}),
])
def test_a_misspelt_field_fails_validation(helm, kind, path, wrong):
    obj = of_kind(render(helm, *VALUE_SETS["managed-kafka"]), kind)[0]
    target = obj
    for step in path:
        target = target[step]
    target.update(wrong)
    assert validation_errors(obj), f"{kind} with {wrong} passed validation"


def test_memory_limit_holds_the_budget_and_the_documented_headroom(rendered):
    headroom = documented_headroom_mib()
    for worker in workers(rendered):
        budget = parse_bytes(environment(rendered, worker)["STREAMAPP_MEMORY_BUDGET"]) / MIB
        resources = container(worker)["resources"]
        assert mebibytes(resources["limits"]["memory"]) >= budget + headroom, worker["metadata"]["name"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_join_volume_holds_the_disk_budget_and_the_reserve(rendered):
    join = named(rendered, "StatefulSet", "-join")
    env = environment(rendered, join)
    [claim] = join["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert {"name": "data", "mountPath": env["STREAMAPP_DATA_DIR"]} in container(join)["volumeMounts"]
    size = mebibytes(claim["spec"]["resources"]["requests"]["storage"])
    needed = (parse_bytes(env["STREAMAPP_DISK_BUDGET"]) + parse_bytes(env["STREAMAPP_DISK_RESERVE"])) / MIB
    assert size >= needed


def test_sink_out_volume_holds_its_streams_budgets_and_the_reserve(helm):
    for args in VALUE_SETS.values():
        objects = render(helm, *args)
        sink = named(objects, "Deployment", "-sink")
        env = environment(objects, sink)
        values = yaml.safe_load((CHART / "values.yaml").read_text())
        overrides = yaml.safe_load((CHART / "values-managed-kafka.yaml").read_text()) if args else {}
        streams = overrides.get("sink", {}).get("streams", values["sink"]["streams"])
        [out] = [v for v in sink["spec"]["template"]["spec"]["volumes"] if v["name"] == "out"]
        needed = (streams * 5 / 4 * parse_bytes(env["STREAMAPP_SINK_DISK_BUDGET"])
                  + parse_bytes(env["STREAMAPP_DISK_RESERVE"])) / MIB
        assert mebibytes(out["emptyDir"]["sizeLimit"]) >= needed


@pytest.mark.parametrize("max_replicas", [3, 50])
def test_autoscaler_never_asks_for_more_workers_than_partitions(helm, max_replicas, tmp_path):
    objects = render(helm, *VALUE_SETS["managed-kafka"], "--set", f"infer.autoscaling.maxReplicas={max_replicas}")
    [scaled] = of_kind(objects, "ScaledObject")
    partitions = int(named(objects, "ConfigMap", "-env")["data"]["STREAMAPP_PARTITIONS"])
    assert scaled["spec"]["maxReplicaCount"] == min(max_replicas, partitions)
    infer = named(objects, "Deployment", "-infer")
    assert scaled["spec"]["scaleTargetRef"]["name"] == infer["metadata"]["name"]
    assert "replicas" not in infer["spec"], "the autoscaler owns the replica count"
    [trigger] = scaled["spec"]["triggers"]
    settings = settings_of(environment(objects, infer), tmp_path)
    assert trigger["metadata"]["consumerGroup"] == settings.group_id
    assert trigger["metadata"]["topic"] == f"{settings.topic_prefix}frames.scaled"
    assert (trigger["metadata"]["sasl"], trigger["metadata"]["tls"]) == ("scram_sha512", "enable")


def test_every_worker_is_probed_hardened_and_runs_its_stage(rendered, tmp_path):
    stages = set()
    for worker in workers(rendered):
        spec, main = worker["spec"]["template"]["spec"], container(worker)
        env = environment(rendered, worker)
        settings = settings_of(env, tmp_path)  # every value the chart gives is a valid setting
        stages.add(env["STREAMAPP_STAGES"])
        assert env["STREAMAPP_WEB_BIND"] == "0.0.0.0", "probes reach the web port from outside the pod"
        # Static membership only where the host name (part of the member's id) survives a restart.
        assert settings.static_membership == (worker["kind"] == "StatefulSet")
        assert main["command"][:4] == ["faust", "--quiet", "-A", "streamapp.app"]
        assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        mounted = {mount["mountPath"] for mount in main["volumeMounts"]}
        assert {env["STREAMAPP_DATA_DIR"], "/tmp"} <= mounted, "a read-only root needs these writable"
        if env["STREAMAPP_STAGES"] == "sink":
            assert env["STREAMAPP_OUT_DIR"] in mounted
    assert stages == {"resize", "infer", "join", "sink"}
    assert {obj["kind"] for obj in workers(rendered) if "join" in obj["metadata"]["name"]} == {"StatefulSet"}
    disruption = {obj["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
                  for obj in of_kind(rendered, "PodDisruptionBudget")}
    assert disruption == stages


def test_managed_kafka_credentials_reach_the_workers_only_through_the_secret(helm):
    objects = render(helm, *VALUE_SETS["managed-kafka"])
    [secret] = of_kind(objects, "Secret")
    assert secret["stringData"]["sasl-password"] == "s3cret-passw0rd"
    others = yaml.safe_dump([obj for obj in objects if obj is not secret])
    assert "s3cret-passw0rd" not in others
    for worker in workers(objects) + of_kind(objects, "Job"):
        env = environment(objects, worker) if worker["kind"] != "Job" else {
            **named(objects, "ConfigMap", "-env")["data"],
            **{item["name"]: item.get("value") for item in container(worker)["env"]}}
        assert env["STREAMAPP_SECURITY_PROTOCOL"] == "SASL_SSL"
        assert env["STREAMAPP_SASL_MECHANISM"] == "SCRAM-SHA-512"
        assert env["STREAMAPP_SASL_PASSWORD_FILE"] == "/etc/streamapp/kafka/sasl-password"
        assert env["STREAMAPP_SSL_CA_FILE"] == "/etc/streamapp/kafka/ca.crt"
        mounts = {m["name"]: m["mountPath"] for m in container(worker)["volumeMounts"]}
        assert mounts["kafka-credentials"] == "/etc/streamapp/kafka"


def test_a_mechanism_the_chart_cannot_set_up_is_refused_at_render_time(helm):
    finished = subprocess.run([str(helm), "template", "streamapp", str(CHART), *VALUE_SETS["managed-kafka"],
                               "--set", "kafka.saslMechanism=OAUTHBEARER"], capture_output=True, text=True, timeout=120)
    assert finished.returncode != 0 and "OAUTHBEARER" in finished.stderr


def test_a_missing_password_is_refused_at_render_time(helm):
    args = [arg for arg in VALUE_SETS["managed-kafka"] if "saslPassword" not in arg]
    args.remove("--set")
    finished = subprocess.run([str(helm), "template", "streamapp", str(CHART), *args],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode != 0 and "kafka.saslPassword is required" in finished.stderr


# --- alert rules and dashboard ------------------------------------------------------------------

ALERTS = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
DASHBOARD = json.loads((CHART / "files" / "dashboard.json").read_text())



def metric_rows() -> set[str]:
    """The metrics of docs/operations.md's tables (tests/unit/test_operations_doc.py ties them to the code)."""
    return set(re.findall(r"^\| `([a-z_]+)` \| (?:gauge|counter|histogram)", DOC, re.M))


def metrics_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (parsed, so a syntax error fails here); a
    ``{__name__=~"..."}`` selector stands for the documented metrics its pattern matches (at
    least one); a histogram's ``_bucket`` series for its family."""
    selectors: list[promql_parser.VectorSelector] = []
    promql_parser.walk(promql_parser.parse(expr),
                       lambda node: selectors.append(node) if isinstance(node, promql_parser.VectorSelector) else None)
    names = set()
    for selector in selectors:
        if selector.name:
            names.add(selector.name.removesuffix("_bucket"))
        for matcher in selector.matchers.matchers:
            if matcher.name == "__name__":
                matched = {name for name in metric_rows() if re.fullmatch(matcher.value, name)}
                assert matched, f"{matcher.value!r} matches no documented metric"
                names |= matched
    return names


def alert_rules() -> list[dict]:
    return [rule for group in ALERTS["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]]


def test_metrics_of_alerts_and_dashboard_are_the_documented_ones():
    used = {name for expr in [rule["expr"] for rule in alert_rules()] + dashboard_exprs() for name in metrics_in(expr)}
    standard = {"process_resident_memory_bytes"}  # the standard collector's, documented by its family row
    assert used - standard <= metric_rows(), f"not in docs/operations.md: {sorted(used - standard - metric_rows())}"
    assert "join_latency_seconds" in used and "resize_dead_lettered_total" in used


def test_the_name_matcher_finds_metrics_and_nothing_else():
    assert metrics_in('sum by (pod, le) (rate(join_latency_seconds_bucket{stage="join"}[5m])) > 0.5') == {
        "join_latency_seconds"}
    assert metrics_in('increase({__name__=~"(join|sink)_dead_lettered_total"}[10m])') == {
        "join_dead_lettered_total", "sink_dead_lettered_total"}
    with pytest.raises(ValueError):
        metrics_in("sum(rate(join_joined_total[1m])")


def test_every_alert_on_of_the_docs_has_an_alert_rule():
    alerted = {name for rule in alert_rules() for name in metrics_in(rule["expr"])}
    wanted = set(re.findall(r"^\| `([a-z_]+)` \|.*\b[Aa]lert (?:on|above)\b", DOC, re.M))
    assert len(wanted) >= 9
    assert wanted - alerted == set(), "documented as alert on, with no rule"
    for rule in alert_rules():
        assert rule["alert"] in DOC, f"{rule['alert']} is not in docs/operations.md's Alerts table"
        assert {"summary", "description"} <= set(rule["annotations"]) and rule["labels"]["severity"]
