"""``kvpressure scrape URL --out LOG.jsonl``: record a live server's metrics during a load test."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the server's metrics endpoint, e.g. http://host:8000/metrics")
    parser.add_argument("--out", required=True,
                        help="scrape log (JSONL, appended to; read it with `kvpressure ingest`)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between scrapes")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=float, default=None,
                      help="stop after this many seconds (default: until Ctrl-C)")
    stop.add_argument("--count", type=int, default=None, help="stop after this many scrapes")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="total time one scrape may take, s (a server that trickles its "
                        "answer is cut there)")
    parser.add_argument("--max-failures", type=int, default=None, metavar="N",
                        help="give up after N failed scrapes in a row (default: never; an "
                        "outage is recorded as gaps and scraping resumes with back-off)")


def run(args: argparse.Namespace) -> int:
    from kvpressure.ingestion.live_scrape import scrape_to_log

    print(f"scraping {args.url} every {args.interval:g} s into {args.out} (Ctrl-C stops)",
          file=sys.stderr)
    try:
        # A first scrape that fails is a wrong URL far more often than an outage: say so now.
        log = scrape_to_log(args.url, args.out, interval_s=args.interval,
                            duration_s=args.duration, count=args.count, timeout_s=args.timeout,
                            max_failures=args.max_failures, require_first=True)
    except KeyboardInterrupt:
        print(f"stopped; the scrapes taken so far are in {args.out}", file=sys.stderr)
        return 0
    gaps = f", {len(log.failures)} failed scrapes (gaps, logged with their reasons)" \
        if log.failures else ""
    print(f"{log.scrapes} scrapes -> {args.out}{gaps}", file=sys.stderr)
    if log.gave_up:
        print(f"kvpressure scrape: gave up after {log.gave_up}; the scrapes taken are kept",
              file=sys.stderr)
        return 2
    return 0
