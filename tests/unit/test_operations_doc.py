"""docs/operations.md stays complete: every setting and every metric has its row."""

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from streamapp.kafka.monitor import faust_monitor
from streamapp.settings import _ENV, Settings
from streamapp.tools.localkafka.acls import PatternType, pipeline_acls
from streamapp.worker.metrics import HELP, Metrics

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


def rows() -> set[str]:
    """The first cell of every table row, where it is one `code` name."""
    return set(re.findall(r"^\| `([A-Za-z_]+)`", DOC, re.M))


def family_rows() -> set[str]:
    """Rows of the families that prometheus_client and Faust name: `prefix_*`."""
    return set(re.findall(r"^\| `([a-z_]+)\*`", DOC, re.M))


def test_every_setting_is_documented():
    variables = {variable for variable, _ in _ENV.values()} | {"STREAMAPP_RESIZE"}
    assert variables <= rows(), f"not in docs/operations.md: {sorted(variables - rows())}"


def test_every_metric_is_documented():
    assert set(HELP) <= rows(), f"not in docs/operations.md: {sorted(set(HELP) - rows())}"


def test_every_family_on_the_metrics_page_is_documented():
    metrics = Metrics()
    faust_monitor(metrics.registry)
    metrics.inc("join_joined_total")
    names = {sample.name for family in text_string_to_metric_families(metrics.prometheus_text())
             for sample in family.samples}
    # A histogram's samples are documented by its family's row.
    undocumented = {name for name in names if not (
        {name, re.sub(r"_(bucket|sum|count)$", "", name)} & rows()
        or any(name.startswith(prefix) for prefix in family_rows()))}
    assert {"process_", "python_gc_", "faust_"} <= family_rows()
    assert "join_joined_total" in names and not undocumented, f"not in docs/operations.md: {sorted(undocumented)}"


def test_every_security_setting_is_documented(tmp_path):
    pem = tmp_path / "file.pem"
    pem.write_text("")
    tls = {"STREAMAPP_SSL_CA_FILE": str(pem), "STREAMAPP_SSL_CERT_FILE": str(pem), "STREAMAPP_SSL_KEY_FILE": str(pem),
           "STREAMAPP_SSL_KEY_PASSWORD": "x"}
    scram = {"STREAMAPP_SECURITY_PROTOCOL": "SASL_SSL", "STREAMAPP_SASL_MECHANISM": "SCRAM-SHA-512",
             "STREAMAPP_SASL_USERNAME": "u", "STREAMAPP_SASL_PASSWORD": "p", **tls}
    oauth = {"STREAMAPP_SECURITY_PROTOCOL": "SASL_SSL", "STREAMAPP_SASL_MECHANISM": "OAUTHBEARER",
             "STREAMAPP_OAUTH_TOKEN_URL": "https://t", "STREAMAPP_OAUTH_CLIENT_ID": "c",
             "STREAMAPP_OAUTH_CLIENT_SECRET": "s", "STREAMAPP_OAUTH_SCOPE": "k"}
    variables = {name for env in (scram, oauth) for name in Settings.from_env(env).security.to_env()}
    assert len(variables) == 13 and variables <= rows(), f"not in docs/operations.md: {sorted(variables - rows())}"


def test_the_documented_acls_are_the_ones_the_local_broker_grants():
    section = DOC.split("### Kafka ACLs", 1)[1].split("\n### ", 1)[0]
    documented = re.findall(r"^\| (READ|WRITE) \| ([A-Z_]+) \| `([^`]+)` \| ([A-Z]+) \| ([^|]+) \|$", section, re.M)
    granted = [(acl.operation.name, acl.resource.name, f"{acl.name}*" if acl.pattern is PatternType.PREFIXED
                else acl.name, acl.pattern.name, ", ".join(acl.needed_by))
               for acl in pipeline_acls(Settings(processing_guarantee="exactly_once"))]
    assert documented == granted


def settings_rows(page: str) -> list[str]:
    """The settings each table of ``page`` documents: a table whose header has a "default" column."""
    names = []
    for table in re.findall(r"(?:^\|.*\n)+", page, re.M):
        header, *rows = table.splitlines()
        if "| default |" in header:
            names += [name for row in rows for name in re.findall(r"^\| `(STREAMAPP_[A-Z_]+)`", row)]
    return names


def test_each_setting_has_one_row_in_all_the_docs():
    """The settings table of docs/operations.md is the only one; every other page links to it."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    pages = {page.name: page.read_text() for page in [docs.parent / "README.md", *docs.glob("*.md")]}
    elsewhere = sorted(name for name, text in pages.items() if name != "operations.md" and settings_rows(text))
    names = settings_rows(pages["operations.md"])
    assert not elsewhere, f"settings tables outside docs/operations.md: {elsewhere}"
    assert len(names) == len(set(names)) > 40, sorted({name for name in names if names.count(name) > 1})
