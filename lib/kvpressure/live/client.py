"""One streamed completion and a closed loop of them, timed the way ``vllm bench serve`` times.

A request posts token ids to ``/v1/completions`` (exact prompt lengths, no tokenizer round
trip) with ``ignore_eos`` and a fixed ``max_tokens``, streams the answer and stamps every chunk
that carries a choice: TTFT is the first stamp after sending, ITL the gaps between stamps,
latency the last stamp. The output length is the server's own ``usage.completion_tokens``.
Any failure (a refused connection, HTTP 4xx/5xx, a stall past the read timeout, a stream that
never delivered a token) is an error of that request, with its reason; it never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

ERROR_PAUSE_S = (0.05, 2.0)  # a failing server is not hammered: the pause doubles up to 2 s


@dataclass
class RequestOutcome:
    prompt_len: int
    output_len: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0  # unix time the request was sent
    error: str = ""

    @property
    def success(self) -> bool:
        return not self.error


def _short(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


async def stream_completion(
    http: httpx.AsyncClient,
    url: str,
    model: str,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    extra: dict | None = None,
) -> RequestOutcome:
    """Send one streamed completion; the outcome, with ``error`` set on any failure."""
    payload = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": int(max_tokens),
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    out = RequestOutcome(prompt_len=len(prompt), start_time=time.time())
    st = time.perf_counter()
    last = st
    chunks = 0
    try:
        async with http.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                try:
                    body = json.loads(body)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    pass
                out.error = f"HTTP {resp.status_code}: {_short(str(body))}"
                return out
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    obj = json.loads(data)
                except ValueError:
                    out.error = f"not JSON in the stream: {_short(data, 80)}"
                    return out
                if obj.get("choices"):
                    now = time.perf_counter()
                    if chunks == 0:
                        out.ttft = now - st
                    else:
                        out.itl.append(now - last)
                    last = now
                    chunks += 1
                elif isinstance(obj.get("usage"), dict):
                    tokens = obj["usage"].get("completion_tokens")
                    if isinstance(tokens, int):
                        out.output_len = tokens
                    prompt_tokens = obj["usage"].get("prompt_tokens")
                    if isinstance(prompt_tokens, int):
                        out.prompt_len = prompt_tokens
                elif "error" in obj:
                    out.error = f"error in the stream: {_short(json.dumps(obj['error']))}"
                    return out
    except httpx.TimeoutException as exc:
        out.error = f"timeout ({type(exc).__name__}) after {time.perf_counter() - st:.1f} s"
        return out
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {_short(str(exc)) or 'connection failed'}"
        return out
    if chunks == 0:
        out.error = "the stream ended without a token"
        return out
    out.latency = last - st
    if out.output_len == 0:
        out.output_len = chunks
    return out


@dataclass
class LoopResult:
    outcomes: list[RequestOutcome]
    started: float  # unix time of the first request
    ended: float  # unix time the last one finished
    stopped: str | None = None  # why the loop stopped before its end, if it did


def _reported(outcome: RequestOutcome, on_outcome: Callable[[RequestOutcome], None] | None,
              should_stop: Callable[[], str | None] | None, stop_reason: list[str]) -> bool:
    """A finished request told to the caller, then its stopping rule asked (once a reason is
    kept it is not asked again); True when this outcome gave the reason."""
    if on_outcome is not None:
        on_outcome(outcome)
    if should_stop is not None and not stop_reason:
        reason = should_stop()
        if reason:
            stop_reason.append(reason)
            return True
    return False


async def closed_loop(
    http: httpx.AsyncClient,
    url: str,
    model: str,
    request_at: Callable[[int], tuple[Sequence[int], int]],
    concurrency: int,
    num_requests: int | None = None,
    *,
    duration_s: float | None = None,
    timeout_s: float | None = None,
    on_outcome: Callable[[RequestOutcome], None] | None = None,
    should_stop: Callable[[], str | None] | None = None,
) -> LoopResult:
    """``concurrency`` clients, each sending its next prompt as soon as its last one finished.

    ``request_at(k)`` gives request k as (prompt token ids, max_tokens). Stops submitting after
    ``num_requests`` (or at ``duration_s``), waits for what is in flight, and cancels everything
    at ``timeout_s``
    (those requests count as errors). ``should_stop`` is asked after every request: a reason
    ends the loop the same way.
    """
    outcomes: list[RequestOutcome] = []
    next_index = 0
    stop_reason: list[str] = []
    started = time.time()
    t0 = time.monotonic()

    def take() -> int | None:
        nonlocal next_index
        if stop_reason:
            return None
        if num_requests is not None and next_index >= num_requests:
            return None
        if duration_s is not None and time.monotonic() - t0 >= duration_s:
            return None
        k = next_index
        next_index += 1
        return k

    async def client() -> None:
        errors_in_row = 0
        while (k := take()) is not None:
            prompt, max_tokens = request_at(k)
            outcome = await stream_completion(http, url, model, prompt, max_tokens)
            outcomes.append(outcome)
            _reported(outcome, on_outcome, should_stop, stop_reason)
            if outcome.success:
                errors_in_row = 0
            else:
                errors_in_row += 1
                lo, hi = ERROR_PAUSE_S
                await asyncio.sleep(min(hi, lo * 2 ** (errors_in_row - 1)))

    tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
    try:
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        if pending:
            stop_reason.append(f"level timeout ({timeout_s:g} s)")
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            cut = len(pending)
            outcomes.extend(
                RequestOutcome(prompt_len=0, start_time=time.time(),
                               error=f"cancelled at the level timeout ({timeout_s:g} s)")
                for _ in range(cut)
            )
        for task in done:
            failed = task.exception()
            if failed is not None:
                raise failed
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return LoopResult(outcomes, started, time.time(), stop_reason[0] if stop_reason else None)


async def open_loop(
    http: httpx.AsyncClient,
    url: str,
    model: str,
    request_at: Callable[[int], tuple[Sequence[int], int]],
    send_at: Sequence[float],
    max_concurrency: int | None = None,
    *,
    timeout_s: float | None = None,
    on_outcome: Callable[[RequestOutcome], None] | None = None,
    should_stop: Callable[[], str | None] | None = None,
) -> LoopResult:
    """Request k sent ``send_at[k]`` seconds after the start whatever the server's state (an
    open loop, as ``vllm bench serve --request-rate``), or, with ``max_concurrency``, as soon
    after as fewer than that many are in flight. Outcomes are in send order. ``timeout_s``
    cancels what is still running (errors, as in :func:`closed_loop`); a reason from
    ``should_stop`` (asked after every request) stops the sending."""
    outcomes: list[RequestOutcome | None] = [None] * len(send_at)
    stop_reason: list[str] = []
    started = time.time()
    t0 = time.monotonic()
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    wake = asyncio.Event()

    async def one(k: int) -> None:
        prompt, max_tokens = request_at(k)
        if gate is not None:
            async with gate:
                outcome = await stream_completion(http, url, model, prompt, max_tokens)
        else:
            outcome = await stream_completion(http, url, model, prompt, max_tokens)
        outcomes[k] = outcome
        if _reported(outcome, on_outcome, should_stop, stop_reason):
            wake.set()

    async def sender() -> list[asyncio.Task]:
        tasks = []
        for k, at in enumerate(send_at):
            delay = at - (time.monotonic() - t0)
            if delay > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=delay)
            if stop_reason:
                break
            # Under a cap a request that arrives while the cap is reached waits for a slot
            # (in one(), as vllm bench serve's semaphore): later arrivals are not delayed.
            tasks.append(asyncio.create_task(one(k)))
        return tasks

    deadline = None if timeout_s is None else t0 + timeout_s
    send = asyncio.create_task(sender())
    tasks: list[asyncio.Task] = []
    try:
        done_send, _ = await asyncio.wait([send], timeout=timeout_s)
        tasks = send.result() if done_send else []
        if not done_send:
            send.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await send
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        pending: set[asyncio.Task] = set()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=left)
        if pending or not done_send:
            stop_reason.insert(0, f"level timeout ({timeout_s:g} s)")
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for task in tasks:
            failed = None if task.cancelled() else task.exception()
            if failed is not None:
                raise failed
    except asyncio.CancelledError:
        send.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(send, *tasks, return_exceptions=True)
        raise
    sent = len(tasks)
    kept = [o if o is not None else RequestOutcome(
        prompt_len=0, start_time=time.time(),
        error=f"cancelled at the level timeout ({timeout_s:g} s)") for o in outcomes[:sent]]
    return LoopResult(kept, started, time.time(), stop_reason[0] if stop_reason else None)
