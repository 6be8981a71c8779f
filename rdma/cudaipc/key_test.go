package cudaipc

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

// TestKeyVersion: a key of version 1 (one allocation, "CIK1") is refused
// by its version, not misread; a version 2 key round-trips. (Checked to
// fail: with parseKey not naming the version, the error says only "not a
// cudaipc key".)
func TestKeyVersion(t *testing.T) {
	k := regionKey{pid: 42, length: 1 << 20, count: 3}
	k.owner[0], k.fileID[1], k.secret[2], k.digest[3] = 1, 2, 3, 4
	got, err := parseKey(k.encode())
	if err != nil || got != k {
		t.Fatalf("parseKey(encode(k)) = %+v, %v; want %+v", got, err, k)
	}
	old := append([]byte("CIK1"), make([]byte, 4+16+4+16+16+64+8+8-4)...) // a version 1 key's length
	_, err = parseKey(old)
	if !errors.Is(err, rdma.ErrBadKey) || !strings.Contains(err.Error(), `"CIK1"`) || !strings.Contains(err.Error(), `"CIK2"`) {
		t.Fatalf("parseKey(version 1 key) = %v, want ErrBadKey naming both versions", err)
	}
	t.Log(err)
}
