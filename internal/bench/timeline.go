package bench

import (
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/actors"
)

// ChunkSpan is one chunk's life on the context side, as its session saw
// it: handed over (TxChunk), its KV written (TxFenceFired: compute ends),
// its op completed by the backend (TxCompleted: the transfer ends).
type ChunkSpan struct {
	Chunk  int       `json:"chunk"`
	Handed time.Time `json:"handed"`
	Fenced time.Time `json:"fenced"`
	Done   time.Time `json:"done"`
}

// RequestTimeline is one request's chunks. PeerRequest is when the
// generation side's RequestData reached the session (no op leaves before).
type RequestTimeline struct {
	Request     string      `json:"request"`
	PeerRequest time.Time   `json:"peer_request"`
	Chunks      []ChunkSpan `json:"chunks"`
}

// Timeline is an actors.Recorder that keeps, per context-side session, the
// times of its chunks' events. It assumes one stream per session (one
// generation rank) whose every chunk makes one op, so that op n is chunk n:
// true of a TP1 → TP1 pair of full-attention layouts.
type Timeline struct {
	mu       sync.Mutex
	sessions map[string]*RequestTimeline // by actor path
	// byRequest: the same timelines by request id, from the first op of
	// each that completed (Request was a scan of sessions, O(requests)
	// per call: quadratic over a benchmark's run).
	byRequest map[string]*RequestTimeline
}

var _ actors.Recorder = (*Timeline)(nil)

func newTimeline() *Timeline {
	return &Timeline{sessions: map[string]*RequestTimeline{}, byRequest: map[string]*RequestTimeline{}}
}

// Record implements actors.Recorder.
func (t *Timeline) Record(actor string, msg any, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sessions[actor]
	if s == nil {
		s = &RequestTimeline{}
		t.sessions[actor] = s
	}
	switch m := msg.(type) {
	case actors.TxPeerRequest:
		if s.PeerRequest.IsZero() {
			s.PeerRequest = at
		}
	case actors.TxChunk:
		s.Chunks = append(s.Chunks, ChunkSpan{Chunk: len(s.Chunks), Handed: at})
	case actors.TxFenceFired:
		if m.Index >= 0 && m.Index < len(s.Chunks) {
			s.Chunks[m.Index].Fenced = at
		}
	case actors.TxCompleted:
		if s.Request == "" {
			s.Request = m.Op.Request // the path names the actor, not the request
			if _, ok := t.byRequest[s.Request]; !ok {
				t.byRequest[s.Request] = s
			}
		}
		if m.Op.Seq >= 0 && m.Op.Seq < len(s.Chunks) {
			s.Chunks[m.Op.Seq].Done = at
		}
	}
}

// Request returns the timeline of the context-side session of request id
// (false when none was recorded, or none of its ops completed: the request
// is learnt from the first completion).
func (t *Timeline) Request(id string) (RequestTimeline, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.byRequest[id]
	if !ok {
		return RequestTimeline{}, false
	}
	c := *s
	c.Chunks = append([]ChunkSpan(nil), s.Chunks...)
	return c, true
}
