package core

import (
	"hash/fnv"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Planner turns one chunk's source blocks into the segments one peer needs.
// It is pure; Route builds one from the kvcache peer map and plan.
type Planner interface {
	// Plan appends the chunk's segments for the peer to buf. An empty
	// result means the chunk lies outside what the peer needs (a no-op).
	Plan(c kvcache.Chunk, src []kvcache.BlockRun, buf []kvcache.Segment) ([]kvcache.Segment, uint64, error)
}

// Route is a stream's fixed description of its peer: who it is, how to
// reach its data plane and how to plan writes into its blocks. It is
// immutable once built and shared by the session and the worker.
type Route struct {
	Peer      messages.PeerID
	AgentAddr []byte
	RegionKey []byte
	RegionLen uint64
	Planner   Planner
	// CompletionsDeliver: the writer's backend completes a write only
	// once its bytes are in the peer's memory (rdma.Delivering), so the
	// stream's last completion proves delivery and its Result needs no
	// Flush first. False keeps the Flush.
	CompletionsDeliver bool
	// SmallPayload: the peer predates messages.FeatureLargePayload and
	// refuses a Result whose payload is over messages.LegacyMaxPayload.
	SmallPayload bool
}

// WorkerFor is the one routing function from (request, peer) to a worker:
// fixed for the stream's life, so a stream's ops, FAILED and CANCEL leave in
// the order they were queued. A request's streams start at a worker chosen
// by the request's hash and take consecutive workers by peer rank, so the
// streams of one request spread over distinct workers when there are
// enough of them.
func WorkerFor(request string, peer messages.PeerID, workers int) int {
	if workers <= 1 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(request))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(peer.Instance))
	return int((h.Sum64() + uint64(uint32(peer.Rank))) % uint64(workers))
}
