"""The record's status: "bound by KV blocks", "bound by single-sequence length" or
"not established", with the rule that decided it and its evidence.

Rules, checked in this order (the first that fires decides):

1. **bound by single-sequence length** when any of
   a. the longest sequence of the workload (prompt + output) takes at least ``seq_pool_frac``
      (default 0.5) of the KV pool, so two such sequences cannot both be resident;
   b. ``max_model_len`` exceeds the pool (vLLM's start-up check would fail; a full-length
      request could never be admitted);
   c. the pool is full (symptom 4) while on average at most ``few_running`` (default 2)
      sequences run and requests wait: the pool holds only one or two sequences.
2. **bound by KV blocks** when the direct evidence says the pool ran out: requests wait for
   capacity while running is below ``max_num_seqs`` (symptom 3) *and* preemptions come with a
   recompute ratio over threshold (symptom 5); or one of the two with support: symptom 3 with
   KV usage high, symptom 5 with requests waiting (symptom 2) or KV usage high. KV usage is
   high when it stays near full (symptom 4) or averages at least ``kv_high_mean`` (default
   0.7) over the window: with a small pool and large blocks the gauge swings between ~0.7 and
   1.0 as preemptions free blocks, so usage near full supports the verdict but never vetoes
   it. (In vLLM V1 a preemption happens only when ``allocate_slots`` finds no free block.) When a single-variable comparison of a
   KV-relevant parameter exists (lower ``max_num_seqs``, larger pool, smaller
   ``max_model_len``, full-sequence admission, watermark), it must agree: a knee that moved
   right beyond run-to-run noise confirms (by :mod:`kvpressure.analysis.compare`'s rule: the
   point of diminishing returns or the end of the sustained range moved right, the decline
   disappearing included); a knee that did not move leaves the status "not established".
   Without a comparison the status stands on the symptoms alone (``confirmed`` False, and
   the rule says so).
3. **not established** otherwise, with the reason and the evidence that is missing; when
   nothing ran or waited in the data (an idle server) the reason says "no load in the data";
   when none of the engine metrics was given (bench results alone) the reason says that, not
   that the symptoms are absent.

Prefill interference is a separate finding (``prefill_interference``) and never sets the status.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpressure.analysis.compare import moved_right_by, moved_right_words
from kvpressure.analysis.symptoms import SymptomChecklist
from kvpressure.jsonable import to_jsonable
from kvpressure.stages.results import (
    ComparisonResult,
    Interference,
    InterferenceResult,
    KneeComparison,
    NoEvidence,
    PrefillEvidence,
)

KV_BOUND = "bound by KV blocks"
SEQ_BOUND = "bound by single-sequence length"
NOT_ESTABLISHED = "not established"
STATUSES = (KV_BOUND, SEQ_BOUND, NOT_ESTABLISHED)

# Parameters whose change relieves KV pressure, and the direction that does it.
KV_RELIEF = {
    "max_num_seqs": "lower", "gpu_memory_utilization": "higher", "num_gpu_blocks": "higher",
    "max_model_len": "lower", "scheduler_reserve_full_isl": "False -> True",
    "watermark": "higher",
}


@dataclass
class Status:
    status: str
    rule: str
    confirmed: bool
    evidence: dict = field(default_factory=dict)
    prefill_interference: bool | None = None
    prefill_evidence: PrefillEvidence = field(default_factory=NoEvidence)
    findings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return to_jsonable(self)


def decide_status(
    symptoms: SymptomChecklist,
    *,
    comparison: KneeComparison | ComparisonResult | None = None,
    interference: Interference | InterferenceResult | None = None,
    max_sequence_tokens: int | None = None,
    pool_tokens: int | None = None,
    max_model_len: int | None = None,
    seq_pool_frac: float = 0.5,
    few_running: float = 2.0,
    kv_high_mean: float = 0.7,
    idle: bool | None = None,
) -> Status:
    """Apply the rules above. ``comparison``: the analysis' or stage 04's (None when the data
    holds none); ``interference`` likewise the analysis' or stage 05's. ``pool_tokens`` = num_gpu_blocks x block_size; ``idle``: nothing
    ran or waited in the window (:func:`kvpressure.ingestion.load_window.is_idle`)."""
    sym = {s.id: s for s in symptoms.symptoms}
    verdicts = {k: s.verdict for k, s in sym.items()}
    kv_full = verdicts.get("kv_usage_near_full") == "present"
    silent = verdicts.get("running_below_max_num_seqs") == "present"
    waiting = verdicts.get("waiting_persists") == "present"
    recompute = verdicts.get("preemption_recompute") == "present"
    mean_running = sym["running_below_max_num_seqs"].evidence.get("mean_running") if (
        "running_below_max_num_seqs" in sym) else None
    kv_mean = sym["kv_usage_near_full"].evidence.get("mean_kv_usage") if (
        "kv_usage_near_full" in sym) else None
    kv_high = kv_full or (kv_mean is not None and kv_mean >= kv_high_mean)
    ev: dict = {"symptoms": verdicts}
    if kv_mean is not None:
        ev["mean_kv_usage"] = kv_mean

    pi = interference.prefill_interference if interference is not None else None
    pe = interference.prefill_evidence if interference is not None else NoEvidence()
    findings = []
    if pi:
        findings.append("prefill interference: ITL spikes with long prefills while KV is not full")

    def done(status: str, rule: str, confirmed: bool) -> Status:
        return Status(status=status, rule=rule, confirmed=confirmed, evidence=ev,
                      prefill_interference=pi, prefill_evidence=pe, findings=findings)

    if idle:
        ev["idle"] = True
        return done(NOT_ESTABLISHED,
                    "3: no load in the data: nothing ran or waited at any scrape of the window, "
                    "so the engine's state under load is not measured; scrape the server while "
                    "the load test runs", False)

    # Rule 1: one sequence is too large for the pool.
    if pool_tokens:
        ev["pool_tokens"] = pool_tokens
        if max_sequence_tokens:
            ev["max_sequence_tokens"] = max_sequence_tokens
            ev["sequence_pool_frac"] = max_sequence_tokens / pool_tokens
            if max_sequence_tokens >= seq_pool_frac * pool_tokens:
                return done(SEQ_BOUND, f"1a: longest sequence >= {seq_pool_frac:g} of the pool",
                            True)
        if max_model_len:
            ev["max_model_len"] = max_model_len
            if max_model_len > pool_tokens:
                return done(SEQ_BOUND, "1b: max_model_len exceeds the KV pool", True)
    if mean_running is not None:
        ev["mean_running"] = mean_running
    if kv_full and waiting and mean_running is not None and mean_running <= few_running:
        return done(SEQ_BOUND, f"1c: pool full with <= {few_running:g} sequences running", False)

    # Rule 2: KV blocks, from the direct evidence with usage as support.
    if (silent and recompute) or (silent and kv_high) or (recompute and (waiting or kv_high)):
        direct = [n for n, on in (("requests wait for capacity while running stays below "
                                   "max_num_seqs", silent),
                                  ("preemptions with recomputed tokens", recompute)) if on]
        support = [n for n, on in (
            ("KV usage near full" if kv_full else f"KV usage high (mean {kv_mean:.0%})"
             if kv_high else "", kv_high),
            ("requests keep waiting", waiting and not silent)) if on]
        rule = "2: " + " and ".join(direct) + ("; with " + " and ".join(support)
                                               if support else "")
        if comparison is not None and comparison.parameter in KV_RELIEF:
            ev["comparison"] = {"parameter": comparison.parameter,
                                "knee_moves_right": comparison.knee_moves_right,
                                "beyond_noise": comparison.beyond_noise,
                                "noise_method": comparison.noise_method,
                                "shifts": [s.model_dump() for s in comparison.shifts]}
            if comparison.knee_moves_right and comparison.beyond_noise:
                by = moved_right_by(comparison.shifts)
                return done(KV_BOUND, rule + f"; {moved_right_words(by, past=True)} when "
                            f"{comparison.parameter} changed", True)
            return done(NOT_ESTABLISHED,
                        rule + f"; but the knee did not move right beyond noise when "
                        f"{comparison.parameter} changed", False)
        return done(KV_BOUND, rule + "; from the engine metrics alone, not confirmed: the data "
                    "holds no single-variable comparison (change max_num_seqs and measure the "
                    "curve again)", False)

    engine = ("waiting_persists", "kv_usage_near_full", "running_below_max_num_seqs",
              "preemption_recompute")
    missing = [k for k in engine[1:] if verdicts.get(k) == "no data"]
    if all(verdicts.get(k) == "no data" for k in engine):
        return done(NOT_ESTABLISHED,
                    "3: no engine metrics were given (vllm:kv_cache_usage_perc, "
                    "vllm:num_requests_waiting/running, vllm:num_preemptions_total): the "
                    "throughput curve and latencies alone cannot tell KV pressure from other "
                    "limits; scrape the server's /metrics during the load test", False)
    seen = [n for n, on in (("capacity waiting below max_num_seqs", silent),
                            ("preemptions with recompute", recompute),
                            ("requests waiting", waiting), ("KV usage high", kv_high)) if on]
    reason = ("3: the evidence does not add up to KV pressure (needs capacity waiting below "
              "max_num_seqs or preemptions with recompute, each with support); seen: "
              + (", ".join(seen) if seen else "none of it"))
    if missing:
        reason += "; no data for " + ", ".join(
            f"{k} (missing {sym[k].evidence['missing']})" if sym[k].evidence.get("missing")
            else k for k in missing)
    return done(NOT_ESTABLISHED, reason, False)
