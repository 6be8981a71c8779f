package actors

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
}

// WorkerFor is the one routing function from (request, peer) to a worker:
// fixed for the stream's life, so a stream's ops, FAILED and CANCEL leave in
// the order they were queued.
func WorkerFor(request string, peer messages.PeerID, workers int) int {
	if workers <= 1 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(request))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(peer.Instance))
	_, _ = h.Write([]byte{byte(peer.Rank), byte(peer.Rank >> 8), byte(peer.Rank >> 16), byte(peer.Rank >> 24)})
	return int(h.Sum64() % uint64(workers))
}
