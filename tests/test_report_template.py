"""index.html from its template: every value escaped by the template engine, the first screen
in its order, the recommendation box alone the same as on the page."""

from __future__ import annotations

import re

from kvpressure.record.io import validate_record
from kvpressure.report.html import build_html, recommendation_html
from report_helpers import valid_record

PAYLOAD = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


def _page(**changes):
    data = valid_record()
    data["counters"]["window"]["run"] = PAYLOAD  # a run's name: a folder the user named
    data["workload"]["model_name"] = PAYLOAD
    return build_html(validate_record(data), [], PAYLOAD, **changes)


def test_every_text_from_the_data_is_escaped():
    page = _page()
    assert "<script" not in page and "<img" not in page
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x onerror=alert(2)&gt;"
    # the title, the subtitle's model name and the key numbers' window, each as text
    assert page.count(escaped) >= 4


def test_the_first_screen_in_its_order_and_one_recommendation_box():
    rec = {"text": "max_num_seqs 64 -> 32: +20% at concurrency 48", "concurrency": 48,
           "limits": "TTFT p95 <= 2 s", "source": "twin", "twin_fit": "within 5% <b>",
           "ranked": [{"parameter": "max_num_seqs", "from": 64, "value": 32, "gain_pct": 20.0},
                      {"parameter": "watermark", "from": 0.0, "value": 0.01, "gain_pct": 3.0,
                       "breaks": ["TTFT p95 2.5 s > 2 s"]}],
           "not_run": [{"parameter": "tensor_parallel_size", "from": 1, "value": 2,
                        "why": "one card"}]}
    box = recommendation_html(rec)
    assert box.index("fitted to its curve: within 5% &lt;b&gt;") < box.index('<p class="do">')
    rows = re.findall(r"<tr>.*?</tr>", box, re.S)
    assert len(rows) == 3  # the header, the runner-up, the one not run
    assert "TTFT p95 2.5 s &gt; 2 s" in rows[1] and "<td>not run</td>" * 3 in rows[2]
    assert recommendation_html(None) == "" and recommendation_html({"text": ""}) == ""
    page = _page()
    order = [page.index(x) for x in ('id="verdict"', 'class="lead"', "<h3>Key numbers</h3>",
                                     "<h3>Symptom checklist</h3>", 'class="toc"', "<footer>")]
    assert order == sorted(order)
