// Package agentaddr encodes the agent addresses of kvxfer's host backends:
// "<scheme>:<number>:<32 hex digits of nonce>", where the number names the
// agent (a process id, or an id within a process) and the nonce tells two
// incarnations with the same number apart.
package agentaddr

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/rdma"
)

// Nonce is an agent's random incarnation tag.
type Nonce [16]byte

// Format returns "<scheme>:<n>:<hex nonce>".
func Format(scheme string, n uint64, nonce Nonce) string {
	return fmt.Sprintf("%s:%d:%s", scheme, n, hex.EncodeToString(nonce[:]))
}

// Parse parses an address of scheme whose number (called what in errors)
// lies in 1..max. Errors wrap rdma.ErrBadAddress and quote the input.
func Parse(scheme, what string, max uint64, b []byte) (uint64, Nonce, error) {
	var nonce Nonce
	parts := strings.Split(string(b), ":")
	if len(parts) != 3 || parts[0] != scheme {
		return 0, nonce, fmt.Errorf("%w: %q is not %s:<%s>:<nonce>", rdma.ErrBadAddress, b, scheme, what)
	}
	n, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || n == 0 || n > max {
		return 0, nonce, fmt.Errorf("%w: %q: %s %q is not an integer in 1..%d", rdma.ErrBadAddress, b, what, parts[1], max)
	}
	h, err := hex.DecodeString(parts[2])
	if err != nil || len(h) != len(nonce) {
		return 0, nonce, fmt.Errorf("%w: %q: nonce %q is not %d hex bytes", rdma.ErrBadAddress, b, parts[2], len(nonce))
	}
	copy(nonce[:], h)
	return n, nonce, nil
}
