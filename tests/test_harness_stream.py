"""The harness's stream of jobs: every call feeds one pipeline of
preparation (builds) and device work, so a later call's builds start while an earlier call's
slowest build still runs; identical jobs in flight are measured once; rejections that need no
build cost none. Logic only: preparation and device runs are replaced by controllable stand-ins
where the point is ordering, and no assertion is about time."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
from kernelharness import HarnessSession
from kernelharness.orchestrator import Batch
from kernelharness.rows import Prepared, prepared_failure
from kernelharness.static_checks import static_flags
from dicepipe.judgement import named_protocol
from dicepipe.train.rl_reward import KernelReward, Rollout
from dicepipe.train.rl_tasks import Task
from kernelharness.testing import HONEST_RELU, RELU_REF, by_id, job, python_candidate, settings

GOOD = python_candidate("return x.clamp_min(0)")
WRONG = python_candidate("return x")


class Gate:
    """Preparation stand-in: a job whose id is in `held` waits for `release`; every job ends
    as a build failure (a final row, so no device work is needed) unless `to_device`."""

    def __init__(self, batch: Batch, held=(), to_device=()):
        self.batch, self.held, self.to_device = batch, set(held), set(to_device)
        self.release = threading.Event()
        self.started: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, token, j):
        with self.lock:
            self.started.append(j.job_id)
        if j.job_id in self.held:
            assert self.release.wait(30), "the test never released the held build"
        item = Prepared(job=j, seed=0, static_flags=static_flags(j.candidate_code, j.backend),
                        token=token)
        if j.job_id not in self.to_device:
            item.final_row = prepared_failure(item, "build", "extension 'x' failed to build")
        return item


def _collector():
    rows, event, lock = {}, threading.Event(), threading.Lock()

    def deliver(kind, payload):
        assert kind == "row", payload
        with lock:
            rows[payload["job_id"]] = payload
        event.set()

    return rows, deliver


def test_a_later_call_does_not_wait_for_an_earlier_calls_slowest_build(tmp_path):
    """The first call's job `slow` is still building; the second call (`run`, blocking)
    finishes its own jobs meanwhile, and `slow`'s row arrives once its build ends."""
    batch = Batch(settings(tmp_path), ["cpu"])
    try:
        gate = Gate(batch, held={"slow"})
        batch._prepare = gate
        early, deliver = _collector()
        batch.submit("1:slow", job("slow", RELU_REF, GOOD), deliver)
        batch.submit("2:quick", job("quick", RELU_REF, GOOD), deliver)
        later = []
        batch.run([("3:b", job("b", RELU_REF, GOOD)), ("4:c", job("c", RELU_REF, WRONG))],
                  later.append, progress=False)
        assert sorted(r["job_id"] for r in later) == ["b", "c"]
        assert "slow" not in early, "the held build cannot have finished"
        gate.release.set()
        for _ in range(300):
            if "slow" in early and "quick" in early:
                break
            threading.Event().wait(0.1)
        assert set(early) == {"slow", "quick"}
        assert early["slow"]["error_phase"] == "build" and not early["slow"]["compiled"]
    finally:
        batch.close()


def test_cpu_device_work_waits_until_no_cpu_build_runs(tmp_path, monkeypatch):
    """On cpu no job is timed while another is being prepared (compilers would share the
    cores being timed): a job ready for its device is held until the held build ends, then
    the held jobs go in the order they were submitted."""
    batch = Batch(settings(tmp_path), ["cpu"])
    ran: list[str] = []

    def fake_run(item, worker, measure_speed):
        ran.append(item.job.job_id)
        return {"op": "result", "row": {"compiled": True, "correct": True}}, 0.0

    try:
        gate = Gate(batch, held={"slow"}, to_device={"b", "a"})
        batch._prepare = gate
        monkeypatch.setattr(batch, "_run_clean", fake_run)
        rows, deliver = _collector()
        batch.submit("1:slow", job("slow", RELU_REF, GOOD), deliver)
        batch.submit("2:b", job("b", RELU_REF, GOOD), deliver)
        batch.submit("3:a", job("a", RELU_REF, GOOD), deliver)
        for _ in range(300):
            if len(gate.started) == 3:
                break
            threading.Event().wait(0.05)
        assert sorted(gate.started) == ["a", "b", "slow"]
        threading.Event().wait(0.3)
        assert ran == [], "a cpu job reached its device while a build was still running"
        gate.release.set()
        for _ in range(300):
            if len(rows) == 3:
                break
            threading.Event().wait(0.05)
        assert ran == ["b", "a"], "held jobs go in submission order"
        assert rows["a"]["correct"] and rows["slow"]["error_phase"] == "build"
    finally:
        batch.close()


def test_a_closed_batch_answers_every_pending_job(tmp_path):
    batch = Batch(settings(tmp_path), ["cpu"])
    gate = Gate(batch, held={"slow"})
    batch._prepare = gate
    got: list[tuple[str, object]] = []
    batch.submit("1:slow", job("slow", RELU_REF, GOOD), lambda k, p: got.append((k, p)))
    batch.submit("2:late", job("late", RELU_REF, GOOD), lambda k, p: got.append((k, p)))
    batch.close()
    gate.release.set()
    for _ in range(300):
        if len(got) == 2:
            break
        threading.Event().wait(0.05)
    batch.submit("3:after", job("after", RELU_REF, GOOD), lambda k, p: got.append((k, p)))
    assert len(got) == 3 and got[-1][0] == "abort"


def test_submit_measures_identical_jobs_once_and_shares_the_memo(build_cache_dir):
    """Real workers (pure-Python candidates, no build): twins submitted together are
    measured once; a later submit and a later evaluate copy the row."""
    with HarnessSession(settings(build_cache_dir)) as session:
        futures = session.submit([job("a", RELU_REF, GOOD), job("a2", RELU_REF, GOOD),
                                  job("w", RELU_REF, WRONG)], measure_speed=False)
        rows = [f.result(timeout=300) for f in futures]
        assert session.in_flight() == 0
        a, a2, w = rows
        assert a["job_id"] == "a" and a2["job_id"] == "a2"
        assert a["correct"] and not w["correct"]
        assert not a["reused"] and a2["reused"] and a2["content_key"] == a["content_key"]
        again = session.submit([job("a3", RELU_REF, GOOD)], measure_speed=False)[0].result(timeout=60)
        assert again["reused"] and again["job_id"] == "a3"
        table = by_id(session.evaluate([job("a4", RELU_REF, GOOD)], progress=False,
                                       measure_speed=False))
        assert session.last_summary.measured == 0 and table["a4"]["reused"]
        # measure_speed is part of the content: a timed job is its own measurement
        timed = session.submit([job("t", RELU_REF, GOOD)])[0].result(timeout=300)
        assert not timed["reused"] and timed["content_key"] != a["content_key"]


# --- the reward's cheap rejections ---------------------------------------------------------------

class RecordingSession:
    """A session stand-in: records what the reward submits and answers with given rows."""

    def __init__(self, answer):
        self.jobs, self.answer, self.futures = [], answer, []

    def submit(self, jobs, measure_speed=True):
        out = []
        for j in jobs:
            self.jobs.append(j)
            f = Future()
            self.futures.append((j, f))
            out.append(f)
        return out

    def finish(self):
        for j, f in self.futures:
            f.set_result(self.answer(j))


def _rollout(code: str | None) -> Rollout:
    task = Task("t", 1, RELU_REF, "prompt")
    return Rollout(task, 0, [1], [2], [1], "text", 1, True, code)


FLAGGED = python_candidate("return torch.relu(x)")  # no kernel of its own: flag_no_kernel


def _row(compiled=True, correct=True, **flags):
    row = {"compiled": compiled, "correct": correct, "tolerance_needed": 0.0,
           "output_precision": "fp32", "speedup_low": None}
    row.update({f"flag_{k}": v for k, v in flags.items()})
    return row


@pytest.mark.parametrize("robust", [True, False])
def test_reward_rejects_without_a_build_only_what_the_verdict_would(robust):
    """No code, a file that does not parse, and (robust) a statically flagged file earn 0
    with no job; everything else goes to the harness, and the futures give the rewards."""
    assert static_flags(FLAGGED, "cpu")["flag_no_kernel"]
    assert not any(v for k, v in static_flags(HONEST_RELU, "cpu").items() if k.startswith("flag_"))
    session = RecordingSession(lambda j: _row(no_kernel=bool(static_flags(j.candidate_code, "cpu")["flag_no_kernel"])))
    reward = KernelReward(session, named_protocol("strict"), robust=robust, backend="cpu",
                          latency_weight=0.0, latency_cap_speedup=4.0)
    rollouts = [_rollout(None), _rollout("def broken(:\n"), _rollout(FLAGGED), _rollout(HONEST_RELU)]
    future = reward.submit(rollouts)
    assert not future.done(), "the reward waits for the harness, not before submitting"
    submitted = [j.candidate_code for j in session.jobs]
    assert submitted == ([HONEST_RELU] if robust else [FLAGGED, HONEST_RELU])
    session.finish()
    rewards = future.result(timeout=5)
    # the flagged file: 0 under robust (never built), 1 under plain (correct, flags ignored)
    assert rewards == [0.0, 0.0, 0.0 if robust else 1.0, 1.0]
    assert rollouts[0].info["rejected"] == "no_code"
    assert rollouts[1].info["rejected"] == "not_compiled"
    assert (rollouts[2].info.get("rejected") == "flagged") == robust
    assert reward.skipped == (3 if robust else 2)


def test_reward_call_is_submit_then_wait():
    session = RecordingSession(lambda j: _row(correct=False))
    reward = KernelReward(session, named_protocol("strict"), robust=True, backend="cpu",
                          latency_weight=0.0, latency_cap_speedup=4.0)
    done = []
    thread = threading.Thread(target=lambda: done.append(reward([_rollout(HONEST_RELU)])))
    thread.start()
    for _ in range(100):
        if session.futures:
            break
        threading.Event().wait(0.02)
    session.finish()
    thread.join(10)
    assert done == [[0.0]]


# --- roll_out: chunks go to scoring as they decode; rewards handed back as chunks finish ---------

class _Gen:
    def __init__(self, n):
        self.token_ids, self.trace_ids, self.trace_steps, self.stopped = [5] * n, [5] * n, [1] * n, True


class _Decoder:
    def __init__(self, log):
        self.log = log

    def generate(self, prompts, cfg):
        self.log.append(("decode", len(prompts)))
        return type("R", (), {"generations": [_Gen(2) for _ in prompts]})()


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return "```python\nprint(1)\n```"


def test_roll_out_submits_every_chunk_before_any_score():
    """With a streaming reward, the second chunk is submitted while the first is unscored;
    `on_scored` sees each chunk once with its rewards set, and the rollouts come back in group
    order with their chunk's rewards."""
    from concurrent.futures import ThreadPoolExecutor

    from dicepipe.model.decode import DecodeSettings
    from dicepipe.train.rl_rollout import roll_out

    log: list = []

    class Reward:
        def __init__(self):
            self.futures = []

        @staticmethod
        def force(f, n):
            if not f.done():
                log.append(("forced",))
                f.set_result([0.0] * n)

        def submit(self, rollouts):
            log.append(("submit", len(rollouts)))
            f = Future()
            self.futures.append((f, len(rollouts), len(self.futures)))
            if len(self.futures) == 1:  # a roll_out that waited here would hang: fail it instead
                timer = threading.Timer(20, self.force, (f, len(rollouts)))
                timer.daemon = True
                timer.start()
            if len(self.futures) == 2:  # finish the second chunk first, then the first
                for fut, n, c in reversed(self.futures):
                    fut.set_result([float(c + 1)] * n)
            return f

    seen = []
    model = type("M", (), {"decoder": _Decoder(log)})()
    task = Task("t", 1, RELU_REF, "p")
    groups = [(task, [1, 2]), (task, [1, 2, 3])]
    with ThreadPoolExecutor(max_workers=1) as pool:
        rollouts, times = roll_out(model, groups, group_size=2, groups_per_call=1,
                                   cfg=DecodeSettings(), tokenizer=_Tok(), reward=Reward(), seed=0,
                                   scorer=pool, on_scored=lambda rs: seen.append([r.reward for r in rs]))
    assert log == [("decode", 2), ("submit", 2), ("decode", 2), ("submit", 2)]
    assert sorted(seen) == [[1.0, 1.0], [2.0, 2.0]]  # each chunk once, with its rewards (both
    # were done before roll_out waited, so in no set order)
    assert [r.reward for r in rollouts] == [1.0, 1.0, 2.0, 2.0]
    assert [r.group for r in rollouts] == [0, 0, 1, 1]
    assert times.score_s >= 0.0 and times.score_wait_s >= 0.0


def test_a_broken_batch_is_replaced_on_the_next_submit(build_cache_dir):
    """A batch that cannot go on (its device worker failed to start, say) answers with its
    error; the next submit, with nothing in flight, starts fresh workers."""
    from dicepipe.errors import HarnessError

    with HarnessSession(settings(build_cache_dir)) as session:
        first = session.submit([job("a", RELU_REF, GOOD)], measure_speed=False)[0].result(timeout=300)
        assert first["correct"]
        old = session._batch
        old.broken = HarnessError("the cpu device worker failed to start 3 times: test")
        row = session.submit([job("w", RELU_REF, WRONG)], measure_speed=False)[0].result(timeout=300)
        assert session._batch is not old and not row["correct"] and row["compiled"]


def test_a_failed_harness_call_fails_the_rewards_future():
    """The batch's error (say, its device worker never starts) reaches the reward's caller."""
    from dicepipe.errors import HarnessError

    session = RecordingSession(lambda j: _row())
    reward = KernelReward(session, named_protocol("strict"), robust=True, backend="cpu",
                          latency_weight=0.0, latency_cap_speedup=4.0)
    future = reward.submit([_rollout(HONEST_RELU), _rollout(HONEST_RELU)])
    session.futures[0][1].set_exception(HarnessError("the cpu device worker failed to start"))
    session.futures[1][1].set_result(_row())
    with pytest.raises(HarnessError, match="failed to start"):
        future.result(timeout=5)
