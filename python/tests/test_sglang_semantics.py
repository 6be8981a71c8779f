"""kvxfer.sglang driven as SGLang's schedulers drive a transfer backend.

The sequence (SGLang's python/sglang/srt/disaggregation/prefill.py and
decode.py; kvxfer/sglang.py's docstring cites the commits):

  prefill: sender = KVSender(mgr, bootstrap_addr, bootstrap_room,
           dest_tp_ranks, pp_rank); poll() until not Bootstrapping
           (PrefillBootstrapQueue.pop_bootstrapped); init(num_pages,
           metadata_buffer_index); send(page_indices) per chunk from
           send_kv_chunk, set_buf(req) writing the aux slot before the last
           one; poll() in process_disagg_prefill_inflight_queue until
           Success or Failed (then failure_exception(), caught).
  decode:  receiver = KVReceiver(mgr, bootstrap_addr, bootstrap_room);
           older: poll() until WaitingForInput, init(page_indices,
           metadata_buffer_index); newer: init(prefill_dp_rank), poll()
           until WaitingForInput, send_metadata(page_indices,
           metadata_buffer_index, state_indices, decode_prefix_len=...);
           poll() in DecodeTransferQueue.pop_transferred until Success
           (reads the aux slot) or Failed.

Two nodes in one process over host memory (ucx, CURVE); every byte of
every layer's K and V pages and of the aux slot is compared."""

import logging
import sys
import tempfile
import threading
import types

import pytest

import kvxfer
from kvxfer import KvxferError, Status
from kvxfer import sglang as ks
from kvxfer.sglang import KVManager, KVPoll, KVReceiver, KVSender

from conftest import unique, wait_until
from sglang_helpers import AUX_ITEMS, ITEM, LAYOUT, PAGE, Pool, node_cfg, poll_until

P, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed
ADDR = "10.0.0.1:8998"  # the prefill's bootstrap address, as the router hands it to both sides
TERMINAL = (S, F)


def _pair(tmp, prefill_kw=None, decode_kw=None, start_prefill=True):
    (p_pub, p_sec), (d_pub, d_sec) = kvxfer.keygen(), kvxfer.keygen()
    p_name, d_name = unique("sg-prefill"), unique("sg-decode")
    p_ep, d_ep = "ipc://%s/p.sock" % tmp, "ipc://%s/d.sock" % tmp
    p_cfg = node_cfg(p_name, p_ep, p_sec, [{"instance": d_name, "endpoint": d_ep, "public_key": d_pub}],
                     **(prefill_kw or {}))
    d_cfg = node_cfg(d_name, d_ep, d_sec, [{"instance": p_name, "endpoint": p_ep, "public_key": p_pub}],
                     prefill_instances={ADDR: p_name}, **(decode_kw or {}))
    p_pool, d_pool = Pool(), Pool()
    pm = KVManager(p_pool.args, "prefill", None, False, config=p_cfg) if start_prefill else None
    dm = KVManager(d_pool.args, "decode", None, False, config=d_cfg)
    if pm is not None:  # both connected, as long-running instances are
        pm.node.wait_peers(20000)
        dm.node.wait_peers(20000)
    return pm, dm, p_pool, d_pool


@pytest.fixture
def pair():
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        made = []

        def make(**kw):
            out = _pair(tmp, **kw)
            made.extend(m for m in out[:2] if m is not None)
            return out

        before = kvxfer.handle_count()
        yield make
        for m in made:
            m.close()
        assert kvxfer.handle_count() == before


def _bootstrap(sender, receiver, num_pages, p_slot, d_pages, d_slot, newer=False, seen=None):
    """Both sides as SGLang bootstraps them, up to the decode's pages."""
    if newer:
        receiver.init(0)  # prefill_dp_rank
    poll_until([sender], lambda s: s[0] != P, seen=seen and seen[:1])
    sender.init(num_pages, p_slot)
    poll_until([receiver], lambda s: s[0] != P, seen=seen and seen[1:])
    if newer:
        receiver.send_metadata(d_pages, d_slot, None, decode_prefix_len=0)
    else:
        receiver.init(d_pages, d_slot)


@pytest.mark.parametrize("newer", [False, True], ids=["init-pages", "send-metadata"])
def test_chunked_prompt_lands_in_the_decode_pages(pair, newer):
    """A 10-page prompt in chunks of 4, 4 and 2 pages, into other page ids
    on the decode side: every byte of every layer's K and V and of the aux
    slot (two payloads) lands; both sides go Bootstrapping,
    WaitingForInput, Transferring, Success. (Checked to fail: with the aux
    copy in _finish removed, the aux slot stays zero; with each chunk's
    run naming its first page for every page, the request fails.)"""
    pm, dm, pp, dp = pair()
    room = 1234567890123
    src, dst = list(range(3, 13)), [30, 2, 17, 5, 9, 21, 11, 28, 14, 6]
    pp.fill(src, seed=1)
    pp.fill_aux(2, seed=2)
    sender = KVSender(pm, ADDR, room, [0], 0)
    receiver = KVReceiver(dm, ADDR, room)
    seen = [[], []]
    _bootstrap(sender, receiver, len(src), 2, dst, 3, newer=newer, seen=seen)
    for lst, o in zip(seen, (sender, receiver)):
        lst.append(o.poll())
    for a, b in ((0, 4), (4, 8), (8, 10)):
        sender.send(src[a:b])
        assert sender.poll() in (T, S)
    states = poll_until([sender, receiver], lambda s: all(x in TERMINAL for x in s), seen=seen)
    assert states == [S, S], (sender.reason, receiver.reason)
    dedup = [[s for i, s in enumerate(lst) if i == 0 or lst[i - 1] != s] for lst in seen]
    assert dedup == [[P, W, T, S], [P, W, T, S]], dedup
    assert (dp.pages(dst) == pp.pages(src)).all()
    assert dp.aux_slot(3) == pp.aux_slot(2) and any(dp.aux_slot(3))
    assert not dp.pages([0, 1]).any()  # no other page touched
    assert dm.aux_bytes == len(pp.aux_slot(2)) > 4096  # more than a payload held before 64 KiB


def test_decode_prefix_hit_pages_are_not_written(pair):
    """newer SGLang's decode_prefix_len: the decode holds the first pages in
    its own prefix cache and names only the rest; the prefill (whose
    pop_decode_prefix_len is 0) sends the whole prompt, and only the pages
    past the hit are written."""
    pm, dm, pp, dp = pair()
    src, dst = list(range(3, 9)), [20, 21, 22, 23]  # 6 pages, 2 of them a decode prefix hit
    pp.fill(src, seed=3)
    sender, receiver = KVSender(pm, ADDR, 77, [0], 0), KVReceiver(dm, ADDR, 77)
    receiver.init(0)
    poll_until([sender, receiver], lambda s: P not in s)
    sender.init(len(src), 0)
    receiver.send_metadata(dst, 0, None, decode_prefix_len=2 * PAGE)
    sender.send(src[:4])
    sender.send(src[4:])
    assert poll_until([sender, receiver], lambda s: all(x in TERMINAL for x in s)) == [S, S], receiver.reason
    assert (dp.pages(dst) == pp.pages(src[2:])).all()


def _failed(obj, *words):
    """obj's failure_exception raises, naming every word."""
    with pytest.raises(RuntimeError) as exc:
        obj.failure_exception()
    for w in words:
        assert w in str(exc.value), (w, str(exc.value))
    return str(exc.value)


def test_wrong_pages_count_fails_both_sides(pair):
    """The decode side names 9 pages, the prefill announced 10: kvxfer's
    prompt check fails both, naming both lengths, no hang, no exception raised into
    the caller."""
    pm, dm, pp, dp = pair()
    sender, receiver = KVSender(pm, ADDR, 5, [0], 0), KVReceiver(dm, ADDR, 5)
    _bootstrap(sender, receiver, 10, 0, list(range(20, 29)), 0)
    sender.send(list(range(3, 13)))
    assert poll_until([sender, receiver], lambda s: all(x in TERMINAL for x in s)) == [F, F]
    _failed(receiver, "planned a prompt of 36 tokens, Send has 40 tokens")
    _failed(sender, "sglang-5", "40 tokens")


def test_send_past_the_announced_pages_fails_alone(pair):
    """A send past init's page count raises nothing: the request fails,
    naming the counts, once its kvxfer send ended; another request of the
    same managers still succeeds."""
    pm, dm, pp, dp = pair()
    bad, badr = KVSender(pm, ADDR, 6, [0], 0), KVReceiver(dm, ADDR, 6)
    _bootstrap(bad, badr, 2, 0, [20, 21], 0)
    bad.send([3])
    bad.send([4, 5])  # 3 pages of 2
    assert poll_until([bad, badr], lambda s: all(x in TERMINAL for x in s)) == [F, F]
    _failed(bad, "init announced 2")
    good, goodr = KVSender(pm, ADDR, 7, [0], 0), KVReceiver(dm, ADDR, 7)
    pp.fill([8, 9], seed=4)
    _bootstrap(good, goodr, 2, 1, [22, 23], 1)
    good.send([8, 9])
    assert poll_until([good, goodr], lambda s: all(x in TERMINAL for x in s)) == [S, S]
    assert (dp.pages([22, 23]) == pp.pages([8, 9])).all()


@pytest.mark.parametrize("who", ["receiver", "sender"])
def test_abort_mid_transfer(pair, who):
    """abort() after the first of two chunks: both sides end Failed (the
    aborted one naming the abort, the other its kvxfer request's end),
    each only once kvxfer's events came; nothing raises. (Checked to fail
    with abort() a no-op.)"""
    # A decode abort that races the prefill's last chunk leaves the aux
    # sends opened after it to end at the transfer timeout (a kvxfer send
    # opened after its receiver cancelled waits for its deadline): 5 s here.
    pm, dm, pp, dp = pair(prefill_kw={"transfer_timeout": "5s"}, decode_kw={"transfer_timeout": "5s"})
    sender, receiver = KVSender(pm, ADDR, 8, [0], 0), KVReceiver(dm, ADDR, 8)
    _bootstrap(sender, receiver, 4, 0, [20, 21, 22, 23], 0)
    sender.send([3, 4])
    (receiver if who == "receiver" else sender).abort()
    sender.send([5, 6])  # SGLang hands the last chunk all the same: nothing raises
    assert poll_until([sender, receiver], lambda s: all(x in TERMINAL for x in s)) == [F, F]
    aborted, other = (receiver, sender) if who == "receiver" else (sender, receiver)
    _failed(aborted, "aborted")
    _failed(other, "sglang-8")


def test_prefill_closing_mid_transfer_fails_the_decode(pair):
    """The prefill's manager closes (its node cancels what is live) after
    the first chunk: the decode request ends Failed naming the cause."""
    pm, dm, pp, dp = pair()
    sender, receiver = KVSender(pm, ADDR, 9, [0], 0), KVReceiver(dm, ADDR, 9)
    _bootstrap(sender, receiver, 4, 0, [20, 21, 22, 23], 0)
    sender.send([3, 4])
    pm.close()
    assert poll_until([receiver], lambda s: s[0] in TERMINAL) == [F]
    msg = _failed(receiver, "sglang-9")
    assert "CANCELLED" in msg or "PEER_GONE" in msg, msg
    assert sender.poll() == F  # its node is closed: no exception either
    _failed(sender, "was closed")


def test_prefill_not_started_fails_at_the_deadline(pair):
    """No prefill process at all: the decode request waits for its writer
    and ends Failed at kvxfer's transfer timeout, naming it; no hang."""
    pm, dm, pp, dp = pair(decode_kw={"transfer_timeout": "2s"}, start_prefill=False)
    receiver = KVReceiver(dm, ADDR, 10)
    poll_until([receiver], lambda s: s[0] != P)
    receiver.init([20, 21], 0)
    assert poll_until([receiver], lambda s: s[0] in TERMINAL) == [F]
    _failed(receiver, "TIMED_OUT")


def test_unknown_bootstrap_addr_fails_at_once(pair):
    pm, dm, pp, dp = pair()
    receiver = KVReceiver(dm, "10.9.9.9:1", 11)
    assert receiver.poll() == F
    _failed(receiver, "10.9.9.9:1", "prefill_instances")
    receiver.init([20], 0)  # nothing raises, nothing opens
    assert receiver.poll() == F


def test_manager_refuses_what_kvxfer_cannot_describe(monkeypatch):
    """Each refusal names the value: a page (kv_item_lens) other than the
    layout's, hybrid state pools, aux needing more payloads than allowed,
    no node keys, a config tokens_per_block other than page_size."""
    pub, sec = kvxfer.keygen()
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        cfg = node_cfg(unique("sg-r"), "ipc://%s/r.sock" % tmp, sec, [], send_only=True)
        before = kvxfer.handle_count()
        bad = Pool(item=ITEM * 2)
        with pytest.raises(ValueError, match="256 bytes per layer buffer.*kvxfer's layout has 128"):
            KVManager(bad.args, "prefill", None, False, config=cfg)
        pool = Pool()
        pool.args.state_data_ptrs = [[pool.kv.ctypes.data]]
        with pytest.raises(ValueError, match="state_data_ptrs"):
            KVManager(pool.args, "prefill", None, False, config=cfg)
        big = Pool(aux_items=[32768] * 2 + [1])
        with pytest.raises(ValueError, match="65537 bytes per request.*more than a kvxfer payload holds, 65536"):
            KVManager(big.args, "prefill", None, False, config=cfg)
        with pytest.raises(ValueError, match="node's keys"):
            KVManager(Pool().args, "prefill", None, False, config={"layout": cfg["layout"]})
        with pytest.raises(ValueError, match="tokens_per_block = 16.*page_size is 4"):
            KVManager(Pool().args, "prefill", None, False, config=dict(cfg, tokens_per_block=16))
        # Pipeline parallelism, on either side: a stage whose KV buffers
        # are not its layers of SGLang's split (the tiny layout's 2 layers
        # over 2 stages: one each; this pool registers both), or one that
        # starts elsewhere, is named.
        for mode in ("prefill", "decode"):
            with pytest.raises(ValueError, match=r"stage 0 registered 2 layers' KV buffers, SGLang's split of 2 "
                                                 r"layers over 2 stages \(1,1\) gives it 1"):
                KVManager(Pool().args, mode, types.SimpleNamespace(pp_size=2, tp_size=1), False, config=cfg)
        late = Pool(layers=1)
        late.args.prefill_start_layer = 1
        with pytest.raises(ValueError, match=r"stage 0 starts at layer 1 \(KVArgs.prefill_start_layer\), SGLang's "
                                             r"split .* starts it at 0"):
            KVManager(late.args, "prefill", types.SimpleNamespace(pp_size=2, tp_size=1), False, config=cfg)
        # SGLang's staging buffers are its own backends' path.
        with monkeypatch.context() as m:
            m.setenv("SGLANG_DISAGG_STAGING_BUFFER", "1")
            with pytest.raises(ValueError, match="SGLANG_DISAGG_STAGING_BUFFER"):
                KVManager(Pool().args, "decode", None, False, config=cfg)
        # Without a transfer_timeout, SGLang's own wait bound is kvxfer's.
        no_timeout = {k: v for k, v in cfg.items() if k != "transfer_timeout"}
        with monkeypatch.context() as m:
            m.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "soon")
            with pytest.raises(ValueError, match="SGLANG_DISAGGREGATION_WAITING_TIMEOUT = 'soon'"):
                KVManager(Pool().args, "decode", None, False, config=no_timeout)
        assert kvxfer.handle_count() == before  # every refused node was closed


def test_room_ids():
    assert ks.room_id(42) == "sglang-42"
    with pytest.raises(ValueError, match="bootstrap_room"):
        ks.room_id("x")
    assert ks.room_id("42") == "sglang-42"
    # A float room was cut by int(): 42.7 was room 42's id, another
    # request's (checked to fail). It is refused, naming it.
    for bad in (42.7, 42.0, None, True):
        with pytest.raises(ValueError, match=r"bootstrap_room = %s: want an int" % bad):
            ks.room_id(bad)
    assert sum(AUX_ITEMS) == 5504


@pytest.mark.parametrize("hooks", [("failure_exception", "clear"), ("clear",)], ids=["failure-then-clear", "clear"])
def test_decode_ended_while_live_no_write_lands(pair, hooks):
    """SGLang acts on the MIN of every TP rank's poll (utils.py
    poll_and_all_reduce): another rank's Failed is this rank's Failed too,
    while this rank's kvxfer receive may still be live (its own poll says
    Transferring). decode.py's pop_transferred then calls
    failure_exception(), frees the pages (release_kv_cache) and calls
    clear(), dropping the receiver. Once those hooks returned, the receive
    has ended and no write can land in those pages: a prefill chunk sent
    after them leaves them untouched. (Checked to fail with both hooks
    doing nothing beyond raising: the chunk landed in the freed pages.)"""
    pm, dm, pp, dp = pair(prefill_kw={"transfer_timeout": "5s"}, decode_kw={"transfer_timeout": "5s"})
    src, dst = [3, 4], [20, 21]
    pp.fill(src, seed=9)
    sender, receiver = KVSender(pm, ADDR, 11, [0], 0), KVReceiver(dm, ADDR, 11)
    _bootstrap(sender, receiver, len(src), 0, dst, 0)
    assert receiver.poll() == T  # this rank's own poll: still transferring
    for hook in hooks:  # the reduced poll said Failed
        if hook == "failure_exception":
            with pytest.raises(RuntimeError) as exc:
                receiver.failure_exception()
            assert not receiver.live and "kv" in receiver.events
            assert "another rank" in str(exc.value), str(exc.value)
        else:
            receiver.clear()
    assert not receiver.live and "kv" in receiver.events
    sender.send(src)
    assert poll_until([sender], lambda s: s[0] in TERMINAL) == [F]
    assert not dp.pages(dst).any(), "a write landed in pages SGLang freed"


def test_prefill_failed_by_another_rank_ends_the_live_send(pair):
    """The prefill side of the same: prefill.py's inflight queue, on a
    Failed that another rank's poll decided, calls failure_exception() and
    then frees the pages (release_kv_cache), with no other call. This
    rank's send, live after its first chunk, has ended once
    failure_exception() returned (its event came: no transfer reads the
    pages any more), and the decode side fails. (Checked to fail with
    failure_exception() only raising: the send was still live.)"""
    pm, dm, pp, dp = pair(prefill_kw={"transfer_timeout": "5s"}, decode_kw={"transfer_timeout": "5s"})
    sender, receiver = KVSender(pm, ADDR, 12, [0], 0), KVReceiver(dm, ADDR, 12)
    _bootstrap(sender, receiver, 4, 0, [20, 21, 22, 23], 0)
    sender.send([3, 4])
    assert sender.poll() == T
    with pytest.raises(RuntimeError) as exc:
        sender.failure_exception()
    assert not sender.live and "kv" in sender.events
    assert "another rank" in str(exc.value), str(exc.value)
    assert poll_until([receiver], lambda s: s[0] in TERMINAL) == [F]


def test_sglang_pp_split():
    """SGLang's split (get_pp_indices, which this host has no SGLang for):
    the last layers % pp stages one layer longer, or
    SGLANG_PP_LAYER_PARTITION; the config's pp_stages wins."""
    args = types.SimpleNamespace()
    assert ks.sglang_pp_stages({"layout": {"layers": 5}}, None, args, 2, 1, 3) == "2,3"
    assert ks.sglang_pp_stages({"layout": {"layers": 30}}, None, args, 4, 0, 7) == "7,7,8,8"
    assert ks.sglang_pp_stages({"pp_stages": "4,1"}, None, args, 2, 1, 1) == "4,1"
    with pytest.raises(ValueError, match=r"stage 1 registered 2 layers' KV buffers, the config's pp_stages '4,1'"):
        ks.sglang_pp_stages({"pp_stages": "4,1"}, None, args, 2, 1, 2)
    with pytest.raises(ValueError, match="give the config's \"layout\""):
        ks.sglang_pp_stages({"model": "Llama-3.1-8B"}, None, args, 2, 0, 16)
    # prefill_start_layer is a prefill rank's: a decode stage's is not
    # checked (SGLang may leave it 0 there).
    late = types.SimpleNamespace(prefill_start_layer=0)
    with pytest.raises(ValueError, match=r"stage 1 starts at layer 0 \(KVArgs.prefill_start_layer\)"):
        ks.sglang_pp_stages({"layout": {"layers": 5}}, None, late, 2, 1, 3)
    assert ks.sglang_pp_stages({"layout": {"layers": 5}}, None, late, 2, 1, 3, check_start=False) == "2,3"


def test_sglang_pp_split_from_the_environment(monkeypatch):
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "1,4")
    args = types.SimpleNamespace()
    assert ks.sglang_pp_stages({"layout": {"layers": 5}}, None, args, 2, 0, 1) == "1,4"
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "2,4")
    with pytest.raises(ValueError, match="SGLANG_PP_LAYER_PARTITION = '2,4': 2 stages of 6 layers"):
        ks.sglang_pp_stages({"layout": {"layers": 5}}, None, args, 2, 0, 2)


@pytest.mark.parametrize("route", ["peers", "prefill_parallel"])
def test_pipelined_prefill_lands_in_the_decode_pages(route):
    """A prefill of two pipeline stages over a 3-layer model (SGLang's
    split: 1 layer, then 2 — kvxfer's default would be 2, then 1) into a
    decode of one: each stage's KVSender sends its layers of every page,
    and the decode's one KVReceiver gets every byte of every layer and
    the last stage's aux slot
    (the earlier stage sends none: the decode takes the first writer's
    payload). (Checked to fail: with the split left to kvxfer's default
    the stages refuse their buffers; with every stage sending its aux
    slot, the decode's aux slot is stage 0's.) The receive names the
    split its static peers' "parallel" gives, or, routed by a
    "prefill_parallel" that names none, lets the node take it from the
    stages' Hello."""
    layers = 3
    layout = dict(LAYOUT, layers=layers)
    (p_pub, p_sec), (d_pub, d_sec) = kvxfer.keygen(), kvxfer.keygen()
    p_name, d_name = unique("sg-pp-prefill"), unique("sg-pp-decode")
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        p_eps = ["ipc://%s/p%d.sock" % (tmp, r) for r in range(2)]
        d_ep = "ipc://%s/d.sock" % tmp
        par = {"tp": 1, "pp": 2, "stages": "1,2"}
        own = {"prefill_parallel": {"tp": 1, "pp": 2}} if route == "prefill_parallel" else {}
        d_cfg = node_cfg(d_name, d_ep, d_sec, [{"instance": p_name, "parallel": par, "rank": {"tp": 0, "pp": r},
                                                "endpoint": p_eps[r], "public_key": p_pub} for r in range(2)],
                         layout=layout, prefill_instances={ADDR: p_name}, **own)
        before = kvxfer.handle_count()
        stage_pools = [Pool(layers=1), Pool(layers=2)]
        managers = []
        try:
            for r, pool in enumerate(stage_pools):
                pool.args.pp_rank, pool.args.prefill_start_layer = r, r
                cfg = node_cfg(p_name, p_eps[r], p_sec, [{"instance": d_name, "endpoint": d_ep, "public_key": d_pub}],
                               layout=layout, send_only=True)
                managers.append(KVManager(pool.args, "prefill", types.SimpleNamespace(pp_size=2, tp_size=1), False,
                                          config=cfg))
            d_pool = Pool(layers=layers)
            dm = KVManager(d_pool.args, "decode", None, False, config=d_cfg)
            managers.append(dm)
            for m in managers:
                m.node.wait_peers(20000)
            room = 77
            src, dst = [3, 4, 5, 6, 7], [9, 2, 30, 11, 5]
            for r, pool in enumerate(stage_pools):
                pool.fill(src, seed=10 + r)
                pool.fill_aux(1, seed=20 + r)
            senders = [KVSender(m, ADDR, room, [0], r) for r, m in enumerate(managers[:2])]
            receiver = KVReceiver(dm, ADDR, room)
            poll_until(senders, lambda st: all(x != P for x in st))
            for s_ in senders:
                s_.init(len(src), 1)
            poll_until([receiver], lambda st: st[0] != P)
            receiver.init(dst, 3)
            for s_ in senders:
                s_.send(src[:3])
                s_.send(src[3:])
            states = poll_until(senders + [receiver], lambda st: all(x in TERMINAL for x in st))
            assert states == [S, S, S], [o.reason for o in senders + [receiver]]
            # Decode layer L's K is buffer L, its V buffer layers + L; stage
            # r's layer l (global stage_start + l) likewise in its pool.
            for r, pool in enumerate(stage_pools):
                for l in range(pool.layers):
                    g = r + l
                    assert (d_pool.kv[g][dst] == pool.kv[l][src]).all(), ("K", r, l)
                    assert (d_pool.kv[layers + g][dst] == pool.kv[pool.layers + l][src]).all(), ("V", r, l)
            assert d_pool.aux_slot(3) == stage_pools[1].aux_slot(1) != stage_pools[0].aux_slot(1)
        finally:
            for m in managers:
                m.close()
        assert kvxfer.handle_count() == before


def test_pipelined_decode_behind_a_pipelined_prefill():
    """A decode of two pipeline stages behind a prefill of two, over a
    3-layer model (SGLang's split, 1 + 2, on both sides: SGLang pairs decode
    stage k with prefill stage k when the sizes match). Each decode stage
    gets every byte of its layers from its prefill stage; only the last
    prefill stage sends the aux slot (SGLang's backends send aux from
    there alone, to the decode ranks it transfers to), so decode stage 0,
    which no last prefill stage writes to, succeeds without one and keeps
    its aux slot as it was, while decode stage 1 gets the last stage's.
    (Checked to fail: decode stage 0 failed every request, "the prefill
    sent 0 bytes of metadata".)"""
    layers = 3
    layout = dict(LAYOUT, layers=layers)
    (p_pub, p_sec), (d_pub, d_sec) = kvxfer.keygen(), kvxfer.keygen()
    p_name, d_name = unique("sg-pp2-prefill"), unique("sg-pp2-decode")
    par = {"tp": 1, "pp": 2, "stages": "1,2"}
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        p_eps = ["ipc://%s/p%d.sock" % (tmp, r) for r in range(2)]
        d_eps = ["ipc://%s/d%d.sock" % (tmp, r) for r in range(2)]

        def peers(name, eps, pub):
            return [{"instance": name, "parallel": par, "rank": {"tp": 0, "pp": r}, "endpoint": eps[r],
                     "public_key": pub} for r in range(2)]

        before = kvxfer.handle_count()
        p_pools, d_pools = [Pool(layers=1), Pool(layers=2)], [Pool(layers=1), Pool(layers=2)]
        prefill, decode = [], []
        try:
            for r in range(2):
                p_pools[r].args.pp_rank, p_pools[r].args.prefill_start_layer = r, r
                d_pools[r].args.pp_rank, d_pools[r].args.prefill_start_layer = r, r
                sa = types.SimpleNamespace(pp_size=2, tp_size=1)
                prefill.append(KVManager(p_pools[r].args, "prefill", sa, False, config=node_cfg(
                    p_name, p_eps[r], p_sec, peers(d_name, d_eps, d_pub), layout=layout, send_only=True)))
                decode.append(KVManager(d_pools[r].args, "decode", sa, False, config=node_cfg(
                    d_name, d_eps[r], d_sec, peers(p_name, p_eps, p_pub), layout=layout,
                    prefill_instances={ADDR: p_name})))
            for m in prefill + decode:
                m.node.wait_peers(20000)
            room = 78
            src, dst = [3, 4, 5, 6, 7], [9, 2, 30, 11, 5]
            for r in range(2):
                p_pools[r].fill(src, seed=10 + r)
                p_pools[r].fill_aux(1, seed=20 + r)
            kept = d_pools[0].aux_slot(3)
            senders = [KVSender(m, ADDR, room, [0], r) for r, m in enumerate(prefill)]
            receivers = [KVReceiver(m, ADDR, room) for m in decode]
            poll_until(senders, lambda st: all(x != P for x in st))
            for s_ in senders:
                s_.init(len(src), 1)
            poll_until(receivers, lambda st: all(x != P for x in st))
            for rv in receivers:
                rv.init(dst, 3)
            for s_ in senders:
                s_.send(src[:3])
                s_.send(src[3:])
            states = poll_until(senders + receivers, lambda st: all(x in TERMINAL for x in st))
            assert states == [S, S, S, S], [o.reason for o in senders + receivers]
            for r in range(2):
                n = d_pools[r].layers
                for l in range(n):
                    assert (d_pools[r].kv[l][dst] == p_pools[r].kv[l][src]).all(), ("K", r, l)
                    assert (d_pools[r].kv[n + l][dst] == p_pools[r].kv[n + l][src]).all(), ("V", r, l)
            assert d_pools[1].aux_slot(3) == p_pools[1].aux_slot(1)
            assert d_pools[0].aux_slot(3) == kept
        finally:
            for m in prefill + decode:
                m.close()
        assert kvxfer.handle_count() == before


def test_route_names_what_the_config_says_else_lets_the_node_derive():
    """The decode's route to a prefill instance: its parallelism and split
    from "prefill_parallel", else from the static peers' "parallel"; when
    neither says it (peers found through etcd), 0, 0 so that the node takes
    it from the prefill's ranks (a 1 x 1 here failed every request of a
    TP2 prefill found through etcd)."""
    def mgr(**kw):
        m = types.SimpleNamespace(prefill_instances={ADDR: "p"}, prefill_instance=None, prefill_parallel={},
                                  _peers=[])
        m.__dict__.update(kw)
        return m
    assert KVManager.route(mgr(), ADDR) == ("p", 0, 0, None)
    assert KVManager.route(mgr(_peers=[{"instance": "p"}]), ADDR) == ("p", 0, 0, None)
    assert KVManager.route(mgr(prefill_parallel={"tp": 2, "pp": 1}), ADDR) == ("p", 2, 1, None)
    peers = [{"instance": "p", "parallel": {"tp": 1, "pp": 2, "stages": "1,2"}, "rank": {"tp": 0, "pp": 0}}]
    assert KVManager.route(mgr(_peers=peers), ADDR) == ("p", 1, 2, "1,2")
    with pytest.raises(ValueError, match="names no prefill instance"):
        KVManager.route(mgr(prefill_instances={}), "10.9.9.9:1")


def test_event_of_an_unknown_status_code_loses_no_other_event(pair):
    """A newer library of the same ABI may end a request with a status
    code this package does not know (kvxfer.h: treat it as an error; Event
    keeps it as the number). The backend's reason named ev.error.name: the
    AttributeError left reap() with the rest of the polled batch, whose
    events the library had handed over already, so those requests never
    heard their end (Transferring for good), and the first one's handle
    was never released."""
    pm, dm, pp, dp = pair(decode_kw={"transfer_timeout": "1s"}, start_prefill=False)
    a, b = KVReceiver(dm, ADDR, 41), KVReceiver(dm, ADDR, 42)
    for r, pages in ((a, [20, 21]), (b, [22, 23])):
        poll_until([r], lambda s: s[0] != P)
        r.init(pages, 0)
    assert [a.poll(), b.poll()] == [T, T]
    before = kvxfer.handle_count()
    real, got = dm.node.poll, []

    def poll(timeout_ms=0):  # both events in one batch, the first of an unknown status code
        got.extend(real(timeout_ms))
        if len(got) < 2:
            return []
        evs = list(got)
        got.clear()
        evs[0].error = 99
        return evs

    dm.node.poll = poll  # no prefill: both end TIMED_OUT at the deadline
    assert poll_until([a, b], lambda s: all(x in TERMINAL for x in s), timeout=20) == [F, F]
    assert kvxfer.handle_count() == before - 2, "a request handle was not released"
    msgs = [_failed(a, "sglang-41", "TIMED_OUT"), _failed(b, "sglang-42", "TIMED_OUT")]
    assert sum("(99)" in m for m in msgs) == 1, msgs  # the unknown code, as its number


def _live(pair, room, **kw):
    """A request both of whose sides hold a live kvxfer request: the first
    chunk (2 of 4 pages) handed over, the last one not. The pools are kept
    (on the managers) as long as the nodes: kvxfer writes them by raw
    pointer. kw: pair()'s."""
    pm, dm, pp, dp = pair(**kw)
    sender, receiver = KVSender(pm, ADDR, room, [0], 0), KVReceiver(dm, ADDR, room)
    _bootstrap(sender, receiver, 4, 0, [20, 21, 22, 23], 0)
    sender.send([3, 4])
    assert [sender.poll(), receiver.poll()] == [T, T]
    assert sender.live and receiver.live
    pm.test_pool, dm.test_pool = pp, dp
    return pm, dm, sender, receiver


def _held_close(monkeypatch, mgr, order=None):
    """Replaces mgr.node.close by one that stops before the library's
    close until the returned go is set: (entered, go, calls)."""
    real, entered, go, calls = mgr.node.close, threading.Event(), threading.Event(), []

    def close(timeout_ms=5000):
        calls.append(timeout_ms)
        entered.set()
        assert go.wait(20)
        real(timeout_ms)
        if order is not None:
            order.append("close finished")

    monkeypatch.setattr(mgr.node, "close", close)
    return entered, go, calls


def _in_function(thread, name):
    f = sys._current_frames().get(thread.ident)
    while f is not None:
        if f.f_code.co_name == name:
            return True
        f = f.f_back
    return False


@pytest.mark.parametrize("side", ["decode", "prefill"])
def test_poll_during_a_close_under_way_keeps_live_requests_transferring(pair, monkeypatch, side):
    """A poll on another thread while the manager's close still drains:
    kvxfer may still write (decode) or read (prefill) the request's pages,
    so poll() says Transferring, not Failed (SGLang frees the pages on
    Failed); Failed once the close finished. A second close() while the
    first is under way answers False and closes nothing twice; one after
    it answers True. (Checked to fail without the fix: close() set closed
    before the node's close ran, and that poll said Failed.)"""
    pm, dm, sender, receiver = _live(pair, 12)
    mgr, obj = (dm, receiver) if side == "decode" else (pm, sender)
    entered, go, calls = _held_close(monkeypatch, mgr)
    res = {}
    th = threading.Thread(target=lambda: res.setdefault("first", mgr.close()))
    th.start()
    try:
        assert entered.wait(20)
        assert obj.poll() == T, obj.reason
        assert mgr.close() is False  # under way on another thread
        assert obj.poll() == T, obj.reason
    finally:
        go.set()
        th.join(20)
    assert res == {"first": True} and len(calls) == 1
    assert obj.poll() == F  # the close finished: no transfer touches the pages
    _failed(obj, "was closed")
    assert mgr.close() is True and len(calls) == 1


@pytest.mark.parametrize("side", ["decode", "prefill"])
def test_close_that_did_not_finish_never_reports_live_pages_free(pair, monkeypatch, caplog, side):
    """A close that times out (Status.TIMEOUT: some requests did not
    drain, a peer may still write the memory): close() answers False (it
    raised) and the requests live at it stay Transferring for good, also
    after failure_exception() and clear() (which log that the pages SGLang
    frees may still be written); a later close() answers False again and
    does not close again (a second library close would look finished).
    (Checked to fail without the fix: poll() said Failed right after the
    close, and close() raised KvxferError.)"""
    pm, dm, sender, receiver = _live(pair, 13)
    mgr, obj = (dm, receiver) if side == "decode" else (pm, sender)
    real, calls = mgr.node.close, []

    def timed_out(timeout_ms=5000):
        calls.append(timeout_ms)
        raise KvxferError(Status.TIMEOUT, "close: 1 request did not drain")

    monkeypatch.setattr(mgr.node, "close", timed_out)
    try:
        got = mgr.close()
    except KvxferError as exc:
        got = exc
    assert obj.poll() == T, obj.reason
    assert got is False
    assert mgr.close() is False and len(calls) == 1
    assert obj.poll() == T
    with caplog.at_level(logging.ERROR, logger="kvxfer.sglang"):
        _failed(obj)
        obj.clear()
    assert "did not finish closing" in caplog.text, caplog.text
    assert obj.live and obj.poll() == T
    monkeypatch.setattr(mgr.node, "close", real)
    mgr.node.close()  # for the fixture's handle count
    assert obj.poll() == T


def test_failure_exception_during_a_close_under_way_waits_for_it(pair, monkeypatch):
    """failure_exception() (SGLang frees the pages right after it) of a
    live request while another thread's close still drains returns only
    once the close finished, when no write lands in the pages any more.
    (Checked to fail without the fix: it returned at once, the close still
    held.)"""
    pm, dm, sender, receiver = _live(pair, 14)
    order = []
    entered, go, calls = _held_close(monkeypatch, dm, order)
    th = threading.Thread(target=dm.close)
    th.start()

    def fail():
        try:
            receiver.failure_exception()
        except RuntimeError:
            pass
        order.append("failure_exception returned")

    ft = threading.Thread(target=fail)
    try:
        assert entered.wait(20)
        ft.start()
        wait_until(lambda: order or _in_function(ft, "_wait_close"), what="failure_exception waiting for the close")
    finally:
        go.set()
        th.join(20)
        ft.join(20)
    assert order == ["close finished", "failure_exception returned"], order
    assert not receiver.live and receiver.poll() == F


def test_refused_close_leaves_the_manager_open(pair):
    """close(-1): kvxfer refuses the timeout (naming it) and the node stays
    open, so the manager does too: its live requests stay Transferring and
    end as kvxfer says, and a later close() closes the node. (Checked to
    fail without the fix: the manager counted itself closed, poll() said
    Failed with the transfer still running, and no later close() closed
    the node.)"""
    pm, dm, sender, receiver = _live(pair, 15)
    with pytest.raises(KvxferError) as err:
        dm.close(-1)
    assert err.value.status == Status.INVALID_ARGUMENT and "-1" in err.value.message
    assert dm.node.handle and receiver.poll() == T, receiver.reason
    sender.send([5, 6])
    assert poll_until([sender, receiver], lambda s: all(x in TERMINAL for x in s)) == [S, S], receiver.reason
    assert dm.close() is True and not dm.node.handle


@pytest.mark.parametrize("end", ["timed-out", "ready"])
def test_close_between_poll_and_dispatch_loses_no_event(pair, monkeypatch, end):
    """A close on another thread that ends (here: one that did not finish,
    Status.TIMEOUT, having released every handle) after reap() took a batch
    of events from the node and before it handed them over: releasing the
    first request's handle (timed-out), or reading its payload (ready),
    raised BAD_HANDLE out of reap(), and the rest of the batch, which the
    library had handed over already, was lost: those requests stayed
    Transferring for good although their events (no write lands any more)
    came. Each event reaches its request, which ends Failed. (Checked to
    fail without the fix: the second request stayed Transferring; the
    ready case also with only release() guarded.)"""
    ready = end == "ready"
    pm, dm, pp, dp = pair(decode_kw={"transfer_timeout": "1s"}, start_prefill=ready)
    a, b = KVReceiver(dm, ADDR, 43), KVReceiver(dm, ADDR, 44)
    senders = [KVSender(pm, ADDR, room, [0], 0) for room in (43, 44)] if ready else []
    for r, pages in ((a, [20, 21]), (b, [22, 23])):
        poll_until([r], lambda s: s[0] != P)
        r.init(pages, 0)
    assert [a.poll(), b.poll()] == [T, T]
    real_poll, real_close, got = dm.node.poll, dm.node.close, []

    def close_not_finished(timeout_ms=5000):
        real_close(timeout_ms)  # every handle released, as any close that began
        raise KvxferError(Status.TIMEOUT, "close: 1 request did not drain")

    def poll(timeout_ms=0):  # both events in one batch; the close ends before reap hands them over
        got.extend(real_poll(timeout_ms))
        if len(got) < 2:
            return []
        assert dm.close() is False
        return list(got)

    monkeypatch.setattr(dm.node, "close", close_not_finished)
    monkeypatch.setattr(dm.node, "poll", poll)
    for i, s in enumerate(senders):
        poll_until([s], lambda st: st[0] != P)
        s.init(2, i)
        s.send([3 + 2 * i, 4 + 2 * i])

    def polled():
        for o in senders + [a, b]:
            o.poll()
        return len(got) == 2

    wait_until(polled, timeout=20, what="both events polled")
    assert [ev.ok for ev in got] == [ready, ready]
    assert [a.poll(), b.poll()] == [F, F], (a.reason, b.reason)
    for r, room in ((a, 43), (b, 44)):
        _failed(r, "sglang-%d" % room, "CLOSED" if ready else "TIMED_OUT")  # its engine closed under it


class _Queue:
    """SGLang's PrefillBootstrapQueue / DecodePreallocQueue as they drive
    the manager when the KV cache is released and restored for a weight
    update (python/sglang/srt/disaggregation/prefill.py and decode.py,
    commit 0035ca4; their scheduler calls them once it paused the KV cache
    and flushed it, and on resume). Lines as they read there."""

    def __init__(self, kv_manager):
        self.kv_manager = kv_manager
        self.queue = []

    def release_memory_occupation(self):
        self.queue.clear()
        if hasattr(self.kv_manager, "deregister_buffer_to_engine"):
            self.kv_manager.deregister_buffer_to_engine()

    def resume_memory_occupation(self):
        if hasattr(self.kv_manager, "register_buffer_to_engine"):
            self.kv_manager.register_buffer_to_engine()


def test_release_then_resume_then_a_transfer_lands(pair):
    """An RL weight update on both sides: SGLang's release_memory_occupation
    closes each manager's node (no kvxfer transfer touches the pool it
    frees), resume_memory_occupation opens a new incarnation over the
    restored pool with the same configuration; the peers see the old one's
    goodbye and the new one's Hello, and a request made after the resume
    lands every byte. A receiver made before the release (its pages were
    SGLang's before the release) fails, naming why, and does not hang.
    (Checked to fail without the fix: the release left the node open.)"""
    pm, dm, pp, dp = pair()
    old = [pm.node, dm.node]
    queues = [_Queue(pm), _Queue(dm)]
    early = KVReceiver(dm, ADDR, 30)
    assert early.poll() == P
    for q in queues:
        q.release_memory_occupation()
    assert not old[0].handle and not old[1].handle, "the release left a kvxfer node open over the freed pool"
    assert early.poll() == F
    _failed(early, "release_memory_occupation")
    for q in queues:
        q.resume_memory_occupation()
    assert pm.node is not old[0] and dm.node is not old[1] and pm.node.handle and dm.node.handle
    pm.node.wait_peers(20000)
    dm.node.wait_peers(20000)
    early.init([20, 21], 0)  # nothing raises, nothing opens: it stays Failed
    assert early.poll() == F and not early.live
    src, dst = [3, 4, 5], [9, 14, 2]
    pp.fill(src, seed=31)
    pp.fill_aux(1, seed=32)
    sender, receiver = KVSender(pm, ADDR, 31, [0], 0), KVReceiver(dm, ADDR, 31)
    _bootstrap(sender, receiver, len(src), 1, dst, 2)
    sender.send(src)
    states = poll_until([sender, receiver], lambda s: all(x in TERMINAL for x in s))
    assert states == [S, S], (sender.reason, receiver.reason)
    assert (dp.pages(dst) == pp.pages(src)).all()
    assert dp.aux_slot(2) == pp.aux_slot(1)


@pytest.mark.parametrize("side", ["decode", "prefill"])
def test_release_while_a_request_is_live_ends_it_before_returning(pair, side):
    """A release with a kvxfer request still live (SGLang asserts it is idle,
    but clears its queues without ending their receivers): the node's close
    has finished, ending the request, before the release returns, so no
    write lands in the pool SGLang then frees; poll() says Failed naming
    the release (no hang), and the peer's side of the request ends too (a
    send whose receiving node closed ends at its transfer timeout, 2 s
    here). After the resume the old request stays Failed. (Checked to fail
    without the fix: the release returned with the node open and the
    request Transferring.)"""
    pm, dm, sender, receiver = _live(pair, 32, prefill_kw={"transfer_timeout": "2s"},
                                     decode_kw={"transfer_timeout": "2s"})
    mgr, obj, other = (dm, receiver, sender) if side == "decode" else (pm, sender, receiver)
    old, order = mgr.node, []
    real = old.close

    def close(timeout_ms=5000):
        real(timeout_ms)
        order.append("close finished")

    old.close = close
    q = _Queue(mgr)
    q.release_memory_occupation()
    order.append("release returned")
    assert order == ["close finished", "release returned"], order
    assert not old.handle
    assert obj.poll() == F and not obj.live
    _failed(obj, "release_memory_occupation")
    assert poll_until([other], lambda s: s[0] in TERMINAL) == [F]
    q.resume_memory_occupation()
    assert obj.poll() == F and not obj.live
    obj.clear()  # nothing live: returns at once


def test_release_whose_close_is_unproven_raises(pair, monkeypatch):
    """A release whose close does not finish (Status.TIMEOUT: a peer may
    still write the pool) raises a RuntimeError naming the node and what
    to do, so SGLang does not go on as if the pool were free (its scheduler
    stops on the error); the live request stays Transferring, and a resume
    refuses to open a node over that pool. (Checked to fail without the
    fix: the release returned quietly.)"""
    pm, dm, sender, receiver = _live(pair, 33)
    real = dm.node.close

    def timed_out(timeout_ms=5000):
        raise KvxferError(Status.TIMEOUT, "close: 1 request did not drain")

    monkeypatch.setattr(dm.node, "close", timed_out)
    q = _Queue(dm)
    with pytest.raises(RuntimeError, match=r"release_memory_occupation.*did not finish closing.*restart") as exc:
        q.release_memory_occupation()
    assert dm.instance in str(exc.value)
    assert receiver.poll() == T and receiver.live
    with pytest.raises(RuntimeError, match="did not finish closing"):
        q.resume_memory_occupation()
    monkeypatch.setattr(dm.node, "close", real)
    dm.node.close()  # for the fixture's handle count
