"""The twin of a measured server: build it from a run folder, fit it, check it, predict.

```python
from kvpressure.twin.api import build_twin
twin = build_twin("reports/prod")            # settings + workload + basis simulations
fit = twin.fit()                              # step-time coefficients with bootstrap intervals
report = twin.fit_report()                    # measured vs twin per level, and the verdict
advice = twin.predict_remedies(limits={"ttft_p95_s": 2.0, "itl_p95_s": 0.08})
```

A twin that was not fitted simulates nothing: ``predict_remedies`` refuses it. A twin whose
fit report does not pass marks every prediction as untrusted, with the reason.

Levels are the measured closed loops, keyed by concurrency, or, for a folder of open loops
(``vllm bench serve --request-rate R`` without ``--max-concurrency``), the request rates
(``open_loop.py``: fitted on the server's step trace, every prediction simulated).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.folders.run_folder import RunFolder, as_run_folder
from kvpressure.ingestion.source_kind import SourceKind
from kvpressure.simulation.engine import simulate
from kvpressure.twin.basis import LevelBasis, build_scenario, simulate_basis
from kvpressure.twin.fit import PARAMETERS, TwinFit, fit_step_time
from kvpressure.twin.fit_report import FitVerdict, comparison_table, verdict
from kvpressure.twin.lengths import MEANS, PER_REQUEST
from kvpressure.twin.measured import Measured, ingested_sources, level_name, load_measured
from kvpressure.twin.return_lag import ReturnLag, from_step_trace, from_turnaround, given
from kvpressure.twin.settings import assumed_settings, twin_settings
from kvpressure.twin.simulate import simulate_level
from kvpressure.twin.workload import REDRAWS, LevelWorkload, level_workloads


class TwinNotFitted(InputError):
    """A prediction was asked of a twin whose step time was never fitted."""


@dataclass
class FitReport:
    table: pd.DataFrame
    verdict: FitVerdict
    twin_levels: dict[int, dict[str, Any]]


@dataclass
class Twin:
    measured: Measured
    settings: dict[str, Any]
    settings_source: dict[str, str]
    workloads: dict[Any, LevelWorkload]
    priors: dict[str, float] | None = None
    prior_source: str = "profile"
    bases: dict[int, LevelBasis] = field(default_factory=dict)
    redrawn_preemptions: dict[Any, np.ndarray] = field(default_factory=dict)
    fitted: TwinFit | None = None
    report: FitReport | None = None
    timings: dict[str, float] = field(default_factory=dict)
    step_trace: pd.DataFrame | None = None
    """The server's own steps (``ingestion.iteration_log``): the step time is fitted on them."""
    return_lag: ReturnLag | None = None
    """The clients' return in engine steps (``return_lag.py``); None until estimated (the
    client turnaround route needs the fitted step time)."""

    @property
    def key(self) -> str:
        """``concurrency`` (closed loops) or ``request_rate`` (an open loop)."""
        return self.measured.key

    @property
    def open_loop(self) -> bool:
        return self.measured.open_loop

    def level_name(self, level: Any) -> str:
        return level_name(level, self.key)

    # --- fit ------------------------------------------------------------------------------
    def basis(self, concurrency: int, overrides: Mapping[str, Any] | None = None
              ) -> LevelBasis:
        """The level's basis simulations under the baseline settings (kept) or ``overrides``."""
        if not overrides:
            if concurrency not in self.bases:
                self.bases[concurrency] = simulate_basis(self.settings,
                                                         self.workloads[concurrency])
            return self.bases[concurrency]
        return simulate_basis({**self.settings, **overrides}, self.workloads[concurrency])

    def fit(self, *, levels: list[int] | None = None, bootstrap: int = 200, seed: int = 0,
            min_levels: int | None = None) -> TwinFit:
        """Fit the step time on ``levels`` (default: every measured level)."""
        t = time.perf_counter()
        chosen = levels if levels is not None else sorted(self.workloads)
        unknown = [c for c in chosen if c not in self.workloads]
        if unknown:
            raise InputError(f"levels {unknown}: not measured "
                             f"({', '.join(map(str, sorted(self.workloads)))})")
        if self.open_loop:
            from kvpressure.twin.open_loop import fit_open_loop

            sub = self.measured.levels[self.measured.levels[self.key].isin(chosen)]
            self.fitted = fit_open_loop(self.step_trace, sub, self.settings, self.workloads,
                                        priors=self.priors, prior_source=self.prior_source,
                                        bootstrap=bootstrap, seed=seed)
            self.timings["fit_s"] = time.perf_counter() - t
            self.report = None
            return self.fitted
        bases = {c: self.basis(c) for c in chosen}
        self.timings["basis_s"] = time.perf_counter() - t
        t = time.perf_counter()
        kw: dict[str, Any] = {} if min_levels is None else {"min_levels": min_levels}
        sub = self.measured.levels[self.measured.levels["concurrency"].isin(chosen)]
        if self.step_trace is not None:
            from kvpressure.twin.step_trace import fit_on_levels

            self.fitted = fit_on_levels(self.step_trace, sub, bases, priors=self.priors,
                                        prior_source=self.prior_source, bootstrap=bootstrap,
                                        seed=seed)
        else:
            self.fitted = fit_step_time(sub, bases, priors=self.priors,
                                        prior_source=self.prior_source, bootstrap=bootstrap,
                                        seed=seed, **kw)
        self.timings["fit_s"] = time.perf_counter() - t
        self.report = None
        if self.return_lag is None:
            lag = self._lag_from_turnaround(chosen)
            if any(lag.return_steps.values()):
                # The lag changes the decisions the bases hold: simulate and fit again.
                return self.fit(levels=levels, bootstrap=bootstrap, seed=seed,
                                min_levels=min_levels)
        return self.fitted

    def _lag_from_turnaround(self, levels: list[int]) -> ReturnLag:
        """The return lag from the client-side turnaround over the fitted mean step time of
        each fitted level (the others take the median of those)."""
        fitted = self.require_fit("the clients' return lag")
        coef = np.array(list(fitted.step_coefficients().values()), dtype=float)
        step_s = {c: float(self.bases[c].time("duration", coef)) / max(self.bases[c].steps, 1)
                  for c in levels}
        gaps = {c: v["client_gap_s"] for c, v in self.turnaround()["per_level"].items()}
        lag = from_turnaround(gaps, step_s)
        rest = [c for c in self.workloads if c not in lag.return_steps]
        if rest:
            k = int(np.median(list(lag.return_steps.values()))) if lag.return_steps else 0
            lag.return_steps.update({c: k for c in rest})
        if any(lag.return_steps.values()):
            self.set_return_lag(lag)
        else:
            self.return_lag = lag  # no lag: the bases and the fit stand
        return lag

    def set_return_lag(self, lag: ReturnLag) -> None:
        """Use ``lag`` for every level from now on (kept bases are simulated again)."""
        self.return_lag = lag
        self.workloads = lag.apply(self.workloads)
        self.bases.clear()
        self.redrawn_preemptions.clear()
        self.fitted = None
        self.report = None

    def require_fit(self, what: str) -> TwinFit:
        if self.fitted is None:
            raise TwinNotFitted(
                f"{what}: the twin's step time is not fitted to the measured server, so its "
                "times would be the kit's defaults, not this server's; fit it first "
                "(Twin.fit(), which needs " + ("the server's step trace)" if self.open_loop
                                               else "at least 3 measured levels)"))
        return self.fitted

    # --- predictions -----------------------------------------------------------------------
    def predict_level(self, level: Any, overrides: Mapping[str, Any] | None = None
                      ) -> dict[str, Any]:
        """One level simulated with the fitted coefficients (and ``overrides``)."""
        fit = self.require_fit(f"simulating {self.level_name(level)}")
        if level not in self.workloads:
            raise InputError(f"{self.level_name(level)}: no measured workload for it")
        return simulate_level({**self.settings, **(overrides or {})},
                              self.workloads[level], fit.step_coefficients(),
                              fit.theta["ttft_offset"])

    def level_draws(self, level: Any, overrides: Mapping[str, Any] | None = None
                    ) -> dict[str, np.ndarray]:
        """Output throughput, TTFT p95 and preemptions of one level under the fit's draws:
        matrix products on the basis of a closed loop (whose preemptions do not move with the
        step time), replays of an open one (``open_loop.simulated_draws``)."""
        fit = self.require_fit(f"the uncertainty at {self.level_name(level)}")
        names = ("output_throughput", "ttft_p95_s", "preemptions")
        if not len(fit.samples):
            return {k: np.array([]) for k in names}
        if self.open_loop:
            from kvpressure.twin.open_loop import simulated_draws

            sims = simulated_draws({**self.settings, **(overrides or {})},
                                   self.workloads[level], fit)
            return {k: np.array([d[k] for d in sims], dtype=float) for k in names}
        basis = self.basis(level, overrides or None)
        thr = basis.output_tokens / basis.time("duration", fit.samples[:, :-1])
        ttft = basis.ttft @ fit.samples[:, :-1].T + fit.samples[:, -1]
        return {"output_throughput": np.atleast_1d(thr),
                "ttft_p95_s": np.percentile(ttft, 95, axis=0, method="inverted_cdf"),
                "preemptions": np.full(len(fit.samples), float(basis.preemptions))}

    def preemptions_redrawn(self, level: Any) -> np.ndarray:
        """A closed-loop level's preemptions over ``REDRAWS`` versions the data cannot tell
        from the measured one (``LevelWorkload.redrawn``); its decisions do not depend on the
        step time, so each is simulated in steps."""
        if level not in self.redrawn_preemptions:
            self.redrawn_preemptions[level] = np.array(
                [simulate(build_scenario(self.settings, self.workloads[level].redrawn(seed)),
                          fast_path="leap").summary["preemptions"]
                 for seed in range(1, REDRAWS + 1)], dtype=float)
        return self.redrawn_preemptions[level]

    def throughput_band(self, level: Any) -> tuple[float, float]:
        """The 5-95% band of a level's output throughput over the fit's draws."""
        return _band(self.level_draws(level)["output_throughput"], 5, 95)

    def fit_report(self, levels: list[int] | None = None) -> FitReport:
        """Measured against twin at ``levels`` (default: every measured level), with the
        verdict. Levels left out of the fit are predictions (leave-levels-out)."""
        self.require_fit("the fit report")
        t = time.perf_counter()
        chosen = levels if levels is not None else sorted(self.workloads)
        twin_levels = {c: self.predict_level(c) for c in chosen}
        draws = {c: self.level_draws(c) for c in chosen}
        band = {c: _band(d["output_throughput"], 5, 95) for c, d in draws.items()}
        # An open loop's preemptions move with the step times, a closed loop's with the order
        # its requests sent at once reach the engine: their whole range over the replays is
        # what a measured count is read against.
        spread = ({c: _band(d["preemptions"], 0, 100) for c, d in draws.items()}
                  if self.open_loop else
                  {c: _band(self.preemptions_redrawn(c), 0, 100) for c in chosen})
        sub = self.measured.levels[self.measured.levels[self.key].isin(chosen)]
        table = comparison_table(sub, twin_levels, band, key=self.key,
                                 preemption_range=spread)
        self.report = FitReport(table, verdict(table, key=self.key), twin_levels)
        self.timings["report_s"] = time.perf_counter() - t
        return self.report

    def predict_remedies(self, *, focus: float | None = None,
                         limits: Mapping[str, float] | None = None,
                         candidates: Mapping[str, Mapping[str, Any]] | None = None,
                         latency_tolerance_pct: float | None = None) -> dict[str, Any]:
        from kvpressure.twin.remedies import predict_remedies

        self.require_fit("a remedy")
        if self.report is None:
            self.fit_report()
        t = time.perf_counter()
        out = predict_remedies(self, focus=focus, limits=limits or {}, candidates=candidates,
                               latency_tolerance_pct=latency_tolerance_pct)
        self.timings["remedies_s"] = time.perf_counter() - t
        return out

    # --- description -----------------------------------------------------------------------
    def assumptions(self) -> list[str]:
        out = [f"{k} = {self.settings[k]}: {self.settings_source[k]}"
               for k in self.assumed_settings]
        out.extend(self.lengths_assumptions())
        if self.open_loop:
            out.append(self.arrival_assumption())
        else:
            out.append(self.turnaround_assumption())
            out.append("the requests a level sends at once (its first C) reach the engine in "
                       "the order sent; no result records that order, so each level's "
                       f"preemptions are read against {REDRAWS} other orders (seeded) and a "
                       "remedy's interval holds their spread")
        if self.fitted is not None:
            for p in PARAMETERS:
                if self.fitted.source[p] != "fitted":
                    out.append(f"{p} = {self.fitted.theta[p]:.3g}: {self.fitted.source[p]}")
        return out + list(self.measured.notes)

    @property
    def assumed_settings(self) -> list[str]:
        """Engine settings not in the data, taken at vLLM's defaults (``settings.py``)."""
        return assumed_settings(self.settings_source)

    def lengths_sources(self) -> dict[Any, str]:
        """Where each level's request lengths came from (``lengths.py``)."""
        return {c: w.lengths_source for c, w in sorted(self.workloads.items())}

    @property
    def spread_known(self) -> bool:
        """Every level's length spread is in the data (not only its mean)."""
        return all(w.lengths_source != MEANS for w in self.workloads.values())

    def lengths_assumptions(self) -> list[str]:
        """The request lengths' source, one line per group of levels with the same one (the
        per-request lengths themselves are no assumption)."""
        what = "request rate" if self.open_loop else "concurrency"
        groups: dict[str, list[Any]] = {}
        for c, w in sorted(self.workloads.items()):
            if w.lengths_source not in (PER_REQUEST, ""):
                groups.setdefault(w.lengths_source, []).append(c)
        out = []
        for src, levels in groups.items():
            details = [self.workloads[c].lengths_detail for c in levels]
            said = details[0] if len(set(details)) == 1 else "; ".join(
                f"{self.level_name(c)}: {d}" for c, d in zip(levels, details, strict=True))
            out.append(f"request lengths at {what} " + ", ".join(f"{c:g}" for c in levels)
                       + f" from the {src}: {said}")
        return out

    def arrival_assumption(self) -> str:
        """How an open loop's requests arrive in the twin."""
        drawn = [f"{c:g}" for c, w in sorted(self.workloads.items()) if not w.arrivals_measured]
        text = ("open loop (vllm bench serve --request-rate R, no --max-concurrency): each "
                "request reaches the engine at its measured send time, measured from the level's "
                "first; the time the API server takes to hand it over is in the fitted TTFT "
                "offset, not in the arrival")
        if drawn:
            text += ("; at request rate " + ", ".join(drawn) + " the data has no send times "
                     "(vllm bench serve --save-detailed keeps them), so the arrivals are drawn "
                     "at the rate with the run's burstiness (seeded), like vllm bench serve's "
                     "own, not the same ones")
        return text

    def turnaround(self) -> dict[str, Any]:
        """The measured client turnaround (``turnaround.py``): per level and over the levels
        that have it, the engine-side and client-side gap in seconds."""
        lv = self.measured.levels
        per = {int(r["concurrency"]): {"engine_gap_s": float(r["engine_gap_mean_s"]),
                                       "client_gap_s": float(r["client_gap_mean_s"]),
                                       "mean_in_engine": float(r["mean_in_engine"])}
               for _, r in lv.iterrows()}

        def median(key: str) -> float:
            vals = [v[key] for v in per.values() if np.isfinite(v[key])]
            return float(np.median(vals)) if vals else float("nan")

        return {"per_level": per, "engine_gap_s": median("engine_gap_s"),
                "client_gap_s": median("client_gap_s")}

    def turnaround_assumption(self) -> str:
        got = self.turnaround()
        lag = self.return_lag
        if lag is None or not (any(lag.return_steps.values()) or lag.first_alone):
            head = ("closed loop without think time: a finished request's client resubmits "
                    "at the next engine step (vllm bench serve --request-rate inf "
                    "--max-concurrency C)")
        else:
            per = ", ".join(f"c={c}: {k}" for c, k in sorted(lag.return_steps.items()))
            head = ("closed loop without think time (vllm bench serve --request-rate inf "
                    "--max-concurrency C): a finished request's client resubmits before step "
                    f"s + 1 + R after its finish in step s, R in engine steps ({per})"
                    + ("; the first request of each level starts one step ahead of the others "
                       "(as the server's step trace shows)" if lag.first_alone else ""))
        if lag is not None:
            head += f"; return lag {lag.source}"
        eng, cli = got["engine_gap_s"], got["client_gap_s"]
        if not (np.isfinite(eng) or np.isfinite(cli)):
            return head + "; the data has no measure of the real client's turnaround"
        parts = []
        if np.isfinite(eng):
            parts.append(f"{eng * 1000:.0f} ms from a finish to the next request reaching the "
                         "engine (median over levels, from the running and waiting gauges)")
        if np.isfinite(cli):
            parts.append(f"{cli * 1000:.0f} ms of it at the client, between the response's end "
                         "and the next request sent (bench start times and latencies)")
        lagged = lag is not None and any(lag.return_steps.values())
        return (head + "; measured, a real client's slot stays empty " + "; ".join(parts)
                + ("" if lagged else ": the twin keeps its slots fuller than the server saw "
                   "at low concurrency, where the engine is rarely full"))


def _band(values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    if not len(values):
        return (float("nan"), float("nan"))
    a, b = np.percentile(values, [lo, hi])
    return float(a), float(b)


def build_twin(run_dir: RunFolder | str | os.PathLike[str], *, overrides: Mapping[str, Any] | None = None,
               variant: str | None = None, cost_model: Any = None,
               workloads: Mapping[int, LevelWorkload] | None = None,
               server_log: str | Path | None = None,
               return_steps: int | None = None) -> Twin:
    """The twin of the server measured in ``run_dir``: settings and workload from the data.

    ``overrides`` replace engine settings (``{"num_gpu_blocks": 512}``); ``cost_model`` (a
    ``StepCostModel`` from the hardware and model profiles) supplies the coefficients the data
    cannot identify; ``workloads`` replace the per-level request sets. A server log with
    vLLM's iteration details (``server_log``, else ``server.log`` in ``run_dir``) gives the
    step time from the server's own steps (``step_trace.py``). ``return_steps``: the
    clients' return lag in engine steps at every level (docs/scheduler.md#loop-closed-return);
    by default estimated from the step trace, else from the client turnaround once the step
    time is fitted (``return_lag.py``). A :class:`RunFolder` given is read through: what a
    stage already read of it is not read again.
    """
    from kvpressure.twin.step_time import profile_priors

    folder = as_run_folder(run_dir)
    run_dir = folder.path
    measured = load_measured(folder, variant=variant)
    if measured.levels.empty:
        raise InputError(
            f"{run_dir}: runs.csv has no run with a concurrency level or a request rate: the "
            "twin replays closed loops (vllm bench serve --max-concurrency C) or open loops "
            "(--request-rate R), one level a run")
    logged = ingested_sources(folder, measured.ingest, SourceKind.SERVER_LOG)
    settings, source = twin_settings(folder, measured.runs, measured.series,
                                     measured.ingest, overrides,
                                     [Path(server_log)] if server_log is not None else logged,
                                     measured.bench_settings)
    loads = dict(workloads) if workloads is not None else level_workloads(measured)
    priors = profile_priors(cost_model) if cost_model is not None else None
    name = getattr(getattr(cost_model, "geometry", None), "name", "profile")
    from kvpressure.twin.step_trace import find_step_trace

    starts = (pd.to_numeric(measured.levels["t_start"], errors="coerce")
              if "t_start" in measured.levels else pd.Series(dtype=float))
    near = float(starts.min()) if starts.notna().any() else None
    trace = find_step_trace(Path(run_dir), server_log, near, logged)
    twin = Twin(measured, settings, source, loads, priors,
                f"profile roofline ({name})" if priors else "profile", step_trace=trace)
    if measured.open_loop:
        if return_steps is not None:
            raise InputError("--return-steps (return_steps): an open loop has no clients to "
                             "return, its requests arrive at their measured times")
        return twin
    lag = None
    if trace is not None:
        lag = from_step_trace(trace, measured.levels, settings, loads, return_steps)
    if lag is None and return_steps is not None:
        lag = given(return_steps, list(loads))
    if lag is not None:
        twin.set_return_lag(lag)
    return twin
