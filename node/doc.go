// Package node is the one entry point a serving process needs to take part
// in kvxfer across processes and machines: Open wires what each process
// needs, so that no embedder copies kvxfer's internals.
//
//   - The control link: a ZeroMQ ROUTER bound at Config.Bind, a static
//     directory of peers (instance, rank, endpoint, CURVE public key), CURVE
//     keys from key files (`kvxfer keygen`) or inline, unless Insecure.
//   - The data plane: ucx where this binary has it (ucx.Available), else
//     shm; loopback for peers in this same process; cudaipc (never chosen
//     by auto) for GPU to GPU between processes of one host.
//   - Pool memory the backend can write: a shared-memory file (shm) or
//     memory UCX allocated (ucx); private memory would make every request
//     fail late. A SendOnly node (a prefill rank) keeps private memory and
//     refuses Node.Receive at once. Or, with Config.CallerMemory, the
//     framework's own KV tensors (memory it allocated: vLLM's KV cache)
//     and no pool of the node's own: a receiving rank needs ucx (which
//     registers memory it did not allocate; shm is refused), a send-only
//     rank any backend; no revocation, no exit proofs; the memory must
//     outlive the node (CallerMemory's doc).
//   - GPU to GPU on one host (backend "cudaipc", Config.Device): the
//     pool is pool_bytes of device memory on GPU Device (for a send-only
//     rank too), allocated through package cuda and registered with a
//     cudaipc agent on that GPU; peers map it through its CUDA IPC handle
//     and write it with their GPU's copy engines (prefill on GPU 0,
//     decode on GPU 1, two processes). Or CallerMemory: device memory of
//     that GPU, its tensors in one CUDA allocation or several (vLLM's
//     per-layer tensors: the node registers every allocation the
//     described tensors lie in); host memory, another GPU's memory and a
//     tensor that runs out of its allocation are refused by name. It
//     needs the NVIDIA driver (libcuda.so.1, or
//     $KVXFER_LIBCUDA): without one Open fails with an error wrapping
//     cuda.ErrNoDevice that names the backend and what to use instead.
//     Refused: memory (the CPU cannot address the pool: give the
//     framework's device tensors as CallerMemory) and revoke_spare_bytes
//     > 0 (a CUDA IPC mapping cannot be withdrawn). One host only: a
//     request whose peer's Hello names a process of another host (or pid
//     namespace) fails at its connect with ErrOtherHost (a Hello naming
//     no process leaves it to cudaipc: an agent whose agent file is not
//     on this host, for its pid and start time, fails the connect with
//     rdma.ErrPeerGone). A writer's exit is no proof on
//     cudaipc (its copies run on the GPU; the driver documents nothing
//     about queued copies at process exit): failed requests' pages wait
//     for the writer's Result or CancelAck.
//   - Liveness: heartbeats on the control link; a peer silent for
//     HeartbeatMisses intervals is handed to Engine.PeerDown (its requests
//     fail and drain) and to Config.OnPeerDown. Suspicion only: pages the
//     peer may still write stay quarantined. Its frames and heartbeats
//     renew this node's writer lease on it (Engine.PeerAlive, at most once
//     per heartbeat interval; Config.WriterLease, off by default). A node
//     that closes gracefully (Close) says goodbye on its control link to
//     each peer it is connected to; a peer takes that incarnation down at
//     once (Engine.PeerIncarnationDown, "closed (it said goodbye)", and
//     Config.OnPeerGoodbye, Config.OnPeerDown, unless a later incarnation
//     of it said Hello first: the peer is up) instead of after the
//     heartbeat timeout — with or without etcd. A node closed on an error
//     (CloseBecause) names it in its goodbye: the peer's requests fail
//     naming it ("exited on an error (its goodbye says: …)"), and
//     OnPeerGoodbye hears it, for an owner that stops waiting for a
//     restart. Suspicion too: it does what a Down does and frees
//     nothing more (docs/membership.md, "A graceful stop says goodbye") —
//     unless it is a drained goodbye: a node whose engine's Close drained
//     every write it started (kvxfer.Engine.WritesOver) says so in its
//     goodbye, and a peer takes that as proof that the incarnation writes
//     no more (Engine.WriterProven, kvxfer.ProofDrainedGoodbye, "it closed
//     after draining its writes (goodbye)"), as for a pidfd exit below,
//     across hosts too; a ucx agent takes it as well, for the agent
//     address that incarnation's Hello named (ucx.Agent.PeerDrained).
//   - Proof of death (issue 17): a peer of this host and pid namespace
//     whose Hello names its process (pid and start time, checked) is
//     watched through a pidfd, on the shm backend and on ucx over shared
//     memory. Its exit is proof only if that process was seen, alive,
//     mapping this node's pool (checked at the Hello and before each of
//     the peer's successful Results is delivered) and no other peer names
//     it; then Engine.WriterProven (kvxfer.ProofPidfdExit) frees its
//     requests' quarantined pages, the incarnation is down
//     (Engine.PeerIncarnationDown) and Config.OnPeerDown is called
//     (docs/membership.md). Where no exit can be proof (a send-only node,
//     a pool that is no shared mapping of a file, cudaipc, ucx over tcp,
//     a peer of another backend), a same-host peer's process is watched
//     for liveness only: its exit takes that incarnation down at once, as
//     missed heartbeats would later (Engine.PeerIncarnationDown, "exited
//     (its process N is gone: pidfd)", and Config.OnPeerDown): a context
//     rank's sessions with a SIGKILLed generation process fail at once,
//     and drain their own writes before their sources are released, as
//     on any Down. An exit that touched no request here is logged at
//     info, one that did at warn.
//   - Stale pool files of killed processes of this instance are swept at
//     Open (SweepStale).
//   - Identity: a peer given as (instance, parallel, rank) is rank
//     Parallel.Index(rank) on the wire, the index kvxfer computes when a
//     ReceiveRequest names that instance and parallelism; a rank outside its
//     parallelism, two peers with one identity or one instance with two
//     parallelisms is refused by name.
//   - Startup mistakes are named at once: Open logs "listening on …,
//     waiting for ctx/0 at …"; refused CURVE handshakes are logged with the
//     reason on both sides; a peer serving another model is logged naming
//     both models as its Hello arrives, one whose frames are of another
//     control protocol version naming both versions; WaitPeers returns
//     these as errors. A peer still silent after 3 heartbeat intervals is
//     named in a warning with what the link knows (nothing accepts
//     connections at its endpoint; or it has not connected back to ours)
//     while WaitPeers goes on waiting, and its error at the deadline says
//     the same.
//     Node.Receive refuses a request whose writer is not among the peers
//     and logs a writer that has not said Hello within 2 heartbeats.
//
// # Membership through etcd
//
// With Config.Discovery "etcd://HOST:PORT[,HOST:PORT]" (and Cluster) the
// node takes part in package discovery's etcd registry
// (docs/membership.md); "etcds://…" reaches etcd over TLS (DiscoveryCA,
// and DiscoveryCert with DiscoveryKey for an etcd that wants a client
// certificate), and DiscoveryUser with DiscoveryPasswordFile logs in to
// etcd's user auth:
//
//   - Open registers this rank's record after the link listens: the
//     engine's incarnation (its Hello's, new at each start, so that a
//     peer ties a Hello to its record), the real bound endpoint
//     (Node.Endpoint), the CURVE public key (Node.PublicKey: a public key
//     only; the secret key stays in key_file or secret_key and never
//     leaves the process), and the backend, agent address, layout hash
//     and parallelism of the engine's Hello, under a lease of
//     DiscoveryTTL.
//   - Up (of a rank of another instance; this node's own instance's
//     ranks are not dialed): the peer's key is admitted at the handshake and bound to that
//     rank (AllowKey, SetPeerServerKey), then its endpoint added, so the
//     link dials it with the key known. A peer refused at its handshake
//     because it had not learned this node's key yet is redialed (once
//     per heartbeat interval, until this node's connection to it is up,
//     whether or not its Hello came first). A record without a
//     CURVE key (this node using CURVE), or with a key other than one the
//     config pins for that rank, is refused and logged, and WaitPeers
//     returns that (ErrHandshake) at once.
//   - Down (lease expired, left, superseded) of the incarnation found:
//     Engine.PeerIncarnationDown (the requests addressed to that
//     incarnation fail and drain; those of a later one whose Hello came
//     first go on) and
//     Config.OnPeerDown, logged with the reason (a Down of another
//     incarnation is ignored, logged at debug). Their destination pages stay quarantined until a proof (a
//     Result or CancelAck, or the writer's exit seen through a pidfd;
//     docs/membership.md §3–4).
//   - Rejected: logged with its key.
//   - Lost (this node's own record is gone): the node fails rather than
//     register again — every peer already refused this incarnation, and a
//     new one in the same process would race the old one's in-flight
//     writes. It fails every request with every peer (Engine.PeerDown, so
//     its writers stop posting and their endpoints close), WaitPeers
//     returns ErrMembershipLost and Err says why; the embedder closes the
//     node and opens a new one (a new incarnation).
//   - Close closes the registry first (peers see "left" at once), then
//     the rest.
//
// Peers found through etcd need no static entry. A Peer given without
// endpoint (instance, parallel, rank) names a rank WaitPeers waits for;
// one that never registers is named "(not registered in etcd cluster
// C)", followed, where other ranks of its instance are registered, by
// those ranks and the rank to start (with the CLI's --tp-rank for it),
// and where none is, by etcd's address, whether that instance's process
// runs with this cluster and instance name, and the ranks of other
// instances registered in C (a misspelt instance name shows there): in
// WaitPeers' warning after 3 heartbeat intervals, while it goes on
// waiting, in its error, and in Receive's.
// Config.OnMembership sees every registry event. Static discovery
// (the default) opens no registry: Peers are the membership, liveness is
// heartbeats.
//
// Config is a plain struct with snake_case JSON names (ParseConfig) so a C
// ABI can pass it as JSON; every bad value is an error wrapping ErrConfig
// that names the field and the value.
//
// The node owns nothing of the transfer: requests go through the root
// package's *kvxfer.Engine (Node.Engine): Send/Chunk on the context side,
// Receive (or Node.Receive)/Done/Released on the generation side.
//
// # Concurrency
//
// Open returns a Node whose methods are safe for concurrent use, except
// that nothing may be called after Close has returned. Engine's methods
// are the root package's (safe for concurrent use). WaitPeers may be
// called from any number of goroutines; it polls the link and only reads.
// Close is idempotent; it closes the registry (etcd), waits for the
// node's watcher and membership goroutines and for
// the engine to drain (bounded by its ctx), then closes the link, the
// agent and the pool, in that order. Config.OnPeerDown and the logger are
// called from the link's goroutines (OnPeerDown also from the pidfd
// watches; with etcd, OnPeerDown and OnMembership from the membership
// goroutine) and must not block.
package node
