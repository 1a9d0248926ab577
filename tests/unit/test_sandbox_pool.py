"""run_batch: order, per-job settings, concurrency (two sleepers overlap), progress callback."""

import time

from glmstack.sandbox import Job, Limits, run_batch


def test_results_come_back_in_job_order_with_per_job_inputs():
    jobs = [Job(code="print(input() * 2)", stdin=str(i)) for i in range(6)] + ["print('plain string job')"]
    seen = []
    results = run_batch(jobs, concurrency=2, on_result=lambda i, r: seen.append(i))
    assert [r.stdout for r in results] == [f"{i}{i}\n" for i in range(6)] + ["plain string job\n"]
    assert sorted(seen) == list(range(7))


def test_jobs_run_concurrently_and_a_bad_one_does_not_block_the_rest():
    jobs = [Job(code="import time; time.sleep(1)") for _ in range(2)]
    jobs.append(Job(code="while True: pass", limits=Limits(timeout_s=0.5)))
    t = time.monotonic()
    results = run_batch(jobs, concurrency=3, limits=Limits(timeout_s=5))
    assert time.monotonic() - t < 2.5  # serially it would be 2.5 s plus start-up
    assert [r.ok for r in results] == [True, True, False] and results[2].timed_out
