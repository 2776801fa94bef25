"""The triggers file: the shipped one loads; every mistake fails at start-up with its location (TRG-1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gateway_support import REPO, load_triggers_yaml

from temporality_protocol import HumanPolicy, TimeoutPolicy
from temporality_trigger_gateway import TriggerConfigError, WebhookTrigger, load_triggers
from temporality_trigger_gateway.triggers import BasicAuth, EventTrigger, NoAuth, ScheduleTrigger

GOOD = """
triggers:
  - id: ado-pr-review
    name: Review Azure DevOps pull requests
    type: webhook
    enabled: true
    adapter: azure_devops.pull_request
    events: [git.pullrequest.created]
    agent: reviewer
    tenant: fabrikam
    auth: {type: basic, username: azure, password: change-me}
    deduplication: {ttl_days: 7}
    human:
      allowed_recipients: [user:alice]
      default_timeout_s: 3600
      on_timeout: {action: default, default_option: keep-v1}
"""


def _error(text: str, **environ: str) -> str:
    with pytest.raises(TriggerConfigError) as info:
        load_triggers_yaml(text, **environ)
    return str(info.value)


def test_shipped_config_has_exactly_the_review_trigger() -> None:
    (trigger,) = load_triggers(REPO / "config/triggers.yaml", environ={})
    assert isinstance(trigger, WebhookTrigger)
    assert trigger.id == "ado-pr-review"
    assert trigger.name == "Review Azure DevOps pull requests"
    assert trigger.enabled
    assert trigger.adapter == "azure_devops.pull_request"
    assert trigger.events == ["git.pullrequest.created"]
    assert trigger.agent == "reviewer"
    assert trigger.tenant == "fabrikam"
    assert isinstance(trigger.auth, BasicAuth)
    assert trigger.auth.username == "azure"
    assert trigger.auth.matches("azure", "change-me")
    assert trigger.deduplication.ttl_days == 7
    assert trigger.human.policy() == HumanPolicy(
        allowed_recipients=["user:alice"],
        default_timeout_s=3600,
        on_timeout=TimeoutPolicy(action="default", default_option="keep-v1"),
    )
    assert "password_env" in (REPO / "config/triggers.yaml").read_text()  # the comment recommends it


def test_password_never_shows_in_reprs() -> None:
    (trigger,) = load_triggers_yaml(GOOD)
    assert "change-me" not in repr(trigger)
    assert "change-me" not in str(trigger.model_dump())


def test_password_env_is_resolved_at_load() -> None:
    text = GOOD.replace("password: change-me", "password_env: ADO_HOOK_PASSWORD")
    (trigger,) = load_triggers_yaml(text, ADO_HOOK_PASSWORD="from-env")
    assert isinstance(trigger, WebhookTrigger)
    assert isinstance(trigger.auth, BasicAuth)
    assert trigger.auth.matches("azure", "from-env")
    assert not trigger.auth.matches("azure", "change-me")
    assert not trigger.auth.matches("azur", "from-env")


def test_password_env_that_is_not_set_fails() -> None:
    text = GOOD.replace("password: change-me", "password_env: ADO_HOOK_PASSWORD")
    assert "ADO_HOOK_PASSWORD" in _error(text)


def test_password_and_password_env_together_fail() -> None:
    text = GOOD.replace("password: change-me", "password: change-me, password_env: X")
    assert "exactly one of password_env" in _error(text, X="y")


def test_auth_must_be_explicit_and_none_is_allowed_explicitly() -> None:
    assert "triggers[0] (ado-pr-review).auth: Field required" in _error(
        GOOD.replace("    auth: {type: basic, username: azure, password: change-me}\n", "")
    )
    (trigger,) = load_triggers_yaml(GOOD.replace("{type: basic, username: azure, password: change-me}", "{type: none}"))
    assert isinstance(trigger, WebhookTrigger)
    assert isinstance(trigger.auth, NoAuth)


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        pytest.param("enabled: true", "enabeld: true", "triggers[0] (ado-pr-review).enabeld", id="trigger-key"),
        pytest.param(
            "password: change-me", "passwrd: change-me", "triggers[0] (ado-pr-review).auth.passwrd", id="auth"
        ),
        pytest.param("{ttl_days: 7}", "{ttl_day: 7}", "triggers[0] (ado-pr-review).deduplication.ttl_day", id="dedupe"),
        pytest.param(
            "allowed_recipients:",
            "allowed_recipient:",
            "triggers[0] (ado-pr-review).human.allowed_recipient",
            id="human",
        ),
        pytest.param(
            "default_option: keep-v1}",
            "default_option: keep-v1, defualt: x}",
            "triggers[0] (ado-pr-review).human.on_timeout.defualt",
            id="on-timeout",
        ),
        pytest.param(
            "default_option: keep-v1}",
            "default_option: keep-v1, renotify: {every_s: 60, max: 2, evry: 5}}",
            "triggers[0] (ado-pr-review).human.on_timeout.renotify.evry",
            id="renotify",
        ),
        pytest.param("triggers:", "trigers:", "trigers", id="top-level"),
    ],
)
def test_typo_keys_fail_with_their_location(old: str, new: str, where: str) -> None:
    message = _error(GOOD.replace(old, new))
    assert where in message
    assert f"{where}: unknown key '{where.rpartition('.')[2]}'; allowed here: " in message


@pytest.mark.parametrize(
    ("on_timeout", "expected"),
    [
        pytest.param("{action: default}", "needs default_option", id="default-without-option"),
        pytest.param("{action: explode}", "'fail', 'default' or 'cancel'", id="unknown-action"),
    ],
)
def test_bad_on_timeout_fails(on_timeout: str, expected: str) -> None:
    message = _error(GOOD.replace("{action: default, default_option: keep-v1}", on_timeout))
    assert "triggers[0] (ado-pr-review).human.on_timeout" in message
    assert expected in message


def test_groups_may_be_allowed_recipients_and_the_timeout_chain_is_read() -> None:
    text = GOOD.replace("allowed_recipients: [user:alice]", "allowed_recipients: [user:alice, group:api-owners]")
    text = text.replace(
        "{action: default, default_option: keep-v1}",
        "{action: cancel, renotify: {every_s: 600, max: 2}, escalate: {to: 'group:api-owners', after_s: 600}}",
    )
    (trigger,) = load_triggers_yaml(text)
    assert isinstance(trigger, WebhookTrigger)
    policy = trigger.human.policy()
    assert policy.allowed_recipients == ["user:alice", "group:api-owners"]
    assert policy.on_timeout.action == "cancel"
    assert policy.on_timeout.renotify is not None
    assert policy.on_timeout.renotify.max == 2
    assert policy.on_timeout.escalate is not None
    assert policy.on_timeout.escalate.to == "group:api-owners"
    assert "allowed_recipients" in _error(GOOD.replace("[user:alice]", "[channel:telegram]"))


def test_unknown_adapter_fails_and_lists_the_known_ones() -> None:
    message = _error(GOOD.replace("adapter: azure_devops.pull_request", "adapter: azure_devops.pullrequest"))
    assert "triggers[0] (ado-pr-review).adapter" in message
    assert (
        "unknown adapter 'azure_devops.pullrequest'; known: azure_devops.build, azure_devops.pull_request," in message
    )


def test_event_the_adapter_cannot_handle_fails() -> None:
    message = _error(GOOD.replace("events: [git.pullrequest.created]", "events: [git.pullrequest.created, git.push]"))
    assert "cannot handle git.push" in message


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param("id: ado-pr-review", "id: ADO_PR", "triggers[0] (ADO_PR).id", id="bad-id"),
        pytest.param(
            "type: webhook",
            "type: webhok",
            "unknown type 'webhok'; one of: 'webhook', 'event', 'schedule'",
            id="bad-type",
        ),
        pytest.param("{ttl_days: 7}", "{ttl_days: 30}", "cannot exceed", id="ttl-over-bucket"),
        pytest.param("[user:alice]", "[alice]", "human.allowed_recipients[0]", id="recipient-not-user"),
        pytest.param("default_timeout_s: 3600", "default_timeout_s: 0", "default_timeout_s", id="zero-timeout"),
        pytest.param("events: [git.pullrequest.created]", "events: []", "events", id="no-events"),
        pytest.param("agent: reviewer", "agent: Reviewer Bot", "agent", id="bad-agent"),
    ],
)
def test_bad_values_fail(old: str, new: str, expected: str) -> None:
    assert expected in _error(GOOD.replace(old, new))


def test_duplicate_ids_fail() -> None:
    text = GOOD + GOOD.split("triggers:\n", 1)[1]
    assert "'ado-pr-review' is defined twice" in _error(text)


def test_event_and_schedule_triggers_load() -> None:
    text = (
        GOOD
        + """
  - id: on-failure
    name: Triage failed runs
    type: event
    event_type: run.failed
    filter: {project: Fabrikam, data.reason: timeout}
    agent: reviewer
  - id: nightly
    name: Nightly digest
    type: schedule
    cron: "0 3 * * *"
    agent: reviewer
"""
    )
    _, event, schedule = load_triggers_yaml(text)
    assert isinstance(event, EventTrigger)
    assert event.filter == {"project": "Fabrikam", "data.reason": "timeout"}
    assert isinstance(schedule, ScheduleTrigger)


def test_event_trigger_with_unknown_filter_key_fails() -> None:
    text = GOOD + (
        "\n  - {id: t2, name: n, type: event, event_type: run.failed, agent: reviewer, filter: {colour: red}}\n"
    )
    assert "unknown filter key(s) colour" in _error(text)


def test_event_trigger_rejects_webhook_keys() -> None:
    text = GOOD + "\n  - {id: t2, name: n, type: event, event_type: run.failed, agent: reviewer, adapter: x}\n"
    assert "triggers[1] (t2).adapter: unknown key 'adapter'; allowed here: agent, allow_self" in _error(text)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("triggers: [", "not valid YAML", id="yaml"),
        pytest.param("", "expected a mapping", id="empty"),
        pytest.param("- a\n- b\n", "expected a mapping", id="list"),
    ],
)
def test_unusable_files_fail(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "triggers.yaml"
    path.write_text(content)
    with pytest.raises(TriggerConfigError, match=expected):
        load_triggers(path)


def test_missing_file_fails(tmp_path: Path) -> None:
    with pytest.raises(TriggerConfigError, match="cannot read"):
        load_triggers(tmp_path / "absent.yaml")


def test_every_error_is_reported_at_once() -> None:
    data = yaml.safe_load(GOOD)
    data["triggers"][0]["agent"] = "Bad Agent"
    data["triggers"][0]["adapter"] = "nope"
    message = _error(yaml.safe_dump(data))
    assert "2 problem(s)" in message or "3 problem(s)" in message
    assert ".agent" in message
    assert ".adapter" in message


# --------------------------------------------------------------------------- sources and auth kinds
def _webhook(adapter: str, events: str, auth: str) -> str:
    return f"""
triggers:
  - id: hook
    name: A hook
    type: webhook
    adapter: {adapter}
    events: {events}
    agent: reviewer
    auth: {auth}
"""


@pytest.mark.parametrize(
    ("adapter", "events", "auth"),
    [
        pytest.param("github", "[pull_request.opened, push]", "{type: github, secret_env: S}", id="github"),
        pytest.param("gitlab", "[merge_request.open, push]", "{type: gitlab, secret_env: S}", id="gitlab"),
        pytest.param("generic", "[order.created]", "{type: standard_webhooks, secret_env: W}", id="standard-webhooks"),
        pytest.param("generic", "[order.created]", "{type: bearer, token_env: S}", id="bearer"),
        pytest.param("generic", "[x]", "{type: hmac_sha256, header: X-Signature, secret_env: S}", id="hmac"),
        pytest.param("generic", "[x]", "{type: header, header: X-Api-Key, secret_env: S}", id="header"),
        pytest.param(
            "azure_devops.work_item", "[workitem.updated]", "{type: basic, username: a, password_env: S}", id="wi"
        ),
    ],
)
def test_every_source_and_auth_kind_loads(adapter: str, events: str, auth: str) -> None:
    (trigger,) = load_triggers_yaml(_webhook(adapter, events, auth), S="secret", W="whsec_" + "QUJDREVGR0g=")
    assert isinstance(trigger, WebhookTrigger)
    assert trigger.adapter == adapter


@pytest.mark.parametrize(
    ("adapter", "events", "auth", "expected"),
    [
        pytest.param(
            "github",
            "[push]",
            "{type: basic, username: a, password_env: S}",
            "triggers[0] (hook).auth: auth.type 'basic' cannot authenticate github deliveries; use one of github, none",
            id="auth-not-for-the-source",
        ),
        pytest.param(
            "github", "[ping]", "{type: github, secret_env: S}", "adapter github cannot handle ping", id="ping"
        ),
        pytest.param(
            "gitlab",
            "[push]",
            "{type: gitlab}",
            "triggers[0] (hook).auth: give exactly one of secret_env",
            id="no-secret",
        ),
        pytest.param(
            "gitlab",
            "[push]",
            "{type: gitlab, secret_env: NOPE}",
            "environment variable NOPE (secret_env) is not set",
            id="env-unset",
        ),
        pytest.param(
            "generic",
            "[x]",
            "{type: bearer, tokn_env: S}",
            "triggers[0] (hook).auth.tokn_env: unknown key 'tokn_env'; allowed here: token, token_env, type (did you mean 'token_env'?)",
            id="typo",
        ),
        pytest.param(
            "generic",
            "[x]",
            "{type: hmac_sha256, secret_env: S}",
            "triggers[0] (hook).auth.header: Field required",
            id="hmac-no-header",
        ),
        pytest.param(
            "generic",
            "[x]",
            "{type: hmac_sha256, header: X-S, encoding: hexa, secret_env: S}",
            "auth.encoding",
            id="hmac-encoding",
        ),
        pytest.param(
            "generic",
            "[x]",
            "{type: standard_webhooks, secret_env: S, tolerance_s: 0}",
            "auth.tolerance_s",
            id="tolerance",
        ),
        pytest.param(
            "generic",
            "[x]",
            "{type: oauth, secret_env: S}",
            "triggers[0] (hook).auth.type: unknown type 'oauth'; one of: 'none', 'basic'",
            id="unknown-kind",
        ),
        pytest.param(
            "gitlab",
            "[merge_request.opened]",
            "{type: gitlab, secret_env: S}",
            "cannot handle merge_request.opened",
            id="gl-event",
        ),
    ],
)
def test_bad_source_config_fails_naming_the_field(adapter: str, events: str, auth: str, expected: str) -> None:
    assert expected in _error(_webhook(adapter, events, auth), S="secret")


def test_new_auth_secrets_never_show_in_reprs() -> None:
    (trigger,) = load_triggers_yaml(_webhook("generic", "[x]", "{type: bearer, token: literal-tok}"))
    assert "literal-tok" not in repr(trigger)
    assert "literal-tok" not in str(trigger.model_dump())
