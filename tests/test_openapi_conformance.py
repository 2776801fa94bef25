"""Each HTTP service against its own OpenAPI document, with schemathesis (issue 7).

Every service runs as the OS process it is in production (``python -m <package>``, the shipped
``config/``, the test role tokens of :mod:`e2e_support`) on a fresh nats-server; schemathesis loads the
``/openapi.json`` that service serves (with a viewer's token: it is not anonymous) and, for every operation, sends what its coverage phase derives from
the document (boundary and invalid values of each parameter and body, missing required headers) and what
its fuzzing phase draws, then checks each answer against the document:

* ``not_a_server_error`` -- no 5xx, ever (a 5xx is a bug in the code, never in the caller);
* ``status_code_conformance``, ``content_type_conformance``, ``response_schema_conformance``,
  ``response_headers_conformance`` -- the status, the media type, the body and the headers are the
  documented ones (so a client generated from the document is right about what comes back);
* ``unsupported_method`` and ``allow_header_conformance`` -- another method is a 405 whose ``Allow`` lists
  exactly the documented methods; ``missing_required_header`` -- a documented required header left out is
  refused.

Afterwards each process is still alive and none logged a server error (``http.internal_error``).
Where a check cannot hold for one operation, :attr:`Target.operations` turns it off there and says why
(a trigger body's coverage cases would take a minute; the journal's live tail never ends by itself).

Bounded and deterministic: a fixed seed, derandomized generation, :data:`MAX_EXAMPLES` per operation, no
example database and hypothesis's caches in the temporary directory (nothing written to the checkout),
one request at a time. Requests carry valid
credentials for their route (:attr:`Target.auth`) so they get past authentication, and the path
parameters that name something (a trigger, a user, an agent) name one that exists for part of the
operations (:attr:`Target.parameters`), so the answers past the lookup are checked too.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from e2e_support import ALICE, API_TOKENS, CONFIG, HOOK_AUTH
from hypothesis.configuration import set_hypothesis_home_dir
from schemathesis import Case

from temporality_embedded import Stack, StackConfig, free_port
from temporality_embedded.processes import ServiceProcess
from temporality_service.auth import dump_tokens
from temporality_testing import NatsServer

#: One test per service runs every operation's cases and starts the service (setup and teardown count too):
#: ~30 s on a quiet machine, 4x that at a load of 10 on 2 cores; the suite's 120 s guard is for one scenario.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]
# hypothesis keeps caches (``.hypothesis/``) in the working directory: not in the checkout
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "temporality-openapi-hypothesis")

#: Test cases per operation in the fuzzing phase (the coverage phase derives its own, a few per parameter).
MAX_EXAMPLES = 6
SEED = 20261202
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "unsupported_method",
    "allow_header_conformance",
    "missing_required_header",
)
READY_WITHIN_S = 60.0
VIEWER, OPERATOR, ADMIN = (f"Bearer {t.token.get_secret_value()}" for t in API_TOKENS)


@dataclass(frozen=True)
class Target:
    """One service under test: the processes it needs (itself last) and how to call it."""

    name: str
    processes: tuple[str, ...]
    #: ``Authorization`` per path prefix (the first that matches); :attr:`default_auth` otherwise.
    auth: tuple[tuple[str, str], ...] = ()
    default_auth: str = ADMIN
    #: schemathesis ``[[operations]]`` entries: fixed values for named parameters of some operations.
    parameters: tuple[Mapping[str, Any], ...] = ()
    #: Further ``[[operations]]`` entries (a check that cannot hold for an operation, with the reason).
    operations: tuple[Mapping[str, Any], ...] = ()

    def authorization(self, path: str) -> str:
        return next((value for prefix, value in self.auth if path.startswith(prefix)), self.default_auth)


TARGETS = {
    "trigger-gateway": Target(
        name="trigger-gateway",
        processes=("trigger-gateway",),
        auth=(("/hooks/", HOOK_AUTH),),
        parameters=(
            # the shipped webhook trigger, so that bodies reach the adapter and the admin API finds it
            {
                "include-path-regex": "^/(hooks|triggers)/\\{trigger_id\\}$",
                "exclude-method": "DELETE",
                "parameters": {"trigger_id": "ado-pr-review"},
            },
        ),
        operations=(
            # /triggers/preview is also /triggers/{trigger_id} to the router (GET, PUT, DELETE answer 404 there:
            # "preview" is a reserved id), so its Allow rightly names more than the document's POST
            {"include-path": "/triggers/preview", "checks": {"allow_header_conformance": {"enabled": False}}},
            # a trigger's schema is large: the coverage phase would derive ~1,300 cases from it (a minute
            # here); fuzzing draws bodies from it, and the admin API's own tests cover its edges
            {
                "include-path-regex": "^/triggers(/\\{trigger_id\\})?$",
                "include-method-regex": "POST|PUT",
                "phases": {"coverage": {"enabled": False}},
            },
        ),
    ),
    "human-interaction": Target(
        name="human-interaction",
        processes=("human-interaction",),
        auth=(("/inbox", ALICE["Authorization"]), ("/requests/", ALICE["Authorization"])),
        parameters=(
            {
                "include-path": "/directory/users/{user_id}",
                "exclude-method": "DELETE",
                "parameters": {"user_id": "bob"},
            },
        ),
    ),
    "journal": Target(
        name="journal",
        processes=("trigger-gateway", "human-interaction", "journal"),
        auth=(("/human/", ALICE["Authorization"]),),
        parameters=(
            # a shipped trigger, so that the proxied /gateway/ reads answer 200 and their bodies are checked
            # against the gateway's answer models the journal's document declares (GatewayTriggerView ...)
            {
                "include-path-regex": "^/gateway/triggers/\\{trigger_id\\}",
                "exclude-method": "DELETE",
                "parameters": {"trigger_id": "ado-pr-review"},
            },
        ),
        operations=(
            # run ids may hold "/": GET /runs/{run_id:path} also routes /runs/x/cancel (a 404 there), so the
            # cancel route's Allow rightly names GET besides the document's POST
            {"include-path": "/runs/{run_id}/cancel", "checks": {"allow_header_conformance": {"enabled": False}}},
            # the same for the proxied /gateway/triggers/preview (also /gateway/triggers/{trigger_id})
            {"include-path": "/gateway/triggers/preview", "checks": {"allow_header_conformance": {"enabled": False}}},
            # the live tail answers a stream that ends only when the client goes: each case would wait for
            # the request timeout (its refusals are JSON, documented so; services/journal/tests cover it)
            {"include-path": "/events/stream", "enabled": False},
        ),
    ),
    "agent-collab": Target(name="agent-collab", processes=("agent-collab",)),
    "run-executor": Target(
        name="run-executor",
        processes=("run-executor",),
        default_auth=VIEWER,
        parameters=({"include-path": "/agents/{agent_id}", "parameters": {"agent_id": "reviewer"}},),
    ),
}


@dataclass
class Running:
    target: Target
    url: str
    processes: list[ServiceProcess] = field(default_factory=list)


def _start(target: Target, nats: NatsServer, tmp_path: Path) -> Iterator[Running]:
    tokens_file = tmp_path / "api-tokens.json"
    tokens_file.write_text(dump_tokens(API_TOKENS), encoding="utf-8")
    # A stack configuration only for its per-service environment: the test starts the processes it needs.
    stack = Stack(
        StackConfig(
            data_dir=tmp_path / "stack",
            config_dir=CONFIG,
            gateway_port=free_port(),
            human_port=free_port(),
            journal_port=free_port(),
            nats_url=nats.url,
            log_format="json",
            api_tokens_file=tokens_file,
        )
    )
    running: list[ServiceProcess] = []
    try:
        for name in target.processes:
            process = ServiceProcess(name, stack.env_for(name), stack.data_dir / "run", cwd=tmp_path)
            running.append(process)
            process.start()
        for process in running:
            process.wait_ready(READY_WITHIN_S)
        port = stack.http_port(target.name)
        url = f"http://127.0.0.1:{port}" if port else running[-1].url
        assert url is not None, f"{target.name} serves no HTTP"
        yield Running(target, url.replace("0.0.0.0", "127.0.0.1"), running)
    finally:
        for process in running:
            process.request_stop()
        for process in running:
            process.wait_stopped()


def _config(target: Target) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
            "phases": {
                "examples": {"enabled": False},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": False},
            },
            "checks": {
                "enabled": False,
                **{name: {"enabled": True} for name in CHECKS},
                # a missing If-Match where one is required is a 428 Precondition Required (RFC 6585)
                "missing_required_header": {"expected-statuses": [400, 401, 403, 406, 415, 422, 428]},
            },
            "request-timeout": 20,
            "operations": [dict(entry) for entry in target.parameters] + [dict(entry) for entry in target.operations],
        }
    )


@pytest.fixture(params=sorted(TARGETS))
def service(request: pytest.FixtureRequest, nats_server: NatsServer, tmp_path: Path) -> Iterator[Running]:
    yield from _start(TARGETS[request.param], nats_server, tmp_path)


@pytest.fixture
def api(service: Running) -> Iterator[Any]:
    schema = schemathesis.openapi.from_url(  # the document itself needs a viewer (issue 11)
        f"{service.url}/openapi.json", config=_config(service.target), headers={"Authorization": VIEWER}
    )
    yield schema
    # No crash, no server error in any log (the checks see answers; a log also shows what no answer showed).
    for process in service.processes:
        assert process.alive(), f"{process.label} died under the conformance run:\n{process.log_tail()}"
        errors = _server_errors(process.log_file)
        assert not errors, f"{process.label} logged server errors: {errors[:3]}"


def _server_errors(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "http.internal_error" or event.get("level") in ("error", "critical"):
                found.append(event)
        elif "Exception in ASGI application" in line:
            found.append({"line": line})
    return found


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
def test_openapi_conformance(case: Case, service: Running) -> None:
    case.headers["Authorization"] = service.target.authorization(case.path)
    case.call_and_validate(base_url=service.url)
