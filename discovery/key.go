package discovery

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/messages"
)

// KeyRoot is the root of every kvxfer key in etcd.
const KeyRoot = "/kvxfer/"

// MaxClusterLen bounds a cluster name.
const MaxClusterLen = 64

// CheckCluster accepts a cluster name: 1..MaxClusterLen bytes of letters,
// digits, '.', '_' and '-' (one etcd key segment).
func CheckCluster(c string) error {
	if c == "" || len(c) > MaxClusterLen {
		return fmt.Errorf("%w: cluster name of %d bytes, want 1..%d", ErrInvalidRecord, len(c), MaxClusterLen)
	}
	for i := 0; i < len(c); i++ {
		b := c[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '_' || b == '-') {
			return fmt.Errorf("%w: cluster name %q holds %q: want letters, digits, '.', '_' and '-'", ErrInvalidRecord, c, b)
		}
	}
	if c == "." || c == ".." {
		return fmt.Errorf("%w: cluster name %q", ErrInvalidRecord, c)
	}
	return nil
}

// ClusterPrefix is the prefix under which a cluster's ranks register:
// /kvxfer/<cluster>/.
func ClusterPrefix(cluster string) string { return KeyRoot + cluster + "/" }

// Key is where a rank registers: /kvxfer/<cluster>/<instance>/<rank>.
func Key(cluster, instance string, rank int32) string {
	return ClusterPrefix(cluster) + instance + "/" + strconv.FormatInt(int64(rank), 10)
}

// parseKey splits a key under prefix into its instance and rank. The rank
// is canonical decimal (no sign, no leading zero), so one rank has one key.
func parseKey(prefix, key string) (messages.PeerID, error) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return messages.PeerID{}, fmt.Errorf("%w: key %q is not under %q", ErrInvalidRecord, key, prefix)
	}
	inst, rs, ok := strings.Cut(rest, "/")
	if !ok || strings.Contains(rs, "/") {
		return messages.PeerID{}, fmt.Errorf("%w: key %q, want %s<instance>/<rank>", ErrInvalidRecord, key, prefix)
	}
	if err := checkInstance(inst); err != nil {
		return messages.PeerID{}, fmt.Errorf("key %q: %w", key, err)
	}
	r, err := strconv.ParseInt(rs, 10, 32)
	if err != nil || r < 0 || r >= messages.MaxRank || strconv.FormatInt(r, 10) != rs {
		return messages.PeerID{}, fmt.Errorf("%w: key %q: rank %q, want a decimal 0..%d", ErrInvalidRecord, key, rs, messages.MaxRank-1)
	}
	return messages.PeerID{Instance: inst, Rank: int32(r)}, nil
}
