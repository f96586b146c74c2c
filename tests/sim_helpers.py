"""Shared helpers of the simulation tests: a tiny manual engine loop over the Scheduler,
test doubles for the cost model and the recorder, and random small step-level workloads."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import strategies as st

from kvpressure.simulation.request import Request
from kvpressure.simulation.scenario import SchedulerSettings
from kvpressure.simulation.scheduler import Scheduler


def settings(**kw) -> SchedulerSettings:
    base = dict(num_gpu_blocks=10, block_size=16, max_num_seqs=8, max_num_batched_tokens=64,
                enable_chunked_prefill=True, enable_prefix_caching=True, policy="fcfs",
                long_prefill_token_threshold=0, scheduler_reserve_full_isl=True,
                watermark=0.0, max_model_len=8192)
    base.update(kw)
    return SchedulerSettings(**base)


class ManualLoop:
    """Drives a Scheduler the way the reference harness does, exposing the state between
    steps (steps numbered from 0 like the reference runs)."""

    def __init__(self, s: SchedulerSettings) -> None:
        self.sched = Scheduler(s)
        self.n = 0
        self.step = 0
        self.outs = []

    def add(self, rid: str, prompt: int, output: int, priority: int = 0) -> Request:
        r = Request(rid, prompt, output, position=self.n, priority=priority,
                    block_size=self.sched.block_size)
        r.arrival_time = self.n
        r.submit_step = self.step
        self.n += 1
        self.sched.add_request(r)
        return r

    def run_step(self):
        out = self.sched.schedule(self.step)
        usage = self.sched.kv.pool.get_usage()
        self.sched.update_from_output(out, self.step)
        self.outs.append((out, usage))
        self.step += 1
        return out

    @property
    def free_queue(self) -> list[int]:
        return self.sched.kv.pool.free_queue()


class LinearCost:
    """Step time = a + b * prefill tokens + c * decode seqs + d * decode context."""

    def __init__(self, a=0.002, b=2e-5, c=1e-4, d=1e-7):
        self.a, self.b, self.c, self.d = a, b, c, d
        self.calls = 0

    def step_time(self, f):
        self.calls += 1
        return (self.a + self.b * f.num_prefill_tokens + self.c * f.num_decode_seqs
                + self.d * f.sum_decode_ctx + 1e-9 * f.sum_prefill_attn)


class RecordingRecorder:
    """Collects what the engine reports, in aggregate (per-request token times)."""

    def __init__(self, scrape_interval: float | None = None) -> None:
        self.arrivals = {}
        self.scheduled = defaultdict(list)
        self.preempted = defaultdict(list)
        self.token_times = defaultdict(list)
        self.finished = {}
        self.step_ends = []
        self.scrapes = []
        if scrape_interval is not None:
            self.interval = scrape_interval
            self.k = 1

    def on_arrival(self, req, t):
        self.arrivals[req.request_id] = t

    def on_scheduled(self, req, t):
        self.scheduled[req.request_id].append(t)

    def on_preempted(self, req, t):
        self.preempted[req.request_id].append(t)

    def on_output(self, req, t, new_tokens, finished):
        self.token_times[req.request_id].extend([t] * new_tokens)
        if finished:
            self.finished[req.request_id] = t

    def on_decode_leap(self, reqs, times):
        for r in reqs:
            self.token_times[r.request_id].extend(float(t) for t in times)

    def on_step_end(self, t, num_running, num_waiting, num_waiting_deferred, kv_usage,
                    prefix_queries, prefix_hits):
        self.step_ends.append((round(float(t), 12), num_running, num_waiting,
                               num_waiting_deferred, round(float(kv_usage), 12),
                               prefix_queries, prefix_hits))

    @property
    def next_scrape_time(self):
        if not hasattr(self, "interval"):
            raise AttributeError
        return self.k * self.interval

    def maybe_scrape(self, t):
        if hasattr(self, "interval"):
            while self.k * self.interval <= t:
                self.scrapes.append((self.k, sum(len(v) for v in self.token_times.values())))
                self.k += 1

    def aggregate(self):
        return (self.arrivals, dict(self.scheduled), dict(self.preempted),
                {k: [round(x, 12) for x in v] for k, v in self.token_times.items()},
                self.finished, self.step_ends, self.scrapes)


@st.composite
def workloads(draw):
    """A random small step-level workload (the property tests' input)."""
    B = draw(st.sampled_from([4, 16, 32]))
    n_blocks = draw(st.integers(6, 60))
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 8))
    n_req = draw(st.integers(1, 14))
    groups = {"g0": {"length": draw(st.integers(0, 3)) * B + draw(st.sampled_from([0, 5]))},
              "g1": {"length": 2 * B}}
    cap = (n_blocks - 1) * B  # longest sequence that fits the pool
    reqs = []
    for i in range(n_req):
        prompt = draw(st.integers(1, min(150, cap - 1)))
        output = draw(st.integers(1, max(1, min(60, cap - prompt + 1))))
        r = {"id": f"q{i}", "prompt_len": prompt, "output_len": output,
             "arrival_step": draw(st.integers(0, 40)), "priority": draw(st.integers(0, 3))}
        g = draw(st.sampled_from([None, "g0", "g1"]))
        if g is not None:
            r["prefix_group"] = g
        reqs.append(r)
    longest = max(r["prompt_len"] + r["output_len"] for r in reqs)
    budget = draw(st.sampled_from([16, 40, 64, 256]))
    s = {"num_gpu_blocks": n_blocks, "block_size": B, "max_num_seqs": max_num_seqs,
         "enable_chunked_prefill": chunked,
         "enable_prefix_caching": draw(st.booleans()),
         "policy": draw(st.sampled_from(["fcfs", "priority"])),
         # vLLM refuses a threshold above max_model_len.
         "long_prefill_token_threshold": min(draw(st.sampled_from([0, 0, 8, 24])), longest + 1),
         "scheduler_reserve_full_isl": draw(st.booleans()),
         "watermark": draw(st.sampled_from([0.0, 0.0, 0.05, 0.2])),
         "max_model_len": longest + 1}
    s["max_num_batched_tokens"] = max(budget, max_num_seqs) if chunked \
        else max(budget, longest + 1)
    mode = draw(st.sampled_from([{"type": "open"}, {"type": "closed", "concurrency": 3},
                                 {"type": "closed", "concurrency": 8}]))
    return {"name": "prop", "mode": mode, "settings": s, "prefix_groups": groups,
            "requests": reqs}
