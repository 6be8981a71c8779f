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
// digits, '.', '_' and '-', not starting with '.' (one etcd key segment).
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
	if c[0] == '.' {
		return fmt.Errorf("%w: cluster name %q starts with '.'", ErrInvalidRecord, c)
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

// IncarnationSuffix ends a rank's incarnation key,
// /kvxfer/<cluster>/<instance>/<rank>/incarnation: the incarnation last
// registered for the rank and its lease, written with the record in one
// transaction and never deleted, so that every registry — also one started
// later — refuses an incarnation that was ever registered, other than
// under the lease it was registered with.
const IncarnationSuffix = "/incarnation"

// IncarnationKey is the rank's incarnation key.
func IncarnationKey(cluster, instance string, rank int32) string {
	return Key(cluster, instance, rank) + IncarnationSuffix
}

// parseKey splits a key under prefix into its instance and rank, and says
// whether it is the rank's incarnation key. The rank is canonical decimal
// (no sign, no leading zero), so one rank has one key.
func parseKey(prefix, key string) (messages.PeerID, bool, error) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return messages.PeerID{}, false, fmt.Errorf("%w: key %q is not under %q", ErrInvalidRecord, key, prefix)
	}
	rest, isInc := strings.CutSuffix(rest, IncarnationSuffix)
	inst, rs, ok := strings.Cut(rest, "/")
	if !ok || strings.Contains(rs, "/") {
		return messages.PeerID{}, false, fmt.Errorf("%w: key %q, want %s<instance>/<rank>[%s]", ErrInvalidRecord, key, prefix, IncarnationSuffix)
	}
	if err := checkInstance(inst); err != nil {
		return messages.PeerID{}, false, fmt.Errorf("key %q: %w", key, err)
	}
	r, err := strconv.ParseInt(rs, 10, 32)
	if err != nil || r < 0 || r >= messages.MaxRank || strconv.FormatInt(r, 10) != rs {
		return messages.PeerID{}, false, fmt.Errorf("%w: key %q: rank %q, want a decimal 0..%d", ErrInvalidRecord, key, rs, messages.MaxRank-1)
	}
	return messages.PeerID{Instance: inst, Rank: int32(r)}, isInc, nil
}
