package loopback

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/rdma"
)

const addrScheme = "loopback"

// address is a parsed agent address.
type address struct {
	id    uint64
	nonce [16]byte
}

func (a address) String() string {
	return fmt.Sprintf("%s:%d:%s", addrScheme, a.id, hex.EncodeToString(a.nonce[:]))
}

// parseAddress parses "loopback:<id>:<nonce>"; errors wrap rdma.ErrBadAddress
// and quote the input.
func parseAddress(b []byte) (address, error) {
	var a address
	parts := strings.Split(string(b), ":")
	if len(parts) != 3 || parts[0] != addrScheme {
		return a, fmt.Errorf("%w: %q is not %s:<id>:<nonce>", rdma.ErrBadAddress, b, addrScheme)
	}
	id, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || id == 0 {
		return a, fmt.Errorf("%w: %q: agent id %q is not a positive integer", rdma.ErrBadAddress, b, parts[1])
	}
	n, err := hex.DecodeString(parts[2])
	if err != nil || len(n) != len(a.nonce) {
		return a, fmt.Errorf("%w: %q: nonce %q is not %d hex bytes", rdma.ErrBadAddress, b, parts[2], len(a.nonce))
	}
	a.id = id
	copy(a.nonce[:], n)
	return a, nil
}
