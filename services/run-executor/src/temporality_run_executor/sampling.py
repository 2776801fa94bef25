"""A tool's request for a completion of the run's own model mid-call (MCP ``sampling/createMessage``).

An MCP server may ask its client for a completion while it runs a tool (the server has no model of its own).
The run-executor answers with the run's own provider -- the card's model, its API key, its retries -- so
sampling is never a way around the run's limits:

* **tokens**: what each answer cost (the endpoint's ``usage``) is added to the run's usage when the call
  returns (the turn's, or the retried call's, in the next checkpoint); a request when the run's tokens are
  used up (``limits.max_tokens``) is refused, and a call whose samplings take the run past its limit fails
  the run (``token_limit``) at the next turn boundary, like a turn would;
* **turns**: each request is one more model call: refused when the current turn plus the call's samplings
  reach ``limits.max_turns``, and at most :data:`MAX_SAMPLES_PER_CALL` per call;
* **compute time**: it runs inside the tool call, whose time counts as compute (and ``timeout_s`` of the
  server bounds the whole call, its samplings included);
* **journaled**: each answer is a ``run.sampled`` event (the run, turn, call, which sampling, the model,
  previews of the prompt and the answer, redacted like questions, and the tokens), with a deterministic id
  per (run, turn, call, sampling): a redelivered turn republishes the same fact.

A request the run's model cannot serve (tool use, images or audio, no user message) or a provider error is
refused: the server gets an error response, the call goes on. Runs of an external agent get no sampler (the
model is not the executor's to call): the server is refused.

A crash between the answer and the turn's checkpoint makes the call again on redelivery, and the server may
sample again: that model call is spent twice, and only the committed call's tokens are counted.
"""

from __future__ import annotations

from temporality_protocol import RunSampled
from temporality_protocol.redaction import Redactor
from temporality_run_executor.agents import AgentCard
from temporality_run_executor.providers import Provider, ProviderError
from temporality_run_executor.providers.base import TurnContext
from temporality_run_executor.records import Message, RunRecord, Usage
from temporality_run_executor.tools import Publish, Sampled, SamplingRefused

__all__ = ["MAX_SAMPLES_PER_CALL", "RunSampler"]

#: Sampling requests one tool call may make.
MAX_SAMPLES_PER_CALL = 10
_PREVIEW = 4096


class RunSampler:
    """The :data:`~.tools.Sample` of one tool call: the run's provider, counted and journaled.

    ``used``: the run's tokens before this call (committed turns, the turn's reply and its earlier calls);
    ``budget_s``: the compute budget left. :attr:`usage` is what this call's samplings cost (the driver adds it
    to the run's when the call returns).
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
        turns_left: int,
        budget_s: float,
        publish: Publish,
        redactor: Redactor,
    ) -> None:
        self._provider, self._card, self._run = provider, card, run
        self._turn, self._index, self._call_id, self._tool = turn, index, call_id, tool
        self._used, self._turns_left, self._budget_s = used, turns_left, budget_s
        self._publish, self._redactor = publish, redactor
        self.usage = Usage()
        self.count = 0

    @property
    def model(self) -> str:
        return self._card.provider.model or self._card.provider.kind

    async def __call__(self, messages: list[Message], max_tokens: int) -> Sampled:
        n = self.count
        if n >= MAX_SAMPLES_PER_CALL:
            raise SamplingRefused(f"a tool call may ask the run's model at most {MAX_SAMPLES_PER_CALL} times")
        if n >= self._turns_left:
            raise SamplingRefused(f"the run has no model calls left (max_turns {self._card.limits.max_turns})")
        limit = self._card.limits.max_tokens
        spent = self._used + self.usage
        if limit is not None and spent.total_tokens >= limit:
            raise SamplingRefused(f"the run's tokens are used up ({spent.total_tokens} of {limit})")
        self.count += 1
        context = TurnContext(
            run_id=self._run.run_id,
            agent=self._run.agent,
            title=self._run.title,
            people=self._run.human.allowed_recipients,
            turn=self._turn,
        )
        try:
            reply = await self._provider.complete(messages, [], budget_s=self._budget_s, context=context)
        except ProviderError as exc:
            raise SamplingRefused(f"the run's model failed: {exc}") from exc
        tokens = reply.usage or Usage()
        self.usage = self.usage + tokens
        content = reply.content or ""
        prompt = "\n".join(f"{m.role}: {m.content or ''}" for m in messages)
        sampled = RunSampled(
            run_id=self._run.run_id,
            turn=self._turn,
            call_id=self._call_id,
            tool=self._tool,
            sample=n,
            model=self.model,
            prompt_preview=self._redactor.redact(prompt[-_PREVIEW:]).text[:_PREVIEW],
            result_preview=self._redactor.redact(content[:_PREVIEW]).text[:_PREVIEW],
            prompt_tokens=tokens.prompt_tokens,
            completion_tokens=tokens.completion_tokens,
            total_tokens=tokens.total_tokens,
        )
        await self._publish(sampled, (str(self._turn), str(self._index), str(n)))
        return Sampled(content=content, model=self.model)
