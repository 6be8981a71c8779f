"""Helpers of the SGLang backend tests: SGLang's KVArgs as its memory pools
fill them (raw pointers and lengths), over host memory, and node configs.

SGLang is not installed here: the few SGLang values the tests need (the
KVArgs fields, DisaggregationMode's values) are plain stand-ins.

SGLang's MHA pool (mem_cache/memory_pool.py, get_contiguous_buf_infos):
one K buffer per layer, then one V buffer per layer, each of shape
(size + page_size, head_num, head_dim), so a page is page_size tokens x
head_num x head_dim x dtype bytes (kv_item_lens), page 0 SGLang's padding
page. MetadataBuffers (disaggregation/utils.py) hold the aux slots: CPU
tensors, one row per request slot (output_ids (16 int32), logprobs ..., and
hidden states of the model's hidden size)."""

import time
import types

import numpy as np

# The tiny layout: 2 layers, 2 KV heads, head size 8, bf16, pages of 4 tokens.
LAYERS, HEADS, HEAD, DTYPE, PAGE = 2, 2, 8, 2, 4
ITEM = PAGE * HEADS * HEAD * DTYPE  # one page of one layer's K (or V): 128 bytes

LAYOUT = {"name": "sglang-tiny", "layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD, "dtype_bytes": DTYPE,
          "tokens_per_block": PAGE}

# Aux rows in bytes, as MetadataBuffers' rows: output_ids, token logprob
# val/idx, top logprobs val/idx (max_top_logprobs_num 128), topk p/index,
# hidden states (hidden size 2048, bf16): 5,504 bytes, two payloads.
AUX_ITEMS = [64, 64, 64, 512, 512, 64, 128, 4096]


class Pool:
    """An SGLang-shaped KV pool and aux buffers in host memory (NumPy), and
    the KVArgs a scheduler fills from them."""

    def __init__(self, num_pages=32, aux_slots=4, aux_items=AUX_ITEMS, layers=LAYERS, item=ITEM):
        self.num_pages, self.layers, self.item = num_pages, layers, item
        # One allocation for every layer's K and V (the node registers the
        # span from the lowest buffer to the end of the highest).
        self.kv = np.zeros((2 * layers, num_pages, item), dtype=np.uint8)
        self.aux = [np.zeros((aux_slots, n), dtype=np.uint8) for n in aux_items]
        self.args = types.SimpleNamespace(
            engine_rank=0, pp_rank=0, gpu_id=0, page_size=PAGE, kv_head_num=HEADS, total_kv_head_num=HEADS,
            kv_data_ptrs=[self.kv[i].ctypes.data for i in range(2 * layers)],
            kv_data_lens=[self.kv[i].nbytes for i in range(2 * layers)],
            kv_item_lens=[item] * (2 * layers),
            aux_data_ptrs=[a.ctypes.data for a in self.aux], aux_data_lens=[a.nbytes for a in self.aux],
            aux_item_lens=[a.shape[1] for a in self.aux],
            state_types=[], state_data_ptrs=[], state_data_lens=[], state_item_lens=[])

    def fill(self, pages, seed):
        """Random bytes in pages of every layer's K and V."""
        rng = np.random.default_rng(seed)
        for p in pages:
            self.kv[:, p] = rng.integers(0, 256, (2 * self.layers, self.item), dtype=np.uint8)

    def fill_aux(self, slot, seed):
        rng = np.random.default_rng(seed)
        for a in self.aux:
            a[slot] = rng.integers(0, 256, a.shape[1], dtype=np.uint8)

    def pages(self, pages):
        """Every layer's K and V bytes of pages, in order."""
        return self.kv[:, list(pages)].copy()

    def aux_slot(self, slot):
        return b"".join(a[slot].tobytes() for a in self.aux)


def node_cfg(name, endpoint, secret, peers, kv_device="cpu", **kw):
    """A kvxfer config as the SGLang backend takes it: node keys, the
    layout, and the backend's own keys."""
    cfg = {"instance": name, "layout": dict(LAYOUT), "backend": "ucx", "workers": 2, "bind": endpoint,
           "secret_key": secret, "peers": peers, "transfer_timeout": "20s", "heartbeat_interval": "200ms", "heartbeat_misses": 8,
           "kv_device": kv_device}
    cfg.update(kw)
    return cfg


def poll_until(objs, done, timeout=30.0, seen=None):
    """Polls each of objs (senders, receivers) until done(states) holds
    for the list of their latest poll() values, or the deadline (an
    AssertionError naming the states). seen: a list per object, of the
    distinct states in the order they came."""
    deadline = time.monotonic() + timeout
    while True:
        states = [o.poll() for o in objs]
        if seen is not None:
            for lst, st in zip(seen, states):
                if not lst or lst[-1] != st:
                    lst.append(st)
        if done(states):
            return states
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s; states %s" % (timeout, states))
        time.sleep(0.002)
