package cudaipc

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/rdma"
)

const addrScheme = "cudaipc"

// address is a parsed agent address: the agent's process and its nonce.
type address struct {
	pid   int
	nonce [16]byte
}

func (a address) String() string {
	return fmt.Sprintf("%s:%d:%s", addrScheme, a.pid, hex.EncodeToString(a.nonce[:]))
}

// parseAddress parses "cudaipc:<pid>:<nonce>"; errors wrap
// rdma.ErrBadAddress and quote the input.
func parseAddress(b []byte) (address, error) {
	var a address
	parts := strings.Split(string(b), ":")
	if len(parts) != 3 || parts[0] != addrScheme {
		return a, fmt.Errorf("%w: %q is not %s:<pid>:<nonce>", rdma.ErrBadAddress, b, addrScheme)
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 || pid > 1<<31-1 {
		return a, fmt.Errorf("%w: %q: pid %q is not a positive integer", rdma.ErrBadAddress, b, parts[1])
	}
	n, err := hex.DecodeString(parts[2])
	if err != nil || len(n) != len(a.nonce) {
		return a, fmt.Errorf("%w: %q: nonce %q is not %d hex bytes", rdma.ErrBadAddress, b, parts[2], len(a.nonce))
	}
	a.pid = pid
	copy(a.nonce[:], n)
	return a, nil
}
