"""run_batch: order, per-job settings, concurrency (two sleepers overlap), progress callback."""

from glmstack.sandbox import Job, Limits, run_batch


def test_results_come_back_in_job_order_with_per_job_inputs():
    jobs = [Job(code="print(input() * 2)", stdin=str(i)) for i in range(6)] + ["print('plain string job')"]
    seen = []
    results = run_batch(jobs, concurrency=2, on_result=lambda i, r: seen.append(i))
    assert [r.stdout for r in results] == [f"{i}{i}\n" for i in range(6)] + ["plain string job\n"]
    assert sorted(seen) == list(range(7))


def test_jobs_run_concurrently_and_a_bad_one_does_not_block_the_rest():
    sleeper = "import time; a = time.time(); time.sleep(1); print(a, time.time())"
    jobs = [Job(code=sleeper), Job(code=sleeper), Job(code="while True: pass", limits=Limits(timeout_s=0.5))]
    results = run_batch(jobs, concurrency=3, limits=Limits(timeout_s=20))
    (a0, a1), (b0, b1) = (map(float, r.stdout.split()) for r in results[:2])
    assert a0 < b1 and b0 < a1, "the two sleepers did not overlap"
    assert [r.ok for r in results] == [True, True, False] and results[2].timed_out
