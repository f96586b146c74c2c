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
    parser.add_argument("--timeout", type=float, default=5.0, help="HTTP timeout per scrape, s")


def run(args: argparse.Namespace) -> int:
    from kvpressure.ingestion.live_scrape import scrape_to_log

    print(f"scraping {args.url} every {args.interval:g} s into {args.out} (Ctrl-C stops)",
          file=sys.stderr)
    try:
        log = scrape_to_log(args.url, args.out, interval_s=args.interval,
                            duration_s=args.duration, count=args.count, timeout_s=args.timeout)
    except KeyboardInterrupt:
        print(f"stopped; the scrapes taken so far are in {args.out}", file=sys.stderr)
        return 0
    gaps = f", {len(log.failures)} failed scrapes (gaps)" if log.failures else ""
    print(f"{log.scrapes} scrapes -> {args.out}{gaps}", file=sys.stderr)
    return 0
