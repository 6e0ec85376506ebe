"""Resharding from Python: FSDP rows on three trainer runtimes to
tensor-parallel columns on two reader runtimes (two hosts: shm and tcp),
planned once, run for three steps, each reader's shard exactly its columns;
only the planned bytes move."""

import numpy as np
import pytest

import tensorlane as tl
from tensorlane import errors
from tensorlane import reshard as rs


def _host(h):
    return {"preset": "dgx-h100", "hosts": 2, "host": h, "allow_transports": ["shm", "tcp"]}


def test_plan_explain_and_bad_layouts():
    p = rs.ReshardPlan((8, 6), np.float16, rs.rows(2), rs.cols(3))
    assert len(p.moves) == 6 and p.bytes == 8 * 6 * 2
    assert "destination 2 [0:8, 4:6]" in p.explain()
    assert all(m["runs"][0]["count"] == 4 and m["runs"][0]["len"] == 4 for m in p.moves)
    blocks = [((0, 0), (8, 3)), ((0, 3), (8, 6))]
    q = rs.ReshardPlan((8, 6), np.float16, blocks, rs.rows(4))
    assert len(q.moves) == 8
    with pytest.raises(errors.InvalidArgument):
        rs.ReshardPlan((8, 6), np.float16, [((0, 0), (9, 6))], rs.rows(2))  # outside
    with pytest.raises(errors.InvalidArgument):
        rs.ReshardPlan((8, 6), np.float16, rs.rows(9), rs.rows(2))  # more holders than rows
    with pytest.raises(errors.InvalidArgument):
        rs.ReshardPlan((8, 6), np.float16, "rows", rs.rows(2))


def test_fsdp_rows_to_tp_columns_three_steps():
    shape = (96, 40)
    plan = rs.ReshardPlan(shape, np.float32, rs.rows(3), rs.cols(2))
    trainers = [tl.Runtime(_host(h)) for h in ("h0", "h1", "h0")]
    readers = [tl.Runtime(_host(h)) for h in ("h0", "h1")]
    try:
        senders = [rs.ReshardSender(plan, i, runtime=rt) for i, rt in enumerate(trainers)]
        receivers = [rs.ReshardReceiver(plan, j, runtime=rt) for j, rt in enumerate(readers)]
        slots = {}
        for r in receivers:
            slots.update(r.slots())
        assert len(slots) == len(plan.moves)
        rows = np.array_split(np.arange(shape[0]), 3)
        cols = np.array_split(np.arange(shape[1]), 2)
        for step in range(3):
            w = np.random.default_rng(step).standard_normal(shape).astype(np.float32)
            pushed = 0
            for i, s in enumerate(senders):
                res = s.send(np.ascontiguousarray(w[rows[i][0]:rows[i][-1] + 1]), slots, timeout=10)
                pushed += sum(r.bytes for r in res)
            assert pushed == plan.bytes == w.nbytes  # each reader gets only its columns
            for j, r in enumerate(receivers):
                out = np.zeros((shape[0], len(cols[j])), np.float32)
                r.receive(out, timeout=10)
                np.testing.assert_array_equal(out, w[:, cols[j][0]:cols[j][-1] + 1])
        with pytest.raises(errors.InvalidArgument):
            senders[0].send(np.zeros(3, np.float32), slots)
        for s in senders:
            s.close()
        for r in receivers:
            r.close()
    finally:
        for rt in trainers + readers:
            rt.close()


@pytest.mark.parametrize("into", [False, True], ids=["scattered", "in place"])
def test_sender_over_its_shard_pushes_from_it(into):
    """ReshardSender(over=shard): the trainer's shard (runtime memory,
    updated in place each step) is published once and each move's runs are
    pushed straight from it, to readers on its host (shm) and the other
    (tcp); every step each reader gets exactly its columns, the latest
    values, and only the planned bytes move."""
    shape = (96, 40)
    plan = rs.ReshardPlan(shape, np.float32, rs.rows(3), rs.cols(2))
    trainers = [tl.Runtime(_host(h)) for h in ("h0", "h1", "h0")]
    readers = [tl.Runtime(_host(h)) for h in ("h0", "h1")]
    try:
        rows = np.array_split(np.arange(shape[0]), 3)
        cols = np.array_split(np.arange(shape[1]), 2)
        shards = [rt.empty((len(rows[i]), shape[1]), np.float32) for i, rt in enumerate(trainers)]
        outs = [np.zeros((shape[0], len(cols[j])), np.float32) for j in range(2)]
        senders = [rs.ReshardSender(plan, i, runtime=rt, over=shards[i]) for i, rt in enumerate(trainers)]
        receivers = [rs.ReshardReceiver(plan, j, runtime=rt, into=outs[j] if into else None) for j, rt in enumerate(readers)]
        slots = {}
        for r in receivers:
            slots.update(r.slots())
        for step in range(3):
            w = np.random.default_rng(step + 20).standard_normal(shape).astype(np.float32)
            for i, sh in enumerate(shards):
                sh[:] = w[rows[i][0]:rows[i][-1] + 1]  # the trainer's update, in place
            pushed, paths = 0, set()
            for i, s in enumerate(senders):
                res = s.send(shards[i] if step % 2 else None, slots, timeout=10)
                pushed += sum(r.bytes for r in res)
                paths |= {r.transport for r in res}
            assert pushed == plan.bytes and paths == {"shm", "tcp"}
            for j, r in enumerate(receivers):
                r.receive(outs[j], timeout=10)
                np.testing.assert_array_equal(outs[j], w[:, cols[j][0]:cols[j][-1] + 1])
        with pytest.raises(errors.InvalidArgument):  # not the memory it was made over
            senders[0].send(np.zeros_like(shards[0]), slots)
        with pytest.raises(errors.InvalidArgument):  # not the plan's bytes
            rs.ReshardSender(plan, 0, runtime=trainers[0], over=np.zeros(3, np.float32))
        for s in senders:
            s.close()
            s.close()  # idempotent
        for r in receivers:
            r.close()
    finally:
        for rt in trainers + readers:
            rt.close()


@pytest.mark.parametrize("src,dst,in_place", [(rs.rows(3), rs.cols(2), True), (rs.cols(2), rs.rows(3), False)],
                         ids=["rows to columns", "columns to rows"])
def test_receiver_into_the_shard(src, dst, in_place):
    """ReshardReceiver(into=shard): moves that are one contiguous range of
    the reader's shard land in it (trainers on the other host); the others
    are scattered. Every step the shard is exactly the reader's block."""
    shape = (96, 40)
    plan = rs.ReshardPlan(shape, np.float32, src, dst)
    nsrc, ndst = len(plan.src_bytes), len(plan.dst_bytes)
    trainers = [tl.Runtime(_host("h0")) for _ in range(nsrc)]
    readers = [tl.Runtime(_host("h1")) for _ in range(ndst)]
    try:
        dim_s, dim_d = src[1], dst[1]
        parts_s = np.array_split(np.arange(shape[dim_s]), nsrc)
        parts_d = np.array_split(np.arange(shape[dim_d]), ndst)

        def block(w, dim, idx):
            sl = [slice(None), slice(None)]
            sl[dim] = slice(idx[0], idx[-1] + 1)
            return np.ascontiguousarray(w[tuple(sl)])

        shards = [np.zeros(block(np.zeros(shape), dim_d, parts_d[j]).shape, np.float32) for j in range(ndst)]
        senders = [rs.ReshardSender(plan, i, runtime=rt) for i, rt in enumerate(trainers)]
        receivers = [rs.ReshardReceiver(plan, j, runtime=rt, into=shards[j]) for j, rt in enumerate(readers)]
        assert all(ip == in_place for r in receivers for ip in r.in_place)
        slots = {}
        for r in receivers:
            slots.update(r.slots())
        with pytest.raises(errors.InvalidArgument):
            receivers[0].receive(np.zeros_like(shards[0]), timeout=1)
        for step in range(2):
            w = np.random.default_rng(step + 10).standard_normal(shape).astype(np.float32)
            for i, s in enumerate(senders):
                s.send(block(w, dim_s, parts_s[i]), slots, timeout=10)
            for j, r in enumerate(receivers):
                r.receive(shards[j], timeout=10)
                np.testing.assert_array_equal(shards[j], block(w, dim_d, parts_d[j]))
        for s in senders:
            s.close()
        for r in receivers:
            r.close()
    finally:
        for rt in trainers + readers:
            rt.close()
