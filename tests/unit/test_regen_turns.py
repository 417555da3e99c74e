"""The pure parts of regeneration: which turns the target answers, rollouts, rows."""

from blockdraft.regen.turns import Reply, regen_row, rollout, turn_inputs

U1, U2, U3 = ({"role": "user", "content": f"q{i}"} for i in (1, 2, 3))
A = {"role": "assistant", "content": "original answer"}
SYSTEM = {"role": "system", "content": "be brief"}


def test_first_turn_drops_every_original_assistant_turn_and_what_follows():
    assert turn_inputs([SYSTEM, U1, A, U2, A], max_turns=1) == [[SYSTEM, U1]]


def test_multi_turn_keeps_each_user_turn_without_the_original_replies():
    assert turn_inputs([U1, A, U2, A, U3], max_turns=5) == [[U1], [U2], [U3]]
    assert turn_inputs([U1, A, U2, A, U3], max_turns=2) == [[U1], [U2]]


def test_consecutive_user_messages_form_one_turn():
    assert turn_inputs([U1, U2, A], max_turns=1) == [[U1, U2]]


def test_a_conversation_opening_with_the_assistant_has_nothing_to_answer():
    # The same rule as the serve harness's ShareGPT prompts, so held-out positions agree.
    assert turn_inputs([A, U1], max_turns=3) == []
    assert turn_inputs([{"role": "user", "content": "  "}, A], max_turns=1) == []


def test_two_replies_in_a_row_end_the_conversation():
    assert turn_inputs([U1, A, A, U2], max_turns=5) == [[U1]]


def test_extra_message_keys_are_not_sent_to_the_target():
    assert turn_inputs([{"role": "user", "content": "q", "reasoning_content": "x"}], 1) == [[{"role": "user", "content": "q"}]]


def fake_reply(finish=lambda n: "stop"):
    seen = []

    def reply(messages):
        seen.append([m["content"] for m in messages])
        n = len(seen)
        return Reply(f"r{n}", tokens=n, finish_reason=finish(n))

    return reply, seen


def test_rollout_feeds_each_reply_back_as_context():
    reply, seen = fake_reply()
    conversation, replies = rollout([[U1], [U2]], reply)
    assert seen == [["q1"], ["q1", "r1", "q2"]]
    assert [m["content"] for m in conversation] == ["q1", "r1", "q2", "r2"]
    assert [r.tokens for r in replies] == [1, 2]


def test_rollout_stops_after_a_reply_cut_at_max_tokens():
    reply, seen = fake_reply(finish=lambda n: "length")
    conversation, replies = rollout([[U1], [U2]], reply)
    assert len(seen) == 1 and len(replies) == 1 and conversation[-1]["content"] == "r1"


def test_rollout_stops_when_the_context_no_longer_fits():
    calls = iter([Reply("r1", 1, "stop"), None])
    conversation, replies = rollout([[U1], [U2]], lambda m: next(calls))
    assert [m["content"] for m in conversation] == ["q1", "r1"] and len(replies) == 1


def test_rows_record_the_settings_the_index_and_how_each_turn_ended():
    row = regen_row([U1], {"backend": "vllm", "temperature": 0.0}, 7, [Reply("x", 3, "length")])
    assert row["generation"] == {"backend": "vllm", "temperature": 0.0, "index": 7, "finish_reasons": ["length"]}
