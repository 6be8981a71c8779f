package agentaddr

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

func TestRoundTripAndErrors(t *testing.T) {
	nonce := Nonce{1, 2, 3, 15: 0xff}
	s := Format("shm", 42, nonce)
	n, got, err := Parse("shm", "pid", 1<<31-1, []byte(s))
	if err != nil || n != 42 || got != nonce {
		t.Fatalf("Parse(%q) = %d, %x, %v", s, n, got, err)
	}
	for _, bad := range []string{"", "shm", "ucx:1:00", "shm:0:" + s[len(s)-32:], "shm:x:" + s[len(s)-32:],
		"shm:4294967296:" + s[len(s)-32:], "shm:1:zz", "shm:1:0102", "shm:1:2:3"} {
		if _, _, err := Parse("shm", "pid", 1<<31-1, []byte(bad)); !errors.Is(err, rdma.ErrBadAddress) {
			t.Errorf("Parse(%q) err = %v, want ErrBadAddress", bad, err)
		}
	}
}
