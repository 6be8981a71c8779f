package trace

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/actors"
)

// TestEmptyChunkPayloadRoundTrips: an empty payload set at the last chunk
// (SetPayload([]byte{}), the C ABI's set_payload(NULL, 0)) replaces Send's
// in the live session; its trace record replays as a payload set, empty,
// not as none (a review found the replay keeping Send's payload).
func TestEmptyChunkPayloadRoundTrips(t *testing.T) {
	typ, w := encodeMsg(actors.TxChunk{Payload: &[]byte{}}, nil, nil)
	raw, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeMsg(typ, raw)
	if err != nil {
		t.Fatal(err)
	}
	if c := m.(actors.TxChunk); c.Payload == nil || len(*c.Payload) != 0 {
		t.Fatalf("TxChunk with an empty payload set replays as %+v (%s): the session would keep Send's payload", c, raw)
	}
	// A chunk without one is recorded as before payloads could be set.
	_, w = encodeMsg(actors.TxChunk{}, nil, nil)
	if raw, _ := json.Marshal(w); strings.Contains(string(raw), "Payload") {
		t.Fatalf("a chunk without a payload encodes as %s, naming one", raw)
	}
}
