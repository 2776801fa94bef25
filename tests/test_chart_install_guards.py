"""What the chart does so a documented install works, or fails at the render naming why, instead of a pod that
crashes later: the sign-in Secret's keys (the README's command holds every key a pod reads, and each pod mounts
only those), the refusals (more than one journal on SQLite, a config file that does not parse, a memory size
without its unit, a database URL the journal cannot use, a redaction kind Helm's schema check reports with its
path), the Ingresses of the console and human-interaction, the timers migration hook's time budget and what the
install notes say. Rendered with the Helm SDK, as tests/test_deploy_files.py does; no cluster."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_files import CHART, ROOT, SERVICES, _deployments, _helm, _merge, _notes, _render, _validate

from temporality_journal.database import async_url
from temporality_journal.signin import MIN_SESSION_SECRET
from temporality_service.vouch import MIN_SECRET_LENGTH, Voucher

SIGNIN_DIR = "/etc/temporality/signin/"
OIDC = {
    "issuer": "https://sso.example.org/realms/acme",
    "clientId": "temporality-console",
    "redirectBaseUrl": "https://temporality.example.org",
}


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def _signin_items(deployment: dict[str, Any]) -> set[str] | None:
    """The keys of the sign-in Secret projected into the pod (None: no such volume)."""
    pod = deployment["spec"]["template"]["spec"]
    volume = next((v for v in pod["volumes"] if v["name"] == "signin"), None)
    if volume is None:
        assert "signin" not in {m["name"] for m in pod["containers"][0]["volumeMounts"]}
        return None
    items = volume["secret"]["items"]
    assert all(i["key"] == i["path"] for i in items)
    return {i["key"] for i in items}


def _signin_reads(deployment: dict[str, Any]) -> set[str]:
    """The files of the sign-in directory the pod's settings name."""
    return {v.removeprefix(SIGNIN_DIR) for v in _env(deployment).values() if v and v.startswith(SIGNIN_DIR)}


_SIGN_INS: dict[str, tuple[dict[str, Any], dict[str, set[str]]]] = {
    "oidc": (
        {"oidc": OIDC},
        {
            "journal": {"client-secret", "session-secret", "inbox-vouch", "api-vouch"},
            "human-interaction": {"inbox-vouch"},
            "trigger-gateway": {"api-vouch"},
        },
    ),
    "password": (
        {"password": {"enabled": True}},
        {
            "journal": {"session-secret", "inbox-vouch", "api-vouch"},
            "human-interaction": {"inbox-vouch"},
            "trigger-gateway": {"api-vouch"},
        },
    ),
    "password without the inbox vouch": (
        {"password": {"enabled": True}, "existingSecret": {"inboxVouchKey": ""}},
        {"journal": {"session-secret", "api-vouch"}, "trigger-gateway": {"api-vouch"}},
    ),
    "oidc without the api vouch, other key names": (
        {"oidc": OIDC, "existingSecret": {"apiVouchKey": "", "sessionSecretKey": "cookie", "inboxVouchKey": "ib"}},
        {"journal": {"client-secret", "cookie", "ib"}, "human-interaction": {"ib"}},
    ),
}


@pytest.mark.parametrize("case", sorted(_SIGN_INS))
def test_each_pod_mounts_only_the_sign_in_keys_it_reads(case: str) -> None:
    """The internet-facing trigger-gateway never gets the client secret, the session key or the inbox vouch secret;
    every file a pod's settings name is projected, nothing else."""
    sign_in, expected = _SIGN_INS[case]
    values = {"signIn": _merge({"existingSecret": {"name": "temporality-signin"}}, sign_in)}
    deployments = _deployments(values)
    mounted = {name: _signin_items(d) for name, d in deployments.items()}
    assert {name: keys for name, keys in mounted.items() if keys is not None} == expected
    for name, deployment in deployments.items():
        assert (mounted[name] or set()) == _signin_reads(deployment), name


def _command_after(text: str, start: str) -> list[str]:
    """The shell words of the command that begins with ``start`` in ``text`` (continued lines joined)."""
    at = text.index(start)
    lines: list[str] = []
    for line in text[at:].splitlines():
        lines.append(line.strip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            break
    return shlex.split(" ".join(lines))


@pytest.mark.parametrize("doc", ["charts/temporality/README.md", "docs/console.md"])
def test_the_documented_sign_in_secret_has_every_key_the_pods_read(doc: str, tmp_path: Path) -> None:
    """Issue: a Secret with only client-secret and session-secret made the journal, human-interaction and the
    trigger-gateway exit at start (``api-vouch: cannot read``). The documented command makes every key the default
    values mount, each secret long enough for the services."""
    words = _command_after((ROOT / doc).read_text(encoding="utf-8"), "kubectl create secret generic temporality-signin")
    literals = dict(w.removeprefix("--from-literal=").split("=", 1) for w in words if w.startswith("--from-literal="))
    _, oidc = _SIGN_INS["oidc"]
    assert set(literals) == set().union(*oidc.values())
    generated = {key: value for key, value in literals.items() if key != "client-secret"}
    for key, value in generated.items():
        made = re.fullmatch(r"\$\(openssl rand -hex (\d+)\)", value)
        assert made, f"{key}: {value}"
        length = 2 * int(made[1])
        assert length >= max(MIN_SECRET_LENGTH, MIN_SESSION_SECRET), key
        secret = tmp_path / key
        secret.write_text("a" * length, encoding="utf-8")
        Voucher.from_file(secret)  # what the services read at start


def test_the_values_say_the_vouch_keys_are_on_by_default() -> None:
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    block = text[
        text.index("\n  existingSecret:", text.index("\nsignIn:")) : text.index("\n####", text.index("\nsignIn:"))
    ]
    assert "ALL of `session-secret`, `inbox-vouch`" in block
    assert block.count("On by default, so the\n    # Secret must hold it") == 1
    assert "kubectl create secret generic temporality-signin" in block


# --------------------------------------------------------------------------- the journal's replicas
def test_more_than_one_journal_without_postgres_fails_the_render() -> None:
    with pytest.raises(Exception, match=r"services\.journal\.replicas is 2 without PostgreSQL"):
        _render({"services": {"journal": {"replicas": 2}}})
    for database in (
        {"url": "postgresql+asyncpg://journal@db.example/temporality"},
        {"existingSecret": {"name": "temporality-db"}},
    ):
        assert (
            _deployments({"services": {"journal": {"replicas": 2}}, "postgres": database})["journal"]["spec"][
                "replicas"
            ]
            == 2
        )
    assert "journal" not in _deployments({"services": {"journal": {"replicas": 2, "enabled": False}}})
    notes = _notes(None)
    assert "its own copy" not in notes
    assert "it can run one replica only" in notes


# --------------------------------------------------------------------------- the config files
@pytest.mark.parametrize("file", ["triggers.yaml", "users.yaml", "agents.yaml", "external-agents.yaml"])
def test_a_config_file_that_does_not_parse_fails_the_render_naming_it(file: str) -> None:
    """The notes used to print "(none yet ...)" for an unparsable triggers file and the gateway stopped at start."""
    with pytest.raises(Exception, match=re.escape(f'config."{file}" is not a YAML mapping')):
        _render({"config": {file: "triggers:\n  - id: pr\n    type: webhook\n   bad: indent\n"}})


def test_the_notes_list_what_the_values_seed() -> None:
    triggers = "triggers:\n  - {id: ado-pr, type: webhook, agent: reviewer, auth: {type: none}}\n"
    notes = _notes({"config": {"triggers.yaml": triggers}})
    assert "http://127.0.0.1:8080/hooks/ado-pr" in notes
    assert "The file only seeds" in notes
    assert "changing or removing one there later changes nothing" in notes
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    assert "**Triggers and people: the files seed, the APIs own afterwards.**" in readme
    values = (CHART / "values.yaml").read_text(encoding="utf-8")
    assert "only SEED their stores" in values


# --------------------------------------------------------------------------- Ingresses
def _ingresses(values: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _render(values) if d["kind"] == "Ingress"}


def test_the_journal_and_human_interaction_get_an_ingress_when_asked() -> None:
    assert _ingresses(None) == {}
    values = {
        "ingress": {
            "className": "nginx",
            "journal": {"enabled": True, "host": "temporality.example.org", "tlsSecretName": "console-tls"},
            "human-interaction": {"enabled": True, "host": "inbox.example.org", "className": "internal"},
        }
    }
    ingresses = _ingresses(values)
    assert set(ingresses) == {"t-temporality-journal", "t-temporality-human-interaction"}
    journal = ingresses["t-temporality-journal"]["spec"]
    assert journal["ingressClassName"] == "nginx", "ingress.className by default"
    assert journal["tls"] == [{"hosts": ["temporality.example.org"], "secretName": "console-tls"}]
    (rule,) = journal["rules"]
    assert rule["host"] == "temporality.example.org"
    # the journal's own paths, one by one, not /metrics (tests/test_chart_ingress_paths.py)
    backend = {"service": {"name": "t-temporality-journal", "port": {"name": "http"}}}
    assert {"path": "/", "pathType": "Exact", "backend": backend} in rule["http"]["paths"]
    assert {"path": "/console", "pathType": "Prefix", "backend": backend} in rule["http"]["paths"]
    assert all(p["backend"] == backend for p in rule["http"]["paths"])
    human = ingresses["t-temporality-human-interaction"]["spec"]
    assert human["ingressClassName"] == "internal"
    assert "tls" not in human
    assert human["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == "t-temporality-human-interaction"
    # a disabled service gets none
    off = _merge(values, {"services": {"journal": {"enabled": False}}})
    assert set(_ingresses(off)) == {"t-temporality-human-interaction"}
    # the gateway's Ingress is unchanged beside them
    both = _merge(values, {"ingress": {"enabled": True, "host": "hooks.example.org"}})
    assert set(_ingresses(both)) == {"t-temporality-trigger-gateway", *ingresses}
    # the notes give the URLs instead of port-forwards
    notes = _notes(values)
    assert "https://temporality.example.org/console/" in notes
    assert "http://inbox.example.org/" in notes
    assert "port-forward svc/t-temporality-journal" not in notes


def test_the_notes_warn_when_the_oidc_redirect_is_not_the_journal_s_ingress() -> None:
    sign_in = {"signIn": {"oidc": OIDC, "existingSecret": {"name": "temporality-signin"}}}
    same = _merge(
        sign_in, {"ingress": {"journal": {"enabled": True, "host": "temporality.example.org", "tlsSecretName": "t"}}}
    )
    assert "WARNING: signIn.oidc.redirectBaseUrl" not in _notes(same)
    other = _merge(
        sign_in, {"ingress": {"journal": {"enabled": True, "host": "console.example.org", "tlsSecretName": "t"}}}
    )
    assert (
        "WARNING: signIn.oidc.redirectBaseUrl is https://temporality.example.org, not the journal's Ingress"
        in _notes(other)
    )
    assert "make it reach the journal, e.g. ingress.journal" in _notes(sign_in)


@pytest.mark.parametrize("kube", ["1.25.0", "latest"])
def test_the_ingresses_are_valid_kubernetes_objects(kube: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version() if kube == "latest" else kube
    values = {
        "ingress": {
            "journal": {"enabled": True, "host": "temporality.example.org", "annotations": {"a": "b"}},
            "human-interaction": {"enabled": True, "host": "inbox.example.org", "tlsSecretName": "inbox-tls"},
        }
    }
    for ingress in _ingresses(values).values():
        kubernetes_validate.validate(ingress, version, strict=True)


# --------------------------------------------------------------------------- the timers migration's hook
def _job(values: dict[str, Any]) -> dict[str, Any]:
    (job,) = [d for d in _render(values) if d["kind"] == "Job"]
    return job


def test_the_hook_gives_up_before_helm_s_default_timeout() -> None:
    """With 10 retries Kubernetes' backoff lasts ~35 minutes, Helm waits 5: the hook's deadline is under Helm's."""
    external = {"nats": {"auth": {"existingSecret": "nats-users"}}}
    job = _job(external)
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert 0 < job["spec"]["activeDeadlineSeconds"] < 300
    assert (
        "activeDeadlineSeconds" not in _job(_merge(external, {"timersMigrate": {"hookDeadlineSeconds": None}}))["spec"]
    )
    assert (
        _job(_merge(external, {"timersMigrate": {"hookDeadlineSeconds": 900}}))["spec"]["activeDeadlineSeconds"] == 900
    )
    # the embedded NATS's Job waits for the server to roll: no deadline
    embedded = {"nats": {"embedded": {"enabled": True}, "auth": {"existingSecret": "nats-users"}}}
    assert "activeDeadlineSeconds" not in _job(embedded)["spec"]


# --------------------------------------------------------------------------- the values schema
def _values_errors(extra: dict[str, Any]) -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return _validate(schema, _merge(values, extra))


def _memory(value: Any) -> dict[str, Any]:
    return {"services": {"journal": {"resources": {"limits": {"memory": value}}}}}


@pytest.mark.parametrize("value", ["512Mi", "1Gi", "1.5Gi", "500M", "129e6", "2G"])
def test_a_memory_quantity_with_its_unit_is_taken(value: str) -> None:
    assert _values_errors(_memory(value)) == []


@pytest.mark.parametrize("value", [512, "512", "512m", "512MB", "1.2.3Gi", "Mi"])
def test_a_memory_quantity_without_its_unit_is_refused(value: Any) -> None:
    """A bare 512 is 512 bytes (the pod is killed at start), 512m milli-bytes."""
    assert _values_errors(_memory(value))


@pytest.mark.parametrize(("value", "ok"), [(1, True), (0.5, True), ("500m", True), ("2", True), ("500M", False)])
def test_a_cpu_quantity(value: Any, ok: bool) -> None:
    errors = _values_errors({"services": {"journal": {"resources": {"requests": {"cpu": value}}}}})
    assert (errors == []) is ok, errors


def test_helm_itself_refuses_a_memory_size_without_its_unit() -> None:
    with pytest.raises(Exception, match="memory"):
        _render(_memory(512))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://journal:pw@db.example:5432/temporality",
        "postgresql+asyncpg://journal@db.example/temporality?sslmode=verify-full",
        "postgres://journal@db.example/temporality",
    ],
)
def test_a_postgres_url_the_journal_takes_is_taken(url: str) -> None:
    assert _values_errors({"postgres": {"url": url}}) == []
    assert async_url(url).get_backend_name() == "postgresql", "the journal takes it too"


@pytest.mark.parametrize(
    "url",
    [
        "mysql://journal@db.example/temporality",
        "sqlite+aiosqlite:///journal.db",  # the emptyDir is only mounted without a database URL
        "db.example:5432/temporality",
        "postgresql+psycopg2://journal@db.example/temporality",
    ],
)
def test_a_database_url_the_journal_cannot_use_is_refused(url: str) -> None:
    assert _values_errors({"postgres": {"url": url}})


def test_a_bad_redaction_kind_is_reported_with_its_path() -> None:
    """Helm's schema check said ``at '': invalid propertyName`` for a kind outside a-z 0-9 _: now it names where."""
    with pytest.raises(Exception, match=r"/redaction/patterns") as raised:
        _render({"redaction": {"patterns": {"Ticket-Secret": "TKT-[0-9]+"}}})
    assert "Ticket-Secret" in str(raised.value)
    with pytest.raises(Exception, match=r"/redaction/patterns/ticket"):
        _render({"redaction": {"patterns": {"ticket": ""}}})


# --------------------------------------------------------------------------- documentation of the steps
def test_the_readme_s_extra_env_from_values_reach_the_right_services() -> None:
    """The README gives the commands for the chat tokens, the model's API key and webhook passwords, and the
    values that hand each Secret to the service that reads it."""
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Secrets in the environment") :]
    section = section[: section.index("\n## ")]
    commands = re.findall(r"kubectl create secret generic (\S+)((?:.*\\\n)*.*)", section)
    made = {name: re.findall(r"--from-literal=([A-Z0-9_]+)=", rest) for name, rest in commands}
    assert "TEMPORALITY_HUMAN_TELEGRAM_TOKEN" in made["temporality-chat"]
    assert "OPENAI_API_KEY" in made["temporality-model"]
    block = section[section.index("```yaml") + len("```yaml") : section.index("```", section.index("```yaml") + 7)]
    values = yaml.safe_load(block)
    deployments = _deployments(values)
    expected = {
        "human-interaction": "temporality-chat",
        "run-executor": "temporality-model",
        "trigger-gateway": "temporality-webhooks",
    }
    for name in SERVICES:
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        refs = [e["secretRef"]["name"] for e in container.get("envFrom", [])]
        assert refs == ([expected[name]] if name in expected else []), name
    assert set(expected.values()) == set(made)


def test_the_volume_claim_templates_are_documented_as_fixed() -> None:
    values = (CHART / "values.yaml").read_text(encoding="utf-8")
    storage = values[values.index("volumeClaimTemplates") - 200 : values.index("\n    storage:")]
    assert "`helm upgrade` with another size or class is refused" in storage
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert "- **Growing its volumes**" in operations
    assert "kubectl delete statefulset t-temporality-nats --cascade=orphan" in operations


def test_helm_lint_with_the_ingresses() -> None:
    values = {
        "ingress": {
            "journal": {"enabled": True, "host": "temporality.example.org"},
            "human-interaction": {"enabled": True, "host": "inbox.example.org"},
        },
        "postgres": {"url": "postgresql://journal@db.example/temporality"},
        "services": {"journal": {"replicas": 2}},
    }
    report = _helm().lint(CHART, values, strict=True)
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]
