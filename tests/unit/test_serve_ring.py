"""The router's hash ring and session keys (glmstack/serve/router.py): stable, balanced, and a dead replica's
sessions move while the others' stay."""

from glmstack.serve.router import Ring, session_key


def test_ring_is_stable_balanced_and_moves_only_the_dead_replicas_keys():
    ring = Ring(["a", "b", "c"])
    keys = [f"conv-{i}" for i in range(3000)]
    before = {k: ring.pick(k) for k in keys}
    assert before == {k: Ring(["a", "b", "c"]).pick(k) for k in keys}  # deterministic across processes
    share = {r: sum(v == r for v in before.values()) / len(keys) for r in "abc"}
    assert all(0.2 < s < 0.47 for s in share.values()), share
    ring.down.add("b")
    after = {k: ring.pick(k) for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != "b")
    assert {after[k] for k in keys if before[k] == "b"} == {"a", "c"}  # spread over the survivors
    ring.down |= {"a", "c"}
    assert ring.pick("conv-1") is None


def test_session_key_order_and_resent_history():
    assert session_key({"conversation_id": "x", "user": "u"}) == "conversation_id:x"
    assert session_key({"rollout_id": 7}) == "rollout_id:7"
    assert session_key({"user": "u", "messages": []}) == "user:u"
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]
    turn2 = first + [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert session_key({"messages": first}) == session_key({"messages": turn2})  # a re-sent history keeps its key
    assert session_key({"prompt": [1, 2, 3]}) != session_key({"prompt": [1, 2, 4]})
