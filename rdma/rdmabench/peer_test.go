package rdmabench

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// TestPeerRig: a rig whose receiver is this test binary re-executed moves
// the bytes, and the peer's VERIFY catches a destination that was not
// written.
func TestPeerRig(t *testing.T) {
	for _, backend := range peerBackends {
		if !slices.Contains(Backends(), backend) {
			continue // ucx not built in
		}
		t.Run(backend, func(t *testing.T) {
			s := Shape{SegmentBytes: 64 << 10, Segments: 4, Slots: 3}
			r, err := NewPeerRig(backend, s, []string{os.Args[0]})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := r.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			}()
			if err := r.Verify(); err == nil || !strings.Contains(err.Error(), "MISMATCH 0 0") {
				t.Fatalf("Verify before any write: %v, want a MISMATCH in slot 0", err)
			}
			if err := r.Run(64); err != nil {
				t.Fatal(err)
			}
			if err := r.Verify(); err != nil {
				t.Fatalf("Verify after the writes: %v", err)
			}
		})
	}
}

// TestParseVerify: the peer checks the slots a VERIFY names, all of them
// without a count, and refuses a count outside its slots.
func TestParseVerify(t *testing.T) {
	for _, c := range []struct {
		line string
		want int // 0: refused
	}{{"VERIFY", 4}, {"VERIFY 1", 1}, {"VERIFY 4", 4}, {"VERIFY 0", 0}, {"VERIFY 5", 0}, {"VERIFY x", 0}, {"VERIFY 1 2", 0}, {"CHECK", 0}, {"", 0}} {
		n, err := parseVerify(c.line, 4)
		if n != c.want || (err == nil) != (c.want > 0) {
			t.Errorf("parseVerify(%q, 4) = %d, %v, want %d", c.line, n, err, c.want)
		}
	}
	if _, s, err := parsePeerSpec("shm/4096/2/7"); err != nil || s != (Shape{SegmentBytes: 4096, Segments: 2, Slots: 7}) {
		t.Errorf("parsePeerSpec(shm/4096/2/7) = %+v, %v", s, err)
	}
	if _, s, err := parsePeerSpec("shm/4096/2"); err != nil || s.SlotCount() != 1 {
		t.Errorf("parsePeerSpec(shm/4096/2) = %+v, %v, want one slot", s, err)
	}
}

func TestPeerRigRefusals(t *testing.T) {
	s := Shape{SegmentBytes: 4096, Segments: 1}
	if _, err := NewPeerRig("loopback", s, []string{os.Args[0]}); err == nil || !strings.Contains(err.Error(), `"loopback"`) {
		t.Errorf("loopback peer rig: %v, want an error naming the backend", err)
	}
	if _, err := NewPeerRig("shm", s, []string{os.Args[0] + ".missing"}); err == nil {
		t.Error("a peer command that does not exist: no error")
	}
	for _, spec := range []string{"shm", "shm/0/1", "shm/4096/0", "loopback/4096/1", "shm/x/1", "shm/4096/1/0", "shm/4096/1/x", "shm/4096/1/2/3"} {
		if _, _, err := parsePeerSpec(spec); err == nil || !strings.Contains(err.Error(), spec) {
			t.Errorf("parsePeerSpec(%q): %v, want an error quoting it", spec, err)
		}
	}
}
