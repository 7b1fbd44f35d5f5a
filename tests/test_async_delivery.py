"""AsyncEngine's delivery of deltas: one event-loop wake-up per step, and deltas that queued up
behind a busy consumer merged into one (engine/async_engine.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from mtpserve.engine import async_engine
from mtpserve.engine.async_engine import AsyncEngine, merge_outputs
from mtpserve.outputs import RequestOutput, SpecStats, TokenLogprob
from mtpserve.sampling_params import SamplingParams


def _out(rid, ids, text, finished=False, n=0, logprobs=None, spec=None):
    return RequestOutput(rid, ids, text, logprobs, finished, "length" if finished else None,
                         num_prompt_tokens=3, num_output_tokens=n, spec=spec)


def test_merge_outputs_concatenates_in_order_and_keeps_the_last_counters():
    lp = [TokenLogprob(7, -0.5), TokenLogprob(8, -1.0), TokenLogprob(9, -2.0)]
    a = _out("r", [7], "a", n=1, logprobs=lp[:1], spec=SpecStats(3, 1, 1))
    b = _out("r", [8, 9], "bc", finished=True, n=3, logprobs=lp[1:], spec=SpecStats(6, 2, 2))
    m = merge_outputs([a, b])
    assert m.new_token_ids == [7, 8, 9] and m.new_text == "abc"
    assert m.new_logprobs == lp
    assert (m.finished, m.finish_reason, m.num_output_tokens) == (True, "length", 3)
    assert m.spec == SpecStats(6, 2, 2)
    assert merge_outputs([a]) is a
    none = merge_outputs([_out("r", [1], "x"), _out("r", [2], "y")])
    assert none.new_logprobs is None and none.new_token_ids == [1, 2]


def test_merge_outputs_rejects_an_empty_list_and_mixed_requests():
    with pytest.raises(ValueError, match="one request"):
        merge_outputs([])
    with pytest.raises(ValueError, match="one request"):
        merge_outputs([_out("a", [1], "x"), _out("b", [2], "y")])


class _Engine:
    """Each step gives every request one token (100 + its index) until it has ``length``; with
    ``gate``, the steps after the first (``gate_first``: every step) wait for it."""

    def __init__(self, length: int, gate: threading.Event | None = None, gate_first=False):
        self.length, self.count, self.gate, self.steps = length, {}, gate, 0
        self.gate_first = gate_first

    def warmup(self):
        pass

    def add_request(self, rid, prompt, params):
        self.count[rid] = 0

    def abort_request(self, rid):
        self.count.pop(rid, None)

    def has_unfinished_requests(self):
        return bool(self.count)

    def take_deferred_outputs(self):
        return []   # every step's deltas come with it

    def step(self):
        self.steps += 1
        if self.gate is not None and (self.steps > 1 or self.gate_first):
            self.gate.wait(10)
        outs = []
        for rid in sorted(self.count):
            n = self.count[rid] = self.count[rid] + 1
            done = n == self.length
            outs.append(_out(rid, [99 + n], f"t{n}", finished=done, n=n))
            if done:
                del self.count[rid]
        return outs


def _started(length: int, gate: threading.Event | None = None,
             gate_first: bool = False) -> AsyncEngine:
    eng = AsyncEngine(lambda: _Engine(length, gate, gate_first), warmup=True)
    eng.start()
    deadline = time.monotonic() + 10
    while not eng.ready:
        assert time.monotonic() < deadline, eng.error
        time.sleep(0.01)
    return eng


def test_a_step_wakes_the_event_loop_once_for_all_its_requests(monkeypatch):
    batches = []
    real = async_engine._put_all
    monkeypatch.setattr(async_engine, "_put_all", lambda items: (batches.append(len(items)),
                                                                 real(items)))
    gate = threading.Event()
    eng = _started(3, gate, gate_first=True)

    async def both():
        async def one(rid):
            return [o.new_token_ids async for o in eng.generate(rid, [1, 2], SamplingParams())]
        tasks = [asyncio.create_task(one(r)) for r in ("a", "b")]
        # both requests reach the engine before its first step ends (an engine thread that got
        # "a" alone first, on a loaded machine, finished it before "b" came: batches of 1)
        await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*tasks)

    try:
        got = asyncio.run(both())
    finally:
        eng.shutdown()
    tokens = [[t for ids in r for t in ids] for r in got]
    assert tokens == [[100, 101, 102], [100, 101, 102]]
    assert sum(batches) == 6 and max(batches) == 2   # two requests' deltas in one callback


def test_deltas_queued_behind_a_busy_consumer_come_merged():
    gate, finished = threading.Event(), threading.Event()
    eng = _started(5, gate)
    deliver = eng._deliver

    def delivered(outs):
        deliver(outs)
        if any(o.finished for o in outs):
            finished.set()

    eng._deliver = delivered

    async def consume():
        stream = eng.generate("r", [1, 2], SamplingParams())
        first = await stream.__anext__()
        gate.set()
        await asyncio.to_thread(finished.wait, 10)   # the other four deltas are queued now
        rest = [o async for o in stream]
        return first, rest

    try:
        first, rest = asyncio.run(consume())
    finally:
        eng.shutdown()
    assert first.new_token_ids == [100] and first.new_text == "t1"
    assert len(rest) == 1
    assert rest[0].new_token_ids == [101, 102, 103, 104] and rest[0].new_text == "t2t3t4t5"
    assert rest[0].finished and rest[0].num_output_tokens == 5


def test_the_engine_loop_is_profiled_when_asked(monkeypatch, tmp_path):
    """MTPSERVE_ENGINE_PROFILE=PATH (engine/loop_profile.py): the loop's cProfile in
    PATH.<pid>.prof and its table, after the step count (3: one request of 3 tokens), in
    PATH.<pid>.txt once the engine stops; unset, no file."""
    import os
    import pstats

    from mtpserve.engine.loop_profile import ENV

    async def one(eng):
        return [o async for o in eng.generate("r", [1, 2], SamplingParams())]

    eng = _started(3)
    try:
        asyncio.run(one(eng))
    finally:
        eng.shutdown()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(ENV, str(tmp_path / "loop"))
    eng = _started(3)
    try:
        got = asyncio.run(one(eng))
    finally:
        eng.shutdown()
    assert [t for o in got for t in o.new_token_ids] == [100, 101, 102]
    base = tmp_path / f"loop.{os.getpid()}"
    text = (base.with_name(base.name + ".txt")).read_text()
    assert text.startswith("engine steps: 3\n")
    stats = pstats.Stats(str(base.with_name(base.name + ".prof"))).stats
    assert [n for (_, _, n), v in stats.items() if n == "step" and v[1] == 3] == ["step"]


def test_an_abort_reaches_the_engine_before_the_stream_ends():
    """abort_all: the engine drops each request before its stream is ended, so a client that
    sees its stream end also sees it gone from the engine's gauges (the other order raced
    test_server_api's num_running check on a busy CPU, session 15)."""
    gate = threading.Event()
    eng = _started(50, gate)
    order = []
    inner = eng.engine
    abort, end = inner.abort_request, eng._end_sinks
    inner.abort_request = lambda rid: (order.append(("engine", rid)), abort(rid))[1]
    eng._end_sinks = lambda rid: (order.append(("stream", rid)), end(rid))[1]

    async def go():
        stream = eng.generate("r", [1, 2], SamplingParams())
        first = await stream.__anext__()
        eng.abort_all()
        gate.set()
        return first, [o async for o in stream]

    try:
        first, rest = asyncio.run(go())
    finally:
        eng.shutdown()
    assert first.new_token_ids == [100]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert order == [("engine", "r"), ("stream", None)]
    assert "r" not in inner.count
