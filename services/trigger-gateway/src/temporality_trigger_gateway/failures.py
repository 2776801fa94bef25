"""Failed webhook authentications, limited per client address (SEC-1): the project's failure limiter
(:class:`temporality_service.limits.FailureLimiter`, the one behind the API's wrong tokens), twice.

Both counts take ``TEMPORALITY_GATEWAY_WEBHOOK_MAX_FAILURES`` (20) within ``TEMPORALITY_GATEWAY_WEBHOOK_FAILURE_WINDOW_S``
(300 s), and answer past it **429 ``too_many_failures``** with ``Retry-After`` (seconds until the oldest failure
leaves the window), the body and header the API's limit answers, in the audit trail as ``api.access_refused``
(``channel`` webhook, reason ``too_many_failures``) like the API's 429:

* **Per client address and trigger**: every 401 of the trigger's verifier (Basic, bearer, a secret header, GitLab's
  token, an HMAC / GitHub / Standard Webhooks / mindmap signature; missing credentials too). Past the limit every
  delivery of that address to that trigger is 429 before its credentials are looked at -- the right ones too, or
  the 429 would only tell a guesser which of its guesses were wrong and the right one would get in. Per trigger
  and not per address alone: Azure DevOps, GitHub and gitlab.com send every customer's hooks from shared address
  ranges, so one misconfigured hook (a rotated password not yet updated at the sender, which keeps retrying) must
  not block the well-configured hooks of other triggers sent from the same address.
* **Per client address**: deliveries to an id no trigger has (404 ``unknown_trigger``): trigger-id enumeration.
  Past the limit every delivery of that address that does not authenticate is 429 -- to an unknown id instead of
  404, to a trigger this replica does not serve instead of 503, to a trigger with missing or wrong credentials
  instead of 401, to a body-signed trigger with a body refused before its signature is checked (413 too large,
  400 a bad ``Content-Length``, 408 too slow) instead of that refusal -- so the answers no longer tell an id
  that exists from one that does not. A delivery that authenticates still goes through: that took the trigger's credentials, which an enumerator does not have, and
  a stale hook left pointing at a deleted trigger (404 at every event) from a shared sender address must not
  block the good hooks sent from there.

A delivery whose credentials are right never counts. The address is the one the service runtime's server gives
(``request.client``: the TCP peer, or what a proxy named in ``TEMPORALITY_FORWARDED_ALLOW_IPS`` forwarded), an
IPv6 client counted by its /64 (:func:`temporality_service.limits.client_address`). Each replica counts its own, in
memory: a restart forgets them. ``webhook.failure_limit_reached`` is logged at ``warning`` once per block (when
the failure that reaches the limit is counted), never per refused request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import structlog
from starlette.requests import HTTPConnection

from temporality_service import ApiError, FailureLimiter, TooManyFailures
from temporality_service.audit import audit_refusal
from temporality_service.limits import DEFAULT_FAILURE_WINDOW_S, DEFAULT_MAX_FAILURES_PER_ADDRESS

__all__ = ["DEFAULT_FAILURE_WINDOW_S", "DEFAULT_MAX_FAILURES", "WebhookFailures"]

log = structlog.get_logger(__name__)

#: Failed authentications of one trigger, and deliveries to unknown ids, one client address may make per window.
DEFAULT_MAX_FAILURES = DEFAULT_MAX_FAILURES_PER_ADDRESS


class WebhookFailures:
    """The two failure counts of the webhook endpoint (module docstring); synchronous, so nothing runs between a
    check and the count of its outcome but the awaits of the endpoint itself: a body-signed trigger reads the body
    in between, so the endpoint checks again after the body is read (guesses sent at once all pass the first
    check), and then verifies and counts without an await."""

    def __init__(
        self,
        max_failures: int = DEFAULT_MAX_FAILURES,
        window_s: float = DEFAULT_FAILURE_WINDOW_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: Failed authentications per ``"<address> <trigger id>"``.
        self.credentials = FailureLimiter(max_failures, window_s, clock=clock, event=None)  # warned in _count
        #: Deliveries to unknown trigger ids per address.
        self.unknown_ids = FailureLimiter(max_failures, window_s, clock=clock, event=None)

    # ------------------------------------------------------------------ the endpoint's calls
    def admit(self, request: HTTPConnection, address: str | None, trigger_id: str) -> None:
        """Before the credentials of a delivery to ``trigger_id`` are looked at: 429 (audited) when ``address``
        reached the limit of failed authentications of that trigger."""
        self._check(request, self.credentials, _key(address, trigger_id))

    def unserved(self, request: HTTPConnection, address: str | None, refusal: ApiError) -> ApiError:
        """What to answer a delivery to an id this replica does not serve, refused with ``refusal`` (404, or 503
        for a stored trigger it cannot serve): 429 (audited) when ``address`` reached the limit of unknown ids;
        else ``refusal``, a 404 counted."""
        try:
            self._check(request, self.unknown_ids, address)
        except TooManyFailures as limited:
            return limited
        if refusal.status == 404:
            self._count(self.unknown_ids, address, address, None)
        return refusal

    def unread(self, request: HTTPConnection, address: str | None, refusal: ApiError) -> ApiError:
        """What to answer a delivery not yet authenticated whose body was refused while it was read with
        ``refusal`` (413 too large, 400 a bad ``Content-Length``, 408 too slow: a body-signed trigger reads the
        body before it checks the signature): 429 (audited) when ``address`` reached the limit of unknown ids --
        the refusal would tell an existing trigger from a missing one, which gets 429 -- else ``refusal``, not
        counted."""
        try:
            self._check(request, self.unknown_ids, address)
        except TooManyFailures as limited:
            return limited
        return refusal

    def failed(
        self,
        request: HTTPConnection,
        address: str | None,
        trigger_id: str,
        refusal: ApiError,
        reason: Literal["bad_credentials", "bad_signature"],
    ) -> ApiError:
        """A delivery to ``trigger_id`` failed its authentication with ``refusal`` (401): counted, and what to
        answer -- 429 (audited) when ``address`` reached the limit of unknown ids (a 401 would tell an existing
        trigger from a missing one), else ``refusal``, audited with ``reason``."""
        self._count(self.credentials, _key(address, trigger_id), address, trigger_id)
        try:
            self._check(request, self.unknown_ids, address)
        except TooManyFailures as limited:
            return limited
        audit_refusal(request, status=refusal.status, reason=reason, channel="webhook")
        return refusal

    # ------------------------------------------------------------------ mechanics
    def _check(self, request: HTTPConnection, limiter: FailureLimiter, key: str | None) -> None:
        try:
            limiter.check(key)
        except TooManyFailures as exc:
            wait = exc.headers().get("Retry-After", "1")
            audit_refusal(request, status=exc.status, reason=exc.code, channel="webhook")
            # One wording whichever count it is: the answer must not tell an unknown id from a known one.
            raise TooManyFailures(
                f"too many failed webhook authentications from this address; retry in {wait} s",
                headers={"Retry-After": wait},
            ) from None

    def _count(self, limiter: FailureLimiter, key: str | None, address: str | None, trigger_id: str | None) -> None:
        if key is None:
            return
        before = limiter.failures(key)
        limiter.failed(key)
        if before < limiter.max_failures <= limiter.failures(key):  # this failure starts a block: said once
            log.warning(
                "webhook.failure_limit_reached",
                address=address,
                trigger_id=trigger_id,
                counted="failed authentications" if trigger_id is not None else "deliveries to unknown trigger ids",
                failures=limiter.max_failures,
                window_s=limiter.window_s,
            )


def _key(address: str | None, trigger_id: str) -> str | None:
    return None if address is None else f"{address} {trigger_id}"
