import pytest

from blockdraft.serve.client import Completion, RequestError, SpecMetrics, parse_completion, parse_spec_metrics

# As vLLM 0.32 writes it: HELP/TYPE lines, *_created companions, labels in any order.
METRICS = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/m"} 7.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="/m"} 1.79e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m"} 21.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="0"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2",engine="0",model_name="/m"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="/m",position="0"} 1.79e+09
vllm:num_requests_running{engine="0",model_name="/m"} 0.0
vllm:generation_tokens_total{engine="0",model_name="/m"} 128.0
"""


def test_parses_the_total_counters_and_ignores_created_and_others():
    m = parse_spec_metrics(METRICS)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (7.0, 21.0, 9.0)
    assert m.accepted_per_position == [5.0, 3.0, 1.0]


def test_sums_over_engines():
    second = METRICS.replace('engine="0"', 'engine="1"')
    m = parse_spec_metrics(METRICS + second)
    assert m.num_drafts == 14.0
    assert m.accepted_per_position == [10.0, 6.0, 2.0]


def test_a_server_without_speculation_reads_as_zeros():
    m = parse_spec_metrics("vllm:generation_tokens_total{engine=\"0\"} 12.0\n")
    assert m == SpecMetrics()


def test_a_missing_position_counts_zero():
    text = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 4\n'
    assert parse_spec_metrics(text).accepted_per_position == [0.0, 0.0, 4.0]


def test_minus_subtracts_a_warm_up_reading():
    after = SpecMetrics(10, 30, 12, [6, 4, 2])
    before = SpecMetrics(2, 6, 1, [1])
    assert after.minus(before) == SpecMetrics(8, 24, 11, [5, 4, 2])


def test_completion_keeps_token_ids_and_top_logprobs_by_id():
    answer = {
        "choices": [
            {
                "token_ids": [150, 7],
                "finish_reason": "length",
                "logprobs": {"top_logprobs": [{"token_id:150": -0.1, "token_id:3": -2.5}, {"token_id:7": -0.2}]},
            }
        ]
    }
    c = parse_completion(answer, 4, 0.5)
    assert c == Completion(4, [150, 7], 0.5, "length", [{150: -0.1, 3: -2.5}, {7: -0.2}])


def test_an_answer_without_token_ids_says_which_vllm_feature_is_missing():
    with pytest.raises(RequestError, match="return_token_ids"):
        parse_completion({"choices": [{"text": "hi"}]}, 0, 0.1)
