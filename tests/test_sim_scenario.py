"""Workload parsing: vLLM 0.33.0 defaults and the refusals, each naming field and request."""

from __future__ import annotations

import json

import pytest

from kvpressure.errors import InputError
from kvpressure.simulation.engine import simulate
from kvpressure.simulation.scenario import load_scenario


def _sc(settings=None, requests=None, **top):
    data = {"settings": {"num_gpu_blocks": 100, **(settings or {})},
            "requests": requests or [{"id": "a", "prompt_len": 10, "output_len": 5}]}
    data.update(top)
    return data


def test_defaults_are_vllm_0_33_fallbacks():
    s = load_scenario(_sc()).settings
    assert (s.block_size, s.max_num_seqs, s.max_num_batched_tokens) == (16, 128, 2048)
    assert s.enable_chunked_prefill and s.enable_prefix_caching
    assert (s.policy, s.long_prefill_token_threshold, s.watermark) == ("fcfs", 0, 0.0)
    assert s.scheduler_reserve_full_isl and s.async_scheduling is False
    assert s.max_model_len == 8192


def test_max_model_len_default_covers_the_longest_request():
    s = load_scenario(_sc({"num_gpu_blocks": 2000},
                          [{"id": "a", "prompt_len": 9000, "output_len": 300}])).settings
    assert s.max_model_len == 9300


def test_chunked_prefill_off_takes_max_model_len_from_the_budget():
    s = load_scenario(_sc({"enable_chunked_prefill": False,
                           "max_num_batched_tokens": 4096})).settings
    assert s.max_model_len == 4096
    s = load_scenario(_sc({"enable_chunked_prefill": False})).settings
    assert s.max_num_batched_tokens == s.max_model_len == 8192


def test_bare_list_is_an_open_loop_workload_and_unknown_keys_are_annotations():
    sc = load_scenario([{"id": "a", "prompt_len": 5, "output_len": 2}],
                       overrides={"num_gpu_blocks": 10})
    assert sc.mode == "open" and sc.requests[0].arrival_step == 0
    sc = load_scenario(_sc(notes="hello", owner="x"))
    assert sorted(sc.annotations) == ["notes", "owner"]
    assert simulate(sc).summary["annotations"] == ["notes", "owner"]


@pytest.mark.parametrize("data, words", [
    (_sc(mode={"type": "burst"}), ["mode.type", "burst"]),
    (_sc(mode={"type": "closed"}), ["concurrency"]),
    (_sc(requests=[{"id": "a", "prompt_len": -1, "output_len": 5}]), ["'a'", "prompt_len"]),
    (_sc(requests=[{"id": "b", "prompt_len": 5, "output_len": -2}]), ["'b'", "output_len"]),
    (_sc({"max_model_len": 100}, [{"id": "c", "prompt_len": 100, "output_len": 1}]),
     ["'c'", "max_model_len"]),
    (_sc(requests=[{"id": "d", "prompt_len": 5, "output_len": 1},
                   {"id": "d", "prompt_len": 5, "output_len": 1}]), ["'d'", "duplicate"]),
    (_sc(requests=[{"id": "e", "prompt_len": 5, "output_len": 1, "prefix_group": "zz"}]),
     ["'e'", "zz"]),
    (_sc({"max_num_seqz": 4}), ["max_num_seqz"]),
    (_sc({"max_num_batched_tokens": 64, "max_num_seqs": 128}), ["max_num_batched_tokens"]),
    (_sc({"enable_chunked_prefill": False, "max_num_batched_tokens": 2048,
          "max_model_len": 4096}), ["max_model_len", "chunked"]),
    (_sc({"num_gpu_blocks": 4}, [{"id": "f", "prompt_len": 40, "output_len": 20}]),
     ["'f'", "cannot finish"]),
    (_sc({"policy": "lifo"}), ["policy"]),
    (_sc({"watermark": 1.0}), ["watermark"]),
    ({"requests": [{"id": "g", "prompt_len": 5, "output_len": 1}]}, ["num_gpu_blocks"]),
])
def test_invalid_input_is_refused_naming_field_and_request(data, words):
    with pytest.raises(InputError) as exc:
        load_scenario(data)
    for w in words:
        assert w in str(exc.value)


def test_invalid_json_names_file_and_line(tmp_path):
    p = tmp_path / "w.json"
    p.write_text('{\n "requests": [\n  {"id": 1,}\n ]\n}\n')
    with pytest.raises(InputError, match=r"w\.json: line 3"):
        load_scenario(p)


def test_a_request_that_fits_exactly_runs_alone_to_completion(tmp_path):
    # 4 usable blocks x 16 = 64 slots; prompt 40 + 25 outputs needs 64 (the last token is
    # never written back).
    p = tmp_path / "w.json"
    p.write_text(json.dumps(_sc({"num_gpu_blocks": 5},
                                [{"id": "a", "prompt_len": 40, "output_len": 25}])))
    res = simulate(load_scenario(p))
    assert res.summary["max_kv_usage"] == 1.0 and res.summary["preemptions"] == 0
    assert res.requests[0].num_output_tokens == 25


def test_max_model_len_caps_the_output():
    sc = load_scenario(_sc({"max_model_len": 20}, [{"id": "a", "prompt_len": 15,
                                                    "output_len": 50}]))
    res = simulate(sc)
    assert res.requests[0].num_output_tokens == 5  # stops when L reaches max_model_len
