package core

// Read-only views of a TxSession for its shell's tracer and meter: they
// copy nothing and never change the session.

// EachOp calls f with every op of the session and its state: stream by
// stream in the order the streams opened, each stream's ops in order. It
// is OpStates without the map, for per-step digests (package trace).
func (s *TxSession) EachOp(f func(OpRef, OpState)) {
	s.eachOp(func(r OpRef, o *op) { f(r, o.state) })
}

// PinnedCount is len(PinnedChunks()) without the slice.
func (s *TxSession) PinnedCount() int {
	n := 0
	for i := range s.chunks {
		if s.chunks[i].pinned {
			n++
		}
	}
	return n
}

// Config is what the session was born with.
func (s *TxSession) Config() TxConfig { return s.cfg }

// Chunks is the number of chunks the session was handed.
func (s *TxSession) Chunks() int { return len(s.chunks) }

// Streams is the number of the session's streams. Streams open in the
// order their peers' RequestData arrived and are never replaced, so
// Stream(i) names the same stream for the session's whole life.
func (s *TxSession) Streams() int { return len(s.order) }

// Stream is the i-th stream to open, 0 ≤ i < Streams().
func (s *TxSession) Stream(i int) StreamView { return StreamView{s.streams[s.order[i]]} }

// StreamView is a read-only view of one stream.
type StreamView struct{ st *stream }

// Peer is the stream's generation rank index (OpRef.Peer of its ops).
func (v StreamView) Peer() int { return v.st.peer }

// Epoch is the epoch of the RequestData that opened the stream: the
// epoch of every op of it, and of its terminal Result.
func (v StreamView) Epoch() uint64 { return v.st.epoch }

// Bytes is what the stream's ops have written so far (BACKEND_DONE).
func (v StreamView) Bytes() uint64 { return v.st.bytes }

// Ops is the number of ops the stream admitted.
func (v StreamView) Ops() int { return len(v.st.ops) }

// Next is the stream's next op to submit: ops [Next(), Ops()) wait, in
// admission order, ADMITTED.
func (v StreamView) Next() int { return v.st.next }

// Op is op j's state and the index of the chunk it writes.
func (v StreamView) Op(j int) (state OpState, chunk int) { return v.st.ops[j].state, v.st.ops[j].chunk }

// Config is what the session was born with.
func (s *RxSession) Config() RxConfig { return s.cfg }

// Bytes is what the session's writers reported they wrote (SUCCESS).
func (s *RxSession) Bytes() uint64 { return s.bytes }
