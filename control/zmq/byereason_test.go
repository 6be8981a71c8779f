package zmq

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/messages/pb"
)

// A link whose owner gave a reason (SetGoodbyeReason: it exits on an
// error it found) says it in its goodbye, and the peer hands it to
// OnPeerGoodbye, made to fit (messages.GoodbyeReason: control characters
// escaped, at most MaxGoodbyeReasonLen bytes); a goodbye without one
// gives "" (a possible restart). (Checked to fail: with the reason left
// out of the goodbye, OnPeerGoodbye got "".)
func TestGoodbyeReasonReachesOnPeerGoodbye(t *testing.T) {
	long := "node: peer said nothing: a Hello came from \"ctx2/0\",\nwhich is not a peer of this engine\x00" + strings.Repeat("é", messages.MaxGoodbyeReasonLen/2)
	for name, reason := range map[string]string{"no reason": "", "reason": long} {
		t.Run(name, func(t *testing.T) {
			ctxID, genID := pid("ctx", 0), pid("gen", 0)
			base := Config{Insecure: true, HeartbeatInterval: 20 * time.Millisecond, HeartbeatMisses: 100000}
			ca, cb := base, base
			log := &goodbyeLog{}
			cb.OnPeerGoodbye, cb.OnPeerDown = log.goodbye, log.down
			b := listenAs(t, incHello(genID, 3), cb).link
			ca.Peers = map[messages.PeerID]string{genID: b.Endpoint()}
			a := listenAs(t, incHello(ctxID, 7), ca).link
			if err := b.AddPeer(ctxID, a.Endpoint()); err != nil {
				t.Fatal(err)
			}
			waitFor(t, patience, "Hellos both ways and ctx's connection to gen up", func() bool {
				_, errA := a.Hello(genID)
				_, errB := b.Hello(ctxID)
				st, err := a.PeerState(genID)
				return errA == nil && errB == nil && err == nil && st.Conn == ConnUp
			})
			a.SetGoodbyeReason(reason)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, patience, "gen's OnPeerGoodbye for ctx/0", func() bool { n, _ := log.counts(); return n > 0 })
			log.mu.Lock()
			byes, reasons := append([]goneInc(nil), log.byes...), append([]string(nil), log.reasons...)
			log.mu.Unlock()
			if len(byes) != 1 || byes[0] != (goneInc{ctxID, 7}) {
				t.Fatalf("goodbyes %v; want one of ctx/0's incarnation 7", byes)
			}
			want := messages.GoodbyeReason(reason)
			if reasons[0] != want {
				t.Fatalf("OnPeerGoodbye's reason %q, want %q", reasons[0], want)
			}
			if reason != "" && (len(want) > messages.MaxGoodbyeReasonLen || !strings.Contains(want, `"ctx2/0",\nwhich`) || !strings.Contains(want, `engine\x00`)) {
				t.Fatalf("reason %q: not escaped or not bounded (%d bytes)", want, len(want))
			}
			if _, err := b.Hello(ctxID); !errors.Is(err, control.ErrPeerGone) || !errors.Is(err, ErrPeerClosed) {
				t.Fatalf("Hello of a peer that said goodbye: %v; want ErrPeerClosed", err)
			}
			for r, n := range b.Stats().Rejected {
				if n != 0 {
					t.Errorf("%d frames rejected (%s)", n, r)
				}
			}
		})
	}
}

// A goodbye whose reason breaks its bounds (longer than
// MaxGoodbyeReasonLen, not UTF-8, holding a control character) or a
// heartbeat that gives a reason without leaving, on the peer's own bound
// connection, is refused as undecodable (RejectDecode), one count each:
// nothing is told, the peer stays up, no goodbye waits (no state made)
// and nothing panics. The peer's valid goodbye then takes it down with
// its reason. (Checked to fail: without the reason's checks in Validate,
// the oversized and control-character reasons reached OnPeerGoodbye.)
func TestMalformedGoodbyeReasonIsRefused(t *testing.T) {
	f := newDepartedFixture(t)
	log := &goodbyeLog{}
	f.s.l.cfg.OnPeerGoodbye, f.s.l.cfg.OnPeerDown = log.goodbye, log.down
	wire := func(hb *pb.Heartbeat) []byte {
		t.Helper()
		hb.From = &pb.PeerID{Instance: f.peer.Instance, Rank: f.peer.Rank}
		hb.Seq, hb.FromIncarnation = 5, 1
		b, err := proto.Marshal(&pb.Envelope{Version: messages.Version, Body: &pb.Envelope_Heartbeat{Heartbeat: hb}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Not UTF-8: proto.Marshal refuses to write it, so the bytes of a
	// valid reason are overwritten.
	notUTF8 := wire(&pb.Heartbeat{Leaving: true, Reason: "abc"})
	i := bytes.Index(notUTF8, []byte("abc"))
	copy(notUTF8[i:], "\xff\xfe\xfd")
	frames := map[string][]byte{
		"oversized":          wire(&pb.Heartbeat{Leaving: true, Reason: strings.Repeat("x", messages.MaxGoodbyeReasonLen+1)}),
		"huge":               wire(&pb.Heartbeat{Leaving: true, Drained: true, Reason: strings.Repeat("x", 60<<10)}),
		"control character":  wire(&pb.Heartbeat{Leaving: true, Reason: "bad\ninstance"}),
		"escape sequence":    wire(&pb.Heartbeat{Leaving: true, Reason: "\x1b[2Jcleared"}),
		"not UTF-8":          notUTF8,
		"reason, no leaving": wire(&pb.Heartbeat{Reason: "not a goodbye"}),
	}
	for name, frame := range frames {
		before := f.rejected(RejectDecode)
		f.s.handle("c1", frame, f.old.public, 1)
		f.s.goodbyes()
		if n := f.rejected(RejectDecode) - before; n != 1 {
			t.Fatalf("%s: %d rejected as undecodable, want 1 (%+v)", name, n, f.s.l.Stats().Rejected)
		}
		if byes, downs := log.counts(); byes+downs != 0 {
			t.Fatalf("%s: %d goodbyes and %d downs told", name, byes, downs)
		}
		if len(f.s.byes) != 0 {
			t.Fatalf("%s: %d goodbyes wait to be acted on", name, len(f.s.byes))
		}
		if _, err := f.s.l.Hello(f.peer); err != nil {
			t.Fatalf("%s: gen/0 is down: %v", name, err)
		}
	}
	f.s.handle("c1", mustEncode(t, &messages.Heartbeat{From: f.peer, Seq: 6, FromIncarnation: 1, Leaving: true,
		Reason: "gen/0 found a mistake"}), f.old.public, 1)
	f.s.goodbyes()
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.byes) != 1 || log.reasons[0] != "gen/0 found a mistake" {
		t.Fatalf("the valid goodbye: goodbyes %v, reasons %q; want one, with its reason", log.byes, log.reasons)
	}
}
