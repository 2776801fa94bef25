"""The chart and docker-compose run the timers migration (upgrading from the one shared timers stream of older
releases) as its own NATS user, ``timers-migrate``, before the services with timers need their streams.

Rendered with the Helm SDK and read as YAML (no cluster, no Docker, as in ``tests/test_deploy_files.py``), then run
for real: the rendered embedded NATS's config and environment (or compose's) start a nats-server on an older
release's store, the Job's (or the one-shot's) command runs with the environment the kubelet (or compose) gives
it, and the services lay out their streams and read their timers afterwards."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_files import (
    CHART,
    COMPOSE_NATS_CONF,
    NATS_NAME,
    NATS_SECRET,
    NATS_STORE_LINE,
    _compose_value,
    _deployments,
    _embedded,
    _env,
    _helm,
    _kinds,
    _nats_conf,
    _nats_pod_env,
    _nats_secret,
    _notes,
    _ready,
    _render,
    _start_rendered_nats,
    _stop,
)
from test_timers_migrate_role import (
    MIGRATE_COMMAND,
    migrate_process,
    older_release,
    services_start_and_get_their_timers,
)

from temporality_embedded.natsserver import NatsServer, password_variable
from temporality_protocol.catalog import SERVICES
from temporality_protocol.permissions import TIMERS_MIGRATION_USER

ROOT = Path(__file__).resolve().parents[1]
JOB = "t-temporality-timers-migrate"
PASSWORD_KEY = f"{TIMERS_MIGRATION_USER}-password"
#: The services that own timers: they need their timers streams, which the migration frees.
WITH_TIMERS = tuple(name for name, spec in SERVICES.items() if spec.timers)
HOOK_ANNOTATIONS = {
    "helm.sh/hook": "pre-install,pre-upgrade",
    "helm.sh/hook-weight": "0",
    "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
}


def _jobs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "Job"]


def _container(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def _job_env(job: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(job)["env"]}


def test_with_the_embedded_nats_the_job_is_a_release_resource_named_after_the_revision() -> None:
    docs = _render(_embedded(3))
    (job,) = _jobs(docs)
    # not a hook: the embedded server learns the user in this very upgrade, a pre-upgrade hook would be refused
    assert job["metadata"]["name"] == f"{JOB}-1", "a Job's pod template is immutable: one Job per revision"
    assert "helm.sh/hook" not in (job["metadata"].get("annotations") or {})
    spec = job["spec"]
    assert spec["backoffLimit"] == 10, "it retries while the server rolls to the new users"
    assert "ttlSecondsAfterFinished" not in spec
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert spec["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == TIMERS_MIGRATION_USER
    container = _container(job)
    deployment = _deployments(_embedded(3))["journal"]
    service_pod = deployment["spec"]["template"]["spec"]
    (service_container,) = service_pod["containers"]
    assert container["image"] == service_container["image"], "the journal's image"
    assert container["command"] == MIGRATE_COMMAND
    assert pod["securityContext"] == service_pod["securityContext"], "like the services' pods"
    assert container["securityContext"] == service_container["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "256Mi"}}
    # its own user, its own password, from the services' Secret
    env = _job_env(job)
    assert env == {
        "TEMPORALITY_NATS_URL": f"nats://{NATS_NAME}:4222",
        "TEMPORALITY_NATS_USER": TIMERS_MIGRATION_USER,
        "TEMPORALITY_NATS_PASSWORD": {"secretKeyRef": {"name": NATS_SECRET, "key": PASSWORD_KEY}},
        "TEMPORALITY_NATS_STREAM_REPLICAS": "3",
        "TEMPORALITY_LOG_LEVEL": "info",
        "TEMPORALITY_LOG_FORMAT": "json",
    }
    for name, service in _deployments(_embedded(3)).items():
        (c,) = service["spec"]["template"]["spec"]["containers"]
        refs = [e["valueFrom"]["secretKeyRef"]["key"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})]
        assert PASSWORD_KEY not in refs, f"{name} gets the migration's password"
    # the server knows the user, with the same password
    (server,) = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]["spec"]["containers"]
    server_env = {e["name"]: e["valueFrom"] for e in server["env"]}
    assert server_env[password_variable(TIMERS_MIGRATION_USER)] == env["TEMPORALITY_NATS_PASSWORD"]
    assert f'"user": "{TIMERS_MIGRATION_USER}"' in _nats_conf(docs)


def test_its_password_may_come_from_a_secret_of_its_own_and_the_server_reads_it_there() -> None:
    docs = _render(_embedded(1, timersMigrate={"existingSecret": {"name": "migrate", "key": "pw"}}))
    (job,) = _jobs(docs)
    ref = {"secretKeyRef": {"name": "migrate", "key": "pw"}}
    assert _job_env(job)["TEMPORALITY_NATS_PASSWORD"] == ref
    (server,) = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e["valueFrom"] for e in server["env"]}[password_variable(TIMERS_MIGRATION_USER)] == ref


def test_with_an_external_nats_the_job_is_a_pre_install_pre_upgrade_hook() -> None:
    values = {
        "nats": {
            "url": "nats://nats.example:4222",
            "auth": {"existingSecret": "nats-users"},
            "tls": {"existingSecret": "nats-client", "mutual": True},
        },
        "timersMigrate": {"user": "ops-migrate", "backoffLimit": 3, "ttlSecondsAfterFinished": 600},
    }
    (job,) = _jobs(_render(values))
    assert job["metadata"]["name"] == JOB
    assert job["metadata"]["annotations"] == HOOK_ANNOTATIONS
    assert job["spec"]["backoffLimit"] == 3
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    env = _job_env(job)
    assert env["TEMPORALITY_NATS_URL"] == "nats://nats.example:4222"
    assert env["TEMPORALITY_NATS_USER"] == "ops-migrate"
    assert env["TEMPORALITY_NATS_PASSWORD"] == {"secretKeyRef": {"name": "nats-users", "key": PASSWORD_KEY}}
    assert env["TEMPORALITY_NATS_STREAM_REPLICAS"] == "1"
    # TLS as the services speak it: the CA, and the client certificate for mutual TLS
    tls = {k: v for k, v in env.items() if k.startswith("TEMPORALITY_NATS_TLS_")}
    assert tls == {
        "TEMPORALITY_NATS_TLS_CA_FILE": "/etc/temporality/nats-tls/ca.crt",
        "TEMPORALITY_NATS_TLS_CERT_FILE": "/etc/temporality/nats-tls/tls.crt",
        "TEMPORALITY_NATS_TLS_KEY_FILE": "/etc/temporality/nats-tls/tls.key",
    }
    (volume,) = job["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["secretName"] == "nats-client"
    assert _container(job)["volumeMounts"] == [
        {"name": "nats-tls", "mountPath": "/etc/temporality/nats-tls", "readOnly": True}
    ]


def test_with_an_external_nats_the_job_s_network_policy_is_a_hook_made_before_it() -> None:
    """Helm creates pre-install hooks before any release resource: an ordinary NetworkPolicy of the Job would not
    exist yet on the first install, so in a namespace that denies all traffic by default the hook could not reach
    DNS or NATS. Its policy is a hook of the same events with a lower weight (Helm creates hooks by weight), gone
    with the Job once the hooks succeeded; the Job's pod template carries no service account token."""
    values = {
        "nats": {"url": "nats://nats.example:4333", "auth": {"existingSecret": "nats-users"}},
        "networkPolicy": {"enabled": True},
    }
    docs = _render(values)
    (job,) = _jobs(docs)
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    policies = [
        d
        for d in docs
        if d["kind"] == "NetworkPolicy" and d["spec"]["podSelector"]["matchLabels"].items() <= _pod_labels(job)
    ]
    (policy,) = policies
    annotations = policy["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == HOOK_ANNOTATIONS["helm.sh/hook"]
    assert int(annotations["helm.sh/hook-weight"]) < int(HOOK_ANNOTATIONS["helm.sh/hook-weight"])
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    # not the name of an older release's ordinary policy of the Job, which the upgrade removes by itself
    assert policy["metadata"]["name"] == f"{JOB}-hook"
    assert policy["spec"]["ingress"] == []
    dns, nats = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert nats["ports"] == [{"port": 4333, "protocol": "TCP"}]
    # with the embedded NATS the Job is an ordinary resource, and so is its policy
    embedded = _render(_embedded(1, networkPolicy={"enabled": True}))
    (job,) = _jobs(embedded)
    assert "annotations" not in job["metadata"]
    (policy,) = [
        d
        for d in embedded
        if d["kind"] == "NetworkPolicy" and d["spec"]["podSelector"]["matchLabels"].items() <= _pod_labels(job)
    ]
    assert policy["metadata"]["name"] == JOB
    assert "annotations" not in policy["metadata"]


def _pod_labels(job: dict[str, Any]) -> Any:
    return job["spec"]["template"]["metadata"]["labels"].items()


def test_the_embedded_nats_s_tls_gives_the_job_its_ca_only() -> None:
    (job,) = _jobs(_render(_embedded(1, nats={"embedded": {"tls": {"existingSecret": "nats-server-tls"}}})))
    env = _job_env(job)
    assert env["TEMPORALITY_NATS_TLS_CA_FILE"] == "/etc/temporality/nats-tls/ca.crt"
    assert "TEMPORALITY_NATS_TLS_KEY_FILE" not in env
    (volume,) = job["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}], "never the server's key"


@pytest.mark.parametrize(
    "values",
    [
        None,  # no NATS users: the services move the old timers themselves at start
        {"nats": {"auth": {"existingSecret": "nats-users"}}, "timersMigrate": {"enabled": False}},
        _embedded(1, timersMigrate={"enabled": False}),
    ],
)
def test_no_job_without_nats_users_or_when_turned_off(values: dict[str, Any] | None) -> None:
    docs = _render(values)
    assert _jobs(docs) == []
    if values and values["nats"].get("embedded", {}).get("enabled"):  # the server still needs the password
        (server,) = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]["spec"]["containers"]
        assert password_variable(TIMERS_MIGRATION_USER) in {e["name"] for e in server["env"]}


def test_the_embedded_nats_has_no_other_migration_user() -> None:
    helm = _helm()
    chart = helm.Chart.load(CHART)
    try:
        with pytest.raises(Exception, match=r"timersMigrate\.user"):
            chart.render(_embedded(1, timersMigrate={"user": "other"}), name="t", namespace="default", is_install=True)
    finally:
        chart.close()


@pytest.mark.parametrize(
    "values",
    [
        {"nats": {"auth": {"existingSecret": "nats-users"}}, "networkPolicy": {"enabled": True}},
        _embedded(1, networkPolicy={"enabled": True, "egress": {"allowAll": False}}),
    ],
)
def test_helm_lint_with_the_job(values: dict[str, Any]) -> None:
    report = _helm().lint(CHART, values, strict=True)
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


def test_the_notes_say_where_the_job_s_log_is() -> None:
    notes = _notes(_embedded(1))
    assert f"kubectl logs -n default job/{JOB}-1" in notes
    assert "pre-install/pre-upgrade hook" in _notes({"nats": {"auth": {"existingSecret": "nats-users"}}})
    assert "Timers migration" not in _notes(None)


def test_the_values_document_the_job() -> None:
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    block = text[text.index("\ntimersMigrate:") : text.index("\n####", text.index("\ntimersMigrate:"))]
    for needle in ("pre-install,pre-upgrade", "<revision>", "timers-migrate-password", "nats-authorization"):
        assert needle in block, needle


# --------------------------------------------------------------------------- docker-compose
@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    return doc


def test_compose_runs_the_one_shot_before_the_services_with_timers(compose: dict[str, Any]) -> None:
    services = compose["services"]
    one_shot = services[TIMERS_MIGRATION_USER]
    assert one_shot["image"] == services["journal"]["image"], "the journal's image runs it"
    assert one_shot["build"] == services["journal"]["build"]
    assert one_shot["restart"] == "no"
    assert one_shot["command"] == MIGRATE_COMMAND
    assert one_shot["depends_on"] == {"nats": {"condition": "service_healthy"}}
    assert "ports" not in one_shot
    assert "volumes" not in one_shot
    assert "secrets" not in one_shot, "no API tokens: it speaks to NATS only"
    for name in WITH_TIMERS:
        assert services[name]["depends_on"][TIMERS_MIGRATION_USER] == {"condition": "service_completed_successfully"}
        assert services[name]["depends_on"]["nats"] == {"condition": "service_healthy"}, name
    assert TIMERS_MIGRATION_USER not in services["journal"]["depends_on"], "the journal has no timers"


def test_compose_gives_the_one_shot_its_own_user_and_only_its_password(compose: dict[str, Any]) -> None:
    services = compose["services"]
    env = _env(services[TIMERS_MIGRATION_USER])
    assert env["TEMPORALITY_NATS_URL"] == "nats://nats:4222"
    assert env["TEMPORALITY_NATS_USER"] == TIMERS_MIGRATION_USER
    server_env = _env(services["nats"])
    password = env["TEMPORALITY_NATS_PASSWORD"]
    assert password == server_env[password_variable(TIMERS_MIGRATION_USER)]
    assert password.startswith("${TIMERS_MIGRATE_PASSWORD:-"), "from the environment, a demo default"
    others = {v for k, v in server_env.items() if k != password_variable(TIMERS_MIGRATION_USER)}
    assert not others & set(env.values()), "another user's password"
    for name in SERVICES:
        assert password not in _env(services[name]).values(), f"{name} gets the migration's password"
    assert env["TEMPORALITY_NATS_STREAM_REPLICAS"] == _env(services["journal"])["TEMPORALITY_NATS_STREAM_REPLICAS"]


# --------------------------------------------------------------------------- for real
@pytest.mark.timeout(300)
async def test_the_rendered_job_migrates_on_the_rendered_embedded_nats_and_the_services_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``helm upgrade`` from an older release with the embedded NATS: its store holds the one timers stream; the
    server restarts with the rendered users, the Job's command runs with the environment the kubelet gives it
    (the Secret's password), and the services lay out their streams and get their timers."""
    older = tmp_path / "older"
    await older_release(older)
    docs = _render(_embedded(1))
    secret = _nats_secret()
    pod_env = _nats_pod_env(docs, f"{NATS_NAME}-0", secret)
    # the pod's volume is the older release's store (only the paths and the ports differ from the pod's)
    conf = _nats_conf(docs).replace(NATS_STORE_LINE, f'store_dir: "{older / "jetstream"}"')
    server = _start_rendered_nats(conf, tmp_path / "run", {**os.environ, **pod_env})
    try:
        await _ready(server, tmp_path / "run")
        (job,) = _jobs(docs)
        env: dict[str, str] = {}
        for entry in _container(job)["env"]:
            if "valueFrom" in entry:
                ref = entry["valueFrom"]["secretKeyRef"]
                assert ref["name"] == NATS_SECRET
                env[entry["name"]] = secret[ref["key"]]
            else:
                env[entry["name"]] = entry["value"]
        assert env["TEMPORALITY_NATS_URL"] == f"nats://{NATS_NAME}:4222"
        env["TEMPORALITY_NATS_URL"] = server.url  # the client Service's name resolves only in the cluster
        code, out = await migrate_process(_container(job)["command"], env)
        assert code == 0, out
        assert "migrated TEMPORALITY_TIMERS" in out, out
        passwords = {name: secret[f"{name}-password"] for name in SERVICES}
        await services_start_and_get_their_timers(server.url, passwords)
        code, out = await migrate_process(_container(job)["command"], env)  # the next upgrade's Job
        assert (code, "nothing to migrate" in out) == (0, True), out
    finally:
        _stop(server)


@pytest.mark.timeout(300)
async def test_compose_s_one_shot_migrates_on_compose_s_nats(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``docker compose up`` after an older release: compose's nats config with its (default) environment on the
    older release's store, the one-shot's command with its compose environment, then the services as their users."""
    root = tmp_path / "nats"
    await older_release(root)
    for variable, value in _env(compose["services"]["nats"]).items():
        monkeypatch.setenv(variable, _compose_value(value))
    server = NatsServer(root, config_file=COMPOSE_NATS_CONF)
    server.start()
    try:
        one_shot = compose["services"][TIMERS_MIGRATION_USER]
        env = {k: _compose_value(v) for k, v in _env(one_shot).items()}
        env["TEMPORALITY_NATS_URL"] = server.url  # the service name `nats` resolves only on compose's network
        code, out = await migrate_process(one_shot["command"], env)
        assert code == 0, out
        assert "migrated TEMPORALITY_TIMERS" in out, out
        passwords = {
            name: _compose_value(_env(compose["services"][name])["TEMPORALITY_NATS_PASSWORD"]) for name in SERVICES
        }
        await services_start_and_get_their_timers(server.url, passwords)
    finally:
        server.stop()
