"""docker-compose.yml follows the Compose Specification (its JSON schema, so a misspelt key fails)
and stays in step with the code: the modules, subcommands, options, stages and settings it names
all exist, and every worker's web port is published. (No Docker needed: the file is only read.)"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import re
import shlex
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from streamapp import assets
from streamapp.cli.main import build_parser
from streamapp.settings import STAGES, Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (REPO / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict = COMPOSE["services"]
MIB = 1024**2
# The Compose Specification's schema, vendored with its origin beside it.
SCHEMA_FILE = Path(__file__).parent / "compose-spec" / "compose_spec.json"
SCHEMA_SHA256 = "0dc04bd346dcfee1b1419628fff79937bbf076925f298f272a2b490e2b112bac"


def argv(service: dict) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else list(command)


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def depends_on(service: dict) -> dict[str, str]:
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def ours(service: dict) -> bool:
    return "build" in service


def profile(service: dict) -> str:
    """The profile a service belongs to; "" for the default stack that `docker compose up` runs."""
    profiles = service.get("profiles", [])
    assert len(profiles) <= 1, f"a service in several profiles: {profiles}"
    return profiles[0] if profiles else ""


# Profiles that run beside the default services, replacing some of them (named on the command line).
ADD_ON_PROFILES = {"synthetic"}


def may_use(service: dict, other: dict) -> bool:
    """Whether ``service`` may depend on or connect to ``other``: one of its own profile, or, from
    an add-on profile, one of the default stack."""
    return profile(other) == profile(service) or (profile(service) in ADD_ON_PROFILES and profile(other) == "")


def stage_of(service: dict) -> str:
    return environment(service).get("STREAMAPP_STAGES", "")


def interpolate(value) -> str:
    """Compose's ``${VAR:-default}`` with no variable set."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))


def compose_schema() -> dict:
    raw = SCHEMA_FILE.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == SCHEMA_SHA256, f"{SCHEMA_FILE} is not the vendored file"
    schema = json.loads(raw)
    # The project name, added to the specification after the vendored release.
    schema["properties"]["name"] = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]*$"}
    return schema


def schema_errors(text: str) -> list[str]:
    """What the schema finds wrong in a compose file, after interpolation as Compose does it."""
    validator = jsonschema.Draft201909Validator(compose_schema())
    document = yaml.safe_load(interpolate(text))
    return sorted(f"{'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
                  for error in validator.iter_errors(document))


def web_port(service: dict) -> int:
    args = argv(service)
    return int(args[args.index("--web-port") + 1])


def kafka_nodes(in_profile: str) -> dict[str, dict]:
    return {name: service for name, service in SERVICES.items()
            if service.get("image", "").startswith("apache/kafka") and profile(service) == in_profile}


def commands_of(program: str) -> list[tuple[str, list[str]]]:
    found = [(name, argv(s)) for name, s in SERVICES.items()]
    return [(name, args) for name, args in found if args and args[0] == program]


def test_the_file_follows_the_compose_specification():
    assert schema_errors(COMPOSE_TEXT) == []


@pytest.mark.parametrize("right, misspelt", [
    ("\nservices:\n", "\nservice:\n"),
    ("  restart: unless-stopped\n", "  restrat: unless-stopped\n"),
    ("    healthcheck: *kafka-healthcheck\n", "    healtcheck: *kafka-healthcheck\n"),
    ("condition: service_healthy", "condition: service_healty"),
    ('    ports:\n      - "127.0.0.1:6069:6066"', '    port:\n      - "127.0.0.1:6069:6066"'),
    ("  interval: 5s", "  intervall: 5s"),
])
def test_a_misspelt_key_or_value_fails_the_schema(right, misspelt):
    assert right in COMPOSE_TEXT
    errors = schema_errors(COMPOSE_TEXT.replace(right, misspelt, 1))
    word = next(a for a, b in zip(misspelt.split(), right.split() + [""], strict=False) if a != b).rstrip(":")
    assert any(word in error for error in errors), errors


def test_every_worker_publishes_its_web_port_on_the_loopback():
    host_ports: dict[str, int] = {}
    replacing = {}
    for name, _ in commands_of("faust"):
        service = SERVICES[name]
        published = [str(port).rsplit(":", 2) for port in service.get("ports", [])]
        assert [container for *_, container in published] == [str(web_port(service))], name
        [[address, host, _]] = published
        assert address == "127.0.0.1", f"{name} publishes beyond this machine"
        if "deploy" in service:
            assert host == "", f"{name}: replicas need a free host port each, not {host}"
        elif profile(service) in ADD_ON_PROFILES:
            replacing[stage_of(service)] = int(host)
        else:
            host_ports[stage_of(service)] = int(host)
    assert len(host_ports) == len(set(host_ports.values())) == len(STAGES)
    # A worker of an add-on profile takes the place (and the port) of the default one of its stage.
    assert all(host_ports[stage] == port for stage, port in replacing.items())


def test_every_service_has_an_image_or_build_and_ours_a_command():
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name
        if ours(service):
            assert argv(service), f"service {name} runs our image but gives no command"


def test_build_context_has_a_dockerfile_whose_sources_exist():
    contexts = {s["build"] if isinstance(s["build"], str) else s["build"].get("context", ".")
                for s in SERVICES.values() if ours(s)}
    assert contexts == {"."}
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", dockerfile, re.M)
    for line in re.findall(r"^COPY (?!--from=)(.+)$", dockerfile, re.M):
        for source in line.split()[:-1]:
            if not source.startswith("--"):
                assert (REPO / source).exists() or source == "README.md", source


def dockerfile_stages() -> list[tuple[str, list[str]]]:
    """The Dockerfile's build stages: (name, instructions with continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    stages: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("FROM "):
            stages.append((line.split(" AS ")[1].strip() if " AS " in line else "", []))
        elif line.strip() and not line.startswith("#"):
            stages[-1][1].append(line.strip())
    return stages


def image_assets_home() -> Path:
    """Where the image keeps the model and the samples, after checking that a build stage fetches
    them with the commands users run and the final stage copies them and points the cache there."""
    stages = dict(dockerfile_stages())
    *_, (final_name, final) = dockerfile_stages()
    [(fetching, run)] = [(name, line) for name, lines in stages.items() for line in lines
                         if name != final_name and line.startswith("RUN") and assets.MODEL_FETCH in line]
    fetched_into = set(re.findall(r"STREAMAPP_ASSETS_HOME=(\S+) streamapp", run))
    assert len(fetched_into) == 1, run
    assert {assets.MODEL_FETCH, assets.SAMPLES_FETCH} <= {f"streamapp {word}" for word in re.findall(
        r"streamapp (\w+)", run)}
    assert "apt-get update" in run, "vtest.avi comes from Debian's opencv-doc (`apt-get download`)"
    [copy] = [line for line in final if line.startswith(f"COPY --from={fetching} ")]
    _, _, source, target = copy.split()
    assert {source} == fetched_into
    env = dict(item.split("=", 1) for line in final if line.startswith("ENV ") for item in line.split()[1:])
    assert env["STREAMAPP_ASSETS_HOME"] == target
    return Path(target)


def test_the_image_fetches_the_model_and_the_samples_in_a_build_stage_and_carries_them():
    assert image_assets_home().is_absolute()


def test_the_default_stack_runs_yolo_on_the_samples_the_image_carries():
    home = image_assets_home()
    default = {name: service for name, service in SERVICES.items() if profile(service) == ""}
    [infer] = [s for s in default.values() if "faust" in argv(s)[:1] and stage_of(s) == "infer"]
    assert Settings.from_env(environment(infer)).detector == "yolo"
    produced = [argv(s) for s in default.values() if argv(s)[:2] == ["streamapp", "produce"]]
    videos = {Path(args[args.index("--video") + 1]) for args in produced}
    assert videos == {asset.path(home) for asset in assets.SAMPLES}
    assert not any("--synthetic" in args for args in produced)


def test_the_synthetic_profile_runs_the_colour_detector_on_synthetic_streams():
    synthetic = {name: service for name, service in SERVICES.items() if profile(service) == "synthetic"}
    [infer] = [s for s in synthetic.values() if "faust" in argv(s)[:1]]
    assert stage_of(infer) == "infer" and Settings.from_env(environment(infer)).detector == "color"
    [source] = [argv(s) for s in synthetic.values() if argv(s)[:2] == ["streamapp", "produce"]]
    assert "--synthetic" in source
    # Named on the command line in the file's header, with the default services it runs beside.
    header = COMPOSE_TEXT.split("\nname:")[0].replace("\\\n#", "")
    [line] = re.findall(r"docker compose --profile synthetic up --build ([^\n]+)", header)
    named = set(line.split())
    assert set(synthetic) <= named and "infer" not in named
    assert {name for name in named if name in SERVICES} == named


def test_every_worker_is_healthy_once_its_readiness_endpoint_says_ready():
    for name, _ in commands_of("faust"):
        service = SERVICES[name]
        test = service["healthcheck"]["test"]
        assert f"127.0.0.1:{web_port(service)}/readyz" in " ".join(test), name
        assert environment(service)["STREAMAPP_WEB_BIND"] == "0.0.0.0", f"{name}: a published port needs it"


def test_depends_on_names_existing_services_with_valid_conditions():
    for name, service in SERVICES.items():
        for other, condition in depends_on(service).items():
            assert other in SERVICES, f"{name} depends on unknown service {other}"
            assert other != name
            assert may_use(service, SERVICES[other]), f"{name} depends on {other} of another profile"
            assert condition in ("service_started", "service_healthy", "service_completed_successfully")
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[other], f"{other} has no healthcheck for {name} to wait on"


def test_named_volumes_are_declared_and_worker_data_is_not_shared():
    declared = set(COMPOSE.get("volumes") or {})
    owners: dict[str, str] = {}
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume["source"]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name} mounts undeclared volume {source}"
                assert source not in owners, f"{name} and {owners.get(source)} share volume {source}"
                owners[source] = name


def test_faust_apps_name_modules_of_this_project():
    apps = commands_of("faust")
    assert apps, "no faust workers in docker-compose.yml"
    for name, args in apps:
        flag = "-A" if "-A" in args else "--app"
        module = args[args.index(flag) + 1].split(":")[0]
        assert module.startswith("streamapp."), (name, module)
        assert importlib.util.find_spec(module) is not None, f"{name}: no module {module}"
        assert "worker" in args


CLI_COMMANDS = commands_of("streamapp")


@pytest.mark.parametrize("service, args", CLI_COMMANDS, ids=[name for name, _ in CLI_COMMANDS])
def test_streamapp_commands_are_known_to_the_cli(service, args):
    parser = build_parser()
    [subparsers] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    if args[1] not in subparsers.choices:
        pytest.fail(f"service {service} runs `streamapp {args[1]}`, which the CLI does not have "
                    f"(it has: {', '.join(sorted(subparsers.choices))})", pytrace=False)
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            parser.parse_args(args[1:])
        except SystemExit as exc:
            pytest.fail(f"service {service}: `{shlex.join(args)}` does not parse: {errors.getvalue()} ({exc})")


def test_every_service_environment_is_valid_settings():
    for name, service in SERVICES.items():
        env = environment(service)
        if ours(service):
            settings = Settings.from_env(env)
            for address in settings.bootstrap_servers.split(","):
                host = address.split(":")[0]
                assert host in SERVICES, f"{name}: STREAMAPP_BROKER names unknown host {host}"
                assert may_use(service, SERVICES[host]), f"{name} uses {host} of another profile"


@pytest.mark.parametrize("in_profile", ["", "cluster"])
def test_one_worker_service_per_stage_in_each_profile(in_profile):
    staged = {}
    for name, _ in commands_of("faust"):
        if profile(SERVICES[name]) != in_profile:
            continue
        stages = environment(SERVICES[name]).get("STREAMAPP_STAGES", "")
        assert stages, f"worker {name} does not set STREAMAPP_STAGES"
        for stage in (s.strip() for s in stages.split(",")):
            assert stage in STAGES, f"{name}: unknown stage {stage!r}"
            assert stage not in staged, f"stage {stage} runs in both {staged[stage]} and {name}"
            staged[stage] = name
    assert set(staged) == set(STAGES)


def test_kafka_is_single_node_kraft_for_16mib_frames():
    kafka = SERVICES["kafka"]
    assert kafka["image"] == "apache/kafka:4.1.1"
    env = environment(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) >= 16 * MIB
    assert int(env["KAFKA_REPLICA_FETCH_MAX_BYTES"]) >= 16 * MIB
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(env["KAFKA_NODE_ID"] + "@")
    assert "kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]


def test_cluster_profile_is_three_kraft_brokers_that_replicate_every_topic_three_times():
    nodes = kafka_nodes("cluster")
    assert len(nodes) == 3
    envs = {name: environment(service) for name, service in nodes.items()}
    voters = {f"{env['KAFKA_NODE_ID']}@{name}:9093" for name, env in envs.items()}
    assert len({env["KAFKA_NODE_ID"] for env in envs.values()}) == 3
    for name, env in envs.items():
        assert set(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")) == voters
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
        assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) >= 16 * MIB
        for replication in ("KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
                            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
            assert env[replication] == "3", (name, replication)
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert "healthcheck" in nodes[name]
    assert len({env["CLUSTER_ID"] for env in envs.values()}) == 1
    assert len({str(service.get("volumes")) for service in nodes.values()}) == 3


def test_cluster_workers_run_several_replicas_each_with_its_own_data():
    workers = [name for name, _ in commands_of("faust") if profile(SERVICES[name]) == "cluster"]
    brokers = kafka_nodes("cluster")
    for name in workers:
        service = SERVICES[name]
        assert int(interpolate(service["deploy"]["replicas"])) >= 2, name
        settings = Settings.from_env(environment(service))
        assert settings.replication_factor == len(brokers) == 3
        assert {address.split(":")[0] for address in settings.bootstrap_servers.split(",")} == set(brokers)
        # Replicas share a named volume's folder, and RocksDB allows one process per folder.
        named = [volume for volume in service.get("volumes", []) if not volume.startswith("/")]
        assert named == [], f"{name}: replicas would share {named}"


def test_every_install_is_pinned_by_the_constraints_file():
    pins = constraint_pins()
    assert {"faust-streaming", "aiokafka", "rocksdict", "numpy", "opencv-python-headless"} <= set(pins)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = [re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0] for spec in
                [*project["dependencies"], *project["optional-dependencies"]["test"]]]
    pinned = {_normalized(name) for name in pins} | {project["name"]}  # an extra may name another extra
    assert [name for name in required if _normalized(name) not in pinned] == [], "not pinned in constraints.txt"
    assert "-c constraints.txt" in (REPO / "run").read_text()
    assert "-c /src/constraints.txt" in (REPO / "Dockerfile").read_text()


def test_the_libraries_the_project_reaches_inside_are_pinned_exactly_as_tested():
    # A plain `pip install .` (no constraints file) must install these at the tested versions.
    pins = constraint_pins()
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    exact = dict(spec.split("==") for spec in dependencies if "==" in spec)
    assert set(exact) == {"faust-streaming", "mode-streaming", "aiokafka", "prometheus_client"}
    assert {name: pins[name] for name in exact} == exact


def constraint_pins() -> dict[str, str]:
    return dict(line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))


def _normalized(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()
