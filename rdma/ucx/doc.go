// Package ucx is the rdma backend over UCX (UCP), through cgo against the
// system's UCX found with pkg-config (Debian: libucx-dev; developed against
// UCX 1.13.1). Which transports carry the data is UCX's choice (UCX_TLS and
// the other UCX_* variables as usual): InfiniBand or RoCE verbs where
// present, shared memory and cma between processes of one host, tcp.
// Built without cgo, off Linux or with the kvxfer_noucx tag, New fails with
// ErrUnavailable.
//
// Known UCX fault: UCX 1.13.1 can abort the process (an assertion in its
// wireup, "got REP message") when a tcp connection fails while a
// connection-setup reply to it is still queued, as when a peer goes away
// in the middle of a new endpoint's setup (seen about once in eleven runs
// of a test that cut links early). Nothing this package does can catch an
// abort inside UCX: over tcp, run a UCX release whose wireup no longer
// asserts there. A second one, in UCX's keepalive: a peer's keepalive
// check of an endpoint this process closed is answered over a new tcp
// connection, and UCX 1.13.1 aborts the answering process (an assertion
// in uct_tcp_ep_destroy_progress, "!(ep->flags &
// UCT_TCP_EP_FLAG_CTX_TYPE_TX)") when the checking peer's worker is
// destroyed while that connection is set up (seen about once in 2,700
// runs of a test whose receiver closes right after the writer closed its
// end; UCX_KEEPALIVE_INTERVAL=inf turns keepalive off, at the price of a
// dead peer being seen only through the control plane).
//
// # One agent, one worker, one goroutine
//
// An Agent owns a UCP context (RMA and active messages, with wakeup) and one
// single-threaded UCP worker. Every UCX call for them is made by the
// agent's progress goroutine, locked to its OS thread: Post, Connect,
// Register, Deregister and Close on other goroutines queue a request and
// wake it. Between bursts of work it polls for a short spin (WithSpin),
// then arms the worker and sleeps in epoll_wait on an epoll fd that
// holds UCP's event fd and an eventfd that submitters write to; an idle
// agent wakes once a second for UCX's keepalive (about 0.1% of a core for
// two linked agents). WithProgressCPUs pins that thread.
//
// C never holds a Go pointer: operations carry integer ids, and UCX's
// callbacks (flush, close, endpoint error, active message) are C functions
// that append to a C queue the progress goroutine drains after each
// ucp_worker_progress.
//
// # Batches
//
// Post checks the batch synchronously (source registration, the key, the
// ranges), counts it against its source registration and against the
// peer's destination registration, appends it to the endpoint's completion
// order and queues it. The progress goroutine posts one ucp_put_nbx per
// segment (the small batches of a round in one cgo call; no call copies
// more than 2 MiB, so that the scheduler does not hand the locked
// goroutine's P to another thread during a long copy), then, for every
// endpoint that got puts, one ucp_ep_flush_nbx (every 32 batches or 32 MiB,
// and at the end of each round of requests). A batch is done when that
// flush completes — in UCX's terms remotely: its bytes are in the peer's
// memory — or with the first error: a put refused (a *rdma.SegmentError
// naming the segment), the flush failing (rdma.ErrPeerGone when UCX reports
// the endpoint failed), or the endpoint closing first. Each
// endpoint has a dispatcher goroutine that runs Done and Flush callbacks in
// post order. While batches are outstanding it naps (a 20µs futex wait,
// ended early by the progress goroutine when that runs out of work) rather
// than spin or block: a stream of completions then costs the progress
// thread neither a wakeup per round nor a CPU that a spinner would take
// from it on a small machine; a dispatcher that finds itself on the
// progress thread's CPU moves off it before it naps (see nap.go). A batch
// stops counting against its regions just before its Done runs; one whose
// writes were cut on the wire (rdma.ErrCloseUnproven) keeps counting
// against the peer's region, which they may still reach, so that the
// peer's Deregister of it stays busy, and against its source registration
// until the forced close of its endpoint has completed (UCX may read the
// source until then; below, rdma.ErrSourcesReleased), so that a
// Deregister of the source fails busy until then.
//
// # Links: keys, revocation, goodbye
//
// A peer's agent address (Connect's argument, or the address in a hello)
// is checked before any of it reaches UCX: its envelope and checksum, then
// its UCP worker address, walked in UCX 1.13's packed format with a bounds
// check on every field and the sizes the local transports read
// (workeraddr.go). UCX's ucp_ep_create trusts those bytes and aborts the
// process on some malformed ones; a refused address is an error wrapping
// rdma.ErrBadAddress and ErrBadWorkerAddress.
//
// An agent's address carries its X25519 and Ed25519 public keys, and its
// id is derived from them. The first Connect from agent A to agent B links
// them: A opens a UCP endpoint to B's worker and sends a hello (A's id,
// address and live registrations) as an active message; B opens an
// endpoint back and answers with its own. Every control message (hello,
// welcome, revoke, restore, reply, bye, bye-ack) carries a MAC under the
// link key, which only A and B can derive (X25519 of one's private key and
// the other's public key): one that does not verify is dropped, so no
// third party, peer of both or not, can say bye, revoke, restore or reply
// in A's name (linkkey.go). With WithAdmission, B answers a hello only
// from an agent whose address its admit accepts (a node: an address one of
// its authenticated peers sent); any other is dropped. Data endpoints are
// separate UCP endpoints (one per rdma.Endpoint), all with peer error
// handling (UCP_ERR_HANDLING_MODE_PEER and an error callback).
//
// A RemoteRegion.Key is
//
//	"UCK2" owner-agent-id[16] registration-id base len len(rkey) rkey sig[64]
//
// where base is the region's address in the owner's process, rkey the
// output of ucp_rkey_pack and sig the owner's Ed25519 signature of the
// rest, which only the owner can make. A sender verifies the key once per
// endpoint with the public key in the owner's address (a key altered,
// truncated or extended, signed by another agent, or of another agent, is
// refused with rdma.ErrBadKey); on an endpoint to itself an agent also
// checks the key against its own registration (worker.ownKey) and unpacks the rkey with
// ucp_ep_rkey_unpack on the progress goroutine the first time the endpoint
// uses it, caching it per registration. The owner wrote the packed rkey,
// base and len, so they are checked first (rkey.go, rkeyseg.go):
// the packed rkey against UCX 1.13's format and what the owner's worker
// address says of its memory domains, and the shared-memory segment it
// names (sysv, posix: what a put on one host copies into) against the
// kernel's object, which must be there and hold [base, base+len) and,
// when the owner is an agent of another process, must not be this
// process's own (a sysv segment it created, a posix file it holds open:
// its pool, or the FIFO segments of UCX's own worker); a key that fails
// is refused with rdma.ErrBadKey. UCX would crash the writer
// on either: its unpack's error path dereferences NULL, and its
// shared-memory puts copy without bounds. Deregister revokes the registration
// at every linked peer and waits for each to answer: a peer with batches in
// flight into it answers busy, and Deregister then restores it everywhere
// and fails with rdma.ErrRegionBusy (between the revocation and the
// restoration, that peer's other endpoints are refused with ErrBadKey for
// it); otherwise peers refuse its key from then on (ErrBadKey) and it is
// unmapped. A peer that never answers makes Deregister fail busy after
// WithRevokeTimeout. A peer whose hello went unanswered within
// WithHandshakeTimeout, or whose link's control endpoint UCX reports
// failed, is failed for new work (Connect fails with rdma.ErrPeerGone),
// but neither is proof that it writes no more into this agent: stopped
// or slow, it may take the hello later, bring its side of the link up
// and write; an endpoint error concerns that one endpoint of this agent,
// not the peer's own. A deregistration waiting for its answer, and any
// later one while that link stands, fails busy — until the peer, which
// ran on, says bye after all (proof for all memory: below), or its node
// says in a drained goodbye that every write its engine started is over
// (Agent.PeerDrained: proof for all memory, as the bye; before the link
// failed or after), or its exit
// is proven from outside UCX (Agent.PeerExited, a node's pidfd), which
// releases the memory this agent allocated (Alloc), not memory
// registered with ucp_mem_map, into which what the peer queued is
// applied by this agent's worker.
//
// Agent.Close closes its endpoints, then says bye to every linked peer and
// waits (at most WithRevokeTimeout) for each to acknowledge: a peer closes
// its endpoints to the closing agent (after their writes are flushed) and
// refuses further posts with rdma.ErrPeerGone before it acknowledges, so
// nothing lands in the closing agent's memory after Close returns. Then it
// unmaps every registration and frees every Alloc, and destroys the worker
// and the context.
//
// A bye, and the acknowledgement of one, say exactly this: every
// endpoint of the sender to the receiver has closed, and every write
// posted on them either landed (its flush completed) or never reached
// the wire. An agent one of whose endpoints to a peer had writes cut on
// the wire (their batches failed with rdma.ErrCloseUnproven: the close
// timeout, an endpoint error, a failed link; below) cannot say that:
// over tcp and UCX's software RMA the cut bytes may sit in the peer's
// socket buffers, on another connection than the bye's and not ordered
// with it, and the peer's worker may apply them after it took the bye.
// So it says that peer no bye and acknowledges none of its byes. The
// peer then treats it as any writer gone without a bye: its link fails
// without proof, or its revoke or bye goes unanswered; its
// deregistrations fail busy and its Close returns rdma.ErrCloseUnproven
// keeping the memory, until the writer's exit is proven
// (Agent.PeerExited) for what that proof covers. Nothing new goes on the
// wire: an agent of an earlier version, as the peer, sees a writer that
// went away without a bye, and handles it as its version does. An agent
// of an earlier version, as the writer, still says bye (and acknowledges
// one) after a cut; nothing tells that bye from a sound one, so against
// such a writer the peer still takes it as proof.
//
// A peer that does not acknowledge in time (stopped, cut off, or
// withholding it as above), one already silent that it does not wait
// for, one this agent said no bye to since its own writes into it were
// cut (so none was acknowledged), one whose hello went unanswered
// (above) or is still unanswered, or one whose link failed on an
// endpoint error (above; unless its exit was proven and only allocated
// memory is registered), proves nothing:
// Close then leaves every Alloc mapped and the context alive, as
// KeepMemory does, and returns an error wrapping rdma.ErrCloseUnproven
// naming the peers; memory the caller registered must not be reused
// either. Nothing is owed where every registration is a source
// (RegisterSource) and every Alloc is registered as one: no peer can
// write into such an agent's memory, and none of the above makes its
// Close return ErrCloseUnproven or keep its memory.
//
// # Close and what it proves
//
// Endpoint.Close refuses new posts, fails the batches not yet handed to UCX
// (ErrEndpointClosed), waits for the flushes of those on the wire (at most
// WithCloseTimeout), destroys the endpoint's rkeys and closes the UCP
// endpoint with UCP_EP_CLOSE_FLAG_FORCE, waiting for the close to complete
// while the worker progresses, and returns once every callback has run.
// Writes whose flush completed have landed; there are no others, so after
// Close returns nothing of the endpoint's can land. Only when the close
// timeout expires (a peer that is alive but does not progress) does the
// forced close cut writes that transports such as tcp may still deliver
// once the peer progresses again: their batches fail with
// ErrEndpointClosed and rdma.ErrCloseUnproven, and Close returns an error
// wrapping rdma.ErrCloseUnproven, so that their owner keeps them in doubt;
// and the agent says no bye to that peer (above).
// Whenever Close returns rdma.ErrCloseUnproven (this case or the ones
// below), it wraps rdma.ErrSourcesReleased beside it: Close returns only
// once the forced close has completed and every callback has run, and a
// completed forced close has purged the endpoint's requests, whose buffers
// UCX no longer reads. The cut writes may still land at the peer, but none
// of them reads its source any more: their owner may unpin the source
// pages while it keeps the writes in doubt towards the peer.
//
// When UCX reports a data endpoint failed (the peer died: tcp resets at
// once, shared memory within about two keepalive intervals,
// WithKeepalive; or the peer was stopped, or its VM paused, for longer
// than the keepalive), or fails a flush on it, later posts are refused
// with rdma.ErrPeerGone and the endpoint is closed by force. The report
// concerns this agent's endpoint, not what already reached the peer:
// over tcp and UCX's software RMA the peer's own worker applies what sits
// in its socket buffers once it runs. So the endpoint's batches on the
// wire fail with rdma.ErrCloseUnproven beside ErrPeerGone, and its Close
// returns ErrCloseUnproven, unless the peer's exit was proven before
// (Agent.PeerExited): then they fail with ErrPeerGone alone. A failed
// link fails every endpoint to that peer and cuts their batches on the
// wire the same way, so a batch ends alike whichever of UCX's reports,
// the link's or its endpoint's, comes first. Batches not yet handed to
// UCX fail with ErrPeerGone alone (none of their bytes left), and an
// endpoint with nothing on the wire closes with nil. A cut batch stays
// counted against the peer's region (above): the peer's Deregister of it
// is answered busy while the link stands, and the agent says the peer no
// bye (above).
//
// # Memory
//
// Register maps a region with ucp_mem_map. Host memory always registers;
// device memory (kvcache.DeviceMem) only where UCX reports CUDA support
// (Agent.MemoryTypes), else Register fails with kvcache.ErrBadRegion and
// says so. Alloc gets host memory from UCX itself (UCP_MEM_MAP_ALLOCATE):
// on one host that is a shared-memory segment that peers write into with
// one memcpy (put over the posix or sysv transport), where Go or malloc
// memory is reached through UCX's software RMA over active messages, which
// costs a copy more and needs the receiver's worker to progress.
//
// UCX 1.13's shared-memory transports do not offer peer-failure handling
// unless UCX_MM_ERROR_HANDLING is set, and endpoints with peer error
// handling then cannot use them at all (UCX falls back to tcp over the
// loopback between processes of one host). The agent sets it unless the
// environment does (WithSharedMemoryErrorHandling); failure detection on
// shared memory is then UCX's keepalive, set to 1s unless
// UCX_KEEPALIVE_INTERVAL is set.
//
// UCX logs its own errors to stderr (for example when a peer's connection
// resets); UCX_LOG_LEVEL controls it.
package ucx
