"""The rows in flight: one shared queue fed lazily, retries with backoff, rejects that keep every other row,
servers that go away. Answerers here are functions in this process; tests/integration/test_regen_servers.py
runs the same paths against server processes."""

import threading
import time

import pytest

from blockdraft.regen.answerers import Answerer
from blockdraft.regen.runner import ServersGone, regenerate_rows
from blockdraft.regen.shards import RejectLog, ShardedRows
from blockdraft.regen.turns import Reply
from blockdraft.regen.vllm_backend import RequestRefused, ServerUnreachable
from blockdraft.regen.work_queue import Task, WorkQueue

PROMPTS = [[{"role": "user", "content": f"q{i}"}] for i in range(12)]


def answerer(name, reply, in_flight=2, still_there=lambda: True):
    return Answerer(f"http://{name}", "m", reply, in_flight, "endpoint", still_there)


def answering(name, calls, delay_s=0.0):
    def reply(messages):
        calls.append((name, messages[-1]["content"]))
        time.sleep(delay_s)
        return Reply("a " + messages[-1]["content"], 3, "stop")

    return reply


def run(tmp_path, answerers, prompts=PROMPTS, **kwargs):
    store = ShardedRows(tmp_path / "parts", shard_size=5)
    rejects = RejectLog(store.directory)
    settings = dict(max_turns=1, retries=3, backoff_s=0.01, progress=False, rejects=rejects)
    stats = regenerate_rows(prompts, store, answerers, {"backend": "fake"}, **{**settings, **kwargs})
    return store, rejects, stats


def indices(store):
    return sorted(r["generation"]["index"] for r in store.rows())


def test_the_free_server_takes_the_next_prompt_and_each_prompt_is_answered_once(tmp_path):
    calls = []
    slow, fast = answerer("slow", answering("slow", calls, 0.2), 1), answerer("fast", answering("fast", calls), 1)
    store, _, stats = run(tmp_path, [slow, fast])
    assert indices(store) == list(range(12)) and len(calls) == 12
    by = stats.by_server
    assert by["http://fast"]["rows"] > by["http://slow"]["rows"]  # no fixed split: the slow one held no one back
    assert {r["generation"]["served_by"]["url"] for r in store.rows()} == {"http://slow", "http://fast"}


def test_prompts_are_drawn_only_as_servers_free_up():
    drawn = []

    def indices():
        for i in range(1000):
            drawn.append(i)
            yield i

    work = WorkQueue(indices())
    first, second = work.take(), work.take()
    assert (first.index, second.index, len(drawn)) == (0, 1, 2)
    work.again(Task(first.index, 1), delay_s=0.0)  # a retry that is due goes before fresh prompts
    assert work.take() == Task(0, 1) and len(drawn) == 2
    work.close()
    assert work.take() is None


def test_at_most_in_flight_requests_per_server(tmp_path):
    busy, most, lock = [0], [0], threading.Lock()

    def reply(messages):
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.02)
        with lock:
            busy[0] -= 1
        return Reply("a", 1, "stop")

    store, _, _ = run(tmp_path, [answerer("a", reply, in_flight=3)])
    assert most[0] == 3 and indices(store) == list(range(12))


def failing(fails, calls, error=lambda: RequestRefused("the server answered HTTP 500: broken", 500)):
    """Answers, except `fails[prompt]` times (-1: always) for the prompts named."""

    def reply(messages):
        question = messages[-1]["content"]
        calls.append(question)
        if fails.get(question):
            fails[question] -= 1
            raise error()
        return Reply("a " + question, 2, "stop")

    return reply


def test_a_failed_request_is_retried_then_its_prompt_rejected_and_every_other_row_kept(tmp_path):
    calls = []
    store, rejects, stats = run(tmp_path, [answerer("a", failing({"q3": 2, "q7": -1}, calls))])
    assert indices(store) == [i for i in range(12) if i != 7]  # q3 came through on its third try
    assert calls.count("q3") == 3 and calls.count("q7") == 4  # retries=3: one try and three more
    [reject] = rejects.entries()
    assert (reject["index"], reject["attempts"], reject["server"]) == (7, 4, "http://a")
    assert "HTTP 500: broken" in reject["reason"]
    assert (stats.rejects, stats.failed_requests, stats.rows) == (1, 6, 11)


def test_a_request_the_server_refuses_outright_is_rejected_without_retries(tmp_path):
    calls = []
    error = lambda: RequestRefused("the server answered HTTP 400: too long", 400)  # noqa: E731
    _, rejects, _ = run(tmp_path, [answerer("a", failing({"q2": -1}, calls, error))])
    assert calls.count("q2") == 1 and [r["index"] for r in rejects.entries()] == [2]


def test_retries_back_off_twice_as_long_each_time(tmp_path):
    moments = []

    def reply(messages):
        moments.append(time.monotonic())
        raise RequestRefused("HTTP 503", 503)

    run(tmp_path, [answerer("a", reply, in_flight=1)], prompts=PROMPTS[:1], retries=2, backoff_s=0.1)
    waits = [b - a for a, b in zip(moments, moments[1:])]
    assert len(waits) == 2 and 0.1 <= waits[0] < 0.19 and 0.2 <= waits[1] < 0.35


def test_a_server_that_goes_away_leaves_its_prompts_to_the_others(tmp_path):
    calls, down = [], threading.Event()

    def dying(messages):
        if len(calls) >= 2:
            down.set()
            raise ServerUnreachable("no answer (connection refused)")
        return answering("dying", calls)(messages)

    gone = answerer("dying", dying, 2, still_there=lambda: not down.is_set())
    store, rejects, stats = run(tmp_path, [gone, answerer("other", answering("other", calls, 0.01), 2)])
    assert indices(store) == list(range(12)) and rejects.entries() == []
    assert list(stats.gone) == ["http://dying"] and "connection refused" in stats.gone["http://dying"]
    assert stats.by_server["http://dying"]["rows"] <= 2


def test_with_every_server_gone_the_run_stops_keeping_its_rows_and_says_to_rerun(tmp_path):
    calls = []

    def dying(messages):
        if len(calls) >= 3:
            raise ServerUnreachable("no answer")
        return answering("a", calls)(messages)

    with pytest.raises(ServersGone, match=r"every server stopped answering .*http://a.*rows answered are kept .*rerun to resume"):
        run(tmp_path, [answerer("a", dying, 1, still_there=lambda: False)])
    store = ShardedRows(tmp_path / "parts", shard_size=5)
    assert indices(store) == [0, 1, 2]


def test_a_fault_of_the_program_stops_the_run_instead_of_rejecting_every_prompt(tmp_path):
    def broken(messages):
        raise KeyError("a bug")

    with pytest.raises(KeyError, match="a bug"):
        run(tmp_path, [answerer("a", broken)])
    assert RejectLog(tmp_path / "parts").entries() == []
