"""/metrics in Prometheus' text format: queue length, running requests, tokens/s, time to first token.

Names follow vLLM's (research/serving-protocol.md §7) under a `glmstack:` prefix, so existing dashboards need only
the prefix changed. Counters end in `_total`; time to first token is a summary (`_sum`, `_count`).
"""

from __future__ import annotations


def prometheus_text(srv) -> str:
    s, st = srv.sched, srv.sched.stats
    rows = [
        ("num_requests_waiting", "gauge", "jobs waiting for a batch slot", len(s.waiting)),
        ("num_requests_running", "gauge", "jobs in the running batch", len(s.running)),
        ("generation_tokens_per_second", "gauge", "generated tokens/s over the last 10 s", s.tokens_per_s()),
        ("prompt_tokens_total", "counter", "prompt tokens prefilled", st["prompt_tokens"]),
        ("generation_tokens_total", "counter", "tokens generated", st["generated_tokens"]),
        ("request_finished_total", "counter", "jobs finished (any reason)", st["finished"]),
        ("request_aborted_total", "counter", "jobs cancelled or past their time limit", st["aborted"]),
        ("requests_total", "counter", "HTTP generation requests received", srv.counts["requests"]),
        ("requests_rejected_total", "counter", "requests answered 429 (queue full)", srv.counts["rejected_429"]),
        ("request_errors_total", "counter", "requests answered 4xx", srv.counts["errors_4xx"]),
        ("engine_busy_seconds_total", "counter", "time the engine thread spent stepping", st["busy_s"]),
        ("engine_steps_total", "counter", "batched decode steps", st["steps"]),
    ]
    rows.append(
        (
            "prefill_tokens_computed_total",
            "counter",
            "prompt tokens prefilled (not from the prefix cache)",
            st["prefill_computed"],
        )
    )
    if s.speculative:
        steps = max(st["spec_steps"], 1)
        rows += [
            ("speculative_verify_steps_total", "counter", "verify steps of finished requests", st["spec_steps"]),
            ("speculative_emitted_tokens_total", "counter", "tokens those steps emitted", st["spec_emitted"]),
            ("speculative_acceptance_length", "gauge", "mean tokens per verify step", st["spec_emitted"] / steps),
            (
                "speculative_acceptance_rate",
                "gauge",
                "accepted / drafted tokens",
                (st["spec_emitted"] - st["spec_steps"]) / (steps * s.draft_k),
            ),
        ]
        for rule, n in st["anomalies"].items():
            rows.append(
                (
                    f'speculative_anomalies_total{{rule="{rule}"}}',
                    "counter",
                    f"generations the monitor flagged ({s.monitor.action})",
                    n,
                )
            )
    pc = s.prefix_cache
    if pc is not None:
        rows += [
            (
                "prefix_cache_hit_tokens_total",
                "counter",
                "prompt tokens found in the prefix cache",
                pc.stats["hit_tokens"],
            ),
            ("prefix_cache_query_tokens_total", "counter", "prompt tokens looked up", pc.stats["lookup_tokens"]),
            ("prefix_cache_hit_rate", "gauge", "hit tokens / looked-up tokens since start", pc.hit_rate),
            ("prefix_cache_bytes", "gauge", "bytes of cached KV blocks", pc.bytes),
            ("prefix_cache_blocks", "gauge", "cached KV blocks", len(pc.blocks)),
            ("prefix_cache_evicted_total", "counter", "blocks evicted (LRU, budget)", pc.stats["evicted"]),
        ]
    lines = []
    for name, kind, doc, value in rows:
        base = name.split("{")[0]
        if f"# TYPE glmstack:{base} {kind}" not in lines:
            lines += [f"# HELP glmstack:{base} {doc}", f"# TYPE glmstack:{base} {kind}"]
        lines.append(f"glmstack:{name} {value}")
    lines += [
        "# HELP glmstack:time_to_first_token_seconds time from submission to a job's first token",
        "# TYPE glmstack:time_to_first_token_seconds summary",
        f"glmstack:time_to_first_token_seconds_sum {st['ttft_sum']}",
        f"glmstack:time_to_first_token_seconds_count {st['ttft_count']}",
    ]
    return "\n".join(lines) + "\n"
