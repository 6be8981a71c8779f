"""A connector shaped like vLLM's KV connector (KVConnectorBase_V1 in
vllm/distributed/kv_transfer/kv_connector/v1/base.py), so a framework
engineer sees where each kvxfer call goes. It does not import vLLM: the
method names and arguments mirror the base class, and the objects vLLM
passes are read by duck typing (request.request_id,
request.prompt_token_ids, request.kv_transfer_params,
scheduler_output.num_scheduled_tokens, scheduler_output.scheduled_new_reqs'
req_id and num_computed_tokens, blocks.get_block_ids()).

Roles, as in vLLM:

  Scheduler side (KvxferSchedulerConnector), in the scheduler process:
    get_num_new_matched_tokens  generation side: the whole prompt is
                                external and loads asynchronously
    update_state_after_alloc    records the block ids vLLM allocated
    build_connector_meta        per step: what each worker receives
                                (kvxfer_receive) and which prefill
                                chunks it hands over (kvxfer_chunk)
    request_finished            context side: keep the blocks until the
                                send is DONE, tell the generation side
                                where the KV comes from

  Worker side (KvxferWorkerConnector), in each worker:
    register_kv_caches /        opens the engine over vLLM's KV memory
    register_cross_layers_kv_cache
    start_load_kv               kvxfer_receive into vLLM's block ids
    wait_for_layer_load         nothing: kvxfer moves whole blocks
    save_kv_layer               with "layer_parts": the step's chunks,
                                this layer's part of each
                                (kvxfer_chunk_layers); else nothing
    wait_for_save               the step's chunks: kvxfer_send on the
                                first, then kvxfer_chunk with a fence made
                                ready once the step's KV is written (with
                                "layer_parts": checks every part was handed)
    get_finished                polled events: (sent, received) ids;
                                cancels what vLLM aborted
    get_block_ids_with_load_errors
                                the blocks of failed receives
    shutdown                    kvxfer_engine_close

Memory: kvxfer's block holds every layer of one block ("cross-layer"
blocks, vLLM's prefer_cross_layer_blocks), HND within a layer:
one tensor of shape (num_blocks, num_layers, 2, num_kv_heads, block_size,
head_size); vLLM's per-layer cache kv[:, i] viewed as (num_blocks, 2,
block_size, num_kv_heads, head_size) with HND strides. The framework owns
every block id: the worker marks the whole pool allocated to it, so kvxfer's
allocator is never used.
"""

import re
from dataclasses import dataclass, field

from .core import Engine, KvxferError, Outcome


@dataclass
class RecvSpec:
    prompt_len: int
    block_ids: list
    context: str
    remote_request_id: str  # the context instance's id of the request


@dataclass
class SendSpec:
    prompt_len: int
    block_ids: list
    chunks: list = field(default_factory=list)  # [(start, end)] handed over this step


@dataclass
class KvxferConnectorMetadata:
    """Scheduler -> worker, once per step (vLLM's KVConnectorMetadata)."""

    reqs_to_recv: dict = field(default_factory=dict)  # request id -> RecvSpec
    reqs_to_send: dict = field(default_factory=dict)  # request id -> SendSpec


def layer_index(name):
    """The model's layer index in a vLLM layer name: its one integer part
    ("model.layers.12.self_attn.attn" is 12), as vLLM's
    extract_layer_index reads it; ValueError naming the name otherwise."""
    ints = [int(p) for p in name.split(".") if re.fullmatch(r"\d+", p)]
    if len(ints) != 1:
        raise ValueError("layer name %r: want exactly one integer part (the model's layer index), found %d"
                         % (name, len(ints)))
    return ints[0]


def _block_ids(blocks):
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()
    return [list(g) for g in blocks]


class KvxferSchedulerConnector:
    """The scheduler side. role: "producer" (context/prefill instance) or
    "consumer" (generation/decode instance)."""

    def __init__(self, instance, role, tokens_per_block):
        if role not in ("producer", "consumer"):
            raise ValueError("role %r: producer or consumer" % (role,))
        self.instance = instance
        self.role = role
        self.tpb = tokens_per_block
        self._recv = {}      # request id -> RecvSpec, until the next meta
        self._blocks = {}    # producer: request id -> block ids per group
        self._computed = {}  # producer: request id -> tokens computed (scheduled) so far
        self._handed = {}    # producer: request id -> tokens handed over so far
        self._prompt = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens loaded from the context instance, load is asynchronous)."""
        params = request.kv_transfer_params or {}
        if self.role == "consumer" and params.get("do_remote_prefill"):
            return len(request.prompt_token_ids) - num_computed_tokens, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        ids = _block_ids(blocks)
        rid = request.request_id
        if self.role == "consumer" and num_external_tokens > 0:
            params = request.kv_transfer_params
            self._recv[rid] = RecvSpec(len(request.prompt_token_ids), ids, params["remote_instance"],
                                       params.get("remote_request_id", rid))
        elif self.role == "producer":
            have = self._blocks.setdefault(rid, [[] for _ in ids])
            for g, new in enumerate(ids):
                have[g].extend(new)
            self._prompt[rid] = len(request.prompt_token_ids)

    def build_connector_meta(self, scheduler_output):
        """Producer: each step hands over [handed, end), end the tokens
        computed so far rounded down to a block boundary (all of them once
        the prompt is complete): vLLM's token budget need not be a multiple
        of the block size, but a chunk other than the last must end on a
        block boundary. A new request's tokens from vLLM's local prefix
        cache (num_computed_tokens) count as computed and are handed over
        too: the generation side needs the whole prompt's KV."""
        meta = KvxferConnectorMetadata(reqs_to_recv=self._recv)
        self._recv = {}
        if self.role == "producer":
            for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
                rid = getattr(new, "req_id", None)
                if rid in self._prompt and rid not in self._computed:
                    self._computed[rid] = min(getattr(new, "num_computed_tokens", 0) or 0, self._prompt[rid])
            for rid, n in scheduler_output.num_scheduled_tokens.items():
                if rid not in self._prompt:
                    continue
                prompt = self._prompt[rid]
                computed = min(self._computed.get(rid, 0) + n, prompt)
                self._computed[rid] = computed
                start = self._handed.get(rid, 0)
                end = computed if computed == prompt else computed // self.tpb * self.tpb
                if end <= start:
                    continue
                self._handed[rid] = end
                meta.reqs_to_send[rid] = SendSpec(prompt, [list(g) for g in self._blocks[rid]], [(start, end)])
        return meta

    def request_finished(self, request, block_ids):
        """(keep the blocks until get_finished reports the send, params for
        the generation side).

        Producer: a request some of whose prefill reached a worker keeps its
        blocks until that worker reports the send (a send cut short by an
        abort is cancelled there, and reported once no write can touch the
        blocks); params only when the whole prompt was handed over. A
        request aborted before any of it was scheduled opened no send: its
        blocks go back at once (kept, they would wait for a report no worker
        ever makes).

        Consumer: (False, None). vLLM itself keeps an aborted request's
        blocks while it waits for remote KV (WAITING_FOR_REMOTE_KVS), until
        get_finished reports the id in finished_recving; the worker cancels
        such a receive when the id comes in finished_req_ids."""
        rid = request.request_id
        self._blocks.pop(rid, None)
        self._computed.pop(rid, None)
        handed = self._handed.pop(rid, 0)
        prompt = self._prompt.pop(rid, None)
        if self.role == "producer" and prompt is not None and handed > 0:
            if handed < prompt:
                return True, None
            return True, {"do_remote_prefill": True, "remote_instance": self.instance, "remote_request_id": rid}
        return False, None

    def update_connector_output(self, connector_output):
        return None


class KvxferWorkerConnector:
    """The worker side: one engine rank over the worker's KV memory.

    self.failed maps the id of each request that did not succeed to its
    Event (or to the KvxferError of a receive the engine refused), and keeps
    it until the caller pops it."""

    def __init__(self, config):
        """config: the engine's (kvxfer_engine_open), plus keys of the
        connector's own. "layer_parts": true hands each step's chunks from
        save_kv_layer, one layer part per layer as the forward pass writes
        it (all but the last layer's transfer then hides behind the
        pass); "num_layers": the model's layer count, when this worker
        holds only some layers (a pipeline stage; default: the highest
        registered layer index + 1). "generation_tp" and "generation_pp"
        (a producer, both or neither): the decode instances' parallelism,
        when every one has the same, passed to each send
        (Engine.send's): with MLA and a decode TP smaller than this
        instance's, a rank that writes to no decode rank then reports its
        sends at once instead of failing each at its deadline."""
        self.config = dict(config)
        self.layer_parts = bool(self.config.pop("layer_parts", False))
        self.num_layers = self.config.pop("num_layers", None)
        self.generation = (self.config.pop("generation_tp", 0), self.config.pop("generation_pp", 0))
        self._stage = None   # (first, end) of the model's layers this worker holds
        self._parts = {}     # (request id, start, end) -> the next layer to hand
        self.engine = None
        self._meta = None
        self._sends = {}    # request id -> Request (context side)
        self._recvs = {}    # request id -> Request (generation side)
        self._by_handle = {}
        self._sent_done = set()
        self._recv_done = set()
        self._gen_finished = set()  # finished_req_ids of sends, not yet reported as sent
        self._handed_all = set()    # sends whose last chunk was handed over
        self._nothing_to_send = set()  # sends DONE before their last chunk: a rank that writes to nobody
        self._aborted = set()       # live requests cancelled because vLLM finished them
        self._recv_blocks = {}      # request id -> its destination block ids per group
        self._load_errors = set()   # blocks of failed receives, until vLLM asks
        self.failed = {}    # request id -> Event (or refusal) of a request that did not succeed

    # Registration -----------------------------------------------------------

    def register_kv_caches(self, kv_caches):
        """vLLM's per-layer caches: they must be per-layer views of one
        cross-layer tensor (register_cross_layers_kv_cache takes it)."""
        if self.layer_parts:
            idx = sorted(layer_index(n) for n in kv_caches)
            if idx != list(range(idx[0], idx[0] + len(idx))):
                raise ValueError("layer_parts: the registered layers %s are not one run of the model's layers" % idx)
            self._stage = (idx[0], idx[-1] + 1)
        tensors = list(kv_caches.values())
        base = tensors[0]._base if getattr(tensors[0], "_base", None) is not None else None
        if base is None or any(t._base is not base for t in tensors):
            raise ValueError("kvxfer needs cross-layer blocks: per-layer caches that are views of one tensor "
                             "of shape (num_blocks, num_layers, 2, num_kv_heads, block_size, head_size)")
        self.register_cross_layers_kv_cache(base)

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend=None):
        if self.layer_parts and self._stage is None:  # no names: the model's first layers
            self._stage = (0, kv_cache.shape[1])
        nbytes = kv_cache.numel() * kv_cache.element_size()
        cfg = dict(self.config)
        cfg["pool_bytes"] = nbytes
        self.engine = Engine(cfg, memory=kv_cache)
        g = self.engine.groups[0]
        stride = kv_cache.stride(0) * kv_cache.element_size()
        if g.offset != 0 or g.block_bytes != stride or g.blocks != kv_cache.shape[0]:
            self.engine.close()
            raise ValueError("kvxfer block geometry (offset %d, %d bytes, %d blocks) differs from the tensor's "
                             "(%d bytes per block, %d blocks)" % (g.offset, g.block_bytes, g.blocks, stride,
                                                                  kv_cache.shape[0]))
        # The framework owns every block id: kvxfer's allocator is unused.
        for grp, gi in enumerate(self.engine.groups):
            self.engine.alloc(grp, gi.blocks)

    # Per step ---------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata):
        self._meta = connector_metadata

    def clear_connector_metadata(self):
        self._meta = None

    def start_load_kv(self, forward_context=None, **kwargs):
        """Opens each receive of the step. One the engine refuses (a
        remote_request_id already receiving, a bad value) is a failed load,
        not the step's end: it goes to self.failed with its error, its
        blocks to get_block_ids_with_load_errors, its id to the next
        get_finished's finished_recving (vLLM would wait for it forever
        otherwise), and the other receives go on."""
        for rid, spec in self._meta.reqs_to_recv.items():
            try:
                r = self.engine.receive(spec.remote_request_id, spec.prompt_len, spec.context, blocks=spec.block_ids)
            except (KvxferError, ValueError) as exc:
                self.failed[rid] = exc
                self._load_errors.update(b for group in spec.block_ids for b in group)
                self._recv_done.add(rid)
                continue
            self._recvs[rid] = r
            self._recv_blocks[rid] = spec.block_ids
            self._by_handle[r.handle] = (rid, "recv")

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata=None, **kwargs):
        """Without "layer_parts": nothing (wait_for_save hands whole chunks).

        With it, layer L's KV of the step is written (vLLM calls this after
        each attention layer, in order): each request's chunk of the step
        leaves its part (L, L + 1, num_layers) (kvxfer_chunk_layers), its
        fence made ready at once. (On a GPU: hand it with
        cuda_event=ev, an event recorded after layer L's attention.) A
        chunk's parts run from layer 0 to num_layers on every rank, so a
        pipeline stage holding layers [a, b) also hands (0, a) before its
        first layer's part and (b, num_layers) after its last, unfenced:
        it writes none of them. A layer out of order is a KvxferError
        naming the layers."""
        if not self.layer_parts or self._meta is None:
            return None
        layer = layer_index(layer_name)
        first, end = self._stage
        of = self.num_layers or end
        for rid, spec in self._meta.reqs_to_send.items():
            r = self._send(rid, spec)
            for start, stop in spec.chunks:
                runs, last, key = self._chunk_runs(spec, start, stop), stop == spec.prompt_len, (rid, start, stop)
                if r is None:
                    self._parts[key] = of
                    continue
                if layer == first and first > 0:
                    r.chunk(start, stop, runs, last=last, fenced=False, layers=(0, first, of))
                r.chunk(start, stop, runs, last=last, layers=(layer, layer + 1, of)).ready()
                if layer == end - 1 and end < of:
                    r.chunk(start, stop, runs, last=last, fenced=False, layers=(end, of, of))
                self._parts[key] = of if layer == end - 1 else layer + 1
        return None

    def _send(self, rid, spec):
        """The context side of request rid, opened on its first chunk; None
        once it ended DONE before its last chunk (told the decode
        parallelism, a rank that writes to no decode rank ends at once):
        its later chunks go nowhere."""
        if rid in self._nothing_to_send:
            return None
        r = self._sends.get(rid)
        if r is None:
            r = self.engine.send(rid, spec.prompt_len, generation_tp=self.generation[0],
                                 generation_pp=self.generation[1])
            self._sends[rid] = r
            self._by_handle[r.handle] = (rid, "send")
        return r

    def _chunk_runs(self, spec, start, end):
        tpb = self.engine.tokens_per_block
        b0, b1 = start // tpb, -(-end // tpb)
        return [(b0, ids[b0:b1]) for ids in spec.block_ids]

    def wait_for_save(self):
        """The step's KV is written. (On a GPU: record a torch.cuda.Event
        here and hand each chunk over with Request.chunk(..., cuda_event=ev)
        instead of a fence made ready; use a fresh event per step, since
        kvxfer borrows it until each of its requests has finished.)

        With "layer_parts" the chunks left from save_kv_layer: a chunk of
        the step whose parts did not reach the model's last layer (a layer
        never saved) is a RuntimeError naming it, not a request left to
        time out."""
        if self.layer_parts:
            parts, self._parts = self._parts, {}
            of = self.num_layers or self._stage[1]
            for rid, spec in self._meta.reqs_to_send.items():
                for start, end in spec.chunks:
                    got = parts.get((rid, start, end), 0)
                    if got < of:
                        raise RuntimeError("request %s chunk [%d, %d): save_kv_layer handed its layers up to %d of %s"
                                           % (rid, start, end, got, of))
            self._note_handed_all()
            return
        for rid, spec in self._meta.reqs_to_send.items():
            r = self._send(rid, spec)
            if r is None:
                continue
            for start, end in spec.chunks:
                r.chunk(start, end, self._chunk_runs(spec, start, end)).ready()
        self._note_handed_all()

    def _note_handed_all(self):
        for rid, spec in self._meta.reqs_to_send.items():
            if rid in self._sends and any(end == spec.prompt_len for _, end in spec.chunks):
                self._handed_all.add(rid)

    def get_finished(self, finished_req_ids):
        """(ids whose send is DONE, ids whose receive finished): vLLM frees
        or schedules them. A send is reported only once its request also
        finished generating (its id came in finished_req_ids, now or in an
        earlier call), as vLLM's contract asks: until then the scheduler
        still owns its blocks. A request that failed is reported as
        finished too, and kept in self.failed with its event (a receive
        the engine refused: with its error).

        An id in finished_req_ids whose request is still live here was
        aborted: a receive (vLLM keeps its blocks until it is reported) and
        a send whose last chunk was never handed over (it would wait for it
        until its timeout) are cancelled, and reported once their event
        arrived: the engine's proof that no write touches the blocks any
        more. An aborted request is not in self.failed."""
        finished = set(finished_req_ids or ())
        self._gen_finished.update(r for r in finished if r in self._sends or r in self._sent_done)
        if self.engine is not None:
            self._reap()
            for rid in finished:
                if rid in self._aborted:
                    continue
                live = [self._recvs[rid]] if rid in self._recvs else []
                if rid in self._sends and rid not in self._handed_all:
                    live.append(self._sends[rid])
                for req in live:
                    req.cancel()  # a no-op if it finished meanwhile: its event still comes
                if live:
                    self._aborted.add(rid)
        sent = self._sent_done & self._gen_finished
        self._sent_done -= sent
        self._nothing_to_send -= sent
        self._gen_finished -= sent
        recv, self._recv_done = self._recv_done, set()
        return (sent or None), (recv or None)

    def _reap(self):
        for ev in self.engine.poll():
            rid, side = self._by_handle.pop(ev.request)
            req = (self._sends if side == "send" else self._recvs).pop(rid)
            failed = ev.outcome not in (Outcome.DONE, Outcome.READY) and rid not in self._aborted
            if failed:
                self.failed[rid] = ev
            self._aborted.discard(rid)
            req.release()
            if side == "send":
                if ev.outcome == Outcome.DONE and rid not in self._handed_all:
                    self._nothing_to_send.add(rid)
                self._handed_all.discard(rid)
                self._sent_done.add(rid)
            else:
                blocks = self._recv_blocks.pop(rid, ())
                if failed:
                    self._load_errors.update(b for group in blocks for b in group)
                self._recv_done.add(rid)

    def get_block_ids_with_load_errors(self):
        """The destination blocks of receives that failed since the last
        call (vLLM asks after get_finished): none of a failed receive's KV
        is trusted, so vLLM recomputes or fails the request
        (kv_load_failure_policy) instead of decoding from them. An aborted
        request's blocks are not reported: vLLM frees them."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self, timeout_ms=5000):
        """Closes the engine. A close that times out raises KvxferError
        (Status.TIMEOUT) and warns: the engine is closed all the same, and
        vLLM's KV cache it was registered over stays referenced by kvxfer
        for the rest of the process (Engine.close), since peers may still
        write into it. A refused close leaves the engine open."""
        if self.engine is None:
            return
        try:
            self.engine.close(timeout_ms)
        finally:
            if not self.engine.handle:
                self.engine = None
