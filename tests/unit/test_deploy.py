"""deploy/helm/streamapp renders, for a local cluster, for a Kafka over SASL_SSL and for the
variants an operator reaches for (OAUTHBEARER, existing Secrets, a private registry and node
placement, the optional objects off), into objects that Kubernetes' own schemas accept
(kubernetes-validate, strict: an unknown field is an error) and, for the custom resources, the CRD
schemas vendored in crd-schemas/; `helm lint --strict` passes on each. values.schema.json and the
chart's checks refuse at render time what would fail at runtime. The rendered objects carry what
an operator needs on a real cluster: pull secrets, a topics Job that runs before the workers and can
read its Secret, monitoring objects a stock Prometheus selects, alerts for a stage that is down, a
join volume that no other value moves, placement, a NetworkPolicy and a web token, an autoscaler
that leaves a caught-up group alone, and the numbers derived from the budgets. No cluster:
everything is rendered and checked offline.

Helm itself is built from the Go module proxy on first use (a few minutes on 2 cores) and cached;
each distinct set of values is rendered once.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import faust
import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml

from streamapp.settings import STAGES, Settings
from streamapp.topics import changelog_name, max_record_bytes
from streamapp.units import parse_bytes
from streamapp.worker.factory import create_app

pytestmark = pytest.mark.slow  # helm is built on first use

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "streamapp"
DOC = (REPO / "docs" / "operations.md").read_text()
BENCHMARKS = (REPO / "docs" / "benchmarks.md").read_text()
CRD_SCHEMAS = Path(__file__).parent / "crd-schemas"
HELM_VERSION = "v3.22.1"
# The Kubernetes release whose schemas the objects must satisfy (one kubernetes-validate ships).
KUBERNETES_VERSION = "1.33.0"
RELEASE = "streamapp"
MIB = 1024**2
WORKER_KINDS = ("Deployment", "StatefulSet")
# Where the chart mounts Secrets (Kafka credentials, the web token) in its pods.
SECRET_MOUNTS = "/etc/streamapp/"
ADMIN_SECRET, PIPELINE_SECRET, TOKEN_SECRET = "kafka-admin", "kafka-pipeline", "web-token"

MANAGED_FILE = ("-f", str(CHART / "values-managed-kafka.yaml"), "--set-file", f"kafka.caCert={__file__}")
VALUE_SETS = {
    "local": (),
    "managed-kafka": (*MANAGED_FILE, "--set", "kafka.saslPassword=s3cret-passw0rd", "--set", "web.token=w3b-t0ken"),
}
OAUTH_ENV = {"STREAMAPP_SASL_MECHANISM": "OAUTHBEARER", "STREAMAPP_OAUTH_TOKEN_URL": "https://auth.example.com/token",
             "STREAMAPP_OAUTH_CLIENT_ID": "streamapp",
             "STREAMAPP_OAUTH_CLIENT_SECRET_FILE": "/etc/streamapp/oauth/client-secret"}
# What an operator sets beside the two value sets; each renders, lints and validates.
VARIANTS = {
    "oauthbearer": (*MANAGED_FILE, "--set", "kafka.saslMechanism=", "--set", "kafka.saslUsername=",
                    "--set-json", f"pipeline.extraEnv={json.dumps(OAUTH_ENV)}",
                    "--set-json", 'pipeline.extraVolumes=[{"name": "oauth", "secret": {"secretName": "oauth-client"}}]',
                    "--set-json", 'pipeline.extraVolumeMounts=[{"name": "oauth", "mountPath": "/etc/streamapp/oauth"}]',
                    "--set-json", 'pipeline.extraEnvFrom=[{"secretRef": {"name": "more-settings"}}]',
                    "--set", "infer.autoscaling.authenticationRef=kafka-oauth",
                    "--set", "infer.autoscaling.triggerMetadata.sasl=oauthbearer",
                    "--set-json", 'networkPolicy.extraEgress=[{"ports": [{"port": 443, "protocol": "TCP"}]}]'),
    "existing-secrets": ("-f", str(CHART / "values-managed-kafka.yaml"),
                         "--set", f"kafka.existingSecret={PIPELINE_SECRET}", "--set", "kafka.existingSecretHasCA=false",
                         "--set", f"topicsJob.existingSecret={ADMIN_SECRET}",
                         "--set", f"web.existingSecret={TOKEN_SECRET}"),
    "registry-and-placement": (
        "--set-json", 'imagePullSecrets=[{"name": "regcred"}]', "--set", "serviceAccount.create=false",
        "--set", "serviceAccount.name=streamapp-runner", "--set", f"image.digest=sha256:{'0' * 64}",
        "--set-json", 'stageDefaults.tolerations=[{"key": "video", "operator": "Exists", "effect": "NoSchedule"}]',
        "--set-json", 'infer.nodeSelector={"pool": "cpu-large"}', "--set", "infer.cpuLimit=2",
        "--set", "join.priorityClassName=streamapp-stateful",
        "--set-json", 'sink.outVolume={"ephemeral": {"volumeClaimTemplate": {"spec": {'
                      '"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Gi"}}}}}}'),
    "optional-objects-off": ("--set", "topicsJob.enabled=false", "--set", "networkPolicy.enabled=false",
                             "--set", "podDisruptionBudget.enabled=false", "--set", "serviceAccount.create=false"),
}


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


@functools.cache
def _helm(binary: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *argv], capture_output=True, text=True, timeout=120)


def _template(helm: Path, args: tuple[str, ...], release: str) -> subprocess.CompletedProcess:
    return _helm(helm, "template", release, str(CHART), "--kube-version", KUBERNETES_VERSION, *args)


def render(helm: Path, *args: str, release: str = RELEASE) -> list[dict]:
    finished = _template(helm, args, release)
    assert finished.returncode == 0, finished.stderr
    return [doc for doc in yaml.safe_load_all(finished.stdout) if doc]


def refusal(helm: Path, *args: str) -> str:
    """What helm says when it refuses to render ``args``, on one line."""
    finished = _template(helm, args, RELEASE)
    assert finished.returncode != 0, f"rendered {args}"
    return " ".join(finished.stderr.split())


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


def pods(objects: list[dict]) -> list[dict]:
    """Everything that runs a pod: the workers and the topics Job."""
    return workers(objects) + of_kind(objects, "Job")


def pod_spec(owner: dict) -> dict:
    return owner["spec"]["template"]["spec"]


def container(owner: dict) -> dict:
    [only] = pod_spec(owner)["containers"]
    return only


def stage_of(worker: dict) -> str:
    return worker["metadata"]["labels"]["app.kubernetes.io/component"]


def is_hook(obj: dict) -> bool:
    return "helm.sh/hook" in obj["metadata"].get("annotations", {})


def environment(objects: list[dict], owner: dict) -> dict[str, str]:
    """What the pod's process sees: its ConfigMaps, then its own values; a value from a Secret the
    release does not write stands in as ``<secret>/<key>``."""
    env: dict[str, str] = {}
    for source in container(owner).get("envFrom", []):
        if "configMapRef" in source:
            env.update(named(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    for item in container(owner).get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            written = [obj for obj in of_kind(objects, "Secret") if obj["metadata"]["name"] == ref["name"]]
            env[item["name"]] = written[0]["stringData"][ref["key"]] if written else f"{ref['name']}/{ref['key']}"
    return env


def settings_of(env: dict[str, str], files: Path) -> Settings:
    """The settings a worker reads, with the files its Secrets mount stood in for under ``files``
    (settings refuse a secret or CA file that cannot be read)."""
    mounted = {}
    for name, value in env.items():
        if value.startswith(SECRET_MOUNTS):
            mounted[name] = files / value.removeprefix(SECRET_MOUNTS).replace("/", "-")
            mounted[name].write_text("stand-in-for-a-mounted-secret\n")
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


def cpus(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def documented_headroom_mib() -> dict[str, int]:
    """Each stage's container memory beyond its budget, as docs/operations.md states it."""
    match = re.search(r"memory limit is `STREAMAPP_MEMORY_BUDGET` \+ its stage's `memoryHeadroomMiB`: (\d+) MiB,"
                      r"\s+(\d+) MiB for infer", DOC)
    assert match, "docs/operations.md no longer states the container memory headroom"
    return {stage: int(match.group(2 if stage == "infer" else 1)) for stage in STAGES}


@pytest.mark.parametrize("value_set", list(VALUE_SETS) + list(VARIANTS))
def test_every_rendered_object_validates_strictly(helm, value_set):
    objects = render(helm, *{**VALUE_SETS, **VARIANTS}[value_set])
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap"} <= {obj["kind"] for obj in objects}
    errors = {f"{obj['kind']}/{obj['metadata']['name']}": validation_errors(obj) for obj in objects}
    assert {name: found for name, found in errors.items() if found} == {}


@pytest.mark.parametrize("value_set", list(VALUE_SETS) + list(VARIANTS))
def test_helm_lint_strict_passes(helm, value_set):
    finished = _helm(helm, "lint", "--strict", "--kube-version", KUBERNETES_VERSION, str(CHART),
                     *{**VALUE_SETS, **VARIANTS}[value_set])
    assert finished.returncode == 0, finished.stdout + finished.stderr


def test_managed_kafka_renders_the_custom_resources_and_the_secrets(helm):
    objects = render(helm, *VALUE_SETS["managed-kafka"])
    assert {"ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule", "Secret", "Job",
            "NetworkPolicy", "ServiceAccount", "PodDisruptionBudget"} <= {obj["kind"] for obj in objects}


@pytest.mark.parametrize("kind, path, wrong", [
    ("Deployment", ("spec", "template", "spec", "containers", 0), {"imagePullPolicyy": "Always"}),
    ("ScaledObject", ("spec",), {"maxReplicas": 4}),
    ("ScaledObject", ("spec", "advanced", "horizontalPodAutoscalerConfig", "behavior", "scaleUp"), {"window": 60}),
    ("ServiceMonitor", ("spec", "endpoints", 0), {"intervall": "15s"}),
    ("ServiceMonitor", ("spec", "endpoints", 0, "authorization"), {"credential": {}}),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0), {"fore": "1m"}),
])
def test_a_misspelt_field_fails_validation(helm, kind, path, wrong):
    obj = of_kind(render(helm, *VALUE_SETS["managed-kafka"]), kind)[0]
    target = obj
    for step in path:
        target = target[step]
    target.update(wrong)
    assert validation_errors(obj), f"{kind} with {wrong} passed validation"


# --- values that would fail at runtime are refused at render time -----------------------------

@pytest.mark.parametrize("args, named_in_refusal", [
    (("--set", "infer.replica=5"), "replica"),
    (("--set", "kafka.securityProtocol=SASL-SSL"), "securityProtocol"),
    (("--set", "kafka.saslMechanism=SCRAM-SHA512"), "saslMechanism"),
    ((*VALUE_SETS["managed-kafka"], "--set", "infer.autoscaling.minReplicas=10"), "minReplicas"),
    (("--set", "infer.autoscaling.minReplicas=0"), "minReplicas"),
    (("--set", "pipeline.extraEnv.STREAMAPP_OAUTH_CLIENT_SECRET=topsecret"), "STREAMAPP_OAUTH_CLIENT_SECRET"),
    (("--set", "join.diskBudgetMiB=8192"), "join.volumeSizeMiB"),
    (("--set", "join.sessionTimeout=45"), "sessionTimeout"),
    (("--set", "monitoring.additionalLabel.release=kube-prometheus-stack"), "additionalLabel"),
])
def test_a_misspelt_or_inconsistent_value_is_refused_naming_it(helm, args, named_in_refusal):
    assert named_in_refusal in refusal(helm, *args)


def test_a_mechanism_the_chart_cannot_set_up_is_refused_at_render_time(helm):
    said = refusal(helm, *VALUE_SETS["managed-kafka"], "--set", "kafka.saslMechanism=OAUTHBEARER")
    assert "OAUTHBEARER" in said and "pipeline.extraEnv" in said


def test_a_missing_user_or_password_is_refused_at_render_time(helm):
    assert "kafka.saslPassword is required" in refusal(helm, *MANAGED_FILE)
    no_user = (*VALUE_SETS["managed-kafka"], "--set", "kafka.saslUsername=")
    assert "kafka.saslUsername is required" in refusal(helm, *no_user)


def test_a_kubernetes_older_than_the_chart_needs_is_refused(helm):
    assert "kubeVersion" in refusal(helm, "--kube-version", "1.26.0")


# --- what the rendered objects carry --------------------------------------------------------------

def test_every_pod_pulls_with_the_registry_s_secret_and_mounts_no_api_token(helm):
    objects = render(helm, *VARIANTS["registry-and-placement"])
    for owner in pods(objects):
        spec = pod_spec(owner)
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], owner["metadata"]["name"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["serviceAccountName"] == "streamapp-runner"
        assert container(owner)["image"] == f"streamapp@sha256:{'0' * 64}"
    [account] = of_kind(render(helm), "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert {pod_spec(worker)["serviceAccountName"] for worker in workers(render(helm))} == {account["metadata"]["name"]}


@pytest.mark.parametrize("value_set", ["local", "managed-kafka", "existing-secrets"])
def test_the_topics_job_runs_before_the_workers_with_what_exists_then(helm, value_set):
    """A pre-install hook runs before the release's other objects exist: the Job may use only hooks
    of a lower weight and what the operator made beforehand; fsGroup lets it read its Secret."""
    objects = render(helm, *{**VALUE_SETS, **VARIANTS}[value_set])
    [job] = of_kind(objects, "Job")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    weight = int(annotations.get("helm.sh/hook-weight", 0))
    spec = pod_spec(job)
    used = {("ServiceAccount", spec["serviceAccountName"])}
    used |= {("Secret", volume["secret"]["secretName"]) for volume in spec.get("volumes", []) if "secret" in volume}
    used |= {("Secret", item["valueFrom"]["secretKeyRef"]["name"])
             for item in container(job)["env"] if "valueFrom" in item}
    used |= {("ConfigMap", source["configMapRef"]["name"]) for source in container(job).get("envFrom", [])}
    for kind, name in used:
        made = [obj for obj in of_kind(objects, kind) if obj["metadata"]["name"] == name]
        assert all(is_hook(obj) and int(obj["metadata"]["annotations"].get("helm.sh/hook-weight", 0)) < weight
                   for obj in made), f"the Job needs {kind} {name}, which the release makes after it"
    if any("secret" in volume for volume in spec.get("volumes", [])):
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]


@pytest.mark.parametrize("value_set", ["local", "managed-kafka"])
def test_the_topics_job_makes_the_changelog_the_join_reads(helm, value_set, tmp_path):
    objects = render(helm, *VALUE_SETS[value_set])
    [job] = of_kind(objects, "Job")
    made = settings_of(environment(objects, job), tmp_path)
    read = settings_of(environment(objects, named(objects, "StatefulSet", "-join")), tmp_path)
    assert changelog_name(made) == changelog_name(read)
    assert made.topic_prefix == read.topic_prefix and made.partitions == read.partitions


def test_the_topics_job_creates_with_an_admin_s_credentials_and_the_workers_use_theirs(helm):
    objects = render(helm, *VARIANTS["existing-secrets"])
    [job] = of_kind(objects, "Job")

    def credentials(owner: dict) -> set[str]:
        return {volume["secret"]["secretName"] for volume in pod_spec(owner)["volumes"]
                if volume["name"] == "kafka-credentials"} | {
            item["valueFrom"]["secretKeyRef"]["name"] for item in container(owner)["env"] if "valueFrom" in item}

    assert credentials(job) == {ADMIN_SECRET}
    assert {name for worker in workers(objects) for name in credentials(worker)} == {PIPELINE_SECRET}


def test_monitoring_objects_carry_the_labels_and_namespace_their_selectors_need(helm):
    objects = render(helm, *VALUE_SETS["managed-kafka"])
    wanted = yaml.safe_load((CHART / "values-managed-kafka.yaml").read_text())["monitoring"]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        [obj] = of_kind(objects, kind)
        assert wanted["additionalLabels"].items() <= obj["metadata"]["labels"].items()
    dashboard = named(objects, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["namespace"] == wanted["dashboardNamespace"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def selectors(expr: str) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []
    promql_parser.walk(promql_parser.parse(expr),
                       lambda node: found.append(node) if isinstance(node, promql_parser.VectorSelector) else None)
    return found


def matchers(selector: promql_parser.VectorSelector) -> dict[str, str]:
    return {matcher.name: matcher.value for matcher in selector.matchers.matchers}


def test_the_alert_rules_watch_this_release_s_workers_and_see_a_stage_that_is_down(helm):
    [rule] = of_kind(render(helm, *VALUE_SETS["managed-kafka"], release="cams"), "PrometheusRule")
    exprs = [item["expr"] for group in rule["spec"]["groups"] for item in group["rules"]]
    ours = [f"cams-{stage}" for stage in STAGES] + [f"cams-{stage}-0" for stage in STAGES]
    for expr in exprs:
        for selector in selectors(expr):
            scope = {name: value for name, value in matchers(selector).items() if name in ("job", "pod")}
            assert scope, f"{expr}: {selector.name or 'a selector'} reads every job's series"
            for value in scope.values():
                assert any(re.fullmatch(value, name) for name in ours), expr
                assert not re.fullmatch(value, "streamapp-join"), f"{expr} reads another release's workers"
    absent = {matchers(selector)["job"] for expr in exprs for selector in selectors(expr)
              if selector.name == "up" and "absent(" in expr}
    assert absent == {f"cams-{stage}" for stage in STAGES}
    read = {selector.name for expr in exprs for selector in selectors(expr)}
    assert NOT_THE_WORKERS <= read
    assert any('reason="OOMKilled"' in expr for expr in exprs)


def test_lag_is_summed_per_consumer_group_not_across_groups():
    """resize and join both read frames, each in its own group: their lags must not add up."""
    def groupings(node, found):
        if isinstance(node, promql_parser.AggregateExpr) and any(
                selector.name == "kafka_consumer_lag_records" for selector in selectors(str(node))):
            found.append(set(node.modifier.labels))

    found: list[set[str]] = []
    for item in alert_rules():
        promql_parser.walk(promql_parser.parse(item["expr"]), lambda node: groupings(node, found))
    assert found and all("job" in labels for labels in found)


def test_the_dashboard_shows_one_namespace_and_the_jobs_chosen():
    variables = {variable["name"] for variable in DASHBOARD["templating"]["list"]}
    assert {"namespace", "job"} <= variables
    for expr in dashboard_exprs():
        for selector in selectors(expr):
            assert {"namespace": "$namespace", "job": "$job"}.items() <= matchers(selector).items(), expr


def test_the_join_s_claim_does_not_move_when_its_disk_budget_does(helm):
    """A StatefulSet's volumeClaimTemplates cannot change: `helm upgrade` with another budget must
    leave them as they are."""
    claims = [named(render(helm, "--set", f"join.diskBudgetMiB={budget}"), "StatefulSet", "-join")["spec"][
        "volumeClaimTemplates"] for budget in (2048, 4096)]
    assert claims[0] == claims[1]


def test_each_stage_spreads_softly_and_takes_its_own_placement(helm):
    objects = render(helm, *VARIANTS["registry-and-placement"])
    for worker in workers(objects):
        spec, stage = pod_spec(worker), stage_of(worker)
        spread = spec["topologySpreadConstraints"]
        assert {item["topologyKey"] for item in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
        assert all(item["whenUnsatisfiable"] == "ScheduleAnyway" and
                   item["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == stage for item in spread)
        assert spec.get("nodeSelector") == ({"pool": "cpu-large"} if stage == "infer" else None)
        assert spec.get("priorityClassName") == ("streamapp-stateful" if stage == "join" else None)
        assert ("cpu" in container(worker)["resources"]["limits"]) == (stage == "infer")
    for owner in pods(objects):
        assert pod_spec(owner)["tolerations"] == [{"key": "video", "operator": "Exists", "effect": "NoSchedule"}]


def test_the_network_policy_lets_in_prometheus_and_out_dns_and_the_brokers_only(helm):
    objects = render(helm, *VALUE_SETS["managed-kafka"])
    [policy] = of_kind(objects, "NetworkPolicy")
    spec = policy["spec"]
    for owner in pods(objects):
        assert spec["podSelector"]["matchLabels"].items() <= owner["spec"]["template"]["metadata"]["labels"].items()
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    [ingress] = spec["ingress"]
    assert ingress["ports"] == [{"port": "web", "protocol": "TCP"}] and ingress["from"]
    egress = {(port["port"], port["protocol"]) for rule in spec["egress"] for port in rule["ports"]}
    assert egress == {(53, "UDP"), (53, "TCP"), (9093, "TCP")}
    assert not of_kind(render(helm, *VARIANTS["optional-objects-off"]), "NetworkPolicy")


@pytest.mark.parametrize("value_set, secret", [("managed-kafka", f"{RELEASE}-web"), ("existing-secrets", TOKEN_SECRET)])
def test_the_web_token_reaches_the_workers_as_a_file_and_prometheus_as_a_bearer(helm, value_set, secret):
    objects = render(helm, *{**VALUE_SETS, **VARIANTS}[value_set])
    for worker in workers(objects):
        path = Path(environment(objects, worker)["STREAMAPP_WEB_TOKEN_FILE"])
        [mount] = [m for m in container(worker)["volumeMounts"] if m["mountPath"] == str(path.parent)]
        [volume] = [v for v in pod_spec(worker)["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == secret
        assert {"key": "token", "path": path.name} in volume["secret"]["items"]
    [monitor] = of_kind(objects, "ServiceMonitor")
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": secret, "key": "token"}}
    if value_set == "managed-kafka":
        assert "w3b-t0ken" not in yaml.safe_dump([obj for obj in objects if obj["kind"] != "Secret"])


def test_a_caught_up_infer_group_does_not_ask_for_more_workers(helm):
    """Faust commits every broker_commit_interval, so a worker that keeps up at rate R shows up to
    R x that interval of committed lag; the threshold must be above it, and low enough that a few
    seconds of one worker's work waiting asks for another."""
    [scaled] = of_kind(render(helm, *VALUE_SETS["managed-kafka"]), "ScaledObject")
    [trigger] = scaled["spec"]["triggers"]
    threshold = int(trigger["metadata"]["lagThreshold"])
    rates = re.search(r"one infer worker through a backlog .*\| ([\d.]+)–([\d.]+) frames/s \|$", BENCHMARKS, re.M)
    slowest, fastest = float(rates.group(1)), float(rates.group(2))
    commit_s = faust.App("commit-interval").conf.broker_commit_interval
    assert fastest * commit_s < threshold <= slowest * (commit_s + 10)
    assert "cooldownPeriod" not in scaled["spec"], "KEDA applies it only to scaling to zero"
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] > 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= behavior["scaleUp"]["stabilizationWindowSeconds"]


@pytest.mark.parametrize("value_set", ["local", "managed-kafka", "registry-and-placement"])
def test_every_emptydir_s_space_is_requested_from_the_scheduler(helm, value_set):
    objects = render(helm, *{**VALUE_SETS, **VARIANTS}[value_set])
    for worker in workers(objects):
        scratch = sum(mebibytes(volume["emptyDir"]["sizeLimit"]) for volume in pod_spec(worker)["volumes"]
                      if "emptyDir" in volume)
        assert mebibytes(container(worker)["resources"]["requests"]["ephemeral-storage"]) >= scratch


def test_a_sink_can_write_to_a_volume_of_its_own(helm):
    sink = named(render(helm, *VARIANTS["registry-and-placement"]), "Deployment", "-sink")
    [out] = [volume for volume in pod_spec(sink)["volumes"] if volume["name"] == "out"]
    assert set(out) == {"name", "ephemeral"}
    assert {"name": "out", "mountPath": "/out"} in container(sink)["volumeMounts"]


def test_session_timeouts_reach_the_consumer_and_the_join_s_outlasts_a_rescheduled_pod(helm, tmp_path):
    objects = render(helm)
    timeouts = {stage_of(worker): settings_of(environment(objects, worker), tmp_path).session_timeout_s
                for worker in workers(objects)}
    grace = {stage_of(worker): pod_spec(worker)["terminationGracePeriodSeconds"] for worker in workers(objects)}
    others = set(STAGES) - {"join"}
    assert timeouts["join"] >= 30 and timeouts["join"] > max(timeouts[stage] for stage in others)
    assert grace["join"] > max(grace[stage] for stage in others)
    app = create_app(Settings(data_dir=tmp_path / "data", memory_budget_bytes=256 * MIB, max_frame_bytes=MIB,
                              session_timeout_s=45.0))
    assert app.conf.broker_session_timeout == 45.0


def test_oauthbearer_secrets_come_from_volumes_not_the_configmap_and_keda_uses_its_own_authentication(helm, tmp_path):
    objects = render(helm, *VARIANTS["oauthbearer"])
    for owner in pods(objects):
        assert {"name": "oauth", "mountPath": "/etc/streamapp/oauth"} in container(owner)["volumeMounts"]
        assert {"secretRef": {"name": "more-settings"}} in container(owner)["envFrom"]
        env = environment(objects, owner)
        assert OAUTH_ENV.items() <= env.items()
        assert settings_of(env, tmp_path).security.mechanism == "OAUTHBEARER"
    assert "STREAMAPP_OAUTH_CLIENT_SECRET" not in named(objects, "ConfigMap", "-env")["data"]
    [scaled] = of_kind(objects, "ScaledObject")
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": "kafka-oauth"} and trigger["metadata"]["sasl"] == "oauthbearer"
    assert not of_kind(objects, "TriggerAuthentication")


def test_an_existing_secret_of_a_public_ca_service_asks_for_no_ca_file(helm, tmp_path):
    objects = render(helm, *VARIANTS["existing-secrets"])
    for owner in pods(objects):
        env = environment(objects, owner)
        assert "STREAMAPP_SSL_CA_FILE" not in env
        settings_of(env, tmp_path)
    [authentication] = of_kind(objects, "TriggerAuthentication")
    assert "ca" not in {ref["parameter"] for ref in authentication["spec"]["secretTargetRef"]}


def test_the_managed_example_s_records_fit_under_a_service_s_8_mib_cap(helm, tmp_path):
    objects = render(helm, *VALUE_SETS["managed-kafka"])
    settings = settings_of(environment(objects, named(objects, "StatefulSet", "-join")), tmp_path)
    assert max_record_bytes(settings) <= 8 * MIB


def test_opencv_runs_as_many_threads_as_the_worker_asks_cpus_for(helm):
    objects = render(helm)
    for worker in workers(objects):
        env = environment(objects, worker)
        requested = cpus(container(worker)["resources"]["requests"]["cpu"])
        assert env["OMP_NUM_THREADS"] == env["OPENCV_FOR_THREADS_NUM"]
        assert 1 <= int(env["OPENCV_FOR_THREADS_NUM"]) <= math.ceil(requested)
    for threads in {environment(objects, worker)["OPENCV_FOR_THREADS_NUM"] for worker in workers(objects)}:
        told = subprocess.run([sys.executable, "-c", "import cv2; print(cv2.getNumThreads())"], capture_output=True,
                              text=True, env={**os.environ, "OPENCV_FOR_THREADS_NUM": threads}, check=True)
        assert told.stdout.strip() == threads


def test_memory_limit_holds_the_budget_and_the_documented_headroom(rendered):
    headroom = documented_headroom_mib()
    for worker in workers(rendered):
        budget = parse_bytes(environment(rendered, worker)["STREAMAPP_MEMORY_BUDGET"]) / MIB
        resources = container(worker)["resources"]
        limit = mebibytes(resources["limits"]["memory"])
        assert limit >= budget + headroom[stage_of(worker)], worker["metadata"]["name"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_infer_s_headroom_holds_the_process_and_yolo_s_measured_buffers():
    baseline = int(re.search(r"~(\d+) MB process\s+baseline", DOC).group(1))
    buffers = int(re.search(r"(\d+) MB for a batch of 4", BENCHMARKS).group(1))
    assert documented_headroom_mib()["infer"] * MIB >= (baseline + buffers) * 1000**2


def test_each_stage_has_its_own_budgets_written_as_whole_numbers(helm, tmp_path):
    objects = render(helm, "--set", "join.memoryBudgetMiB=1048576", "--set", "join.diskBudgetMiB=2000000",
                     "--set", "join.volumeSizeMiB=2000064")
    budgets = {stage_of(worker): settings_of(environment(objects, worker), tmp_path).memory_budget_bytes
               for worker in workers(objects)}
    assert budgets == {**dict.fromkeys(STAGES, 1024 * MIB), "join": 1048576 * MIB}
    join = settings_of(environment(objects, named(objects, "StatefulSet", "-join")), tmp_path)
    assert join.disk_budget_bytes == 2000000 * MIB


def test_a_changed_password_rolls_the_workers(helm):
    def checksums(password: str) -> list[str]:
        objects = render(helm, *VALUE_SETS["managed-kafka"], "--set", f"kafka.saslPassword={password}")
        return [worker["spec"]["template"]["metadata"]["annotations"]["checksum/secret"] for worker in workers(objects)]

    before, after = checksums("one-password"), checksums("another-password")
    assert all(old != new for old, new in zip(before, after, strict=True))


def test_join_volume_holds_the_disk_budget_and_the_reserve(rendered):
    join = named(rendered, "StatefulSet", "-join")
    env = environment(rendered, join)
    [claim] = join["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert {"name": "data", "mountPath": env["STREAMAPP_DATA_DIR"]} in container(join)["volumeMounts"]
    size = mebibytes(claim["spec"]["resources"]["requests"]["storage"])
    needed = (parse_bytes(env["STREAMAPP_DISK_BUDGET"]) + parse_bytes(env["STREAMAPP_DISK_RESERVE"])) / MIB
    assert size >= needed
    # A volume left by a scale-down would hold a stale store when scaled up again.
    assert join["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Delete"


def test_sink_out_volume_holds_its_budget_and_the_reserve(helm):
    for args in VALUE_SETS.values():
        objects = render(helm, *args)
        sink = named(objects, "Deployment", "-sink")
        env = environment(objects, sink)
        [out] = [v for v in pod_spec(sink)["volumes"] if v["name"] == "out"]
        needed = (5 / 4 * parse_bytes(env["STREAMAPP_SINK_DISK_BUDGET"])
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
        spec, main = pod_spec(worker), container(worker)
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
        assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        mounted = {mount["mountPath"] for mount in main["volumeMounts"]}
        assert {env["STREAMAPP_DATA_DIR"], "/tmp"} <= mounted, "a read-only root needs these writable"
        if env["STREAMAPP_STAGES"] == "sink":
            assert env["STREAMAPP_OUT_DIR"] in mounted
    assert stages == set(STAGES)
    assert {obj["kind"] for obj in workers(rendered) if "join" in obj["metadata"]["name"]} == {"StatefulSet"}
    disruption = {obj["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
                  for obj in of_kind(rendered, "PodDisruptionBudget")}
    assert disruption == stages


def test_managed_kafka_credentials_reach_the_pods_only_through_secrets(helm):
    objects = render(helm, *VALUE_SETS["managed-kafka"])
    secrets = [obj for obj in of_kind(objects, "Secret") if "sasl-password" in obj["stringData"]]
    assert secrets and all(secret["stringData"]["sasl-password"] == "s3cret-passw0rd" for secret in secrets)
    assert "s3cret-passw0rd" not in yaml.safe_dump([obj for obj in objects if obj["kind"] != "Secret"])
    for owner in pods(objects):
        env = environment(objects, owner)
        assert env["STREAMAPP_SECURITY_PROTOCOL"] == "SASL_SSL"
        assert env["STREAMAPP_SASL_MECHANISM"] == "SCRAM-SHA-512"
        assert env["STREAMAPP_SASL_PASSWORD_FILE"] == "/etc/streamapp/kafka/sasl-password"
        assert env["STREAMAPP_SSL_CA_FILE"] == "/etc/streamapp/kafka/ca.crt"
        mounts = {m["name"]: m["mountPath"] for m in container(owner)["volumeMounts"]}
        assert mounts["kafka-credentials"] == "/etc/streamapp/kafka"


# --- alert rules and dashboard ------------------------------------------------------------------

ALERTS = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
DASHBOARD = json.loads((CHART / "files" / "dashboard.json").read_text())
# Series the rules read that no worker exports: Prometheus' own and kube-state-metrics'.
NOT_THE_WORKERS = {"up", "kube_pod_container_status_restarts_total", "kube_pod_container_status_last_terminated_reason"}


def metric_rows() -> set[str]:
    """The metrics of docs/operations.md's tables (tests/unit/test_operations_doc.py ties them to the code)."""
    return set(re.findall(r"^\| `([a-z_]+)` \| (?:gauge|counter|histogram)", DOC, re.M))


def metrics_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (parsed, so a syntax error fails here); a
    ``{__name__=~"..."}`` selector stands for the documented metrics its pattern matches (at
    least one); a histogram's ``_bucket`` series for its family."""
    names = set()
    for selector in selectors(expr):
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
    unknown = used - standard - NOT_THE_WORKERS - metric_rows()
    assert not unknown, f"not in docs/operations.md: {sorted(unknown)}"
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
