"""A tool's request for a completion of the run's own model mid-call (MCP ``sampling/createMessage``).

An MCP server may ask its client for a completion while it runs a tool (the server has no model of its own).
The run-executor answers with the run's own provider -- the card's model, its API key, its retries -- so
sampling is never a way around the run's limits:

* **tokens**: what each answer cost (the endpoint's ``usage``) is added to the run's usage when the call
  returns (the turn's, or the retried call's, in the next checkpoint); a request when the run's tokens are
  used up (``limits.max_tokens``) is refused, the server's ``maxTokens`` is capped by the tokens left, and a
  call whose samplings take the run past its limit (the prompt counts too) fails the run (``token_limit``) at
  the next turn boundary, like a turn would;
* **model calls**: ``limits.max_turns`` bounds the run's model calls, its turns and its samplings together
  (``Usage.samplings``, checkpointed): a request is refused when it would leave the agent no model call for its
  next turn (turns so far + samplings so far + 1 >= ``max_turns``), the run fails ``max_turns`` at a turn
  boundary once turns + samplings reach it, and a call makes at most :data:`MAX_SAMPLES_PER_CALL`. A sampling
  does not advance the turn counter (the ids of a turn's facts stay the same);
* **compute time**: it runs inside the tool call, whose time counts as compute (and ``timeout_s`` of the
  server bounds the whole call, its samplings included);
* **journaled**: each answer is a ``run.sampled`` event (the run, turn, call, which sampling, the model,
  previews of the prompt and the answer, redacted like questions, and the tokens), with a deterministic id
  per (run, turn, call, sampling): a redelivered turn republishes the same fact.

The server's ``maxTokens`` (capped as above), ``temperature`` and ``stopSequences`` go to the provider
(:class:`~.providers.base.SamplingOptions`: the OpenAI-compatible provider sends ``max_tokens``,
``temperature`` and ``stop``; the scripted one logs them and shows them to its script as ``run.sampling``).
At most :data:`MAX_STOP_SEQUENCES` stop sequences are passed on, the first ones (OpenAI's API refuses a request
with more); the rest are dropped, and that is logged. The answer's ``stopReason`` says why the model stopped
(:func:`stop_reason`): ``maxTokens`` when the provider stopped on the length limit, ``stopSequence`` when it
names a stop sequence of the request as the end (vLLM does; OpenAI's own ``finish_reason`` is ``stop`` for a
stop sequence and a natural end alike, so there it reads ``endTurn``), else ``endTurn``.
Its ``modelPreferences``: the hints pick a model only among the card's ``provider.sampling_models`` (each hint
a substring of a model's name, the first hint that matches one wins; none matches, or no list: the card's
``model``) -- a server never chooses a model the card does not allow; the cost/speed/intelligence priorities
are not used (the card's list is the operator's choice). ``includeContext`` is not honoured (the request's own
messages only: no other conversation is shared with a server).

A request the run's model cannot serve (tool use, images or audio, no user message) or a provider error is
refused: the server gets an error response, the call goes on. Runs of an external agent get no sampler (the
model is not the executor's to call): the server is refused.

A crash between the answer and the turn's checkpoint makes the call again on redelivery, and the server may
sample again: that model call is spent twice, and only the committed call's tokens are counted.
"""

from __future__ import annotations

import structlog

from temporality_protocol import RunSampled
from temporality_protocol.redaction import Redactor
from temporality_run_executor.agents import AgentCard
from temporality_run_executor.providers import Provider, ProviderError
from temporality_run_executor.providers.base import AssistantTurn, SamplingOptions, TurnContext
from temporality_run_executor.records import Message, RunRecord, Usage
from temporality_run_executor.tools import Publish, Sampled, SamplingParams, SamplingRefused

__all__ = ["MAX_SAMPLES_PER_CALL", "MAX_STOP_SEQUENCES", "RunSampler", "pick_model", "stop_reason"]

log = structlog.get_logger(__name__)

#: Sampling requests one tool call may make.
MAX_SAMPLES_PER_CALL = 10
#: Stop sequences passed on to the provider (OpenAI's chat completions accept at most 4).
MAX_STOP_SEQUENCES = 4
_PREVIEW = 4096


def stop_reason(reply: AssistantTurn, stop: list[str]) -> str:
    """MCP's ``stopReason`` for the provider's ``reply`` to a sampling request asked with the stop sequences
    ``stop``: ``maxTokens``, ``stopSequence`` or ``endTurn`` (see the module docstring)."""
    if reply.finish_reason == "length":
        return "maxTokens"
    if reply.stop_sequence is not None and reply.stop_sequence in stop:
        return "stopSequence"
    return "endTurn"


def pick_model(hints: tuple[str, ...], allowed: list[str]) -> str | None:
    """The model a sampling request's hints pick among ``allowed`` (the card's ``sampling_models``): the first
    allowed model whose name contains the first hint that matches any (case-insensitive); ``None``: none does."""
    for hint in hints:
        needle = hint.strip().lower()
        if not needle:
            continue
        for model in allowed:
            if needle in model.lower():
                return model
    return None


class RunSampler:
    """The :data:`~.tools.Sample` of one tool call: the run's provider, counted and journaled.

    ``used``: the run's usage before this call (committed turns, the turn's reply and its earlier calls; its
    ``samplings`` the model calls samplings took); ``turn``: the turn the call belongs to (its model calls so
    far); ``budget_s``: the compute budget left. :attr:`usage` is what this call's samplings cost (the driver adds
    it to the run's when the call returns).
    """

    def __init__(
        self,
        *,
        provider: Provider,
        card: AgentCard,
        run: RunRecord,
        turn: int,
        index: int,
        call_id: str,
        tool: str,
        used: Usage,
        max_turns: int,
        budget_s: float,
        publish: Publish,
        redactor: Redactor,
    ) -> None:
        self._provider, self._card, self._run = provider, card, run
        self._turn, self._index, self._call_id, self._tool = turn, index, call_id, tool
        self._used, self._max_turns, self._budget_s = used, max_turns, budget_s
        self._publish, self._redactor = publish, redactor
        self.usage = Usage()
        self.count = 0

    @property
    def model(self) -> str:
        return self._card.provider.model or self._card.provider.kind

    def _options(self, params: SamplingParams, spent: Usage) -> SamplingOptions:
        """How the provider is asked: the server's bounds, ``maxTokens`` capped by the run's tokens left."""
        if params.max_tokens < 1:
            raise SamplingRefused(f"maxTokens must be at least 1, not {params.max_tokens}")
        max_tokens = params.max_tokens
        limit = self._card.limits.max_tokens
        if limit is not None:
            max_tokens = min(max_tokens, limit - spent.total_tokens)
        stop = list(params.stop)
        if len(stop) > MAX_STOP_SEQUENCES:
            log.info("mcp.sampling.stop_sequences_capped", asked=len(stop), kept=MAX_STOP_SEQUENCES)
        return SamplingOptions(
            max_tokens=max_tokens,
            temperature=params.temperature,
            stop=stop[:MAX_STOP_SEQUENCES],
            model=pick_model(params.model_hints, self._card.provider.sampling_models),
            hints=list(params.model_hints),
        )

    async def __call__(self, messages: list[Message], params: SamplingParams) -> Sampled:
        n = self.count
        if n >= MAX_SAMPLES_PER_CALL:
            raise SamplingRefused(f"a tool call may ask the run's model at most {MAX_SAMPLES_PER_CALL} times")
        calls = self._turn + self._used.samplings + n  # the run's model calls so far, this call's samplings included
        if calls + 1 >= self._max_turns:  # one is kept for the agent's next turn
            raise SamplingRefused(
                f"the run has no model calls left (max_turns {self._max_turns}: {self._turn} turn(s) and "
                f"{calls - self._turn} sampling(s) so far, one kept for the agent's next turn)"
            )
        limit = self._card.limits.max_tokens
        spent = self._used + self.usage
        if limit is not None and spent.total_tokens >= limit:
            raise SamplingRefused(f"the run's tokens are used up ({spent.total_tokens} of {limit})")
        options = self._options(params, spent)
        self.count += 1
        context = TurnContext(
            run_id=self._run.run_id,
            agent=self._run.agent,
            title=self._run.title,
            people=self._run.human.allowed_recipients,
            turn=self._turn,
            sampling=options,
        )
        try:
            reply = await self._provider.complete(messages, [], budget_s=self._budget_s, context=context)
        except ProviderError as exc:
            raise SamplingRefused(f"the run's model failed: {exc}") from exc
        tokens = reply.usage or Usage()
        self.usage = self.usage + tokens + Usage(samplings=1)
        content = reply.content or ""
        model = options.model or self.model
        prompt = "\n".join(f"{m.role}: {m.content or ''}" for m in messages)
        sampled = RunSampled(
            run_id=self._run.run_id,
            turn=self._turn,
            call_id=self._call_id,
            tool=self._tool,
            sample=n,
            model=model,
            prompt_preview=self._redactor.redact(prompt[-_PREVIEW:]).text[:_PREVIEW],
            result_preview=self._redactor.redact(content[:_PREVIEW]).text[:_PREVIEW],
            prompt_tokens=tokens.prompt_tokens,
            completion_tokens=tokens.completion_tokens,
            total_tokens=tokens.total_tokens,
        )
        await self._publish(sampled, (str(self._turn), str(self._index), str(n)))
        return Sampled(content=content, model=model, stop_reason=stop_reason(reply, options.stop))
